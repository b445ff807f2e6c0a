package capability

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/stockade-sh/stockade/contract"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
	"github.com/stockade-sh/stockade/wire"
)

// approvals decides the approval requests, expires those whose time is
// up and counts those pending.
type approvals struct {
	*core
	st    approvalStore
	runs  *runs
	cells *cells
}

// approvalStore is what approvals needs of the store.
type approvalStore interface {
	runStore
	GetApproval(ctx context.Context, workspaceID, approvalID string) (model.Approval, error)
	ListApprovals(ctx context.Context, workspaceID string, f store.ApprovalFilter) (store.Page[model.Approval], error)
	ListDueApprovals(ctx context.Context, now time.Time) ([]model.Approval, error)
	GetPolicy(ctx context.Context, workspaceID string) (model.Policy, error)
	GetSession(ctx context.Context, workspaceID, id string) (model.Session, error)
	ListWorkspaces(ctx context.Context) ([]model.Workspace, error)
}

// ApprovalCard is an approval request's card as the store keeps it: the
// wire's card (what an approver is shown), read also in its older form.
type ApprovalCard struct{ wire.ApprovalCard }

// UnmarshalJSON reads a card, also one stored before the card named
// network with the request's words ("network_requested": true).
func (c *ApprovalCard) UnmarshalJSON(b []byte) error {
	var v struct {
		wire.ApprovalCard
		NetworkRequested *bool `json:"network_requested"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	c.ApprovalCard = v.ApprovalCard
	if c.Network == "" && v.NetworkRequested != nil {
		c.Network = policy.NetworkWord(*v.NetworkRequested)
	}
	return nil
}

// CardOf is the card of approval a as the API shows it: the stored card,
// with the approval's and its execution's ids.
func CardOf(a model.Approval) (wire.ApprovalCard, error) {
	var c ApprovalCard
	if err := json.Unmarshal(a.Card, &c); err != nil {
		return wire.ApprovalCard{}, fmt.Errorf("reading the card of approval %s: %w", a.ID, err)
	}
	c.ApprovalID, c.ExecutionID = a.ID, a.ExecutionID
	return c.ApprovalCard, nil
}

// Decide records an approver's decision. Approving queues the execution to
// run; denying ends it, uncharged. Agent keys get ErrPermissionDenied.
func (s *approvals) Decide(ctx context.Context, p Principal, approvalID string, approve bool, reason string) (model.Approval, model.Execution, error) {
	// An agent key is refused before anything is read.
	if err := mayDecide(p); err != nil {
		return model.Approval{}, model.Execution{}, err
	}
	a, err := s.st.GetApproval(ctx, p.WorkspaceID, approvalID)
	if err != nil {
		return a, model.Execution{}, err
	}
	var in Input = Deny{By: p, Reason: reason, At: s.opts.Now()}
	var card ApprovalCard // what is approved: read before the decision is made
	if approve {
		var stale string
		if card, stale, err = s.stillAllowed(ctx, p, a); err != nil {
			return model.Approval{}, model.Execution{}, err
		}
		in = Approve{By: p, Reason: reason, Stale: stale, At: s.opts.Now()}
	}
	e, err := s.st.GetExecution(ctx, p.WorkspaceID, a.ExecutionID)
	if err != nil {
		return a, e, err
	}
	g := GrantOf(e, &a)
	if e.SessionID != "" {
		// A cell: its session's mode says whether approving it covers the
		// session's later cells.
		ss, err := s.st.GetSession(ctx, p.WorkspaceID, e.SessionID)
		if err != nil {
			return a, e, err
		}
		g = GrantOfCell(e, &a, ss)
	}
	step, err := Transition(g, in)
	if err != nil {
		return model.Approval{}, model.Execution{}, err
	}
	if e, err = apply(ctx, s.st, e.ID, step); err != nil {
		return model.Approval{}, model.Execution{}, err
	}
	s.waited(e, a, approve, s.opts.Now())
	if a, err = s.st.GetApproval(ctx, p.WorkspaceID, approvalID); err != nil {
		return a, e, err
	}
	s.runs.notify(step, e)
	if step.Next.Dispatch {
		s.cells.dispatchApproved(ctx, e, time.Duration(card.TimeoutMS)*time.Millisecond)
	}
	return a, e, nil
}

// stillAllowed returns approval a's card and, when it can no longer be
// approved, why: the workspace's policy no longer allows the request (it
// changed while the request waited), or the tool's record changed since
// the card was made, so that the approver would approve what no longer
// runs. Denying such a request stays possible.
func (s *approvals) stillAllowed(ctx context.Context, p Principal, a model.Approval) (ApprovalCard, string, error) {
	var card ApprovalCard
	if err := json.Unmarshal(a.Card, &card); err != nil {
		return card, "", fmt.Errorf("reading approval card: %w", err)
	}
	pol, err := s.st.GetPolicy(ctx, p.WorkspaceID)
	if err != nil {
		return card, "", fmt.Errorf("loading workspace policy: %w", err)
	}
	d := policy.Decide(pol, policy.Request{Capability: contract.CodeExecute, Runtime: card.Runtime,
		Timeout: time.Duration(card.TimeoutMS) * time.Millisecond, Network: card.Network == policy.NetworkAllow}, s.runner.Ceiling().Timeout)
	if !d.Allowed {
		return card, fmt.Sprintf("the workspace policy no longer allows this request (%s); deny it", d.Reason), nil
	}
	if card.ToolFingerprint == "" {
		return card, "", nil // a card from before fingerprints: nothing to compare
	}
	t, err := s.runner.Tools().Get(card.Tool)
	if err != nil || tools.Fingerprint(t) != card.ToolFingerprint {
		return card, fmt.Sprintf("tool %q changed since this request was made; deny it and invoke again", card.Tool), nil
	}
	return card, "", nil
}

// expireApprovals ends the approvals whose time is up, each with its
// approval.expired event in the transaction that expires it, so that no
// crash can leave an expiry unaudited.
func (s *approvals) expireApprovals(ctx context.Context) {
	now := s.opts.Now()
	due, err := s.st.ListDueApprovals(ctx, now)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("expiring approvals", "err", err)
		}
		return
	}
	for _, a := range due {
		err := s.expire(ctx, a, now)
		if err != nil && ctx.Err() == nil {
			s.log.Error("expiring approvals", "approval", a.ID, "err", err)
		}
		if err != nil {
			return
		}
	}
}

// expire ends the execution of approval a, due at now. One that was
// decided or cancelled since it was listed is left alone.
func (s *approvals) expire(ctx context.Context, a model.Approval, now time.Time) error {
	e, err := s.st.GetExecution(ctx, a.WorkspaceID, a.ExecutionID)
	if err != nil {
		return err
	}
	step, err := Transition(GrantOf(e, &a), Expire{At: now})
	if errdefs.IsConflict(err) {
		return nil
	}
	if err != nil {
		return err
	}
	ex, err := apply(ctx, s.st, e.ID, step)
	if errdefs.IsConflict(err) {
		return nil
	}
	if err != nil {
		return err
	}
	s.waited(ex, a, false, now)
	s.runs.notify(step, ex)
	return nil
}

// waited records approval a's wait, from its request to its decision at
// at, in its execution's trace: approved, denied, or expired when no one
// decided (at is then its expiry). e is a's execution, whose tier labels
// the wait's duration.
func (s *approvals) waited(e model.Execution, a model.Approval, approved bool, at time.Time) {
	outcome := "denied"
	switch {
	case approved:
		outcome = "approved"
	case !at.Before(a.ExpiresAt):
		outcome = "expired"
	}
	telemetry.Record(s.withTier(s.traces.Context(s.ctx, a.ExecutionID), e), telemetry.ApprovalWait, a.RequestedAt, at.Sub(a.RequestedAt), outcome)
}

func (s *approvals) countPending(ctx context.Context) error {
	wss, err := s.st.ListWorkspaces(ctx)
	if err != nil {
		return fmt.Errorf("listing workspaces: %w", err)
	}
	n := 0
	for _, ws := range wss {
		req := store.PageRequest{Limit: store.MaxPageLimit}
		for {
			page, err := s.st.ListApprovals(ctx, ws.ID, store.ApprovalFilter{PageRequest: req, Statuses: []model.ApprovalStatus{model.ApprovalPending}})
			if err != nil {
				return fmt.Errorf("counting pending approvals: %w", err)
			}
			n += len(page.Items)
			if page.Next == "" {
				break
			}
			req.Cursor = page.Next
		}
	}
	s.opts.Observer.ApprovalsPending(n)
	return nil
}
