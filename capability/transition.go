package capability

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/policy"
)

// The results of grants that ended without a program's result.
var interruptedResult = errorResult(errors.New("interrupted: the daemon stopped before the execution finished"))

// Transition returns the step in from g's state that in causes, or why in
// is refused, as an errdefs class: ErrPermissionDenied for a key that may
// not (decide, cancel), ErrConflict for a grant that has moved on (decided,
// started, ended) or a request that lapsed or went stale,
// ErrFailedPrecondition for an input that cannot apply to the state at
// all, ErrInvalidArgument for a malformed input. It reads nothing but its
// arguments and changes nothing.
//
// The rules:
//   - who may decide: an approver or admin key of the grant's workspace,
//     never the key that asked; approving is refused once the request is
//     stale or its approval request has expired (at its ExpiresAt);
//   - who may cancel: the key that asked, or an admin key of the
//     workspace; a cancel of an ended grant changes nothing;
//   - charging: a run is charged (its reservation committed) if and only
//     if it started and ended succeeded, failed, timed_out, oom_killed or
//     killed; every other end releases the reservation;
//   - every transition that writes says what it audits (Step.Events).
func Transition(g Grant, in Input) (Step, error) {
	if in == nil {
		return Step{}, errdefs.Publicf("a transition needs an input: %w", errdefs.ErrInvalidArgument)
	}
	switch g.Kind {
	case OneShot:
	case Session:
		if g.Session == nil {
			return Step{}, errdefs.Publicf("cannot %s a session grant without its session: %w", in.verb(), errdefs.ErrInvalidArgument)
		}
		switch in.(type) {
		case OpenSession, EndSession, PauseSession, ResumeSession:
			return sessionTransition(g, in)
		}
	default:
		return Step{}, errdefs.Publicf("cannot %s a grant of kind %q: %w", in.verb(), g.Kind, errdefs.ErrInvalidArgument)
	}
	if g.State == "" {
		g.State = Requested
	}
	if _, admit := in.(Admit); g.State == Requested && !admit {
		return Step{}, errdefs.Publicf("cannot %s a grant that was never admitted: %w", in.verb(), errdefs.ErrFailedPrecondition)
	}
	switch in := in.(type) {
	case Admit:
		return admit(g, in)
	case Approve:
		return decide(g, in.By, in.Reason, in.Stale, in.At, true)
	case Deny:
		return decide(g, in.By, in.Reason, "", in.At, false)
	case Expire:
		return expire(g, in)
	case Cancel:
		return cancel(g, in)
	case Start:
		return start(g, in)
	case LaunchFailed:
		return launchFailed(g, in)
	case Finish:
		return finish(g, in)
	case Interrupt:
		return interrupt(g, in)
	}
	return Step{}, errdefs.Publicf("unknown input %T: %w", in, errdefs.ErrInvalidArgument)
}

func refuse(g Grant, in Input, class error) (Step, error) {
	what := string(g.State)
	if g.State == Settled {
		what = "ended (" + string(g.Status) + ")"
	}
	return Step{}, errdefs.Publicf("cannot %s execution %s: it is %s: %w", in.verb(), g.ID, what, class)
}

func needTime(in Input, at time.Time) error {
	if at.IsZero() {
		return errdefs.Publicf("%s: the input has no time: %w", in.verb(), errdefs.ErrInvalidArgument)
	}
	return nil
}

