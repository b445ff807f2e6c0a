package storetest

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// appendN appends n events to the workspace's chain and returns them.
func appendN(t *testing.T, st store.Store, ws string, n int) []model.Event {
	t.Helper()
	var out []model.Event
	for i := range n {
		e, err := st.AppendEvent(t.Context(), model.NewEvent{
			WorkspaceID: ws, Type: "capability.invoke_allowed", Code: "CAP001", Actor: "key_test",
			Reason: fmt.Sprintf("event %d", i+1), Data: []byte(fmt.Sprintf(`{"n": %d, "z": "last", "a": "first"}`, i+1)),
		})
		if err != nil {
			t.Fatalf("AppendEvent %d: %v", i+1, err)
		}
		out = append(out, e)
	}
	return out
}

func wantIntact(t *testing.T, st store.Store, ws string) {
	t.Helper()
	ok, broken, err := st.VerifyChain(t.Context(), ws)
	if err != nil || !ok || broken != nil {
		t.Fatalf("VerifyChain(%q): got ok %v, broken %+v, err %v; want an intact chain", ws, ok, broken, err)
	}
}

// wantBroken checks that VerifyChain reports the first broken link at seq.
func wantBroken(t *testing.T, st store.Store, ws string, seq int64, witnessed ...model.ChainHead) *model.BrokenLink {
	t.Helper()
	ok, broken, err := st.VerifyChain(t.Context(), ws, witnessed...)
	if err != nil {
		t.Fatalf("VerifyChain: %v", err)
	}
	if ok || broken == nil {
		t.Fatalf("VerifyChain: got an intact chain, want a break at seq %d", seq)
	}
	if broken.Seq != seq || broken.WorkspaceID != ws || broken.Reason == "" {
		t.Fatalf("VerifyChain: got break %+v, want one at seq %d", broken, seq)
	}
	t.Logf("caught: seq %d: %s", broken.Seq, broken.Reason)
	return broken
}

