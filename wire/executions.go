package wire

import (
	"bytes"
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

// ExecutionRequest is what to run: the body of POST /v1/executions.
type ExecutionRequest struct {
	// Runtime is python, node or shell.
	Runtime string `json:"runtime"`
	Code    string `json:"code"`
	// TimeoutMS is the wall clock limit; zero is the policy's default.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Network is "deny" (the default, also when empty) or "allow"; the
	// server also takes the older "denied" and "allowed".
	Network string `json:"network,omitempty"`
	// Stdin is the program's standard input; empty is none.
	Stdin string `json:"stdin,omitempty"`
	// Tool names the tool to run as; empty is the default tool.
	Tool string `json:"tool,omitempty"`
	// IdempotencyKey, if set, makes a retried request return the first
	// execution instead of running again. It travels as the
	// Idempotency-Key header, not in the body.
	IdempotencyKey string `json:"-"`
}

// Execution is an execution: the answer of POST /v1/executions and GET
// /v1/executions/{id}, and the data of the result and denied events.
type Execution struct {
	ID      string          `json:"id"`
	Status  ExecutionStatus `json:"status"`
	Runtime string          `json:"runtime"`
	Tool    string          `json:"tool"`
	// SessionID is the session of an execution that is a session's cell.
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

// Run is how a program's run ended: the result document of a one-shot
// (engine.Result holds it too) but its status. A program that fails is
// data (ExitCode, Signal); Signal is the signal that ended it, 0 when
// none was observed (it exited, or Stockade ended the run: see EndedBy).
type Run struct {
	ExitCode        int    `json:"exit_code"`
	Signal          int    `json:"signal"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	DurationMS      int64  `json:"duration_ms"`
	CPUMS           int64  `json:"cpu_ms"`
	PeakMemoryBytes int64  `json:"peak_memory_bytes"`
	Driver          string `json:"driver"`
	Runtime         string `json:"runtime"`
	// EndedBy is set when Stockade ended the run before its program did
	// (status killed): "cancel", "daemon_shutdown" or "session_ended".
	EndedBy string `json:"ended_by,omitempty"`
	// Network is what the sandbox could reach: "none" (a name lookup
	// fails), "broker" (only the credential broker) or "allowlist" (the
	// tool's egress allowlist). Empty where no sandbox ran.
	Network string `json:"network,omitempty"`
}

// Result is how a run ended: the result document the server keeps of it,
// an Execution's result. Error is set when Stockade could not run the
// program (a sandbox that did not launch, a daemon that stopped during
// the run). A session's cell has a cell's document: its ExecutionID,
// SessionID, Cell, Outputs and KernelRestarted, and the exception it
// raised in Raised (its "error" is then an object).
//
// A Result read from JSON (ResultOf, or a decoder) encodes as the
// document it was read from, so that the server answers a run's document
// as it was kept.
type Result struct {
	// Status is how the program ended: succeeded, failed, timed_out,
	// oom_killed or killed; empty where it did not run.
	Status ExecutionStatus `json:"status,omitempty"`
	Run
	// Error is why Stockade could not run the program, a sentence.
	Error string `json:"-"`
	// Raised is the exception a cell raised (sent as "error").
	Raised *CellError `json:"-"`
	// ExecutionID, SessionID and Cell name a session's cell.
	ExecutionID string `json:"execution_id,omitempty"`
	SessionID   string `json:"session_id,omitempty"`
	Cell        int    `json:"cell,omitempty"`
	// Outputs are a cell's rich outputs; OutputsDropped counts those over
	// the cap.
	Outputs        []CellOutput `json:"outputs,omitempty"`
	OutputsDropped int          `json:"outputs_dropped,omitempty"`
	// KernelRestarted says a cell's kernel was restarted: its state is
	// gone.
	KernelRestarted bool `json:"kernel_restarted,omitempty"`

	// doc is the document the result was read from.
	doc json.RawMessage
}

// resultFields is Result's JSON without its methods, with "error" as it
// comes: a sentence or a cell's exception.
type resultFields struct {
	plainResult
	Error json.RawMessage `json:"error,omitempty"`
}

type plainResult Result

// ResultOf reads a result document as the server keeps it; an empty or
// null document is no result (nil).
func ResultOf(doc []byte) (*Result, error) {
	if len(doc) == 0 || string(doc) == "null" {
		return nil, nil
	}
	var r Result
	if err := json.Unmarshal(doc, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// UnmarshalJSON reads a result document, whose "error" is a sentence or
// the exception a cell raised.
func (r *Result) UnmarshalJSON(b []byte) error {
	var f resultFields
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	*r = Result(f.plainResult)
	r.doc = bytes.Clone(b)
	if len(f.Error) == 0 || string(f.Error) == "null" {
		return nil
	}
	if f.Error[0] == '"' {
		return json.Unmarshal(f.Error, &r.Error)
	}
	r.Raised = &CellError{}
	return json.Unmarshal(f.Error, r.Raised)
}

// MarshalJSON writes the document r was read from, or, for a Result made
// in code, its fields.
func (r Result) MarshalJSON() ([]byte, error) {
	if r.doc != nil {
		return r.doc, nil
	}
	f := resultFields{plainResult: plainResult(r)}
	var err error
	switch {
	case r.Raised != nil:
		f.Error, err = json.Marshal(r.Raised)
	case r.Error != "":
		f.Error, err = json.Marshal(r.Error)
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(f)
}

// ApprovalCard is what an approver is shown of a request: the data of the
// approval_required event and an execution's approval.
type ApprovalCard struct {
	ApprovalID  string `json:"approval_id"`
	ExecutionID string `json:"execution_id"`
	Capability  string `json:"capability"`
	RiskLevel   string `json:"risk_level"`
	Runtime     string `json:"runtime"`
	Code        string `json:"code"`
	// Stdin is what the program reads on its standard input.
	Stdin string `json:"stdin,omitempty"`
	// Network is what the request asked for, in the request's words:
	// "allow" or "deny".
	Network string `json:"network"`
	// Tool is the tool the code runs as; EgressAllow and EgressPorts its
	// record's egress allowlist, which an approved network request may
	// reach (empty without network).
	Tool        string   `json:"tool,omitempty"`
	EgressAllow []string `json:"egress_allow,omitempty"`
	EgressPorts []int    `json:"egress_ports,omitempty"`
	// ToolFingerprint identifies the tool's record as the approver sees
	// it; approving is refused once the record has changed.
	ToolFingerprint string `json:"tool_fingerprint,omitempty"`
	// SessionID and Cell name a session's cell; CoversSession says that
	// approving it approves the session's later cells too (per_session).
	SessionID     string    `json:"session_id,omitempty"`
	Cell          int       `json:"cell,omitempty"`
	CoversSession bool      `json:"covers_session,omitempty"`
	TimeoutMS     int64     `json:"timeout_ms"`
	RequestedBy   string    `json:"requested_by"`
	ExpiresAt     time.Time `json:"expires_at"`
}

// ApprovalStatus is where an approval request is.
type ApprovalStatus string

// The approval statuses.
const (
	ApprovalPending   ApprovalStatus = "pending"
	ApprovalApproved  ApprovalStatus = "approved"
	ApprovalDenied    ApprovalStatus = "denied"
	ApprovalExpired   ApprovalStatus = "expired"
	ApprovalCancelled ApprovalStatus = "cancelled"
)

// Approval is an approval request (GET /v1/approvals).
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

// DecisionRequest is the optional body of an approval's approve and deny,
// of a tool's approve and of an execution's cancel.
type DecisionRequest struct {
	Reason string `json:"reason"`
}

// Decision is the answer of approve and deny: the decided request and its
// execution.
type Decision struct {
	Approval  Approval  `json:"approval"`
	Execution Execution `json:"execution"`
}

// The events of an execution's stream (Accept: text/event-stream), by
// name: approval_required (an ApprovalCard) when a human must decide,
// started, stdout and stderr chunks (Output), then the outcome: result or
// denied (an Execution; a Cell for a session's cell), or error (an
// ErrorBody) when the server could not read it. A cell's stream has
// output events too (a CellOutput shown while it ran).
const (
	EventApprovalRequired = "approval_required"
	EventStarted          = "started"
	EventStdout           = "stdout"
	EventStderr           = "stderr"
	EventOutput           = "output"
	EventResult           = "result"
	EventDenied           = "denied"
	EventError            = "error"
)

// Started is the data of the started event: the sandbox runs the code.
type Started struct {
	ExecutionID string `json:"execution_id"`
	Driver      string `json:"driver"`
	// SessionID and Cell name a session's cell.
	SessionID string `json:"session_id,omitempty"`
	Cell      int    `json:"cell,omitempty"`
}

// Output is the data of a stdout or stderr event: a chunk of the
// program's output, as it came. A subscriber that falls behind may miss
// chunks; the result has the output from its start, up to the cap.
type Output struct {
	// Stream is "stdout" or "stderr": the event's name.
	Stream string `json:"-"`
	Data   string `json:"data"`
}

// JSON is r's document: what the server sends of it. A nil Result has
// none.
func (r *Result) JSON() json.RawMessage {
	if r == nil {
		return nil
	}
	b, err := r.MarshalJSON()
	if err != nil {
		return nil
	}
	return b
}

// String is r's document as text, for messages and logs.
func (r *Result) String() string { return string(r.JSON()) }
