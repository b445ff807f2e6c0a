package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
)

// How much the pages show at once.
const (
	pendingShown  = 100
	decidedShown  = 10
	pageSize      = 25
	ledgerShown   = 20
	eventsShown   = 50
	toolChangesIn = 4 // pages of tool.changed events searched for a tool's diff
)

// approvalsData is the approvals page: what waits, and what was decided
// last.
type approvalsData struct {
	Pending, Decided []*cardView
	// More says more requests wait than the page shows.
	More bool
}

func (c *Console) approvals(ctx context.Context, v *visit, statuses []model.ApprovalStatus, n int) ([]*cardView, bool, error) {
	pg, err := c.st.ListApprovals(ctx, v.key.WorkspaceID, store.ApprovalFilter{PageRequest: store.PageRequest{Limit: n}, Statuses: statuses})
	if err != nil {
		return nil, false, fmt.Errorf("listing approvals: %w", err)
	}
	out := []*cardView{}
	for _, a := range pg.Items {
		cv, err := c.cardView(ctx, v, a)
		if err != nil {
			return nil, false, err
		}
		out = append(out, cv)
	}
	return out, pg.Next != "", nil
}

func (c *Console) approvalsData(ctx context.Context, v *visit) (*approvalsData, error) {
	var d approvalsData
	var err error
	if d.Pending, d.More, err = c.approvals(ctx, v, []model.ApprovalStatus{model.ApprovalPending}, pendingShown); err != nil {
		return nil, err
	}
	// Oldest first: the request that expires first leads.
	slices.Reverse(d.Pending)
	d.Decided, _, err = c.approvals(ctx, v, []model.ApprovalStatus{model.ApprovalApproved, model.ApprovalDenied, model.ApprovalExpired}, decidedShown)
	return &d, err
}

func (c *Console) approvalsPage(w http.ResponseWriter, r *http.Request, v *visit) {
	d, err := c.approvalsData(r.Context(), v)
	if err != nil {
		c.failure(w, r, "rendering the approvals page", err)
		return
	}
	c.render(w, http.StatusOK, "approvals.html", &page{Title: "Approvals", Section: "approvals", Data: d, live: true, v: v, c: c})
}

func (c *Console) pendingFragment(w http.ResponseWriter, r *http.Request, v *visit) {
	d, err := c.approvalsData(r.Context(), v)
	if err != nil {
		c.failure(w, r, "rendering pending approvals", err)
		return
	}
	c.render(w, http.StatusOK, "approval-lists", d)
}

func (c *Console) card(ctx context.Context, v *visit, id string) (*cardView, error) {
	a, err := c.st.GetApproval(ctx, v.key.WorkspaceID, id)
	if err != nil {
		return nil, notFoundIsGone(err, "approval request")
	}
	return c.cardView(ctx, v, a)
}

func (c *Console) approvalPage(w http.ResponseWriter, r *http.Request, v *visit) {
	cv, err := c.card(r.Context(), v, r.PathValue("id"))
	if err != nil {
		c.failure(w, r, "rendering an approval", err)
		return
	}
	c.render(w, http.StatusOK, "approval.html", &page{Title: "Approval " + cv.ID, Section: "approvals", Data: cv, v: v, c: c})
}

func (c *Console) cardFragment(w http.ResponseWriter, r *http.Request, v *visit) {
	cv, err := c.card(r.Context(), v, r.PathValue("id"))
	if err != nil {
		c.failure(w, r, "rendering an approval card", err)
		return
	}
	c.render(w, http.StatusOK, "card", cv)
}