func testAuditAppend(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "audit")
	at := time.Date(2001, 1, 2, 3, 4, 5, 123456789, time.FixedZone("x", 3600)) // before any real clock
	first, err := st.AppendEvent(ctx, model.NewEvent{WorkspaceID: f.ws.ID, Type: "capability.invoke_denied", Code: "CAP002",
		Actor: f.agent.ID, Reason: "runtime not allowed", ExecutionID: "ex_1", Data: []byte(`{"runtime":"ruby"}`), Time: at})
	if err != nil {
		t.Fatalf("AppendEvent: %v", err)
	}
	if first.Seq != 1 || first.PrevHash != "" || first.Hash != store.ChainHash(first) || !first.Time.Equal(store.TruncateTime(at)) {
		t.Fatalf("first event: got %+v", first)
	}
	rest := appendN(t, st, f.ws.ID, 9)
	prev := first
	for _, e := range rest {
		if e.Seq != prev.Seq+1 || e.PrevHash != prev.Hash || e.Hash != store.ChainHash(e) {
			t.Fatalf("event %d does not link to %d: %+v", e.Seq, prev.Seq, e)
		}
		prev = e
	}
	h := must[model.ChainHead](t, "ChainHead")(st.ChainHead(ctx, f.ws.ID))
	if h.Seq != 10 || h.Hash != prev.Hash {
		t.Fatalf("ChainHead: got %+v, want seq 10 hash %s", h, prev.Hash)
	}
	wantIntact(t, st, f.ws.ID)

	// Stored events read back byte for byte, data included, so that anyone
	// can recompute the hashes.
	evID := func(e model.Event) string { return e.ID }
	all := allPages(t, 3, evID, func(p store.PageRequest) (store.Page[model.Event], error) {
		return st.ListEvents(ctx, f.ws.ID, store.EventFilter{PageRequest: p})
	})
	if len(all) != 10 || all[0].Seq != 10 || all[9].Seq != 1 {
		t.Fatalf("ListEvents: got %d events from seq %d, want 10 newest first", len(all), all[0].Seq)
	}
	got := all[9]
	if got.ID != first.ID || string(got.Data) != `{"runtime":"ruby"}` || got.ExecutionID != "ex_1" || !got.Time.Equal(first.Time) ||
		got.Hash != first.Hash || store.ChainHash(got) != got.Hash || got.Code != "CAP002" || got.Reason != "runtime not allowed" {
		t.Fatalf("stored event: got %+v, want %+v", got, first)
	}
	for _, tc := range []struct {
		name   string
		filter store.EventFilter
		want   int
	}{
		{"by type", store.EventFilter{Types: []string{"capability.invoke_denied"}}, 1},
		{"by execution", store.EventFilter{ExecutionID: "ex_1"}, 1},
		{"since", store.EventFilter{Since: rest[0].Time}, 9},
		{"until", store.EventFilter{Until: rest[0].Time}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := must[store.Page[model.Event]](t, "ListEvents")(st.ListEvents(ctx, f.ws.ID, tc.filter))
			if len(p.Items) != tc.want {
				t.Fatalf("ListEvents: got %d, want %d", len(p.Items), tc.want)
			}
		})
	}

	// The unattributed chain works like any other.
	anon := must[model.Event](t, "AppendEvent")(st.AppendEvent(ctx, model.NewEvent{Type: "auth.unknown_key", Reason: "bad bearer"}))
	if anon.Seq != 1 || anon.WorkspaceID != "" {
		t.Fatalf("unattributed event: got %+v", anon)
	}
	appendN(t, st, "", 2)
	wantIntact(t, st, "")
	wantIntact(t, st, f.ws.ID)

	for _, tc := range []struct {
		name  string
		err   error
		class error
	}{
		{"unknown workspace", second(st.AppendEvent(ctx, model.NewEvent{WorkspaceID: "ws_nope", Type: "x"})), errdefs.ErrNotFound},
		{"no type", second(st.AppendEvent(ctx, model.NewEvent{WorkspaceID: f.ws.ID})), errdefs.ErrInvalidArgument},
		{"bad data", second(st.AppendEvent(ctx, model.NewEvent{WorkspaceID: f.ws.ID, Type: "x", Data: []byte("{")})), errdefs.ErrInvalidArgument},
		{"invalid UTF-8", second(st.AppendEvent(ctx, model.NewEvent{WorkspaceID: f.ws.ID, Type: "x", Reason: "\xff"})), errdefs.ErrInvalidArgument},
		{"verify unknown workspace", verifyErr(st, t, "ws_nope"), errdefs.ErrNotFound},
		{"bad cursor", second(st.ListEvents(ctx, f.ws.ID, store.EventFilter{PageRequest: store.PageRequest{Cursor: "!"}})), errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) { wantClass(t, tc.name, tc.err, tc.class) })
	}
}

func verifyErr(st store.Store, t *testing.T, ws string) error {
	_, _, err := st.VerifyChain(t.Context(), ws)
	return err
}

func testAuditUnitOfWork(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "uow")
	mustGrant(t, st, f.ws.ID, 10)
	adm := mustAdmit(t, st, f.newExec("print(1)"), admission(2,
		model.NewEvent{Type: "capability.invoke_allowed", Code: "CAP001", Actor: f.agent.ID, ExecutionID: "ignored"}))
	ran := mustApply(t, st, adm.Execution, start("runc"))
	mustApply(t, st, ran, ending(ran, model.StatusSucceeded, true, model.NewEvent{Type: "execution.finished", Actor: "system"}))
	p := must[store.Page[model.Event]](t, "ListEvents")(st.ListEvents(ctx, f.ws.ID, store.EventFilter{ExecutionID: adm.Execution.ID}))
	if len(p.Items) != 2 || p.Items[1].Type != "capability.invoke_allowed" || p.Items[0].Type != "execution.finished" {
		t.Fatalf("events of the execution: got %+v", p.Items)
	}
	for _, ev := range p.Items {
		if ev.WorkspaceID != f.ws.ID || ev.ExecutionID != adm.Execution.ID {
			t.Fatalf("event %d: got workspace %q execution %q", ev.Seq, ev.WorkspaceID, ev.ExecutionID)
		}
	}
	// A step that fails writes no event.
	_, err := st.Apply(ctx, ran.ID, ending(ran, model.StatusFailed, false, model.NewEvent{Type: "execution.finished"}))
	wantClass(t, "ending twice", err, errdefs.ErrConflict)
	if h := must[model.ChainHead](t, "ChainHead")(st.ChainHead(ctx, f.ws.ID)); h.Seq != 2 {
		t.Fatalf("chain after a failed finish: got seq %d, want 2", h.Seq)
	}
	wantIntact(t, st, f.ws.ID)
}

