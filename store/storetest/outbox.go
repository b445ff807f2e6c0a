package storetest

import (
	"slices"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// testOutboxEveryEnding ends executions in every way the store ends them
// and checks that each tool_invocations row, and nothing else, is enqueued
// once, with the row's fields.
func testOutboxEveryEnding(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "outbox")
	mustGrant(t, st, f.ws.ID, 100)

	ran := run(t, st, f.admit(t, st, "ran", 2).Execution, "runc", model.StatusSucceeded, true)
	launch := f.admit(t, st, "launch", 2).Execution
	mustApply(t, st, launch, ending(launch, model.StatusLaunchFailed, false))
	denied := awaiting(t, st, f, "denied", nowPlus(600))
	mustApply(t, st, denied.Execution, decision(denied.Execution, false, f.approver.ID, ""))
	lapsed := awaiting(t, st, f, "lapsed", time.Now().Add(-time.Second))
	expireDue(t, st, time.Now())
	interrupted := mustApply(t, st, f.admit(t, st, "interrupted", 2).Execution, start("runc"))
	queued := f.admit(t, st, "queued", 2).Execution
	// An execution awaiting approval has no row yet, and so no entry.
	pending := awaiting(t, st, f, "waiting", nowPlus(600))

	// An ending that its events roll back rolls its entry back too.
	_, err := st.Apply(ctx, interrupted.ID, ending(interrupted, model.StatusFailed, false, model.NewEvent{Type: ""}))
	wantClass(t, "an ending with an invalid event", err, errdefs.ErrInvalidArgument)
	if got := outboxIDs(t, st); len(got) != 4 {
		t.Fatalf("entries after a failed ending: got %d, want the 4 of the executions that ended", len(got))
	}
	mustApply(t, st, interrupted, ending(interrupted, model.StatusFailed, false))
	mustApply(t, st, queued, cancel(queued, ""))
	// A refused ending enqueues nothing, and neither does an admission.
	_, err = st.Apply(ctx, ran.ID, ending(interrupted, model.StatusFailed, false))
	wantClass(t, "ending an ended execution", err, errdefs.ErrConflict)
	live := f.admit(t, st, "live", 2)

	rows := allPages(t, store.MaxPageLimit, func(ti model.ToolInvocation) string { return ti.ID },
		func(p store.PageRequest) (store.Page[model.ToolInvocation], error) {
			return st.ListToolInvocations(ctx, f.ws.ID, store.ToolCallFilter{PageRequest: p})
		})
	entries := must[[]store.OutboxEntry](t, "ListOutbox")(st.ListOutbox(ctx, 0))
	wantExecs := []string{ran.ID, launch.ID, denied.Execution.ID, lapsed.Execution.ID, interrupted.ID, queued.ID}
	if len(rows) != len(wantExecs) || len(entries) != len(rows) {
		t.Fatalf("got %d tool_invocations rows and %d outbox entries, want %d of each", len(rows), len(entries), len(wantExecs))
	}
	byID := map[string]model.ToolInvocation{}
	for _, r := range rows {
		byID[r.ID] = r
	}
	var gotExecs []string
	for i, e := range entries {
		if row, ok := byID[e.Invocation.ID]; !ok || row != e.Invocation {
			t.Errorf("entry %d: got %+v, want the tool_invocations row %+v", i, e.Invocation, row)
		}
		if e.EnqueuedAt.IsZero() || (i > 0 && e.EnqueuedAt.Before(entries[i-1].EnqueuedAt)) {
			t.Errorf("entry %d enqueued at %v, after %v: want a time, oldest first", i, e.EnqueuedAt, entries[max(i-1, 0)].EnqueuedAt)
		}
		gotExecs = append(gotExecs, e.Invocation.ExecutionID)
	}
	if !sameSet(gotExecs, wantExecs) {
		t.Errorf("executions enqueued: got %v, want %v", gotExecs, wantExecs)
	}
	if slices.Contains(gotExecs, pending.Execution.ID) || slices.Contains(gotExecs, live.Execution.ID) {
		t.Errorf("a live execution was enqueued")
	}
	if e := entries[0]; e.Invocation.ExecutionID != ran.ID || e.Invocation.Status != model.StatusSucceeded ||
		e.Invocation.Credits != 2 || e.Invocation.Driver != "runc" || e.Invocation.Runtime != "python" || e.Invocation.Tool != "code.execute" {
		t.Errorf("the first entry: got %+v, want the succeeded run on runc, charged 2", e.Invocation)
	}
	stats := must[store.OutboxStats](t, "OutboxStats")(st.OutboxStats(ctx))
	if stats.Rows != int64(len(entries)) || !stats.Oldest.Equal(entries[0].EnqueuedAt) {
		t.Errorf("OutboxStats: got %+v, want %d rows, the oldest at %v", stats, len(entries), entries[0].EnqueuedAt)
	}
}