// decide approves or denies through the service, which applies every
// rule (the key's role, not the requester's own key, the policy now, the
// tool's record unchanged); the card then shows the outcome, or why the
// decision was refused.
func (c *Console) decide(approve bool) func(http.ResponseWriter, *http.Request, *visit) {
	return func(w http.ResponseWriter, r *http.Request, v *visit) {
		ctx := r.Context()
		id := r.PathValue("id")
		_, _, derr := c.svc.Decide(ctx, v.sess.p, id, approve, strings.TrimSpace(r.PostForm.Get("reason")))
		code, flash := http.StatusOK, ""
		if derr != nil {
			code, flash = c.describe(r, "deciding approval "+id, derr)
		}
		if !wantsFragment(r) {
			if derr != nil {
				c.errorPage(w, r, code, flash)
				return
			}
			http.Redirect(w, r, "/ui/approvals#card-"+url.PathEscape(id), http.StatusSeeOther)
			return
		}
		cv, err := c.card(ctx, v, id)
		if err != nil {
			c.failure(w, r, "rendering an approval card", err)
			return
		}
		cv.Flash = flash
		c.render(w, code, "card", cv)
	}
}

// executionsData is one page of the executions list.
type executionsData struct {
	Items  []*execView
	Status string
	// Next is the cursor of the following page, empty on the last;
	// Paged says this is not the first page.
	Next  string
	Paged bool
}

func (c *Console) executionsData(r *http.Request, v *visit) (*executionsData, error) {
	q := r.URL.Query()
	d := &executionsData{Status: q.Get("status"), Paged: q.Get("cursor") != ""}
	f := store.ToolCallFilter{PageRequest: store.PageRequest{Limit: pageSize, Cursor: q.Get("cursor")}}
	if d.Status != "" {
		if !model.ExecutionStatus(d.Status).Valid() {
			return nil, errdefs.Publicf("unknown status %q: %w", d.Status, errdefs.ErrInvalidArgument)
		}
		f.Statuses = []model.ExecutionStatus{model.ExecutionStatus(d.Status)}
	}
	pg, err := c.st.ListToolCalls(r.Context(), v.key.WorkspaceID, f)
	if err != nil {
		return nil, fmt.Errorf("listing executions: %w", err)
	}
	for _, tc := range pg.Items {
		d.Items = append(d.Items, execViewOf(tc))
	}
	d.Next = pg.Next
	return d, nil
}

func (c *Console) executionsPage(w http.ResponseWriter, r *http.Request, v *visit) {
	d, err := c.executionsData(r, v)
	if err != nil {
		c.failure(w, r, "rendering the executions page", err)
		return
	}
	c.render(w, http.StatusOK, "executions.html", &page{Title: "Executions", Section: "executions", Data: d, live: !d.Paged, v: v, c: c})
}

func (c *Console) executionsFragment(w http.ResponseWriter, r *http.Request, v *visit) {
	d, err := c.executionsData(r, v)
	if err != nil {
		c.failure(w, r, "rendering executions", err)
		return
	}
	c.render(w, http.StatusOK, "execution-rows", d)
}

// executionData is one execution's page: what ran, its whole result and
// its trail.
type executionData struct {
	Exec    *execView
	Request capability.InvokeRequest
	Code    Code
	Stdin   *Code
	Result  *resultView
	Card    *cardView
	Trail   []eventView
}

// eventView is an audit event as the pages list it.
type eventView struct {
	model.Event
	ActorLabel string
}

func (c *Console) eventView(ctx context.Context, v *visit, e model.Event) eventView {
	return eventView{Event: e, ActorLabel: c.keyLabel(ctx, v, e.Actor)}
}