// testAuditConcurrent appends from many goroutines at once, plain appends and
// admissions with events mixed, to two workspaces, and checks that each chain
// stays one unforked sequence.
func testAuditConcurrent(t *testing.T, st store.Store) {
	ctx := t.Context()
	a := newFixture(t, st, "chain-a")
	b := newFixture(t, st, "chain-b")
	mustGrant(t, st, a.ws.ID, 1000)
	const writers, each = 8, 20
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				ws := a.ws.ID
				if w%4 == 3 {
					ws = b.ws.ID
				}
				if w%2 == 1 && ws == a.ws.ID {
					if _, err := st.Admit(ctx, a.newExec(fmt.Sprintf("w%d i%d", w, i)), admission(1,
						model.NewEvent{Type: "capability.invoke_allowed"}, model.NewEvent{Type: "approval.not_required"})); err != nil {
						fail(err)
					}
					continue
				}
				if _, err := st.AppendEvent(ctx, model.NewEvent{WorkspaceID: ws, Type: "test.concurrent",
					Reason: fmt.Sprintf("w%d i%d", w, i)}); err != nil {
					fail(err)
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	// Writers 0, 2, 4, 6 append once per round to a (except 3 and 7 to b);
	// writers 1 and 5 admit with two events each.
	wantA, wantB := int64(4*each+2*2*each), int64(2*each)
	for _, c := range []struct {
		ws   string
		want int64
	}{{a.ws.ID, wantA}, {b.ws.ID, wantB}} {
		h := must[model.ChainHead](t, "ChainHead")(st.ChainHead(ctx, c.ws))
		if h.Seq != c.want {
			t.Fatalf("chain %s: got %d links, want %d", c.ws, h.Seq, c.want)
		}
		seqs := map[int64]bool{}
		evs := allPages(t, store.MaxPageLimit, func(e model.Event) string { return e.ID }, func(p store.PageRequest) (store.Page[model.Event], error) {
			return st.ListEvents(ctx, c.ws, store.EventFilter{PageRequest: p})
		})
		for _, e := range evs {
			seqs[e.Seq] = true
		}
		if int64(len(evs)) != c.want || int64(len(seqs)) != c.want {
			t.Fatalf("chain %s: got %d rows with %d distinct seqs, want %d", c.ws, len(evs), len(seqs), c.want)
		}
		wantIntact(t, st, c.ws)
	}
}

func testTamperUpdate(t *testing.T, st store.Store) {
	f := newFixture(t, st, "tamper-update")
	other := newFixture(t, st, "bystander")
	appendN(t, st, f.ws.ID, 8)
	appendN(t, st, other.ws.ID, 3)
	wantIntact(t, st, f.ws.ID)
	for _, tc := range []struct {
		name, set string
	}{
		{"reason", "reason = 'nothing to see'"},
		{"actor", "actor = 'key_someone_else'"},
		{"type", "type = 'capability.invoke_allowed_x'"},
		{"data", `data = '{"n": 4}'`},
		{"seq", "seq = 400"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Each case tampers with seq 4 of a chain of its own.
			g := newFixture(t, st, "tamper-"+tc.name)
			appendN(t, st, g.ws.ID, 6)
			tamper(t, st, fmt.Sprintf("UPDATE audit_events SET %s WHERE workspace_id = %s AND seq = 4", tc.set, lit(g.ws.ID)))
			wantBroken(t, st, g.ws.ID, 4)
		})
	}
	tamper(t, st, fmt.Sprintf("UPDATE audit_events SET reason = 'edited' WHERE workspace_id = %s AND seq = 3", lit(f.ws.ID)))
	b := wantBroken(t, st, f.ws.ID, 3)
	if !strings.Contains(b.Reason, "hash") {
		t.Fatalf("reason for an edited row: got %q", b.Reason)
	}
	wantIntact(t, st, other.ws.ID)
}

