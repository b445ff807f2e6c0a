package storetest

import (
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/store"
)

// awaiting admits an execution that waits for approval, reserving 2 credits.
func awaiting(t *testing.T, st store.Store, f fixture, code string, expires time.Time) store.Admission {
	t.Helper()
	e := f.newExec(code, 2)
	e.Approval = &store.NewApproval{Card: []byte(`{"code":"` + code + `","risk":"high"}`), ExpiresAt: expires}
	adm := mustCreate(t, st, e)
	if adm.Approval == nil || adm.Execution.Status != store.StatusAwaitingApproval || adm.Execution.ApprovalID != adm.Approval.ID {
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
	a := must[store.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, adm.Approval.ID))
	if a.Status != store.ApprovalPending || a.ExecutionID != adm.Execution.ID || string(a.Card) != `{"code":"print(1)","risk":"high"}` ||
		!a.ExpiresAt.Equal(store.TruncateTime(exp)) || a.RequestedAt.IsZero() || a.DecidedBy != "" || !a.DecidedAt.IsZero() {
		t.Fatalf("pending approval: got %+v", a)
	}
	tc := must[store.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, adm.Execution.ID))
	if tc.Status != store.StatusAwaitingApproval {
		t.Fatalf("tool call while awaiting approval: got %s", tc.Status)
	}
	_, err := st.StartExecution(ctx, adm.Execution.ID, "runc")
	wantClass(t, "StartExecution before approval", err, errdefs.ErrConflict)
	_, err = st.FinishExecution(ctx, store.Outcome{ExecutionID: adm.Execution.ID, Status: store.StatusKilled})
	wantClass(t, "FinishExecution before approval", err, errdefs.ErrConflict)

	dec, ex, err := st.DecideApproval(ctx, store.Decision{WorkspaceID: f.ws.ID, ApprovalID: a.ID, Approve: true,
		DecidedBy: f.approver.ID, Reason: "looks fine",
		Audit: []store.NewEvent{{Type: "approval.approved", Actor: f.approver.ID}}})
	if err != nil {
		t.Fatalf("DecideApproval: %v", err)
	}
	if dec.Status != store.ApprovalApproved || dec.DecidedBy != f.approver.ID || dec.DecidedAt.IsZero() || dec.Reason != "looks fine" {
		t.Fatalf("decided approval: got %+v", dec)
	}
	if ex.Status != store.StatusQueued {
		t.Fatalf("execution after approval: got %s, want queued", ex.Status)
	}
	if got := must[store.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, a.ID)); got.Status != store.ApprovalApproved ||
		got.DecidedBy != f.approver.ID || !got.DecidedAt.Equal(dec.DecidedAt) {
		t.Fatalf("stored decision: got %+v", got)
	}
	ev := must[store.Page[store.Event]](t, "ListEvents")(st.ListEvents(ctx, f.ws.ID, store.EventFilter{ExecutionID: adm.Execution.ID}))
	if len(ev.Items) != 1 || ev.Items[0].Type != "approval.approved" {
		t.Fatalf("decision events: got %+v", ev.Items)
	}
	wantCredits(t, st, f.ws.ID, 8, 2)

	must[store.Execution](t, "StartExecution")(st.StartExecution(ctx, ex.ID, "runc"))
	must[store.Execution](t, "FinishExecution")(st.FinishExecution(ctx, store.Outcome{ExecutionID: ex.ID, Status: store.StatusSucceeded}))
	wantCredits(t, st, f.ws.ID, 8, 0)

	_, _, err = st.DecideApproval(ctx, store.Decision{WorkspaceID: f.ws.ID, ApprovalID: a.ID, Approve: false, DecidedBy: f.adm.ID})
	wantClass(t, "deciding twice", err, errdefs.ErrConflict)
	_, _, err = st.DecideApproval(ctx, store.Decision{WorkspaceID: f.ws.ID, ApprovalID: "apr_nope", Approve: true, DecidedBy: f.adm.ID})
	wantClass(t, "deciding an unknown approval", err, errdefs.ErrNotFound)
}

