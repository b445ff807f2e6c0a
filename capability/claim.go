package capability

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/contract"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
	"github.com/stockade-sh/stockade/wire"
)

// A claim is one request for a grant on its way through admission. Invoke
// (a one-shot), ExecCell (a cell of a session) and CreateSession each
// describe theirs as a claim, and gate.admit carries every claim through
// the same steps, in this order:
//
//  1. check: the request against the tool's record. The record refusing
//     it is a decision, recorded below; any other error is the caller's
//     mistake, answered at once.
//  2. policy: the workspace policy decides the request (policy.Decide);
//     the decision is acted on, and recorded, only once the request is
//     known not to be a retry.
//  3. replay: a retry of an admitted request (the same idempotency key and
//     body) answers the first outcome, neither decided nor recorded again.
//  4. the facts of the decision: the tool's refusal, a review of the
//     tool's change pending, egress.
//  5. card: the approval card, when the grant will wait for a human.
//  6. Transition: the rules decide; a refusal is recorded (deny) and
//     answered.
//  7. room: what the service must hold before it admits (the driver's
//     health, memory, a sandbox slot; the workspace's bound of sessions).
//     Its lack is recorded as the request's denial too (refuse).
//  8. record: the admission in one transaction, and what follows it
//     (dispatch, the waiters).
//
// What differs between a one-shot, a cell and a session is the claim's
// data; where a step differs in kind, the claim carries it as a func (room)
// or its record (runRecord for a one-shot's and a cell's execution,
// opening for a session).
type claim struct {
	// by asks for grant, which Transition moves: a requested one-shot, a
	// cell of its session, or a session before it opened.
	by    Principal
	grant Grant
	// ask is what the workspace policy decides; asked fingerprints the
	// request in its decision's event, so that a row changed later no
	// longer matches its chain.
	ask   policy.Request
	asked audit.Invocation
	// timeout is the run's: ask.Timeout, or when it is zero the tool's
	// limit within the policy's ceiling; facts are what the first steps
	// learned (both set by admit, step 2).
	timeout time.Duration
	facts   facts

	// check validates the request against the tool's record (step 1):
	// the engine's Validate or CheckSession.
	check func() (tools.Tool, sandbox.Driver, error)
	// idempotencyKey, when set, makes a retry replay its first outcome
	// (step 3); replayFirst replays it before the check and the policy
	// instead (a session's: its record keeps its request's hash, and a
	// retried creation answers the first whatever the tool's record or the
	// policy say now).
	idempotencyKey string
	replayFirst    bool
	// egress says the tool's egress allowlist and the server's egress are
	// facts of the decision: a one-shot's, a session's, and a cell's of a
	// session with network (its network is its session's). The card of
	// any request with network shows the allowlist.
	egress bool
	// review says a review of the tool's change that the workspace has not
	// made refuses the request, under a policy that requires reviews: a
	// one-shot's and a session's (a cell runs as its session's tool).
	review bool
	// charged says a run costs the service's price, reserved at admission:
	// a one-shot's and a cell's (a session costs nothing; its cells do).
	charged bool
	// card says whether the grant waits for a human, given the facts of
	// step 4, and returns its approval card with the request's own fields
	// (code, stdin, a cell's session); admit fills in the rest (step 5).
	// nil: none ever does.
	card func(in Admit) (wait bool, card wire.ApprovalCard)
	// room holds what the run needs before it is admitted (step 7), or
	// refuses the request (recorded: refuse); the ticket is a one-shot's
	// place among the runs. nil: nothing to hold.
	room func(ctx context.Context, step Step, in Admit) (*ticket, error)
	// record is how the admission is recorded (steps 3, 6 and 8).
	record record
}

// facts are what admission learned of a claim in steps 1 and 2: the tool
// it runs as and its driver, and the workspace's policy.
type facts struct {
	tool tools.Tool
	drv  sandbox.Driver
	pol  model.Policy
}

// A record is how a claim's admission is recorded: an execution for a
// run (runRecord), or a session's opening (opening).
type record interface {
	// replay answers a retry with its first outcome, and says whether it
	// did.
	replay(ctx context.Context, c *claim) (done bool, err error)
	// input is what Transition is given to decide in (step 6).
	input(c *claim, in Admit) Input
	// write records the admission the rules allowed, and does what follows
	// it (step 8).
	write(ctx context.Context, c *claim, step Step, in Admit, t *ticket) error
}