// testTamperUpdateRehashed edits a row and recomputes its own hash, as an
// attacker who knows the format would: the next row's link gives it away.
func testTamperUpdateRehashed(t *testing.T, st store.Store) {
	f := newFixture(t, st, "tamper-rehash")
	evs := appendN(t, st, f.ws.ID, 6)
	forged := evs[3]
	forged.Reason = "rewritten history"
	forged.Hash = store.ChainHash(forged)
	tamper(t, st, fmt.Sprintf("UPDATE audit_events SET reason = %s, hash = %s WHERE workspace_id = %s AND seq = 4",
		lit(forged.Reason), lit(forged.Hash), lit(f.ws.ID)))
	wantBroken(t, st, f.ws.ID, 5)
}

func testTamperDeleteMiddle(t *testing.T, st store.Store) {
	f := newFixture(t, st, "tamper-delete")
	appendN(t, st, f.ws.ID, 7)
	tamper(t, st, fmt.Sprintf("DELETE FROM audit_events WHERE workspace_id = %s AND seq = 5", lit(f.ws.ID)))
	b := wantBroken(t, st, f.ws.ID, 5)
	if b.EventID != "" {
		t.Fatalf("a deleted row is reported with id %q", b.EventID)
	}
}

func testTamperDeleteTail(t *testing.T, st store.Store) {
	f := newFixture(t, st, "tamper-tail")
	appendN(t, st, f.ws.ID, 7)
	tamper(t, st, fmt.Sprintf("DELETE FROM audit_events WHERE workspace_id = %s AND seq >= 6", lit(f.ws.ID)))
	wantBroken(t, st, f.ws.ID, 6)
}

// testTamperTruncateWithHead removes the last events and rewinds the
// recorded head to match, which the chain alone cannot tell from a shorter
// chain: a head witnessed outside the database before catches it, and so
// does one witnessed when the chain is rewritten from some event on.
func testTamperTruncateWithHead(t *testing.T, st store.Store) {
	f := newFixture(t, st, "tamper-truncate")
	evs := appendN(t, st, f.ws.ID, 7)
	witnessed := must[model.ChainHead](t, "ChainHead")(st.ChainHead(t.Context(), f.ws.ID))
	if witnessed.Seq != 7 || witnessed.Hash != evs[6].Hash {
		t.Fatalf("ChainHead: got %+v, want seq 7 and the last event's hash", witnessed)
	}
	tamper(t, st, fmt.Sprintf("DELETE FROM audit_events WHERE workspace_id = %s AND seq >= 6", lit(f.ws.ID)))
	tamper(t, st, fmt.Sprintf("UPDATE audit_chain_heads SET seq = 5, hash = %s WHERE workspace_id = %s", lit(evs[4].Hash), lit(f.ws.ID)))
	if ok, broken, err := st.VerifyChain(t.Context(), f.ws.ID); err != nil || !ok {
		t.Fatalf("VerifyChain without a witness: got ok %v, broken %+v, err %v; the chain alone looks whole", ok, broken, err)
	}
	if ok, _, err := st.VerifyChain(t.Context(), f.ws.ID, model.ChainHead{WorkspaceID: f.ws.ID, Seq: 5, Hash: evs[4].Hash}); err != nil || !ok {
		t.Fatalf("VerifyChain with an older witness still held: got ok %v, err %v", ok, err)
	}
	wantBroken(t, st, f.ws.ID, 6, witnessed)

	// Rewritten from seq 3 on, consistently (rehashed, head updated): the
	// chain holds an event 3 again, another one.
	g := newFixture(t, st, "tamper-rewrite")
	evs = appendN(t, st, g.ws.ID, 4)
	w := model.ChainHead{WorkspaceID: g.ws.ID, Seq: 3, Hash: evs[2].Hash}
	forged := evs[2]
	forged.Reason = "forged"
	forged.Hash = store.ChainHash(forged)
	tamper(t, st, fmt.Sprintf("DELETE FROM audit_events WHERE workspace_id = %s AND seq >= 4", lit(g.ws.ID)))
	tamper(t, st, fmt.Sprintf("UPDATE audit_events SET reason = %s, hash = %s WHERE workspace_id = %s AND seq = 3", lit(forged.Reason), lit(forged.Hash), lit(g.ws.ID)))
	tamper(t, st, fmt.Sprintf("UPDATE audit_chain_heads SET seq = 3, hash = %s WHERE workspace_id = %s", lit(forged.Hash), lit(g.ws.ID)))
	if ok, broken, err := st.VerifyChain(t.Context(), g.ws.ID); err != nil || !ok {
		t.Fatalf("VerifyChain of the rewritten chain without a witness: got ok %v, broken %+v, err %v", ok, broken, err)
	}
	wantBroken(t, st, g.ws.ID, 3, w)
}