func (c *Console) executionPage(w http.ResponseWriter, r *http.Request, v *visit) {
	ctx := r.Context()
	st := c.st
	e, err := st.GetExecution(ctx, v.key.WorkspaceID, r.PathValue("id"))
	if err != nil {
		c.failure(w, r, "rendering an execution", notFoundIsGone(err, "execution"))
		return
	}
	d := &executionData{}
	if d.Exec, err = c.execView(ctx, v, e.ID); err == nil {
		d.Result, err = resultOf(e.Result)
	}
	if err == nil {
		err = json.Unmarshal(e.Request, &d.Request)
	}
	if err == nil && e.ApprovalID != "" {
		d.Card, err = c.card(ctx, v, e.ApprovalID)
	}
	if err != nil {
		c.failure(w, r, "rendering an execution", err)
		return
	}
	d.Code = Highlight(d.Request.Runtime, d.Request.Code)
	if d.Request.Stdin != "" {
		s := Highlight("", d.Request.Stdin)
		d.Stdin = &s
	}
	// The trail is short: an execution has a handful of events, and a
	// sandbox's refusals past 100 are counted in one.
	f := store.EventFilter{ExecutionID: e.ID, PageRequest: store.PageRequest{Limit: store.MaxPageLimit}}
	pg, err := c.chains.ListEvents(ctx, v.key.WorkspaceID, f)
	if err != nil {
		c.failure(w, r, "rendering an execution", err)
		return
	}
	for _, ev := range slices.Backward(pg.Items) {
		d.Trail = append(d.Trail, c.eventView(ctx, v, ev))
	}
	c.render(w, http.StatusOK, "execution.html", &page{Title: "Execution " + e.ID, Section: "executions", Data: d, v: v, c: c})
}

// workspaceData is the workspace page.
type workspaceData struct {
	Workspace model.Workspace
	Credits   model.Credits
	Ledger    []model.LedgerEntry
	Policy    model.Policy
	Tools     []toolView
	CSRF      string
	Flash     string
}

// toolView is a tool with its record and, when a change waits for this
// workspace's review, the changes since.
type toolView struct {
	Name           string
	Fingerprint    string
	Record         []recordLine
	Boundary       string
	ReviewRequired bool
	Changes        []toolChange
}

// toolChange is one tool.changed event of a tool.
type toolChange struct {
	Event  model.Event
	Diff   []string
	Growth []string
}

// toolChanges returns the changes of the tool name that wait for review:
// the tool.changed events (in the chain of the daemon's own events) since
// the last one that needed none, newest first.
func (c *Console) toolChanges(ctx context.Context, name string) ([]toolChange, error) {
	var out []toolChange
	f := store.EventFilter{Types: []string{audit.ToolChanged}, PageRequest: store.PageRequest{Limit: store.MaxPageLimit}}
	for range toolChangesIn {
		pg, err := c.chains.ListEvents(ctx, "", f)
		if err != nil {
			return nil, fmt.Errorf("reading tool changes: %w", err)
		}
		for _, e := range pg.Items {
			var te struct {
				Tool           string   `json:"tool"`
				Diff           []string `json:"diff"`
				Growth         []string `json:"growth"`
				ReviewRequired bool     `json:"review_required"`
			}
			if json.Unmarshal(e.Data, &te) != nil || te.Tool != name {
				continue
			}
			if !te.ReviewRequired {
				return out, nil
			}
			out = append(out, toolChange{Event: e, Diff: te.Diff, Growth: te.Growth})
		}
		if pg.Next == "" {
			break
		}
		f.Cursor = pg.Next
	}
	return out, nil
}

func (c *Console) workspaceData(ctx context.Context, v *visit) (*workspaceData, error) {
	st := c.st
	ws := v.key.WorkspaceID
	d := &workspaceData{CSRF: v.sess.csrf}
	var err error
	if d.Workspace, err = st.GetWorkspace(ctx, ws); err != nil {
		return nil, err
	}
	if d.Credits, err = st.GetCredits(ctx, ws); err != nil {
		return nil, err
	}
	ledger, err := st.ListLedger(ctx, ws, store.PageRequest{Limit: ledgerShown})
	if err != nil {
		return nil, err
	}
	d.Ledger = ledger.Items
	if d.Policy, err = st.GetPolicy(ctx, ws); err != nil {
		return nil, err
	}
	ts, err := c.svc.Tools(ctx, v.sess.p)
	if err != nil {
		return nil, err
	}
	opts := c.toolOptions()
	for _, t := range ts {
		tv := toolView{Name: t.Tool.Name, Fingerprint: t.Fingerprint, Record: recordLines(t.Tool, opts), Boundary: tools.Boundary(t.Tool, opts), ReviewRequired: t.ReviewRequired}
		if t.ReviewRequired {
			if tv.Changes, err = c.toolChanges(ctx, t.Tool.Name); err != nil {
				return nil, err
			}
		}
		d.Tools = append(d.Tools, tv)
	}
	return d, nil
}