// admit carries c through admission (see claim). Its outcome is in c's
// record.
func (s *gate) admit(ctx context.Context, c *claim) error {
	if c.replayFirst {
		if done, err := s.replay(ctx, c); done || err != nil {
			return err
		}
	}
	// 1. The tool's record.
	tool, drv, verr := c.check()
	if verr != nil && !errdefs.IsPermissionDenied(verr) {
		return verr
	}
	if drv != nil {
		ctx = telemetry.WithTier(ctx, string(drv.Capabilities().Tier))
	}
	// 2. The policy.
	pctx, sp := telemetry.Start(ctx, telemetry.Policy)
	pol, err := s.st.GetPolicy(pctx, c.by.WorkspaceID)
	if err != nil {
		sp.End(&err)
		return fmt.Errorf("loading workspace policy: %w", err)
	}
	d := policy.Decide(pol, c.ask, s.runner.Ceiling().Timeout)
	sp.EndAs(decisionOutcome(d), nil)
	if c.timeout = c.ask.Timeout; c.timeout == 0 {
		c.timeout = min(s.runner.Limits(tool).Timeout, d.MaxTimeout)
	}
	// 3. A retry.
	if !c.replayFirst {
		if done, err := s.replay(ctx, c); done || err != nil {
			return err
		}
	}
	// 4. The facts.
	c.facts = facts{tool: tool, drv: drv, pol: pol}
	in := Admit{By: c.by, Asked: c.asked, Policy: d, Network: c.ask.Network, Tool: tool.Name, At: s.opts.Now()}
	if c.egress {
		in.ToolEgress, in.EgressAvailable = !tool.Egress.None(), s.runner.EgressAvailable()
	}
	if c.charged {
		in.Price = s.price
	}
	if verr != nil {
		in.ToolRefusal = strings.TrimSuffix(verr.Error(), ": "+errdefs.ErrPermissionDenied.Error())
	}
	if c.review && pol.ToolChanges == model.ToolChangesRequireReview {
		if in.ReviewPending, err = s.tools.reviewBlocks(ctx, c.by.WorkspaceID, tool.Name); err != nil {
			return err
		}
	}
	// 5. The approval card.
	if c.card != nil {
		if wait, card := c.card(in); wait {
			card.Capability, card.RiskLevel = contract.CodeExecute.Name, string(contract.CodeExecute.Risk)
			card.Runtime, card.Network, card.TimeoutMS = c.ask.Runtime, policy.NetworkWord(c.ask.Network), c.timeout.Milliseconds()
			card.RequestedBy, card.ExpiresAt = c.by.KeyID, in.At.Add(s.opts.ApprovalTTL).UTC().Truncate(time.Microsecond)
			card.Tool, card.ToolFingerprint = tool.Name, tools.Fingerprint(tool)
			// A cell of a session with network shows it too: its approval
			// may be the one that covers the session's network use. A
			// session's card shows the list its proxy enforces, pinned at
			// its open (cells.go), which the tool's record may have left.
			if c.ask.Network && card.EgressAllow == nil {
				card.EgressAllow, card.EgressPorts = tool.Egress.Allow, tool.Egress.Ports
			}
			in.Card, in.ExpiresAt = mustJSON(card), card.ExpiresAt
		}
	}
	// 6. The rules.
	step, err := Transition(c.grant, c.record.input(c, in))
	if err != nil {
		return err
	}
	if step.Refusal != nil {
		return s.deny(ctx, step)
	}
	// 7. Room.
	var t *ticket
	if c.room != nil {
		if t, err = c.room(ctx, step, in); err != nil {
			return err
		}
	}
	// 8. The record.
	return c.record.write(ctx, c, step, in, t)
}

// replay answers c, a retry, with its first outcome. A retry was decided
// with its first request: it must not be refused now (for capacity, or a
// policy changed since) nor write a second decision event. The same key on
// another body is a conflict. The record still catches a retry that races
// with its first request. Idempotency keys are the API key's own (the
// store's scope), and a key whose role may not invoke is refused by the
// rules before any replay.
func (s *gate) replay(ctx context.Context, c *claim) (bool, error) {
	if c.idempotencyKey == "" || !mayInvoke(c.by) {
		return false, nil
	}
	return c.record.replay(ctx, c)
}

// refuse denies c's request in, which the rules allowed, for a refusal r
// the service met carrying its admission out, and answers with r.
func (s *gate) refuse(ctx context.Context, c *claim, in Admit, r *Refusal) error {
	in.Refusal = r
	step, err := Transition(c.grant, c.record.input(c, in))
	if err != nil {
		return err
	}
	return s.deny(ctx, step)
}