// admit decides a request: in the order of the checks below, the first
// that refuses denies it (an event of no grant), else it is admitted,
// awaiting approval or approved.
func admit(g Grant, in Admit) (Step, error) {
	if g.State != Requested {
		return refuse(g, in, errdefs.ErrFailedPrecondition)
	}
	if err := needTime(in, in.At); err != nil {
		return Step{}, err
	}
	approval, coveredBy := in.Policy.ApprovalRequired || in.Network, ""
	if g.Kind == Session {
		switch g.Session.State {
		case model.SessionPaused:
			return Step{}, errdefs.Publicf("session %s is paused; resume it: %w", g.Session.ID, errdefs.ErrFailedPrecondition)
		case model.SessionEnded:
			return Step{}, expiredError(g.Session)
		}
		approval, coveredBy = cellApproval(g, in)
	}
	if r := refusalOf(in); r != nil {
		return denial(in, r), nil
	}
	if in.Price < 0 {
		return Step{}, errdefs.Publicf("admit: price %d: %w", in.Price, errdefs.ErrInvalidArgument)
	}
	w := &model.Step{To: model.StatusQueued, At: in.At}
	if in.Price > 0 {
		w.Credits = model.CreditMove{Kind: model.LedgerReserve, Amount: in.Price}
	}
	allowedEv := audit.InvokeAllowedEvent{Meta: audit.Meta{Actor: in.By.KeyID, Reason: "allowed by workspace policy"},
		ApprovalRequired: approval, Request: in.Asked, CoveredBy: coveredBy}
	if g.Kind == Session {
		allowedEv.SessionID, allowedEv.Cell = g.Session.ID, g.Session.Cells+1
		if coveredBy != "" {
			allowedEv.Reason = "covered by the approval of the session's first cell (" + coveredBy + ")"
		}
	}
	events := []audit.Event{allowedEv}
	s := Step{From: Requested, To: Approved, Next: Next{Dispatch: true}}
	if approval {
		if len(in.Card) == 0 || in.ExpiresAt.IsZero() {
			return Step{}, errdefs.Publicf("admit: a request that needs approval needs its card and expiry: %w", errdefs.ErrInvalidArgument)
		}
		why := "high-risk capability needs a human decision"
		if in.Network {
			why = "network access needs a human decision"
		}
		w.To, w.Approval = model.StatusAwaitingApproval, model.ApprovalChange{To: model.ApprovalPending, Card: in.Card, ExpiresAt: in.ExpiresAt}
		events = append(events, audit.ApprovalRequestedEvent{Meta: audit.Meta{Actor: in.By.KeyID, Reason: why}})
		s.To, s.Next = AwaitingApproval, Next{Change: ApprovalRequested, Pending: 1}
	}
	return withEvents(s, w, events), nil
}

// mayInvoke says whether p's role may invoke capabilities: an approver's
// may not, so that no key approves what it asked for.
func mayInvoke(p Principal) bool { return p.Role != model.RoleApprover }

// refusalOf returns the first of the checks of an admission that refuses
// it, in order, or nil.
func refusalOf(in Admit) *Refusal {
	var r *Refusal
	switch {
	case in.ToolRefusal != "":
		r = &Refusal{"tool_runtime_not_allowed", in.ToolRefusal, errdefs.ErrPermissionDenied}
	case !mayInvoke(in.By):
		r = &Refusal{"role_cannot_invoke", "approver keys cannot invoke capabilities", errdefs.ErrPermissionDenied}
	case !in.Policy.Allowed:
		r = &Refusal{in.Policy.Code, in.Policy.Reason, errdefs.ErrPermissionDenied}
	case in.ReviewPending != "":
		r = &Refusal{"tool_review_required", in.ReviewPending, errdefs.ErrPermissionDenied}
	case in.Network && !in.ToolEgress:
		r = &Refusal{policy.DenyNetworkNotPermitted, fmt.Sprintf("network access needs a tool whose record has an egress allowlist; tool %q has none", in.Tool), errdefs.ErrPermissionDenied}
	case in.Network && !in.EgressAvailable:
		r = &Refusal{policy.DenyNetworkNotPermitted, "network access is not available on this server (egress needs root and nftables)", errdefs.ErrPermissionDenied}
	case in.Refusal != nil:
		r = in.Refusal
	}
	return r
}

// denial is the step that denies the request in for r: an event of no
// grant.
func denial(in Admit, r *Refusal) Step {
	ev := audit.InvokeDeniedEvent{Meta: audit.Meta{WorkspaceID: in.By.WorkspaceID, Actor: in.By.KeyID, Reason: r.Reason},
		Decision: r.Code, Request: in.Asked}
	return Step{From: Requested, To: Settled, Status: model.StatusDenied, Events: []audit.Event{ev},
		Refusal: errdefs.Publicf("%s: %w", r.Reason, r.Class)}
}

