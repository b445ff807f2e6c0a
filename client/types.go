package client

import (
	"encoding/json"
	"time"
)

// ExecutionStatus is where an execution is in its life.
type ExecutionStatus string

// The execution statuses. Every status but the first three is final.
const (
	StatusQueued           ExecutionStatus = "queued"
	StatusAwaitingApproval ExecutionStatus = "awaiting_approval"
	StatusRunning          ExecutionStatus = "running"
	StatusSucceeded        ExecutionStatus = "succeeded"
	StatusFailed           ExecutionStatus = "failed"
	StatusTimedOut         ExecutionStatus = "timed_out"
	StatusOOMKilled        ExecutionStatus = "oom_killed"
	StatusKilled           ExecutionStatus = "killed"
	StatusDenied           ExecutionStatus = "denied"
	StatusApprovalExpired  ExecutionStatus = "approval_expired"
	StatusLaunchFailed     ExecutionStatus = "launch_failed"
	StatusCancelled        ExecutionStatus = "cancelled"
)

// Final reports whether s is a final status: the execution has ended.
func (s ExecutionStatus) Final() bool {
	switch s {
	case StatusQueued, StatusAwaitingApproval, StatusRunning, "":
		return false
	}
	return true
}

// ExecutionRequest is what to run (POST /v1/executions).
type ExecutionRequest struct {
	// Runtime is python, node or shell.
	Runtime string `json:"runtime"`
	Code    string `json:"code"`
	// TimeoutMS is the wall clock limit; zero is the policy's default.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Network is "deny" (the default, also when empty) or "allow".
	Network string `json:"network,omitempty"`
	// Stdin is the program's standard input; empty is none.
	Stdin string `json:"stdin,omitempty"`
	// Tool names the tool to run as; empty is the default tool.
	Tool string `json:"tool,omitempty"`
	// IdempotencyKey, if set, makes a retried request return the first
	// execution instead of running again (the Idempotency-Key header).
	IdempotencyKey string `json:"-"`
}

// Execution is an execution as the API shows it.
type Execution struct {
	ID      string          `json:"id"`
	Status  ExecutionStatus `json:"status"`
	Runtime string          `json:"runtime"`
	Tool    string          `json:"tool"`
	// SessionID is set for a session's cell (WaitCell reads its outcome).
	SessionID  string `json:"session_id,omitempty"`
	ApprovalID string `json:"approval_id,omitempty"`
	// Approval is the card an approver is shown, when the execution needed
	// one.
	Approval   *ApprovalCard `json:"approval,omitempty"`
	Driver     string        `json:"driver,omitempty"`
	CreatedAt  time.Time     `json:"created_at"`
	StartedAt  *time.Time    `json:"started_at,omitempty"`
	FinishedAt *time.Time    `json:"finished_at,omitempty"`
	// Result is set once the execution has ended: how the program ended,
	// or an Error when the sandbox could not run it.
	Result *Result `json:"result,omitempty"`
	// Replayed is set when an Idempotency-Key matched an earlier request.
	Replayed bool `json:"replayed,omitempty"`
}

// Result is how a run ended. A program that fails is data (Status,
// ExitCode, Signal); Error is set when Stockade could not run it (a
// sandbox that did not launch, a daemon that stopped during the run).
type Result struct {
	Status          ExecutionStatus `json:"status,omitempty"`
	ExitCode        int             `json:"exit_code"`
	Signal          int             `json:"signal"`
	Stdout          string          `json:"stdout"`
	Stderr          string          `json:"stderr"`
	StdoutTruncated bool            `json:"stdout_truncated"`
	StderrTruncated bool            `json:"stderr_truncated"`
	DurationMS      int64           `json:"duration_ms"`
	CPUMS           int64           `json:"cpu_ms"`
	PeakMemoryBytes int64           `json:"peak_memory_bytes"`
	Driver          string          `json:"driver,omitempty"`
	Runtime         string          `json:"runtime,omitempty"`
	// Network is what the sandbox could reach: "none" (a name lookup
	// fails), "broker" (only the credential broker) or "allowlist" (the
	// tool's egress allowlist). Empty where no sandbox ran.
	Network string `json:"network,omitempty"`
	// EndedBy is set when Stockade ended the run before its program did
	// (status killed): "cancel", "daemon_shutdown" or "session_ended".
	EndedBy string `json:"ended_by,omitempty"`
	Error   string `json:"error,omitempty"`
}

