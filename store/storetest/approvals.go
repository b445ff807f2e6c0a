package storetest

import (
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// awaiting admits an execution that waits for approval, reserving 2 credits.
func awaiting(t *testing.T, st store.Store, f fixture, code string, expires time.Time) store.Admission {
	t.Helper()
	adm := mustAdmit(t, st, f.newExec(code), waiting(2, `{"code":"`+code+`","risk":"high"}`, expires))
	if adm.Approval == nil || adm.Execution.Status != model.StatusAwaitingApproval || adm.Execution.ApprovalID != adm.Approval.ID {
		t.Fatalf("admission with approval: got %+v", adm)
	}
	return adm
}

func testApprovalApprove(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "approve")
	mustGrant(t, st, f.ws.ID, 10)
	exp := nowPlus(600)
	adm := awaiting(t, st, f, "print(1)", exp)
	a := must[model.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, adm.Approval.ID))
	if a.Status != model.ApprovalPending || a.ExecutionID != adm.Execution.ID || string(a.Card) != `{"code":"print(1)","risk":"high"}` ||
		!a.ExpiresAt.Equal(store.TruncateTime(exp)) || a.RequestedAt.IsZero() || a.DecidedBy != "" || !a.DecidedAt.IsZero() {
		t.Fatalf("pending approval: got %+v", a)
	}
	tc := must[model.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, adm.Execution.ID))
	if tc.Status != model.StatusAwaitingApproval {
		t.Fatalf("tool call while awaiting approval: got %s", tc.Status)
	}

	step := decision(adm.Execution, true, f.approver.ID, "looks fine", model.NewEvent{Type: "approval.approved", Actor: f.approver.ID})
	step.At = store.TruncateTime(time.Now())
	ex := mustApply(t, st, adm.Execution, step)
	if ex.Status != model.StatusQueued {
		t.Fatalf("execution after approval: got %s, want queued", ex.Status)
	}
	if got := must[model.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, a.ID)); got.Status != model.ApprovalApproved ||
		got.DecidedBy != f.approver.ID || !got.DecidedAt.Equal(step.At) || got.Reason != "looks fine" {
		t.Fatalf("stored decision: got %+v, want approved by %s at %v", got, f.approver.ID, step.At)
	}
	if tc := must[model.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, ex.ID)); tc.Status != model.StatusQueued {
		t.Fatalf("tool call after approval: got %s, want queued", tc.Status)
	}
	ev := must[store.Page[model.Event]](t, "ListEvents")(st.ListEvents(ctx, f.ws.ID, store.EventFilter{ExecutionID: adm.Execution.ID}))
	if len(ev.Items) != 1 || ev.Items[0].Type != "approval.approved" {
		t.Fatalf("decision events: got %+v", ev.Items)
	}
	wantCredits(t, st, f.ws.ID, 8, 2)

	run(t, st, ex, "runc", model.StatusSucceeded, true)
	wantCredits(t, st, f.ws.ID, 8, 0)

	// The request is closed: deciding it again is refused, whatever the
	// step says the execution is.
	_, err := st.Apply(ctx, ex.ID, decision(adm.Execution, false, f.adm.ID, ""))
	wantClass(t, "deciding twice", err, errdefs.ErrConflict)
	_, err = st.Apply(ctx, "ex_nope", decision(adm.Execution, true, f.adm.ID, ""))
	wantClass(t, "deciding the request of an unknown execution", err, errdefs.ErrNotFound)
}

func testApprovalDeny(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "deny")
	mustGrant(t, st, f.ws.ID, 10)
	adm := awaiting(t, st, f, "rm -rf /", nowPlus(600))
	wantCredits(t, st, f.ws.ID, 8, 2)
	ex := mustApply(t, st, adm.Execution, decision(adm.Execution, false, f.adm.ID, "no"))
	dec := must[model.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, adm.Approval.ID))
	if dec.Status != model.ApprovalDenied || dec.DecidedBy != f.adm.ID || dec.Reason != "no" || ex.Status != model.StatusDenied || ex.FinishedAt.IsZero() {
		t.Fatalf("denial: got approval %+v, execution %s", dec, ex.Status)
	}
	wantCredits(t, st, f.ws.ID, 10, 0)
	tc := must[model.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, ex.ID))
	if tc.Status != model.StatusDenied || tc.CreditsCharged != 0 {
		t.Fatalf("tool call of a denied execution: got %s, %d credits", tc.Status, tc.CreditsCharged)
	}
	inv := must[store.Page[model.ToolInvocation]](t, "ListToolInvocations")(st.ListToolInvocations(ctx, f.ws.ID, store.ToolCallFilter{}))
	if len(inv.Items) != 1 || inv.Items[0].Status != model.StatusDenied {
		t.Fatalf("tool invocations after a denial: got %+v", inv.Items)
	}
	_, err := st.Apply(ctx, ex.ID, decision(adm.Execution, true, f.adm.ID, ""))
	wantClass(t, "approving a denied request", err, errdefs.ErrConflict)
}

