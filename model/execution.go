package model

import (
	"encoding/json"
	"time"
)

// ExecutionStatus is the lifecycle state of an execution.
type ExecutionStatus string

// The execution states. Queued, awaiting_approval and running are live; all
// others are terminal and final.
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
	// StatusCancelled: the key that invoked (or an admin) cancelled it
	// before it started.
	StatusCancelled ExecutionStatus = "cancelled"
)

// ExecutionStatuses lists every status.
var ExecutionStatuses = []ExecutionStatus{
	StatusQueued, StatusAwaitingApproval, StatusRunning, StatusSucceeded, StatusFailed,
	StatusTimedOut, StatusOOMKilled, StatusKilled, StatusDenied, StatusApprovalExpired,
	StatusLaunchFailed, StatusCancelled,
}

// Valid reports whether s is one of the statuses.
func (s ExecutionStatus) Valid() bool {
	for _, v := range ExecutionStatuses {
		if s == v {
			return true
		}
	}
	return false
}

// Terminal reports whether s is a final status.
func (s ExecutionStatus) Terminal() bool {
	return s.Valid() && s != StatusQueued && s != StatusAwaitingApproval && s != StatusRunning
}

// Execution is one invocation. Times not reached yet are zero.
type Execution struct {
	ID             string
	WorkspaceID    string
	KeyID          string
	Status         ExecutionStatus
	Runtime        string
	Tool           string
	Request        json.RawMessage
	Result         json.RawMessage
	IdempotencyKey string
	InputSHA256    string
	// ReservationID and ApprovalID are empty when there is none.
	ReservationID string
	ApprovalID    string
	// Credits is the amount of its reservation, 0 when it has none.
	Credits int64
	// SessionID is the session of a cell, and Cell its number in the
	// session from 1; empty and 0 for a one-shot execution.
	SessionID  string
	Cell       int
	Driver     string
	CreatedAt  time.Time
	StartedAt  time.Time
	FinishedAt time.Time
}

// PreviewLimit is the most bytes of each output stream a tool_calls row
// keeps; the store truncates longer previews and sets the truncation flag.
const PreviewLimit = 4096

// Step is one transition of an execution, as the store's Journal.Admit
// and Journal.Apply write it. Its fields say what the transition changes;
// zero fields change nothing.
type Step struct {
	// From is the status the execution must be in for the step to apply
	// (Apply's compare-and-set); Admit does not read it.
	From ExecutionStatus
	// To is the status the execution moves to; it differs from From.
	To ExecutionStatus
	// At is when the step happened: the execution's creation, start or
	// end, the decision on its approval request. Zero means the store's
	// clock.
	At time.Time
	// Credits is the step's movement of credits.
	Credits CreditMove
	// Approval is the step's change of the execution's approval request.
	Approval ApprovalChange
	// Driver is the driver the execution starts on (required when To is
	// running), or ended on (when To is terminal; empty keeps the one
	// recorded at the start).
	Driver string
	// Result is the result document of an execution that ends (JSON); it
	// may be nil.
	Result json.RawMessage
	// Output is what the tool_calls row keeps of a run that ended.
	Output Output
	// Invocation is the tool_invocations row of an execution that ends,
	// set exactly when To is terminal. Its Status must be To and its
	// Credits what the step charges (the reservation's amount when it
	// commits it, else 0); the store sets its ID, ExecutionID,
	// WorkspaceID and CreatedAt (At).
	Invocation *ToolInvocation
	// Audit events are appended in the same transaction, with WorkspaceID
	// and ExecutionID set to the execution's.
	Audit []NewEvent
	// CoverSession makes the approval this step approves cover the rest of
	// the cells of the execution's session (ApprovalPerSession): the
	// session records it and the deciding key.
	CoverSession bool
}

// CreditMove is a step's movement of credits. Its zero value moves none.
type CreditMove struct {
	// Kind is LedgerReserve (Admit only: Amount > 0 becomes the
	// execution's reservation), LedgerCommit or LedgerRelease (Apply
	// only: the execution's open reservation is charged or returned), or
	// empty for none.
	Kind LedgerKind
	// Amount is what LedgerReserve holds; a settlement moves the
	// reservation's own amount and ignores it.
	Amount int64
}

// ApprovalChange is a step's change of its execution's approval request.
// Its zero value changes none.
type ApprovalChange struct {
	// To is ApprovalPending (Admit only: the request is created), or
	// ApprovalApproved, ApprovalDenied, ApprovalExpired or
	// ApprovalCancelled (Apply only: the pending request is closed so),
	// or empty for none.
	To ApprovalStatus
	// Card and ExpiresAt describe a request created; both are required.
	Card      json.RawMessage
	ExpiresAt time.Time
	// DecidedBy is the deciding key of an approved or denied request;
	// the step's At is its DecidedAt.
	DecidedBy string
	// Reason is kept on the closed request.
	Reason string
}

// Output is what a tool_calls row keeps of a run that ended.
type Output struct {
	// ExitCode is nil when no process exit was observed.
	ExitCode *int
	// Stdout and Stderr are previews; bytes past PreviewLimit are dropped.
	Stdout, Stderr []byte
	// StdoutTruncated and StderrTruncated say the producer already cut the
	// stream; the store also sets them when it truncates a preview.
	StdoutTruncated, StderrTruncated bool
}

// ToolCall is the audit row of one invocation, created with the execution
// and completed when it ends. Status mirrors the execution's.
type ToolCall struct {
	ID              string
	ExecutionID     string
	WorkspaceID     string
	Tool            string
	Runtime         string
	InputSHA256     string
	Status          ExecutionStatus
	ExitCode        *int
	StdoutPreview   []byte
	StderrPreview   []byte
	StdoutTruncated bool
	StderrTruncated bool
	Driver          string
	CreditsCharged  int64
	CreatedAt       time.Time
	StartedAt       time.Time
	FinishedAt      time.Time
}

// ToolInvocation is the analytics row written once when an execution ends.
type ToolInvocation struct {
	ID          string
	ExecutionID string
	WorkspaceID string
	Tool        string
	Runtime     string
	Status      ExecutionStatus
	Driver      string
	// Queued is from creation to start (or end, if it never started); Ran is
	// from start to end, zero if it never started.
	Queued  time.Duration
	Ran     time.Duration
	Credits int64
	// CreatedAt is when the execution ended.
	CreatedAt time.Time
}