// mayDecide refuses a key that may not decide approvals at all.
func mayDecide(p Principal) error {
	if p.Role != model.RoleApprover && p.Role != model.RoleAdmin {
		return errdefs.Publicf("only approver or admin keys may decide approvals: %w", errdefs.ErrPermissionDenied)
	}
	return nil
}

// decide approves (approve) or denies a grant awaiting approval.
func decide(g Grant, by Principal, reason, stale string, at time.Time, approve bool) (Step, error) {
	var in Input = Deny{}
	if approve {
		in = Approve{}
	}
	if err := mayDecide(by); err != nil {
		return Step{}, err
	}
	if err := needTime(in, at); err != nil {
		return Step{}, err
	}
	switch {
	case approve && stale != "":
		return Step{}, errdefs.Publicf("%s: %w", stale, errdefs.ErrConflict)
	case by.WorkspaceID != g.WorkspaceID:
		return Step{}, errdefs.Publicf("key %s is not a key of the workspace of execution %s: %w", by.KeyID, g.ID, errdefs.ErrPermissionDenied)
	case g.State != AwaitingApproval:
		return refuse(g, in, errdefs.ErrConflict)
	case g.ApprovalExpires.IsZero():
		return Step{}, errdefs.Publicf("%s execution %s: its approval request's expiry is unknown: %w", in.verb(), g.ID, errdefs.ErrInvalidArgument)
	case !at.Before(g.ApprovalExpires):
		return Step{}, errdefs.Publicf("approval expired at %s: %w", g.ApprovalExpires.Format(time.RFC3339), errdefs.ErrConflict)
	case by.KeyID == g.KeyID:
		return Step{}, errdefs.Publicf("the key that invoked cannot decide its own approval: %w", errdefs.ErrPermissionDenied)
	}
	meta := audit.Meta{Actor: by.KeyID, Reason: reason}
	change := model.ApprovalChange{DecidedBy: by.KeyID, Reason: reason}
	next := Next{Change: ApprovalDecided, Pending: -1}
	if approve {
		change.To = model.ApprovalApproved
		next.Dispatch = true
		w := &model.Step{From: g.Status, To: model.StatusQueued, At: at, Approval: change, CoverSession: coversSession(g)}
		return withEvents(Step{From: g.State, To: Approved, Next: next},
			w, []audit.Event{audit.ApprovalApprovedEvent{Meta: meta, ApprovalID: g.ApprovalID}}), nil
	}
	change.To = model.ApprovalDenied
	next.Ended = true
	w := settle(g, model.StatusDenied, at, "", false)
	w.Approval = change
	return withEvents(Step{From: g.State, To: Settled, Next: next},
		w, []audit.Event{audit.ApprovalDeniedEvent{Meta: meta, ApprovalID: g.ApprovalID}}), nil
}

func expire(g Grant, in Expire) (Step, error) {
	if err := needTime(in, in.At); err != nil {
		return Step{}, err
	}
	switch {
	case g.State != AwaitingApproval:
		return refuse(g, in, errdefs.ErrConflict)
	case g.ApprovalExpires.IsZero():
		return Step{}, errdefs.Publicf("expire execution %s: its approval request's expiry is unknown: %w", g.ID, errdefs.ErrInvalidArgument)
	case in.At.Before(g.ApprovalExpires):
		return Step{}, errdefs.Publicf("the approval request of execution %s is due at %s, not before: %w",
			g.ID, g.ApprovalExpires.Format(time.RFC3339Nano), errdefs.ErrFailedPrecondition)
	}
	w := settle(g, model.StatusApprovalExpired, in.At, "", false)
	w.Approval = model.ApprovalChange{To: model.ApprovalExpired, Reason: "expired without a decision"}
	ev := audit.ApprovalExpiredEvent{Meta: audit.Meta{Actor: "system", Reason: "no decision before the approval expired"}, ApprovalID: g.ApprovalID}
	return withEvents(Step{From: g.State, To: Settled, Next: Next{Change: ApprovalExpired, Ended: true, Pending: -1}},
		w, []audit.Event{ev}), nil
}