// testApprovalDecider records the decider of a request as the key it is:
// a key the database does not hold is refused. Which keys may decide is
// the capability layer's rule; that the decider is a key is the store's
// integrity.
func testApprovalDecider(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "deciders")
	other := newFixture(t, st, "deciders-other")
	mustGrant(t, st, f.ws.ID, 10)
	adm := awaiting(t, st, f, "print(2)", nowPlus(600))
	_, err := st.Apply(ctx, adm.Execution.ID, decision(adm.Execution, true, "key_nope", ""))
	if err == nil {
		t.Fatal("a decision by a key the database does not hold was recorded")
	}
	if a := must[model.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, adm.Approval.ID)); a.Status != model.ApprovalPending {
		t.Fatalf("a refused decision changed the approval to %s", a.Status)
	}
	_, err = st.GetApproval(ctx, other.ws.ID, adm.Approval.ID)
	wantClass(t, "GetApproval from another workspace", err, errdefs.ErrNotFound)
	wantCredits(t, st, f.ws.ID, 8, 2)
}

// expiredEvents is the audit trail of one expiry in the suite: one event
// naming the request.
func expiredEvents(a model.Approval) []model.NewEvent {
	return []model.NewEvent{{Type: "approval.expired", Code: "APR004W", Actor: "system",
		Reason: "no decision before the approval expired", Data: []byte(`{"approval_id":"` + a.ID + `"}`)}}
}

// expireDue expires every request due at now, as the capability layer's
// expiry loop does, and returns those it expired.
func expireDue(t *testing.T, st store.Store, now time.Time) []model.Approval {
	t.Helper()
	ctx := t.Context()
	due := must[[]model.Approval](t, "ListDueApprovals")(st.ListDueApprovals(ctx, now))
	var expired []model.Approval
	for _, a := range due {
		ex := must[model.Execution](t, "GetExecution")(st.GetExecution(ctx, a.WorkspaceID, a.ExecutionID))
		if ex.Status != model.StatusAwaitingApproval {
			continue
		}
		_, err := st.Apply(ctx, ex.ID, expiry(ex, expiredEvents(a)...))
		if errdefs.IsConflict(err) {
			continue // decided, cancelled or expired meanwhile
		}
		if err != nil {
			t.Fatalf("expiring approval %s: %v", a.ID, err)
		}
		expired = append(expired, a)
	}
	return expired
}