// testOutboxSameTransaction shows that the entry is written in the ending's
// transaction: an entry that cannot be written fails the ending whole.
func testOutboxSameTransaction(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "outbox-tx")
	mustGrant(t, st, f.ws.ID, 10)
	ex := mustApply(t, st, f.admit(t, st, "print(1)", 2).Execution, start("runc"))
	tamper(t, st, "DROP TABLE analytics_outbox")
	if _, err := st.Apply(ctx, ex.ID, ending(ex, model.StatusSucceeded, true)); err == nil {
		t.Fatal("an ending without an outbox table succeeded; the entry is not written with the row")
	}
	if ex := must[model.Execution](t, "GetExecution")(st.GetExecution(ctx, f.ws.ID, ex.ID)); ex.Status != model.StatusRunning {
		t.Errorf("execution after the failed ending: got %s, want still running", ex.Status)
	}
	if p := must[store.Page[model.ToolInvocation]](t, "ListToolInvocations")(st.ListToolInvocations(ctx, f.ws.ID, store.ToolCallFilter{})); len(p.Items) != 0 {
		t.Errorf("tool_invocations rows after the failed ending: got %d, want none", len(p.Items))
	}
	wantCredits(t, st, f.ws.ID, 8, 2)
}

// testOutboxBatches reads and deletes entries in batches, oldest first.
func testOutboxBatches(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "outbox-batches")
	ended := endN(t, st, f, 7)
	first := must[[]store.OutboxEntry](t, "ListOutbox")(st.ListOutbox(ctx, 3))
	if got := entryIDs(first); !slices.Equal(got, ended[:3]) {
		t.Fatalf("ListOutbox(3): got %v, want the oldest three %v", got, ended[:3])
	}
	n := must[int64](t, "DeleteOutbox")(st.DeleteOutbox(ctx, append(entryIDs(first), "inv_unknown", "inv_\x00bad")))
	if n != 3 {
		t.Errorf("DeleteOutbox of three entries and two unknown ids: got %d, want 3", n)
	}
	if got := outboxIDs(t, st); !slices.Equal(got, ended[3:]) {
		t.Errorf("entries after the delete: got %v, want %v", got, ended[3:])
	}
	if n := must[int64](t, "DeleteOutbox")(st.DeleteOutbox(ctx, nil)); n != 0 {
		t.Errorf("DeleteOutbox(nil): got %d, want 0", n)
	}
	_, err := st.DeleteOutbox(ctx, make([]string, store.MaxOutboxBatch+1))
	wantClass(t, "DeleteOutbox of too many ids", err, errdefs.ErrInvalidArgument)
	for _, limit := range []int{-1, 0, store.MaxOutboxBatch + 1} {
		if got := must[[]store.OutboxEntry](t, "ListOutbox")(st.ListOutbox(ctx, limit)); len(got) != 4 {
			t.Errorf("ListOutbox(%d): got %d entries, want all 4", limit, len(got))
		}
	}
	must[int64](t, "DeleteOutbox")(st.DeleteOutbox(ctx, ended[3:]))
	if stats := must[store.OutboxStats](t, "OutboxStats")(st.OutboxStats(ctx)); stats.Rows != 0 || !stats.Oldest.IsZero() {
		t.Errorf("OutboxStats of an empty outbox: got %+v, want zero", stats)
	}
	if p := must[store.Page[model.ToolInvocation]](t, "ListToolInvocations")(st.ListToolInvocations(ctx, f.ws.ID, store.ToolCallFilter{})); len(p.Items) != 7 {
		t.Errorf("tool_invocations rows after emptying the outbox: got %d, want all 7", len(p.Items))
	}
}