// testVerifyChainFrom checks the walk a witness makes before it moves on
// to a later head: from the witnessed head to the recorded one, reading
// only the events from the witnessed seq on. A chain rewritten
// consistently from before the witnessed head and padded past it, which
// the chain alone cannot tell from an intact one, does not pass.
func testVerifyChainFrom(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "verify-from")
	evs := appendN(t, st, f.ws.ID, 7)
	w := model.ChainHead{WorkspaceID: f.ws.ID, Seq: 5, Hash: evs[4].Hash}
	head := must[model.ChainHead](t, "ChainHead")(st.ChainHead(ctx, f.ws.ID))
	if got, broken, err := st.VerifyChainFrom(ctx, w); err != nil || broken != nil || got != head {
		t.Fatalf("VerifyChainFrom(seq 5) of an intact chain: got %+v, %+v, %v; want the head %+v", got, broken, err, head)
	}
	if got, broken, err := st.VerifyChainFrom(ctx, head); err != nil || broken != nil || got != head {
		t.Fatalf("VerifyChainFrom(the head): got %+v, %+v, %v; want the head %+v", got, broken, err, head)
	}
	// An edit before the witnessed seq is a full walk's to find: the walk
	// from the witness does not read that far back.
	tamper(t, st, fmt.Sprintf("UPDATE audit_events SET reason = 'edited' WHERE workspace_id = %s AND seq = 2", lit(f.ws.ID)))
	if got, broken, err := st.VerifyChainFrom(ctx, w); err != nil || broken != nil || got != head {
		t.Fatalf("VerifyChainFrom(seq 5) after an edit of seq 2: got %+v, %+v, %v; want the head (seq 2 is not read)", got, broken, err)
	}
	if _, broken, err := st.VerifyChainFrom(ctx, model.ChainHead{WorkspaceID: f.ws.ID}); err != nil || broken == nil || broken.Seq != 2 {
		t.Fatalf("VerifyChainFrom(nothing witnessed): got %+v, %v; want the break at seq 2", broken, err)
	}

	// Rewritten from seq 3 on, through the store itself so that every
	// hash and link is right, and padded to seq 9, past the witness.
	g := newFixture(t, st, "verify-from-rewrite")
	evs = appendN(t, st, g.ws.ID, 7)
	w = model.ChainHead{WorkspaceID: g.ws.ID, Seq: 5, Hash: evs[4].Hash}
	for seq := 7; seq >= 3; seq-- {
		tamper(t, st, fmt.Sprintf("DELETE FROM audit_events WHERE workspace_id = %s AND seq = %d", lit(g.ws.ID), seq))
	}
	tamper(t, st, fmt.Sprintf("UPDATE audit_chain_heads SET seq = 2, hash = %s WHERE workspace_id = %s", lit(evs[1].Hash), lit(g.ws.ID)))
	appendN(t, st, g.ws.ID, 7)
	wantIntact(t, st, g.ws.ID)
	if got, broken, err := st.VerifyChainFrom(ctx, w); err != nil || broken == nil || broken.Seq != 5 || got != (model.ChainHead{}) {
		t.Fatalf("VerifyChainFrom(seq 5) of a chain rewritten from seq 3 to seq 9: got %+v, %+v, %v; want no head and the break at seq 5", got, broken, err)
	}
	wantBroken(t, st, g.ws.ID, 5, w)
	_, _, err := st.VerifyChainFrom(ctx, model.ChainHead{WorkspaceID: "ws_nope", Seq: 1, Hash: evs[0].Hash})
	wantClass(t, "VerifyChainFrom of an unknown workspace", err, errdefs.ErrNotFound)
}

