// Package capability is Stockade's capability layer: the lifecycle of a
// grant (what one decision allowed an API key to run), the rules that move
// it, and the service that runs it.
//
// A grant moves requested -> denied | awaiting approval -> approved |
// denied | expired | cancelled -> running -> settled. One pure function,
// Transition, takes a grant and an input (an admission, a decision, a
// cancel, a start, an end) and returns the Step it causes: the state
// change, the ledger movement, the approval request's change, the
// tool_calls and tool_invocations rows, the typed audit events, and what
// the service must do next. A Journal applies the step in one
// transaction; the Service does the rest (authentication, the policy
// decision, dispatch to the engine, waiters):
//
//	step, err := capability.Transition(g, capability.Start{Driver: "runc", At: time.Now()})
//	if err != nil { ... refused ... }
//	ex, err := journal.Apply(ctx, g.ID, *step.Write)
//	if errdefs.IsConflict(err) { ... another transition won ... }
//
// A one-shot execution is a grant with one run; a session is a grant with
// many (see session.go).
package capability

import (
	"fmt"
	"time"

	"github.com/stockade-sh/stockade/model"
)

// Kind is what a grant allows: one run, or a session of many.
type Kind string

// The kinds of grant.
const (
	// OneShot allows one run: a stored execution.
	OneShot Kind = "one_shot"
	// Session allows many runs in one sandbox: the grant of one of its
	// cells, or of the session itself (its opening and end).
	Session Kind = "session"
)

// State is where a grant is in its lifecycle.
type State string

// The states. A grant is Requested only while it is decided, in memory;
// every other state is stored as its execution's status (Approved as
// "queued", Settled as one of the terminal statuses).
const (
	Requested        State = "requested"
	AwaitingApproval State = "awaiting_approval"
	Approved         State = "approved"
	Running          State = "running"
	Settled          State = "settled"
)

// StateOf returns the state of a grant whose execution is in s.
func StateOf(s model.ExecutionStatus) State {
	switch s {
	case model.StatusAwaitingApproval:
		return AwaitingApproval
	case model.StatusQueued:
		return Approved
	case model.StatusRunning:
		return Running
	}
	if s.Terminal() {
		return Settled
	}
	return Requested
}

// Grant is what one decision allowed: a one-shot grant is an execution
// and its one run. Its zero value with a Kind is a requested grant,
// which only Admit moves on.
type Grant struct {
	ID          string
	Kind        Kind
	WorkspaceID string
	// KeyID is the API key that asked for it.
	KeyID string
	State State
	// Status is its execution's stored status: for a settled grant, how
	// it ended.
	Status    model.ExecutionStatus
	Tool      string
	Runtime   string
	CreatedAt time.Time
	// ApprovalID and ApprovalExpires are its approval request's; empty
	// when it needed none.
	ApprovalID      string
	ApprovalExpires time.Time
	// Run is the grant's run: a one-shot grant's only one, or one cell of
	// a session.
	Run Run
	// Session is the session of a grant of kind Session; nil otherwise.
	Session *SessionOf
}

// Run is one invocation under a grant.
type Run struct {
	// Reserved is what was reserved for it at admission: 0 when it is free.
	Reserved int64
	// Driver and StartedAt are set once it started.
	Driver    string
	StartedAt time.Time
}

// GrantOf returns the one-shot grant of execution e, whose approval request
// a is (nil when it has none, or when the caller did not read it: then
// only an expiry or a decision, which need its expiry, are refused).
func GrantOf(e model.Execution, a *model.Approval) Grant {
	g := Grant{
		ID: e.ID, Kind: OneShot, WorkspaceID: e.WorkspaceID, KeyID: e.KeyID, State: StateOf(e.Status), Status: e.Status,
		Tool: e.Tool, Runtime: e.Runtime, CreatedAt: e.CreatedAt, ApprovalID: e.ApprovalID,
		Run: Run{Reserved: e.Credits, Driver: e.Driver, StartedAt: e.StartedAt},
	}
	if a != nil {
		g.ApprovalExpires = a.ExpiresAt
	}
	return g
}

// Principal is an authenticated API key.
type Principal struct {
	KeyID       string
	WorkspaceID string
	Role        model.Role
}

// Cancellation is a cancel: who asked, and why. It is the cause of the
// context of a run it stops.
type Cancellation struct {
	// By is the cancelling key's id; empty is the daemon's own cancel
	// (the cell of a session that ended).
	By     string
	Reason string
	// EndedBy is the ended_by of a run the cancel cuts short:
	// engine.EndedByCancel when empty.
	EndedBy string
}

// actor is the audit actor of the cancel: the key, or the system.
func (c *Cancellation) actor() string {
	if c.By == "" {
		return "system"
	}
	return c.By
}

func (c *Cancellation) Error() string {
	by := "key " + c.By
	if c.By == "" {
		by = "the daemon"
	}
	if c.Reason == "" {
		return "cancelled by " + by
	}
	return fmt.Sprintf("cancelled by %s: %s", by, c.Reason)
}

// Refusal is a refusal of a request the rules allowed, met while the
// service carried the admission out: the driver down, no slot free, too
// few credits. Admit turns it into the request's denial.
type Refusal struct {
	// Code is the denial's stable code, e.g. "server_at_capacity".
	Code   string
	Reason string
	// Class is the errdefs class the caller is answered with.
	Class error
}
