package storetest

import (
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/store"
)

// cancelEvents is the audit argument of CancelExecution in the suite: one
// event naming the status the execution was cancelled in.
func cancelEvents(by string) func(store.Execution) []store.NewEvent {
	return func(from store.Execution) []store.NewEvent {
		return []store.NewEvent{{Type: "execution.cancelled", Code: "EXE003I", Actor: by, Reason: "from " + string(from.Status)}}
	}
}

// testCancelPending cancels an execution awaiting approval: it ends
// cancelled, its approval request is closed, its reservation released,
// its rows written and its event appended, all at once; a second cancel
// and a decision after it change nothing.
func testCancelPending(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "cancel-pending")
	mustGrant(t, st, f.ws.ID, 10)
	adm := awaiting(t, st, f, "print(1)", nowPlus(600))
	wantCredits(t, st, f.ws.ID, 8, 2)
	ex, err := st.CancelExecution(ctx, store.Cancellation{WorkspaceID: f.ws.ID, ExecutionID: adm.Execution.ID, By: f.agent.ID,
		Reason: "no longer needed", Result: []byte(`{"error":"cancelled"}`), Audit: cancelEvents(f.agent.ID)})
	if err != nil {
		t.Fatalf("CancelExecution: %v", err)
	}
	if ex.Status != store.StatusCancelled || ex.FinishedAt.IsZero() || string(ex.Result) != `{"error":"cancelled"}` {
		t.Fatalf("cancelled execution: got %+v", ex)
	}
	wantCredits(t, st, f.ws.ID, 10, 0)
	a := must[store.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, adm.Approval.ID))
	if a.Status != store.ApprovalCancelled || a.Reason != "no longer needed" || a.DecidedBy != "" {
		t.Fatalf("approval of a cancelled execution: got %+v", a)
	}
	tc := must[store.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, ex.ID))
	if tc.Status != store.StatusCancelled || tc.CreditsCharged != 0 || tc.FinishedAt.IsZero() {
		t.Fatalf("tool call of a cancelled execution: got %+v", tc)
	}
	inv := must[store.Page[store.ToolInvocation]](t, "ListToolInvocations")(st.ListToolInvocations(ctx, f.ws.ID, store.ToolCallFilter{}))
	if len(inv.Items) != 1 || inv.Items[0].Status != store.StatusCancelled || inv.Items[0].Credits != 0 {
		t.Fatalf("tool invocations after a cancel: got %+v", inv.Items)
	}
	ev := must[store.Page[store.Event]](t, "ListEvents")(st.ListEvents(ctx, f.ws.ID, store.EventFilter{ExecutionID: ex.ID}))
	if len(ev.Items) != 1 || ev.Items[0].Type != "execution.cancelled" || ev.Items[0].WorkspaceID != f.ws.ID ||
		ev.Items[0].Reason != "from awaiting_approval" {
		t.Fatalf("cancel events: got %+v", ev.Items)
	}
	if pending := must[store.Page[store.Approval]](t, "ListApprovals")(st.ListApprovals(ctx, f.ws.ID,
		store.ApprovalFilter{Statuses: []store.ApprovalStatus{store.ApprovalPending}})); len(pending.Items) != 0 {
		t.Fatalf("pending approvals after the cancel: got %+v", pending.Items)
	}

	_, err = st.CancelExecution(ctx, store.Cancellation{WorkspaceID: f.ws.ID, ExecutionID: ex.ID, By: f.agent.ID})
	wantClass(t, "cancelling twice", err, errdefs.ErrConflict)
	_, _, err = st.DecideApproval(ctx, store.Decision{WorkspaceID: f.ws.ID, ApprovalID: a.ID, Approve: true, DecidedBy: f.approver.ID})
	wantClass(t, "approving after the cancel", err, errdefs.ErrConflict)
	if _, err := st.ExpireApprovals(ctx, nowPlus(3600), nil); err != nil {
		t.Fatal(err)
	}
	if got := must[store.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, a.ID)); got.Status != store.ApprovalCancelled {
		t.Fatalf("approval after an expiry pass: got %s, want it still cancelled", got.Status)
	}
	wantCredits(t, st, f.ws.ID, 10, 0)
	if n := len(must[store.Page[store.Event]](t, "ListEvents")(st.ListEvents(ctx, f.ws.ID, store.EventFilter{})).Items); n != 1 {
		t.Fatalf("events after the refused changes: got %d, want the cancel's only", n)
	}
}