// testOutboxTrim bounds the outbox by age and by rows.
func testOutboxTrim(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "outbox-trim")
	ended := endN(t, st, f, 6)
	entries := must[[]store.OutboxEntry](t, "ListOutbox")(st.ListOutbox(ctx, 0))
	if got := entryIDs(entries); !slices.Equal(got, ended) {
		t.Fatalf("entries: got %v, want %v", got, ended)
	}
	for _, tc := range []struct {
		name    string
		maxRows int64
		before  time.Time
		dropped int64
		left    []string
	}{
		{"no bound", 0, time.Time{}, 0, ended},
		{"rows within the bound", 6, time.Time{}, 0, ended},
		{"by age: before the oldest", 0, entries[0].EnqueuedAt, 0, ended},
		{"by age", 0, entries[2].EnqueuedAt, 2, ended[2:]},
		{"by rows", 3, time.Time{}, 1, ended[3:]},
		{"by both", 1, entries[4].EnqueuedAt, 2, ended[5:]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := must[int64](t, "TrimOutbox")(st.TrimOutbox(ctx, tc.maxRows, tc.before))
			if got := outboxIDs(t, st); n != tc.dropped || !slices.Equal(got, tc.left) {
				t.Errorf("TrimOutbox(%d, %v): got %d dropped, %v left; want %d and %v", tc.maxRows, tc.before, n, got, tc.dropped, tc.left)
			}
		})
	}
	if p := must[store.Page[model.ToolInvocation]](t, "ListToolInvocations")(st.ListToolInvocations(ctx, f.ws.ID, store.ToolCallFilter{})); len(p.Items) != 6 {
		t.Errorf("tool_invocations rows after trimming: got %d, want all 6", len(p.Items))
	}
}

// CheckOutboxOff fails t unless st, a store opened with its analytics
// outbox off, ends an execution without enqueuing its row.
func CheckOutboxOff(t *testing.T, st store.Store) {
	t.Helper()
	f := newFixture(t, st, "outbox-off")
	endN(t, st, f, 1)
	if got := outboxIDs(t, st); len(got) != 0 {
		t.Errorf("entries with the outbox off: got %v, want none", got)
	}
}

// endN ends n executions of f, each a little after the last, and returns
// their tool_invocations ids in the order they ended.
func endN(t *testing.T, st store.Store, f fixture, n int) []string {
	t.Helper()
	ctx := t.Context()
	var ids []string
	for i := range n {
		a := f.admit(t, st, "end", 0)
		mustApply(t, st, a.Execution, ending(a.Execution, model.StatusLaunchFailed, false))
		p := must[store.Page[model.ToolInvocation]](t, "ListToolInvocations")(st.ListToolInvocations(ctx, f.ws.ID,
			store.ToolCallFilter{PageRequest: store.PageRequest{Limit: 1}}))
		if len(p.Items) != 1 || p.Items[0].ExecutionID != a.Execution.ID {
			t.Fatalf("the newest tool_invocations row after ending %d: got %+v, want %s's", i, p.Items, a.Execution.ID)
		}
		ids = append(ids, p.Items[0].ID)
		// Stored times have microseconds: the next entry is enqueued later.
		time.Sleep(2 * time.Millisecond)
	}
	return ids
}

func entryIDs(es []store.OutboxEntry) []string {
	ids := make([]string, len(es))
	for i, e := range es {
		ids[i] = e.Invocation.ID
	}
	return ids
}

func outboxIDs(t *testing.T, st store.Store) []string {
	t.Helper()
	return entryIDs(must[[]store.OutboxEntry](t, "ListOutbox")(st.ListOutbox(t.Context(), store.MaxOutboxBatch)))
}

func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}