func testApprovalDeny(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "deny")
	mustGrant(t, st, f.ws.ID, 10)
	adm := awaiting(t, st, f, "rm -rf /", nowPlus(600))
	wantCredits(t, st, f.ws.ID, 8, 2)
	dec, ex, err := st.DecideApproval(ctx, store.Decision{WorkspaceID: f.ws.ID, ApprovalID: adm.Approval.ID,
		DecidedBy: f.adm.ID, Reason: "no"})
	if err != nil {
		t.Fatalf("DecideApproval: %v", err)
	}
	if dec.Status != store.ApprovalDenied || ex.Status != store.StatusDenied || ex.FinishedAt.IsZero() {
		t.Fatalf("denial: got approval %s, execution %s", dec.Status, ex.Status)
	}
	wantCredits(t, st, f.ws.ID, 10, 0)
	tc := must[store.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, ex.ID))
	if tc.Status != store.StatusDenied || tc.CreditsCharged != 0 {
		t.Fatalf("tool call of a denied execution: got %s, %d credits", tc.Status, tc.CreditsCharged)
	}
	inv := must[store.Page[store.ToolInvocation]](t, "ListToolInvocations")(st.ListToolInvocations(ctx, f.ws.ID, store.ToolCallFilter{}))
	if len(inv.Items) != 1 || inv.Items[0].Status != store.StatusDenied {
		t.Fatalf("tool invocations after a denial: got %+v", inv.Items)
	}
	_, _, err = st.DecideApproval(ctx, store.Decision{WorkspaceID: f.ws.ID, ApprovalID: adm.Approval.ID, Approve: true, DecidedBy: f.adm.ID})
	wantClass(t, "approving a denied request", err, errdefs.ErrConflict)
}

func testApprovalDeciders(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "deciders")
	other := newFixture(t, st, "deciders-other")
	mustGrant(t, st, f.ws.ID, 10)
	adm := awaiting(t, st, f, "print(2)", nowPlus(600))
	revoked := must[store.APIKey](t, "CreateAPIKey")(st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: f.ws.ID,
		Role: store.RoleApprover, Hash: store.HashKey("revoked approver")}))
	if err := st.RevokeAPIKey(ctx, f.ws.ID, revoked.ID, nil); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, ws, key string
		class         error
	}{
		{"agent key", f.ws.ID, f.agent.ID, errdefs.ErrPermissionDenied},
		{"another workspace's approver", f.ws.ID, other.approver.ID, errdefs.ErrPermissionDenied},
		{"revoked approver", f.ws.ID, revoked.ID, errdefs.ErrPermissionDenied},
		{"unknown key", f.ws.ID, "key_nope", errdefs.ErrPermissionDenied},
		{"approval of another workspace", other.ws.ID, other.approver.ID, errdefs.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := st.DecideApproval(ctx, store.Decision{WorkspaceID: tc.ws, ApprovalID: adm.Approval.ID,
				Approve: true, DecidedBy: tc.key})
			wantClass(t, "DecideApproval", err, tc.class)
		})
	}
	if a := must[store.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, adm.Approval.ID)); a.Status != store.ApprovalPending {
		t.Fatalf("a refused decider changed the approval to %s", a.Status)
	}
	_, err := st.GetApproval(ctx, other.ws.ID, adm.Approval.ID)
	wantClass(t, "GetApproval from another workspace", err, errdefs.ErrNotFound)
}

// expiredEvents is the audit argument of ExpireApprovals in the suite: one
// event per expired approval, naming it.
func expiredEvents(a store.Approval) []store.NewEvent {
	return []store.NewEvent{{Type: "approval.expired", Code: "APR004W", Actor: "system",
		Reason: "no decision before the approval expired", Data: []byte(`{"approval_id":"` + a.ID + `"}`)}}
}