// testCancelQueued cancels queued executions (one approved first) and
// refuses to cancel running and ended ones: a running execution ends
// through FinishExecution, by the daemon that runs it.
func testCancelQueued(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "cancel-queued")
	mustGrant(t, st, f.ws.ID, 10)
	queued := mustCreate(t, st, f.newExec("print(1)", 2))
	approved := awaiting(t, st, f, "print(2)", nowPlus(600))
	if _, _, err := st.DecideApproval(ctx, store.Decision{WorkspaceID: f.ws.ID, ApprovalID: approved.Approval.ID, Approve: true,
		DecidedBy: f.approver.ID}); err != nil {
		t.Fatal(err)
	}
	running := mustCreate(t, st, f.newExec("print(3)", 2))
	must[store.Execution](t, "StartExecution")(st.StartExecution(ctx, running.Execution.ID, "runc"))
	wantCredits(t, st, f.ws.ID, 4, 6)

	for _, adm := range []store.Admission{queued, approved} {
		ex, err := st.CancelExecution(ctx, store.Cancellation{WorkspaceID: f.ws.ID, ExecutionID: adm.Execution.ID, By: f.agent.ID,
			Audit: cancelEvents(f.agent.ID)})
		if err != nil || ex.Status != store.StatusCancelled {
			t.Fatalf("cancelling a queued execution: got %+v, %v", ex, err)
		}
	}
	if a := must[store.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, approved.Approval.ID)); a.Status != store.ApprovalApproved {
		t.Fatalf("the decided approval of a cancelled execution: got %s, want it still approved", a.Status)
	}
	wantCredits(t, st, f.ws.ID, 8, 2)
	_, err := st.StartExecution(ctx, queued.Execution.ID, "runc")
	wantClass(t, "starting a cancelled execution", err, errdefs.ErrConflict)
	_, err = st.FinishExecution(ctx, store.Outcome{ExecutionID: queued.Execution.ID, Status: store.StatusLaunchFailed})
	wantClass(t, "finishing a cancelled execution", err, errdefs.ErrConflict)

	_, err = st.CancelExecution(ctx, store.Cancellation{WorkspaceID: f.ws.ID, ExecutionID: running.Execution.ID, By: f.agent.ID})
	wantClass(t, "cancelling a running execution", err, errdefs.ErrFailedPrecondition)
	must[store.Execution](t, "FinishExecution")(st.FinishExecution(ctx, store.Outcome{ExecutionID: running.Execution.ID, Status: store.StatusKilled}))
	wantCredits(t, st, f.ws.ID, 8, 0)
	_, err = st.CancelExecution(ctx, store.Cancellation{WorkspaceID: f.ws.ID, ExecutionID: running.Execution.ID, By: f.agent.ID})
	wantClass(t, "cancelling an ended execution", err, errdefs.ErrConflict)
}

// testCancelWho checks who may cancel: the key that invoked, or an admin
// key of the workspace; nobody else, and nobody of another workspace.
func testCancelWho(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "cancel-who")
	other := newFixture(t, st, "cancel-who-other")
	mustGrant(t, st, f.ws.ID, 10)
	second := must[store.APIKey](t, "CreateAPIKey")(st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: f.ws.ID,
		Role: store.RoleAgent, Hash: store.HashKey("second agent")}))
	revokedAdmin := must[store.APIKey](t, "CreateAPIKey")(st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: f.ws.ID,
		Role: store.RoleAdmin, Hash: store.HashKey("revoked admin")}))
	if err := st.RevokeAPIKey(ctx, f.ws.ID, revokedAdmin.ID, nil); err != nil {
		t.Fatal(err)
	}
	adm := awaiting(t, st, f, "print(1)", nowPlus(600))
	for _, tc := range []struct {
		name, ws, key string
		class         error
	}{
		{"another agent", f.ws.ID, second.ID, errdefs.ErrPermissionDenied},
		{"an approver", f.ws.ID, f.approver.ID, errdefs.ErrPermissionDenied},
		{"a revoked admin", f.ws.ID, revokedAdmin.ID, errdefs.ErrPermissionDenied},
		{"another workspace's admin", f.ws.ID, other.adm.ID, errdefs.ErrPermissionDenied},
		{"an unknown key", f.ws.ID, "key_nope", errdefs.ErrPermissionDenied},
		{"from another workspace", other.ws.ID, other.adm.ID, errdefs.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := st.CancelExecution(ctx, store.Cancellation{WorkspaceID: tc.ws, ExecutionID: adm.Execution.ID, By: tc.key})
			wantClass(t, "CancelExecution", err, tc.class)
		})
	}
	if ex := must[store.Execution](t, "GetExecution")(st.GetExecution(ctx, f.ws.ID, adm.Execution.ID)); ex.Status != store.StatusAwaitingApproval {
		t.Fatalf("a refused canceller changed the execution to %s", ex.Status)
	}
	wantCredits(t, st, f.ws.ID, 8, 2)
	if ex, err := st.CancelExecution(ctx, store.Cancellation{WorkspaceID: f.ws.ID, ExecutionID: adm.Execution.ID, By: f.adm.ID}); err != nil || ex.Status != store.StatusCancelled {
		t.Fatalf("an admin's cancel: got %+v, %v", ex, err)
	}
	wantCredits(t, st, f.ws.ID, 10, 0)
}

