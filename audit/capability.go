package audit

import "github.com/stockade-sh/stockade/model"

// The decision on an invocation: every invocation has exactly one of these.
const (
	InvokeAllowed     = "capability.invoke_allowed"
	InvokeAllowedCode = "CAP001I"
	InvokeDenied      = "capability.invoke_denied"
	InvokeDeniedCode  = "CAP002W"
)

// Invocation fingerprints what an invocation asked to run, in the event of
// its decision: a row changed later no longer matches its chain.
type Invocation struct {
	Capability  string `json:"capability"`
	InputSHA256 string `json:"input_sha256"`
	// Network is what the invocation asked for: "allow" or "deny".
	// (Events written before the request's own words were used hold a
	// boolean here.)
	Network     string `json:"network"`
	Runtime     string `json:"runtime"`
	StdinSHA256 string `json:"stdin_sha256"`
	// TimeoutMS is the timeout the request named, 0 for none.
	TimeoutMS int64 `json:"timeout_ms"`
}

// InvokeAllowedEvent is an invocation the workspace's policy allowed,
// written with its admission (and its approval request, when it needs
// one).
type InvokeAllowedEvent struct {
	Meta             `json:"-"`
	ApprovalRequired bool `json:"approval_required"`
	// Cell is the number of a session's cell in its session; 0 for a
	// one-shot execution.
	Cell int `json:"cell,omitempty"`
	// CoveredBy is the approval that covers a cell of a per_session
	// session: it needs no approval of its own.
	CoveredBy string     `json:"covered_by,omitempty"`
	Request   Invocation `json:"request"`
	SessionID string     `json:"session_id,omitempty"`
}

func (InvokeAllowedEvent) Type() string { return InvokeAllowed }
func (InvokeAllowedEvent) Code() string { return InvokeAllowedCode }

// InvokeDeniedEvent is an invocation refused; Reason says why in words.
type InvokeDeniedEvent struct {
	Meta `json:"-"`
	// Decision is the refusal's stable code, e.g. "runtime_not_allowed".
	Decision string     `json:"decision"`
	Request  Invocation `json:"request"`
}

func (InvokeDeniedEvent) Type() string { return InvokeDenied }
func (InvokeDeniedEvent) Code() string { return InvokeDeniedCode }

// The approval gate.
const (
	ApprovalRequested     = "approval.requested"
	ApprovalRequestedCode = "APR001I"
	ApprovalApproved      = "approval.approved"
	ApprovalApprovedCode  = "APR002I"
	ApprovalDenied        = "approval.denied"
	ApprovalDeniedCode    = "APR003W"
	ApprovalExpired       = "approval.expired"
	ApprovalExpiredCode   = "APR004W"
)

// ApprovalRequestedEvent is an invocation that waits for a human decision,
// written with its approval request. It has no data.
type ApprovalRequestedEvent struct {
	Meta `json:"-"`
}

func (ApprovalRequestedEvent) Type() string { return ApprovalRequested }
func (ApprovalRequestedEvent) Code() string { return ApprovalRequestedCode }
func (ApprovalRequestedEvent) dataless()    {}

// ApprovalApprovedEvent is an approver's approval; the actor is the
// approver's key.
type ApprovalApprovedEvent struct {
	Meta       `json:"-"`
	ApprovalID string `json:"approval_id"`
}

func (ApprovalApprovedEvent) Type() string { return ApprovalApproved }
func (ApprovalApprovedEvent) Code() string { return ApprovalApprovedCode }

// ApprovalDeniedEvent is an approver's denial; the actor is the approver's
// key.
type ApprovalDeniedEvent struct {
	Meta       `json:"-"`
	ApprovalID string `json:"approval_id"`
}

func (ApprovalDeniedEvent) Type() string { return ApprovalDenied }
func (ApprovalDeniedEvent) Code() string { return ApprovalDeniedCode }

// ApprovalExpiredEvent is an approval request that no one decided in time,
// written in the transaction that expires it.
type ApprovalExpiredEvent struct {
	Meta       `json:"-"`
	ApprovalID string `json:"approval_id"`
}

func (ApprovalExpiredEvent) Type() string { return ApprovalExpired }
func (ApprovalExpiredEvent) Code() string { return ApprovalExpiredCode }

// The end of an execution.
const (
	ExecutionFinished      = "execution.finished"
	ExecutionFinishedCode  = "EXE001I"
	ExecutionRecovered     = "execution.recovered"
	ExecutionRecoveredCode = "EXE002W"
	ExecutionCancelled     = "execution.cancelled"
	ExecutionCancelledCode = "EXE003I"
)

// ExecutionFinishedEvent is the end of an execution that was queued or
// running, written with it: how it ended, what it was charged, and a
// fingerprint of the result document (which holds the program's output),
// so that a result changed in the database no longer matches the chain.
type ExecutionFinishedEvent struct {
	Meta    `json:"-"`
	Credits int64 `json:"credits"`
	// Driver is the driver it ran on, empty when it never launched.
	Driver string `json:"driver"`
	// ExitCode is the program's exit code; nil when it did not exit.
	ExitCode     *int                  `json:"exit_code,omitempty"`
	ResultSHA256 string                `json:"result_sha256"`
	Status       model.ExecutionStatus `json:"status"`
}

func (ExecutionFinishedEvent) Type() string { return ExecutionFinished }
func (ExecutionFinishedEvent) Code() string { return ExecutionFinishedCode }

// ExecutionRecoveredEvent is an execution a daemon stop interrupted, ended
// failed by the next start with its credits released. It has no data.
type ExecutionRecoveredEvent struct {
	Meta `json:"-"`
}

func (ExecutionRecoveredEvent) Type() string { return ExecutionRecovered }
func (ExecutionRecoveredEvent) Code() string { return ExecutionRecoveredCode }
func (ExecutionRecoveredEvent) dataless()    {}

// ExecutionCancelledEvent is an execution cancelled by the key that invoked
// it or an admin key, or by the daemon (actor "system": a cell still
// waiting when its session ended), in the chain with the cancel it
// records (one transaction). A running cell the daemon cut short is no
// cancel: its finished event's ended_by says why it ended.
type ExecutionCancelledEvent struct {
	Meta `json:"-"`
	// From is the status the execution was cancelled in:
	// awaiting_approval, queued or running.
	From model.ExecutionStatus `json:"from"`
	// To is the status it ended in: cancelled, or killed for a running
	// one, whose sandbox was destroyed.
	To model.ExecutionStatus `json:"to"`
	// Credits is what the execution was charged: 0, or the price of an
	// invocation for a running one (it launched).
	Credits int64 `json:"credits"`
	// ApprovalID is the approval request the cancel closed, if any.
	ApprovalID string `json:"approval_id,omitempty"`
}

func (ExecutionCancelledEvent) Type() string { return ExecutionCancelled }
func (ExecutionCancelledEvent) Code() string { return ExecutionCancelledCode }