func testApprovalExpiry(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "expiry")
	mustGrant(t, st, f.ws.ID, 10)
	lapsed := awaiting(t, st, f, "late", time.Now().Add(-time.Second))
	fresh := awaiting(t, st, f, "fresh", nowPlus(3600))
	wantCredits(t, st, f.ws.ID, 6, 4)

	_, _, err := st.DecideApproval(ctx, store.Decision{WorkspaceID: f.ws.ID, ApprovalID: lapsed.Approval.ID, Approve: true, DecidedBy: f.approver.ID})
	wantClass(t, "approving after the expiry", err, errdefs.ErrConflict)

	// An event the store refuses rolls the expiry back with it: the two are
	// one transaction.
	_, err = st.ExpireApprovals(ctx, time.Now(), func(store.Approval) []store.NewEvent { return []store.NewEvent{{Type: ""}} })
	wantClass(t, "ExpireApprovals with an invalid event", err, errdefs.ErrInvalidArgument)
	if a := must[store.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, lapsed.Approval.ID)); a.Status != store.ApprovalPending {
		t.Fatalf("approval after a failed expiry: got %s, want pending", a.Status)
	}
	wantCredits(t, st, f.ws.ID, 6, 4)

	got := must[[]store.Approval](t, "ExpireApprovals")(st.ExpireApprovals(ctx, time.Now(), expiredEvents))
	if len(got) != 1 || got[0].ID != lapsed.Approval.ID || got[0].Status != store.ApprovalExpired || got[0].DecidedBy != "" {
		t.Fatalf("ExpireApprovals: got %+v, want only %s, expired", got, lapsed.Approval.ID)
	}
	ex := must[store.Execution](t, "GetExecution")(st.GetExecution(ctx, f.ws.ID, lapsed.Execution.ID))
	if ex.Status != store.StatusApprovalExpired {
		t.Fatalf("execution of an expired approval: got %s", ex.Status)
	}
	wantCredits(t, st, f.ws.ID, 8, 2)
	wantExpiredEvent(t, st, f.ws.ID, lapsed)
	if again := must[[]store.Approval](t, "ExpireApprovals")(st.ExpireApprovals(ctx, time.Now(), expiredEvents)); len(again) != 0 {
		t.Fatalf("second ExpireApprovals: got %d, want none", len(again))
	}
	wantExpiredEvent(t, st, f.ws.ID, lapsed)

	// Expiry at an explicit time: the fresh request lapses exactly at its
	// ExpiresAt.
	got = must[[]store.Approval](t, "ExpireApprovals")(st.ExpireApprovals(ctx, fresh.Approval.ExpiresAt, expiredEvents))
	if len(got) != 1 || got[0].ID != fresh.Approval.ID {
		t.Fatalf("ExpireApprovals at ExpiresAt: got %+v", got)
	}
	wantCredits(t, st, f.ws.ID, 10, 0)
	wantExpiredEvent(t, st, f.ws.ID, fresh)
	wantIntact(t, st, f.ws.ID)

	// A nil audit expires without events.
	quiet := awaiting(t, st, f, "quiet", time.Now().Add(-time.Second))
	if got := must[[]store.Approval](t, "ExpireApprovals")(st.ExpireApprovals(ctx, time.Now(), nil)); len(got) != 1 || got[0].ID != quiet.Approval.ID {
		t.Fatalf("ExpireApprovals without audit: got %+v, want %s", got, quiet.Approval.ID)
	}
	ev := must[store.Page[store.Event]](t, "ListEvents")(st.ListEvents(ctx, f.ws.ID, store.EventFilter{ExecutionID: quiet.Execution.ID}))
	if len(ev.Items) != 0 {
		t.Fatalf("events of an expiry without audit: got %+v, want none", ev.Items)
	}
	wantIntact(t, st, f.ws.ID)
}

// wantExpiredEvent checks that the admission's approval has exactly one
// expiry event, in its workspace's chain, attributed to its execution.
func wantExpiredEvent(t *testing.T, st store.Store, ws string, adm store.Admission) {
	t.Helper()
	ev := must[store.Page[store.Event]](t, "ListEvents")(st.ListEvents(t.Context(), ws,
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
			if _, _, err := st.DecideApproval(ctx, store.Decision{WorkspaceID: f.ws.ID, ApprovalID: adm.Approval.ID,
				Approve: i%2 == 0, DecidedBy: f.approver.ID}); err != nil {
				t.Fatal(err)
			}
			decided = append(decided, adm.Approval.ID)
		} else {
			pending = append(pending, adm.Approval.ID)
		}
	}
	aID := func(a store.Approval) string { return a.ID }
	all := allPages(t, 2, aID, func(p store.PageRequest) (store.Page[store.Approval], error) {
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
	got := allPages(t, 2, aID, func(p store.PageRequest) (store.Page[store.Approval], error) {
		return st.ListApprovals(ctx, f.ws.ID, store.ApprovalFilter{PageRequest: p, Statuses: []store.ApprovalStatus{store.ApprovalPending}})
	})
	if len(got) != len(pending) {
		t.Fatalf("pending approvals: got %s, want %v", ids(got, aID), pending)
	}
	for _, a := range got {
		if a.Status != store.ApprovalPending {
			t.Fatalf("status filter returned a %s approval", a.Status)
		}
	}
}
