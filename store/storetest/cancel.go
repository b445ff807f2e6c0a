package storetest

import (
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// cancelled is the audit trail of a cancel in the suite: one event naming
// the status the execution was cancelled in.
func cancelled(by string, from model.Execution) model.NewEvent {
	return model.NewEvent{Type: "execution.cancelled", Code: "EXE003I", Actor: by, Reason: "from " + string(from.Status)}
}

// testCancelPending cancels an execution awaiting approval: it ends
// cancelled, its approval request is closed, its reservation released,
// its rows written and its event appended, all at once; a second cancel,
// a decision and an expiry after it change nothing.
func testCancelPending(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "cancel-pending")
	mustGrant(t, st, f.ws.ID, 10)
	adm := awaiting(t, st, f, "print(1)", nowPlus(600))
	wantCredits(t, st, f.ws.ID, 8, 2)
	ex := mustApply(t, st, adm.Execution, cancel(adm.Execution, "no longer needed", cancelled(f.agent.ID, adm.Execution)))
	if ex.Status != model.StatusCancelled || ex.FinishedAt.IsZero() || string(ex.Result) != `{"error":"cancelled"}` {
		t.Fatalf("cancelled execution: got %+v", ex)
	}
	wantCredits(t, st, f.ws.ID, 10, 0)
	a := must[model.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, adm.Approval.ID))
	if a.Status != model.ApprovalCancelled || a.Reason != "no longer needed" || a.DecidedBy != "" {
		t.Fatalf("approval of a cancelled execution: got %+v", a)
	}
	tc := must[model.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, ex.ID))
	if tc.Status != model.StatusCancelled || tc.CreditsCharged != 0 || tc.FinishedAt.IsZero() {
		t.Fatalf("tool call of a cancelled execution: got %+v", tc)
	}
	inv := must[store.Page[model.ToolInvocation]](t, "ListToolInvocations")(st.ListToolInvocations(ctx, f.ws.ID, store.ToolCallFilter{}))
	if len(inv.Items) != 1 || inv.Items[0].Status != model.StatusCancelled || inv.Items[0].Credits != 0 {
		t.Fatalf("tool invocations after a cancel: got %+v", inv.Items)
	}
	ev := must[store.Page[model.Event]](t, "ListEvents")(st.ListEvents(ctx, f.ws.ID, store.EventFilter{ExecutionID: ex.ID}))
	if len(ev.Items) != 1 || ev.Items[0].Type != "execution.cancelled" || ev.Items[0].WorkspaceID != f.ws.ID ||
		ev.Items[0].Reason != "from awaiting_approval" {
		t.Fatalf("cancel events: got %+v", ev.Items)
	}
	if pending := must[store.Page[model.Approval]](t, "ListApprovals")(st.ListApprovals(ctx, f.ws.ID,
		store.ApprovalFilter{Statuses: []model.ApprovalStatus{model.ApprovalPending}})); len(pending.Items) != 0 {
		t.Fatalf("pending approvals after the cancel: got %+v", pending.Items)
	}

	_, err := st.Apply(ctx, ex.ID, cancel(adm.Execution, "again"))
	wantClass(t, "cancelling twice", err, errdefs.ErrConflict)
	_, err = st.Apply(ctx, ex.ID, decision(adm.Execution, true, f.approver.ID, ""))
	wantClass(t, "approving after the cancel", err, errdefs.ErrConflict)
	if due := expireDue(t, st, nowPlus(3600)); len(due) != 0 {
		t.Fatalf("an expiry pass after the cancel expired %+v", due)
	}
	if got := must[model.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, a.ID)); got.Status != model.ApprovalCancelled {
		t.Fatalf("approval after an expiry pass: got %s, want it still cancelled", got.Status)
	}
	wantCredits(t, st, f.ws.ID, 10, 0)
	if n := len(must[store.Page[model.Event]](t, "ListEvents")(st.ListEvents(ctx, f.ws.ID, store.EventFilter{})).Items); n != 1 {
		t.Fatalf("events after the refused changes: got %d, want the cancel's only", n)
	}
}

// testCancelQueued cancels queued executions (one approved first): an
// approved request stays approved, and what was cancelled can no longer
// start or end otherwise.
func testCancelQueued(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "cancel-queued")
	mustGrant(t, st, f.ws.ID, 10)
	queued := f.admit(t, st, "print(1)", 2)
	approved := awaiting(t, st, f, "print(2)", nowPlus(600))
	ready := mustApply(t, st, approved.Execution, decision(approved.Execution, true, f.approver.ID, ""))
	wantCredits(t, st, f.ws.ID, 6, 4)

	for _, ex := range []model.Execution{queued.Execution, ready} {
		got := mustApply(t, st, ex, cancel(ex, "", cancelled(f.agent.ID, ex)))
		if got.Status != model.StatusCancelled {
			t.Fatalf("cancelling a queued execution: got %+v", got)
		}
	}
	if a := must[model.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, approved.Approval.ID)); a.Status != model.ApprovalApproved {
		t.Fatalf("the decided approval of a cancelled execution: got %s, want it still approved", a.Status)
	}
	wantCredits(t, st, f.ws.ID, 10, 0)
	_, err := st.Apply(ctx, queued.Execution.ID, start("runc"))
	wantClass(t, "starting a cancelled execution", err, errdefs.ErrConflict)
	_, err = st.Apply(ctx, queued.Execution.ID, ending(queued.Execution, model.StatusLaunchFailed, false))
	wantClass(t, "ending a cancelled execution", err, errdefs.ErrConflict)
}