// ApprovalCard is what an approver is shown of a request.
type ApprovalCard struct {
	ApprovalID  string `json:"approval_id"`
	ExecutionID string `json:"execution_id"`
	Capability  string `json:"capability"`
	RiskLevel   string `json:"risk_level"`
	Runtime     string `json:"runtime"`
	Code        string `json:"code"`
	Stdin       string `json:"stdin,omitempty"`
	// Network is what the request asked for: "allow" or "deny".
	Network         string    `json:"network"`
	Tool            string    `json:"tool,omitempty"`
	EgressAllow     []string  `json:"egress_allow,omitempty"`
	EgressPorts     []int     `json:"egress_ports,omitempty"`
	ToolFingerprint string    `json:"tool_fingerprint,omitempty"`
	TimeoutMS       int64     `json:"timeout_ms"`
	RequestedBy     string    `json:"requested_by"`
	ExpiresAt       time.Time `json:"expires_at"`
}

// ApprovalStatus is where an approval request is.
type ApprovalStatus string

// The approval statuses.
const (
	ApprovalPending  ApprovalStatus = "pending"
	ApprovalApproved ApprovalStatus = "approved"
	ApprovalDenied   ApprovalStatus = "denied"
	ApprovalExpired  ApprovalStatus = "expired"
)

// Approval is an approval request.
type Approval struct {
	ID          string         `json:"id"`
	ExecutionID string         `json:"execution_id"`
	Status      ApprovalStatus `json:"status"`
	Card        ApprovalCard   `json:"card"`
	RequestedAt time.Time      `json:"requested_at"`
	ExpiresAt   time.Time      `json:"expires_at"`
	DecidedBy   string         `json:"decided_by,omitempty"`
	DecidedAt   *time.Time     `json:"decided_at,omitempty"`
	Reason      string         `json:"reason,omitempty"`
}

// Decision is the answer of Approve and Deny: the decided request and its
// execution.
type Decision struct {
	Approval  Approval  `json:"approval"`
	Execution Execution `json:"execution"`
}

// AuditEvent is one event of the workspace's hash-chained audit trail.
type AuditEvent struct {
	ID          string          `json:"id"`
	Seq         int64           `json:"seq"`
	Type        string          `json:"type"`
	Code        string          `json:"code"`
	Actor       string          `json:"actor"`
	Reason      string          `json:"reason,omitempty"`
	ExecutionID string          `json:"execution_id,omitempty"`
	Data        json.RawMessage `json:"data,omitempty"`
	Time        time.Time       `json:"time"`
	PrevHash    string          `json:"prev_hash"`
	Hash        string          `json:"hash"`
}

// ToolCall is a tool_calls row: one invocation, its input hash and the
// start of its output.
type ToolCall struct {
	ID              string          `json:"id"`
	ExecutionID     string          `json:"execution_id"`
	Tool            string          `json:"tool"`
	Runtime         string          `json:"runtime"`
	InputSHA256     string          `json:"input_sha256"`
	Status          ExecutionStatus `json:"status"`
	ExitCode        *int            `json:"exit_code"`
	StdoutPreview   string          `json:"stdout_preview"`
	StderrPreview   string          `json:"stderr_preview"`
	StdoutTruncated bool            `json:"stdout_truncated"`
	StderrTruncated bool            `json:"stderr_truncated"`
	Driver          string          `json:"driver,omitempty"`
	CreditsCharged  int64           `json:"credits_charged"`
	CreatedAt       time.Time       `json:"created_at"`
	StartedAt       *time.Time      `json:"started_at,omitempty"`
	FinishedAt      *time.Time      `json:"finished_at,omitempty"`
}

// Workspace is the key's workspace: its policy and credit balance.
type Workspace struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Policy  Policy `json:"policy"`
	Credits struct {
		Available int64 `json:"available"`
		Reserved  int64 `json:"reserved"`
	} `json:"credits"`
	// Sessions is the workspace's usage of sessions: its paused ones and
	// the disk their checkpoints take.
	Sessions struct {
		Paused          int   `json:"paused"`
		CheckpointBytes int64 `json:"checkpoint_bytes"`
	} `json:"sessions"`
}

// Policy is a workspace's policy.
type Policy struct {
	CodeExecution  bool     `json:"code_execution"`
	Approval       string   `json:"approval"`
	NetworkAllowed bool     `json:"network_allowed"`
	MaxTimeoutMS   int64    `json:"max_timeout_ms"`
	Runtimes       []string `json:"runtimes"`
	ToolChanges    string   `json:"tool_changes"`
}

// Tool is a tool and its isolation record.
type Tool struct {
	Name        string `json:"name"`
	Fingerprint string `json:"fingerprint"`
	// Record is the tool's record in its canonical JSON form.
	Record         json.RawMessage `json:"record"`
	ReviewRequired bool            `json:"review_required"`
}

// Health is the daemon's health: each driver's, "ok" or its error.
type Health struct {
	Status        string            `json:"status"`
	DefaultDriver string            `json:"default_driver"`
	Drivers       map[string]string `json:"drivers"`
}

// Page is one page of a list; Next is the cursor of the next page, empty
// on the last.
type Page[T any] struct {
	Items []T    `json:"items"`
	Next  string `json:"next_cursor,omitempty"`
}