func testApprovalExpiry(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "expiry")
	other := newFixture(t, st, "expiry-other")
	mustGrant(t, st, f.ws.ID, 10)
	mustGrant(t, st, other.ws.ID, 10)
	lapsed := awaiting(t, st, f, "late", time.Now().Add(-time.Second))
	fresh := awaiting(t, st, f, "fresh", nowPlus(3600))
	elsewhere := awaiting(t, st, other, "elsewhere", time.Now().Add(-2*time.Second))
	wantCredits(t, st, f.ws.ID, 6, 4)

	// A decision after the request lapsed is refused, though no expiry
	// closed it yet; so is one dated at its ExpiresAt.
	_, err := st.Apply(ctx, lapsed.Execution.ID, decision(lapsed.Execution, true, f.approver.ID, "late"))
	wantClass(t, "approving a lapsed request", err, errdefs.ErrConflict)
	late := decision(fresh.Execution, false, f.approver.ID, "at the end")
	late.At = fresh.Approval.ExpiresAt
	_, err = st.Apply(ctx, fresh.Execution.ID, late)
	wantClass(t, "denying a request at its ExpiresAt", err, errdefs.ErrConflict)
	for _, adm := range []store.Admission{lapsed, fresh} {
		if a := must[model.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, adm.Approval.ID)); a.Status != model.ApprovalPending {
			t.Fatalf("approval after a late decision: got %s, want pending", a.Status)
		}
	}
	wantCredits(t, st, f.ws.ID, 6, 4)

	due := must[[]model.Approval](t, "ListDueApprovals")(st.ListDueApprovals(ctx, time.Now()))
	if got := ids(due, func(a model.Approval) string { return a.ID }); got != ids([]store.Admission{elsewhere, lapsed},
		func(a store.Admission) string { return a.Approval.ID }) {
		t.Fatalf("ListDueApprovals: got %v, want the two lapsed ones, earliest first", got)
	}

	// An event the store refuses rolls the expiry back with it: the two are
	// one transaction.
	_, err = st.Apply(ctx, lapsed.Execution.ID, expiry(lapsed.Execution, model.NewEvent{Type: ""}))
	wantClass(t, "an expiry with an invalid event", err, errdefs.ErrInvalidArgument)
	if a := must[model.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, lapsed.Approval.ID)); a.Status != model.ApprovalPending {
		t.Fatalf("approval after a failed expiry: got %s, want pending", a.Status)
	}
	wantCredits(t, st, f.ws.ID, 6, 4)

	got := expireDue(t, st, time.Now())
	if len(got) != 2 {
		t.Fatalf("expired: got %+v, want the two lapsed ones", got)
	}
	if a := must[model.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, lapsed.Approval.ID)); a.Status != model.ApprovalExpired ||
		a.DecidedBy != "" || !a.DecidedAt.IsZero() {
		t.Fatalf("expired approval: got %+v", a)
	}
	ex := must[model.Execution](t, "GetExecution")(st.GetExecution(ctx, f.ws.ID, lapsed.Execution.ID))
	if ex.Status != model.StatusApprovalExpired {
		t.Fatalf("execution of an expired approval: got %s", ex.Status)
	}
	wantCredits(t, st, f.ws.ID, 8, 2)
	wantExpiredEvent(t, st, f.ws.ID, lapsed)
	wantExpiredEvent(t, st, other.ws.ID, elsewhere)
	if again := expireDue(t, st, time.Now()); len(again) != 0 {
		t.Fatalf("second expiry pass: got %d, want none", len(again))
	}
	wantExpiredEvent(t, st, f.ws.ID, lapsed)

	// Due exactly at its ExpiresAt.
	if got := expireDue(t, st, fresh.Approval.ExpiresAt); len(got) != 1 || got[0].ID != fresh.Approval.ID {
		t.Fatalf("expiring at ExpiresAt: got %+v", got)
	}
	wantCredits(t, st, f.ws.ID, 10, 0)
	wantExpiredEvent(t, st, f.ws.ID, fresh)
	wantIntact(t, st, f.ws.ID)
}

// wantExpiredEvent checks that the admission's approval has exactly one
// expiry event, in its workspace's chain, attributed to its execution.
func wantExpiredEvent(t *testing.T, st store.Store, ws string, adm store.Admission) {
	t.Helper()
	ev := must[store.Page[model.Event]](t, "ListEvents")(st.ListEvents(t.Context(), ws,
		store.EventFilter{ExecutionID: adm.Execution.ID, Types: []string{"approval.expired"}}))
	if len(ev.Items) != 1 {
		t.Fatalf("approval.expired events of %s: got %d, want 1", adm.Execution.ID, len(ev.Items))
	}
	e := ev.Items[0]
	if e.WorkspaceID != ws || e.Code != "APR004W" || e.Actor != "system" || e.Reason != "no decision before the approval expired" ||
		string(e.Data) != `{"approval_id":"`+adm.Approval.ID+`"}` {
		t.Fatalf("approval.expired event: got %+v", e)
	}
}

func testListApprovals(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "list-approvals")
	mustGrant(t, st, f.ws.ID, 100)
	var pending, decided []string
	for i := range 7 {
		adm := awaiting(t, st, f, string(rune('a'+i)), nowPlus(600))
		if i%3 == 0 {
			mustApply(t, st, adm.Execution, decision(adm.Execution, i%2 == 0, f.approver.ID, ""))
			decided = append(decided, adm.Approval.ID)
		} else {
			pending = append(pending, adm.Approval.ID)
		}
	}
	aID := func(a model.Approval) string { return a.ID }
	all := allPages(t, 2, aID, func(p store.PageRequest) (store.Page[model.Approval], error) {
		return st.ListApprovals(ctx, f.ws.ID, store.ApprovalFilter{PageRequest: p})
	})
	if len(all) != 7 {
		t.Fatalf("ListApprovals: got %d, want 7", len(all))
	}
	for i := 1; i < len(all); i++ {
		if all[i].RequestedAt.After(all[i-1].RequestedAt) {
			t.Fatalf("ListApprovals is not newest first at %d", i)
		}
	}
	got := allPages(t, 2, aID, func(p store.PageRequest) (store.Page[model.Approval], error) {
		return st.ListApprovals(ctx, f.ws.ID, store.ApprovalFilter{PageRequest: p, Statuses: []model.ApprovalStatus{model.ApprovalPending}})
	})
	if len(got) != len(pending) {
		t.Fatalf("pending approvals: got %s, want %v", ids(got, aID), pending)
	}
	for _, a := range got {
		if a.Status != model.ApprovalPending {
			t.Fatalf("status filter returned a %s approval", a.Status)
		}
	}
}