func (c *Console) workspacePage(w http.ResponseWriter, r *http.Request, v *visit) {
	d, err := c.workspaceData(r.Context(), v)
	if err != nil {
		c.failure(w, r, "rendering the workspace page", err)
		return
	}
	c.render(w, http.StatusOK, "workspace.html", &page{Title: "Workspace", Section: "workspace", Data: d, v: v, c: c})
}

// approveTool re-approves a changed tool for the workspace, through the
// service.
func (c *Console) approveTool(w http.ResponseWriter, r *http.Request, v *visit) {
	name := r.PathValue("name")
	if _, err := c.svc.ApproveTool(r.Context(), v.sess.p, name, strings.TrimSpace(r.PostForm.Get("reason"))); err != nil {
		c.failure(w, r, "approving a tool", err)
		return
	}
	http.Redirect(w, r, "/ui/workspace#tool-"+url.PathEscape(name), http.StatusSeeOther)
}

// auditData is the audit page: the chain's verdict and its latest events.
type auditData struct {
	Verdict chainVerdict
	Events  []eventView
	// Next is the cursor of the following page of events.
	Next  string
	Paged bool
}

// chainVerdict is what verifying a workspace's audit chain found.
type chainVerdict struct {
	OK     bool
	Broken *model.BrokenLink
	Head   model.ChainHead
	// Witnessed is the head the witness directory holds, if any.
	Witnessed *model.ChainHead
	// Warnings say what the verdict cannot show.
	Warnings []string
}

// verify checks the workspace's chain against its witnessed head, as
// `stockade audit verify` does.
func (c *Console) verify(ctx context.Context, ws string) (chainVerdict, error) {
	var v chainVerdict
	w, witnessed, err := c.opts.Witness.Read(ws)
	if err != nil {
		return v, err
	}
	var heads []model.ChainHead
	switch {
	case c.opts.Witness == "":
		v.Warnings = append(v.Warnings, "The daemon has no audit witness (audit_witness in its configuration): the chain is checked alone, which cannot show its last events removed.")
	case !witnessed:
		v.Warnings = append(v.Warnings, "The audit witness holds no head of this chain yet (the daemon writes one every 10 s): the chain is checked alone.")
	default:
		heads = append(heads, w)
		v.Witnessed = &w
	}
	if v.OK, v.Broken, err = c.chains.VerifyChain(ctx, ws, heads...); err != nil {
		return v, fmt.Errorf("verifying the audit chain: %w", err)
	}
	if v.Head, err = c.chains.ChainHead(ctx, ws); err != nil {
		return v, fmt.Errorf("reading the audit chain's head: %w", err)
	}
	return v, nil
}

func (c *Console) auditPage(w http.ResponseWriter, r *http.Request, v *visit) {
	ctx := r.Context()
	cursor := r.URL.Query().Get("cursor")
	d := &auditData{Paged: cursor != ""}
	var err error
	if d.Verdict, err = c.verify(ctx, v.key.WorkspaceID); err != nil {
		c.failure(w, r, "verifying the audit chain", err)
		return
	}
	pg, err := c.chains.ListEvents(ctx, v.key.WorkspaceID, store.EventFilter{PageRequest: store.PageRequest{Limit: eventsShown, Cursor: cursor}})
	if err != nil {
		c.failure(w, r, "listing audit events", err)
		return
	}
	for _, e := range pg.Items {
		d.Events = append(d.Events, c.eventView(ctx, v, e))
	}
	d.Next = pg.Next
	c.render(w, http.StatusOK, "audit.html", &page{Title: "Audit", Section: "audit", Data: d, v: v, c: c})
}