// testTamperInsert slips a forged event into the middle of a chain, shifting
// the later rows up and giving the forgery a correct hash of its own.
func testTamperInsert(t *testing.T, st store.Store) {
	f := newFixture(t, st, "tamper-insert")
	evs := appendN(t, st, f.ws.ID, 6)
	for seq := 6; seq >= 4; seq-- {
		tamper(t, st, fmt.Sprintf("UPDATE audit_events SET seq = %d WHERE workspace_id = %s AND seq = %d", seq+1, lit(f.ws.ID), seq))
	}
	forged := model.Event{ID: "evt_forged", WorkspaceID: f.ws.ID, Seq: 4, Type: "capability.invoke_allowed", Code: "CAP001",
		Actor: "key_test", Reason: "forged", Time: evs[2].Time, PrevHash: evs[2].Hash}
	forged.Hash = store.ChainHash(forged)
	tamper(t, st, fmt.Sprintf(`INSERT INTO audit_events (id, workspace_id, seq, type, code, actor, reason, execution_id, data,
		occurred_at, prev_hash, hash) SELECT %s, workspace_id, 4, type, code, actor, %s, '', NULL, occurred_at, %s, %s
		FROM audit_events WHERE workspace_id = %s AND seq = 3`,
		lit(forged.ID), lit(forged.Reason), lit(forged.PrevHash), lit(forged.Hash), lit(f.ws.ID)))
	wantBroken(t, st, f.ws.ID, 5)
}

// testTamperAppendPastHead appends a well-formed event behind the store's
// back: the chain head, which the store alone advances, gives it away.
func testTamperAppendPastHead(t *testing.T, st store.Store) {
	f := newFixture(t, st, "tamper-append")
	evs := appendN(t, st, f.ws.ID, 3)
	forged := model.Event{ID: "evt_forged", WorkspaceID: f.ws.ID, Seq: 4, Type: "capability.invoke_allowed",
		Reason: "forged", Time: evs[2].Time, PrevHash: evs[2].Hash}
	forged.Hash = store.ChainHash(forged)
	tamper(t, st, fmt.Sprintf(`INSERT INTO audit_events (id, workspace_id, seq, type, code, actor, reason, execution_id, data,
		occurred_at, prev_hash, hash) SELECT %s, workspace_id, 4, type, '', '', %s, '', NULL, occurred_at, %s, %s
		FROM audit_events WHERE workspace_id = %s AND seq = 3`,
		lit(forged.ID), lit(forged.Reason), lit(forged.PrevHash), lit(forged.Hash), lit(f.ws.ID)))
	wantBroken(t, st, f.ws.ID, 4)
}