// cancel withdraws a grant that has not started, stops the run of one
// that has (the run's end records it), and leaves an ended one alone.
func cancel(g Grant, in Cancel) (Step, error) {
	if in.By != (Principal{}) && (in.By.WorkspaceID != g.WorkspaceID || (in.By.KeyID != g.KeyID && in.By.Role != model.RoleAdmin)) {
		return Step{}, errdefs.Publicf("only the key that invoked an execution or an admin key may cancel it: %w", errdefs.ErrPermissionDenied)
	}
	c := &Cancellation{By: in.By.KeyID, Reason: in.Reason}
	switch g.State {
	case Settled:
		return Step{From: Settled, To: Settled, Status: g.Status}, nil
	case Running:
		return Step{From: Running, To: Running, Status: g.Status, Next: Next{Stop: c}}, nil
	}
	if err := needTime(in, in.At); err != nil {
		return Step{}, err
	}
	next := Next{Stop: c, Change: ExecutionFinished, Ended: true}
	ev := audit.ExecutionCancelledEvent{Meta: audit.Meta{Actor: c.actor(), Reason: c.Error()}, From: g.Status, To: model.StatusCancelled}
	w := settle(g, model.StatusCancelled, in.At, "", false)
	w.Result = errorResult(c)
	if g.State == AwaitingApproval {
		next.Pending = -1
		ev.ApprovalID = g.ApprovalID
		w.Approval = model.ApprovalChange{To: model.ApprovalCancelled, Reason: in.Reason}
	}
	return withEvents(Step{From: g.State, To: Settled, Next: next}, w, []audit.Event{ev}), nil
}

func start(g Grant, in Start) (Step, error) {
	if g.State != Approved {
		return refuse(g, in, errdefs.ErrConflict)
	}
	if err := needTime(in, in.At); err != nil {
		return Step{}, err
	}
	if in.Driver == "" {
		return Step{}, errdefs.Publicf("start: no driver: %w", errdefs.ErrInvalidArgument)
	}
	w := &model.Step{From: g.Status, To: model.StatusRunning, At: in.At, Driver: in.Driver}
	return withEvents(Step{From: Approved, To: Running, Next: Next{Change: ExecutionStarted}}, w, nil), nil
}

func launchFailed(g Grant, in LaunchFailed) (Step, error) {
	if g.State != Approved && g.State != Running {
		return refuse(g, in, errdefs.ErrConflict)
	}
	if err := needTime(in, in.At); err != nil {
		return Step{}, err
	}
	err := in.Err
	if err == nil {
		err = errors.New("the sandbox did not launch")
	}
	w := settle(g, model.StatusLaunchFailed, in.At, "", false)
	w.Result = errorResult(err)
	return withEvents(Step{From: g.State, To: Settled, Next: Next{Change: ExecutionFinished, Ended: true}},
		w, []audit.Event{finishedEvent(model.StatusLaunchFailed, "", w.Result, nil, 0)}), nil
}

// runEnds are the statuses a run that ran ends in.
var runEnds = map[model.ExecutionStatus]bool{
	model.StatusSucceeded: true, model.StatusFailed: true, model.StatusTimedOut: true,
	model.StatusOOMKilled: true, model.StatusKilled: true,
}