// deny records the denial step and answers with its refusal.
func (s *gate) deny(ctx context.Context, step Step) error {
	for _, ev := range step.Events {
		if _, err := s.st.AppendEvent(ctx, audit.NewEvent(ev)); err != nil {
			return fmt.Errorf("recording denial: %w", err)
		}
	}
	return step.Refusal
}

// healthy refuses c (recorded, nothing reserved) when its driver cannot
// run sandboxes now: a refusal, not a run that fails to launch.
func (s *gate) healthy(ctx context.Context, c *claim, in Admit) error {
	drv := c.facts.drv
	hc, ok := drv.(sandbox.HealthChecker)
	if !ok {
		return nil
	}
	if err := hc.Health(ctx); err != nil {
		s.log.Warn("driver unavailable", "driver", drv.Name(), "err", err)
		return s.refuse(ctx, c, in, &Refusal{Code: "driver_unavailable",
			Reason: fmt.Sprintf("the %s sandbox driver is unavailable; retry later", drv.Name()), Class: errdefs.ErrUnavailable})
	}
	return nil
}

// runRecord records the admission of a run, a one-shot's or a cell's: its
// execution, with its reservation and approval request, in one
// transaction (store.Admit).
type runRecord struct {
	g  *gate
	ne store.NewExecution
	// unit names the run in the refusal for credits: "an invocation".
	unit string
	// recoverLost looks the execution up when the store was unavailable
	// (admittedAnyway): a one-shot's, whose id the caller chose.
	recoverLost bool
	// failed answers an admission the store refused, for another reason
	// than credits.
	failed func(ctx context.Context, err error) error
	// dispatch runs the admitted execution, with its ticket.
	dispatch func(e model.Execution, t *ticket)

	// inv is the outcome.
	inv *Invocation
}

func (r *runRecord) replay(ctx context.Context, _ *claim) (bool, error) {
	adm, err := r.g.st.ReplayExecution(ctx, r.ne)
	if err == nil {
		r.inv = &Invocation{Execution: adm.Execution, Approval: adm.Approval, Replayed: true}
		return true, nil
	}
	if !errdefs.IsNotFound(err) {
		return false, fmt.Errorf("looking up the idempotency key: %w", err)
	}
	return false, nil
}

func (r *runRecord) input(_ *claim, in Admit) Input { return in }

// write admits the execution; a run the rules approved is dispatched,
// one that waits for approval tells the watchers.
func (r *runRecord) write(ctx context.Context, c *claim, step Step, in Admit, t *ticket) error {
	s := r.g
	wctx, sp := telemetry.Start(ctx, telemetry.StoreWrite, telemetry.StoreOp("admit"))
	adm, err := s.st.Admit(wctx, r.ne, *step.Write)
	sp.End(&err)
	if err != nil && r.recoverLost && errdefs.IsUnavailable(err) && r.ne.ID != "" {
		adm, err = s.admittedAnyway(ctx, r.ne.WorkspaceID, r.ne.ID, err)
	}
	if err != nil {
		t.release()
		if errdefs.IsResourceExhausted(err) {
			return s.refuse(ctx, c, in, &Refusal{Code: "insufficient_credits",
				Reason: fmt.Sprintf("insufficient credits: %s costs %d", r.unit, s.price), Class: errdefs.ErrPaymentRequired})
		}
		return r.failed(ctx, err)
	}
	r.inv = &Invocation{Execution: adm.Execution, Approval: adm.Approval, Replayed: adm.Replayed}
	kept := !adm.Replayed && s.traces.Keep(ctx, adm.Execution.ID)
	switch {
	case adm.Replayed:
		t.release()
	case step.Next.Dispatch:
		r.dispatch(adm.Execution, t)
	default:
		s.runs.notify(step, adm.Execution)
		if kept && !adm.Execution.Status.Terminal() {
			// It waits for its approval: a decision that ended it
			// between Admit and Keep dropped its span before it was
			// kept. (One approved since is dropped when its run ends.)
			if cur, err := s.st.GetExecution(ctx, adm.Execution.WorkspaceID, adm.Execution.ID); err == nil && cur.Status.Terminal() {
				s.traces.Drop(cur.ID)
			}
		}
	}
	return nil
}

// decisionOutcome is the policy span's outcome: allowed, approval_required
// or denied.
func decisionOutcome(d policy.Decision) string {
	switch {
	case !d.Allowed:
		return "denied"
	case d.ApprovalRequired:
		return "approval_required"
	}
	return "allowed"
}