// Upgrade checks a database made by an older schema against the current
// one: old opens a store at the schema before version 2 (executions and
// approvals that can be cancelled), current opens the same database with
// every migration. What the old schema held survives, the new statuses
// work on it, and foreign keys are still enforced.
func Upgrade(t *testing.T, old, current func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := old(t)
	f := newFixture(t, st, "upgrade")
	mustGrant(t, st, f.ws.ID, 10)
	pending := awaiting(t, st, f, "print(1)", nowPlus(600))
	done := mustCreate(t, st, f.newExec("print(2)", 2))
	must[store.Execution](t, "StartExecution")(st.StartExecution(ctx, done.Execution.ID, "runc"))
	must[store.Execution](t, "FinishExecution")(st.FinishExecution(ctx, store.Outcome{ExecutionID: done.Execution.ID,
		Status: store.StatusSucceeded, ExitCode: ptr(0), Stdout: []byte("2\n")}))
	must[store.Event](t, "AppendEvent")(st.AppendEvent(ctx, store.NewEvent{WorkspaceID: f.ws.ID, Type: "test.before_upgrade"}))
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st = current(t)
	wantCredits(t, st, f.ws.ID, 6, 2)
	if ex := must[store.Execution](t, "GetExecution")(st.GetExecution(ctx, f.ws.ID, done.Execution.ID)); ex.Status != store.StatusSucceeded ||
		ex.Driver != "runc" || ex.StartedAt.IsZero() {
		t.Fatalf("a finished execution after the upgrade: got %+v", ex)
	}
	if tc := must[store.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, done.Execution.ID)); string(tc.StdoutPreview) != "2\n" || tc.CreditsCharged != 2 {
		t.Fatalf("its tool call after the upgrade: got %+v", tc)
	}
	if ok, broken, err := st.VerifyChain(ctx, f.ws.ID); !ok || err != nil {
		t.Fatalf("the chain after the upgrade: ok %v, broken %+v, err %v", ok, broken, err)
	}
	ex, err := st.CancelExecution(ctx, store.Cancellation{WorkspaceID: f.ws.ID, ExecutionID: pending.Execution.ID, By: f.agent.ID})
	if err != nil || ex.Status != store.StatusCancelled {
		t.Fatalf("cancelling an execution of the old schema: got %+v, %v", ex, err)
	}
	if a := must[store.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, pending.Approval.ID)); a.Status != store.ApprovalCancelled {
		t.Fatalf("its approval: got %s, want cancelled", a.Status)
	}
	wantCredits(t, st, f.ws.ID, 8, 0)
	err = tamperer(t, st).UnsafeExec(ctx, `INSERT INTO tool_calls (id, execution_id, workspace_id, tool, runtime, input_sha256,
		status, stdout_preview, stderr_preview, stdout_truncated, stderr_truncated, credits_charged, created_at)
		SELECT 'tc_orphan', 'ex_missing', workspace_id, tool, runtime, input_sha256, status, stdout_preview, stderr_preview,
		stdout_truncated, stderr_truncated, credits_charged, created_at FROM tool_calls LIMIT 1`)
	if err == nil {
		t.Fatal("a tool_calls row of a missing execution was accepted: foreign keys are off after the upgrade")
	}
}