func finish(g Grant, in Finish) (Step, error) {
	if err := needTime(in, in.At); err != nil {
		return Step{}, err
	}
	next := Next{Change: ExecutionFinished, Ended: true}
	if in.Status == model.StatusCancelled {
		// Stopped by a cancel before its code ran (its start may be
		// recorded): nothing is charged.
		if in.Cancel == nil {
			return Step{}, errdefs.Publicf("finish: a run ends cancelled only by a cancel: %w", errdefs.ErrInvalidArgument)
		}
		if g.State != Approved && g.State != Running {
			return refuse(g, in, errdefs.ErrConflict)
		}
		w := settle(g, model.StatusCancelled, in.At, "", false)
		w.Result = errorResult(in.Cancel)
		ev := audit.ExecutionCancelledEvent{Meta: audit.Meta{Actor: in.Cancel.actor(), Reason: in.Cancel.Error()},
			From: g.Status, To: model.StatusCancelled}
		return withEvents(Step{From: g.State, To: Settled, Next: next}, w, []audit.Event{ev}), nil
	}
	if !runEnds[in.Status] {
		return Step{}, errdefs.Publicf("finish: %q is not how a run ends: %w", in.Status, errdefs.ErrInvalidArgument)
	}
	if g.State != Running {
		return refuse(g, in, errdefs.ErrConflict)
	}
	// It started and ran: charged, whatever its exit.
	w := settle(g, in.Status, in.At, in.Driver, true)
	w.Result, w.Output = in.Result, in.Output
	var events []audit.Event
	if in.Cancel != nil && in.Cancel.By != "" {
		// A key's cancel. The daemon's own (its session's end, a
		// shutdown) is no one's cancel: the result's ended_by says it.
		events = append(events, audit.ExecutionCancelledEvent{Meta: audit.Meta{Actor: in.Cancel.actor(), Reason: in.Cancel.Error()},
			From: g.Status, To: in.Status, Credits: w.Invocation.Credits})
	}
	events = append(events, finishedEvent(in.Status, in.Driver, in.Result, in.Output.ExitCode, w.Invocation.Credits))
	return withEvents(Step{From: Running, To: Settled, Next: next}, w, events), nil
}

func interrupt(g Grant, in Interrupt) (Step, error) {
	switch g.State {
	case Approved, Running:
	case AwaitingApproval:
		// Its approval request stays valid across a restart.
		return refuse(g, in, errdefs.ErrFailedPrecondition)
	default:
		return refuse(g, in, errdefs.ErrConflict)
	}
	if err := needTime(in, in.At); err != nil {
		return Step{}, err
	}
	// A run a crash interrupted produced no result: it is never charged.
	w := settle(g, model.StatusFailed, in.At, "", false)
	w.Result = interruptedResult
	ev := audit.ExecutionRecoveredEvent{Meta: audit.Meta{Actor: "system",
		Reason: "execution interrupted by a daemon stop; marked failed, credits released"}}
	return withEvents(Step{From: g.State, To: Settled}, w, []audit.Event{ev}), nil
}

// settle is the write that ends g in status at at, on driver (empty: the
// one its start recorded): its reservation committed when charge is set
// (only finish does, for a run that ran), released otherwise, and its
// tool_invocations row.
func settle(g Grant, status model.ExecutionStatus, at time.Time, driver string, charge bool) *model.Step {
	w := &model.Step{From: g.Status, To: status, At: at, Driver: driver}
	if driver == "" {
		driver = g.Run.Driver
	}
	inv := &model.ToolInvocation{Tool: g.Tool, Runtime: g.Runtime, Status: status, Driver: driver}
	if g.Run.StartedAt.IsZero() {
		inv.Queued = max(at.Sub(g.CreatedAt), 0)
	} else {
		inv.Queued, inv.Ran = max(g.Run.StartedAt.Sub(g.CreatedAt), 0), max(at.Sub(g.Run.StartedAt), 0)
	}
	if g.Run.Reserved > 0 {
		w.Credits.Kind = model.LedgerRelease
		if charge {
			w.Credits.Kind, inv.Credits = model.LedgerCommit, g.Run.Reserved
		}
	}
	w.Invocation = inv
	return w
}

// withEvents completes s with its write w (nil for none) and its events.
func withEvents(s Step, w *model.Step, events []audit.Event) Step {
	s.Events = events
	if w != nil {
		w.Audit = audit.NewEvents(events...)
		s.Status = w.To
	}
	s.Write = w
	return s
}

// finishedEvent is the audit event of a run's end, written with it: how it
// ended, what it was charged, and a fingerprint of the result document
// (which holds the program's output), so that a result changed in the
// database no longer matches the chain.
func finishedEvent(status model.ExecutionStatus, driver string, result json.RawMessage, exit *int, credits int64) audit.ExecutionFinishedEvent {
	return audit.ExecutionFinishedEvent{Meta: audit.Meta{Actor: "system", Reason: "execution ended " + string(status)},
		Status: status, Driver: driver, ResultSHA256: sha256Hex(result), ExitCode: exit, Credits: credits}
}

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func errorResult(err error) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"error": err.Error()})
	return b
}
