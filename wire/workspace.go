package wire

import (
	"encoding/json"
	"time"
)

// AuditEvent is one event of the workspace's hash-chained audit trail
// (GET /v1/audit/events), with its chain links.
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

// ToolCall is a tool_calls row (GET /v1/tool-calls): one invocation, its
// input hash and the start of its output.
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

// Workspace is the key's workspace (GET /v1/workspace): its policy, its
// credit balance and its usage of sessions.
type Workspace struct {
	ID       string            `json:"id"`
	Name     string            `json:"name"`
	Policy   Policy            `json:"policy"`
	Credits  Credits           `json:"credits"`
	Sessions WorkspaceSessions `json:"sessions"`
}

// Credits is a workspace's credit balance.
type Credits struct {
	Available int64 `json:"available"`
	Reserved  int64 `json:"reserved"`
}

// WorkspaceSessions is a workspace's usage of sessions: its paused
// sessions and the disk their checkpoints take.
type WorkspaceSessions struct {
	Paused          int   `json:"paused"`
	CheckpointBytes int64 `json:"checkpoint_bytes"`
}

// Policy is a workspace's policy.
type Policy struct {
	CodeExecution bool `json:"code_execution"`
	// Approval is none, required or per_session.
	Approval string `json:"approval"`
	// Network is "allow" or "deny": whether invocations may ask for it.
	Network string `json:"network"`
	// MaxSessions bounds the workspace's live sessions; 0 is the server's
	// bound.
	MaxSessions  int      `json:"max_sessions"`
	MaxTimeoutMS int64    `json:"max_timeout_ms"`
	Runtimes     []string `json:"runtimes"`
	ToolChanges  string   `json:"tool_changes"`
	// ForkApproval is anew or inherit: whether a session started from a
	// snapshot under per_session is covered by the approval that covered
	// its source (docs/design.md §10).
	ForkApproval string `json:"fork_approval"`
}

// Tool is a tool and its isolation record (GET /v1/tools).
type Tool struct {
	Name        string `json:"name"`
	Fingerprint string `json:"fingerprint"`
	// Record is the tool's record in its canonical JSON form.
	Record         json.RawMessage `json:"record"`
	ReviewRequired bool            `json:"review_required"`
}

// Health is the daemon's health (GET /healthz): each driver's, "ok" or
// its error; Status is ok or degraded (the default driver is not ok).
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