// testAdminAudit checks that a key's creation, a policy change and a grant
// append their audit events in their own transaction: an event the store
// refuses leaves the change undone, and an accepted one is in the chain
// with the change.
func testAdminAudit(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "admin")
	bad := []model.NewEvent{{Type: ""}}
	ev := func(typ string) []model.NewEvent { return []model.NewEvent{{Type: typ, Actor: "cli"}} }
	count := func(typ string) int {
		p := must[store.Page[model.Event]](t, "ListEvents")(st.ListEvents(ctx, f.ws.ID, store.EventFilter{Types: []string{typ}}))
		return len(p.Items)
	}

	_, err := st.CreateWorkspace(ctx, "admin-audit", func(model.Workspace) []model.NewEvent { return bad })
	wantClass(t, "CreateWorkspace with an invalid event", err, errdefs.ErrInvalidArgument)
	_, err = st.GetWorkspaceByName(ctx, "admin-audit")
	wantClass(t, "the workspace of a refused event", err, errdefs.ErrNotFound)
	var wsSeen model.Workspace
	ws := must[model.Workspace](t, "CreateWorkspace")(st.CreateWorkspace(ctx, "admin-audit", func(ws model.Workspace) []model.NewEvent {
		wsSeen = ws
		return ev("workspace.created")
	}))
	wsEvents := must[store.Page[model.Event]](t, "ListEvents")(st.ListEvents(ctx, ws.ID, store.EventFilter{}))
	if wsSeen != ws || len(wsEvents.Items) != 1 || wsEvents.Items[0].Type != "workspace.created" {
		t.Fatalf("workspace.created: the event saw %+v, want %+v; the new chain holds %+v, want that one event", wsSeen, ws, wsEvents.Items)
	}
	if ok, broken, err := st.VerifyChain(ctx, ws.ID); err != nil || !ok {
		t.Fatalf("VerifyChain of the new workspace: got ok %v, broken %+v, err %v", ok, broken, err)
	}

	_, err = st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: f.ws.ID, Role: model.RoleAdmin, Hash: model.HashKey("admin-audit-1"),
		Audit: func(model.APIKey) []model.NewEvent { return bad }})
	wantClass(t, "CreateAPIKey with an invalid event", err, errdefs.ErrInvalidArgument)
	_, err = st.LookupAPIKey(ctx, model.HashKey("admin-audit-1"))
	wantClass(t, "the key of a refused event", err, errdefs.ErrNotFound)
	var created string
	k := must[model.APIKey](t, "CreateAPIKey")(st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: f.ws.ID, Role: model.RoleAdmin, Hash: model.HashKey("admin-audit-2"),
		Audit: func(k model.APIKey) []model.NewEvent { created = k.ID; return ev("key.created") }}))
	if created != k.ID || count("key.created") != 1 {
		t.Fatalf("key.created: the event saw key %q, want %q; %d events, want 1", created, k.ID, count("key.created"))
	}

	pol := model.DefaultPolicy()
	pol.NetworkAllowed = !pol.NetworkAllowed
	_, err = st.SetPolicy(ctx, f.ws.ID, pol, func(model.Policy) []model.NewEvent { return bad })
	wantClass(t, "SetPolicy with an invalid event", err, errdefs.ErrInvalidArgument)
	if got := must[model.Policy](t, "GetPolicy")(st.GetPolicy(ctx, f.ws.ID)); got.NetworkAllowed == pol.NetworkAllowed {
		t.Fatal("the policy changed although its event was refused")
	}
	must[model.Policy](t, "SetPolicy")(st.SetPolicy(ctx, f.ws.ID, pol, func(p model.Policy) []model.NewEvent { return ev("policy.updated") }))
	if got := must[model.Policy](t, "GetPolicy")(st.GetPolicy(ctx, f.ws.ID)); got.NetworkAllowed != pol.NetworkAllowed || count("policy.updated") != 1 {
		t.Fatalf("SetPolicy with its event: policy %+v, %d events", got, count("policy.updated"))
	}

	_, err = st.GrantCredits(ctx, f.ws.ID, 5, "grant", bad)
	wantClass(t, "GrantCredits with an invalid event", err, errdefs.ErrInvalidArgument)
	wantCredits(t, st, f.ws.ID, 0, 0)
	must[model.Credits](t, "GrantCredits")(st.GrantCredits(ctx, f.ws.ID, 5, "grant", ev("credits.granted")))
	wantCredits(t, st, f.ws.ID, 5, 0)
	if n := count("credits.granted"); n != 1 {
		t.Fatalf("credits.granted events: got %d, want 1", n)
	}
	if ok, broken, err := st.VerifyChain(ctx, f.ws.ID); err != nil || !ok {
		t.Fatalf("VerifyChain: got ok %v, broken %+v, err %v", ok, broken, err)
	}
}
