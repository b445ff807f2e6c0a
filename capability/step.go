package capability

import (
	"encoding/json"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/store"
)

// Input is what moves a grant: one of Admit, Approve, Deny, Expire, Cancel,
// Start, LaunchFailed, Finish and Interrupt, and for a session itself
// OpenSession and EndSession.
type Input interface {
	// verb names the input in refusals: "cannot <verb> a running grant".
	verb() string
}

// Admit asks to admit a requested grant: the rules decide on the facts
// the service gathered, in a fixed order (the tool's record, the key's
// role, the workspace policy, a tool review, network), and the grant is
// denied, waits for approval, or is approved to run at once.
type Admit struct {
	// By is the key that asks.
	By Principal
	// Asked fingerprints the request in its decision's event.
	Asked audit.Invocation
	// ToolRefusal says why the tool's record refuses the request's
	// runtime; empty when it allows it.
	ToolRefusal string
	// Policy is the workspace policy's decision on the request.
	Policy policy.Decision
	// ReviewPending says why the tool waits for this workspace's review
	// of a change; empty when it does not.
	ReviewPending string
	// Network says the request asks for egress; the tool's record must
	// then have an allowlist (ToolEgress) and this server egress
	// (EgressAvailable), and a human must approve it.
	Network         bool
	Tool            string
	ToolEgress      bool
	EgressAvailable bool
	// Refusal, when set, refuses a request the rules allow: the service
	// met it carrying the admission out (a driver down, no free slot, too
	// few credits) and asks again with it.
	Refusal *Refusal
	// Price is what a run costs: reserved at admission, committed when it
	// ran. Zero is free.
	Price int64
	// Card is the approval card (JSON) an approver is shown, and
	// ExpiresAt when the request lapses; both are used only when the
	// grant needs approval.
	Card      json.RawMessage
	ExpiresAt time.Time
	At        time.Time
}

// Approve is an approver's approval of a grant awaiting it.
type Approve struct {
	By     Principal
	Reason string
	// Stale says why the request can no longer be approved as it was
	// carded (the policy changed, the tool's record changed); empty when
	// it can.
	Stale string
	At    time.Time
}

// Deny is an approver's denial of a grant awaiting approval.
type Deny struct {
	By     Principal
	Reason string
	At     time.Time
}

// Expire ends a grant whose approval request lapsed undecided.
type Expire struct{ At time.Time }

// Cancel withdraws a grant: the key that asked for it or an admin key of
// its workspace may.
type Cancel struct {
	By     Principal
	Reason string
	At     time.Time
}

// Start records that an approved grant's sandbox launched, before its
// code runs.
type Start struct {
	Driver string
	At     time.Time
}

// LaunchFailed ends a grant whose run could not happen: the sandbox did
// not launch, or could not run the code.
type LaunchFailed struct {
	Err error
	At  time.Time
}

// Finish ends a grant's run. A run cancelled before its code ran ends
// model.StatusCancelled, with Cancel set; one that ran ends in the status
// of its outcome (a run killed by a cancel with Cancel set too).
type Finish struct {
	Status model.ExecutionStatus
	// Result is the result document (JSON); a cancelled run's is made
	// from its cancellation.
	Result json.RawMessage
	Output model.Output
	// Driver is the driver it ran on; empty keeps the one its start
	// recorded.
	Driver string
	Cancel *Cancellation
	At     time.Time
}

// Interrupt ends a grant a daemon stop interrupted while it was approved
// or running: a restarted daemon finds it, with no result to charge for.
type Interrupt struct{ At time.Time }

func (Admit) verb() string        { return "admit" }
func (Approve) verb() string      { return "approve" }
func (Deny) verb() string         { return "deny" }
func (Expire) verb() string       { return "expire" }
func (Cancel) verb() string       { return "cancel" }
func (Start) verb() string        { return "start" }
func (LaunchFailed) verb() string { return "fail the launch of" }
func (Finish) verb() string       { return "finish" }
func (Interrupt) verb() string    { return "interrupt" }

// Step is what one transition causes.
type Step struct {
	From, To State
	// Status is the grant's status after the step: its execution's, or
	// denied for a denial at admission (which stores no execution).
	Status model.ExecutionStatus
	// Write is what the journal applies: Admit for an admission, Apply
	// otherwise, with Write.From as its compare-and-set. It is nil for a
	// step that writes no grant: a denial at admission (whose event the
	// journal appends alone), a cancel of a running grant (its run ends
	// it) or of a settled one (it changes nothing).
	Write *model.Step
	// Events are the step's audit events; Write.Audit holds them
	// encoded.
	Events []audit.Event
	// Refusal is a denial's answer to the caller: the reason, wrapping
	// its errdefs class.
	Refusal error
	Next    Next
	// Open and End are the session record a session's opening creates
	// (Sessions.OpenSession) and its end writes (Sessions.EndSession),
	// with the step's events encoded; nil for every other step.
	Open *store.NewSession
	End  *store.SessionEnd
	// Pause and Resume are what a session's pause writes
	// (Sessions.PauseSession) and its resume (Sessions.ResumeSession).
	Pause  *store.SessionPause
	Resume *store.SessionResume
}

// Next is what the service does once a step is applied.
type Next struct {
	// Dispatch runs the grant: it is approved.
	Dispatch bool
	// Stop ends the grant's run, if it has one, with this cause.
	Stop *Cancellation
	// Change is what the workspace's watchers are told; empty for none.
	Change ChangeKind
	// Ended tells the grant's waiters it ended.
	Ended bool
	// Pending is the change of the number of approvals pending: +1, -1
	// or 0.
	Pending int
}

// ChangeKind is what happened in a Change, which a Step names for the
// service to publish.
type ChangeKind string

// The kinds of change.
const (
	ApprovalRequested ChangeKind = "approval_requested"
	ApprovalDecided   ChangeKind = "approval_decided"
	ApprovalExpired   ChangeKind = "approval_expired"
	ExecutionStarted  ChangeKind = "execution_started"
	ExecutionFinished ChangeKind = "execution_finished"
)
