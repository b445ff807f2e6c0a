package storetest

import (
	"fmt"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// testAuditBroadcast appends an event of the whole daemon with a copy in
// every workspace's chain: each copy links into its own chain and names
// the original, every chain verifies, and a copy the store refuses leaves
// nothing written anywhere.
func testAuditBroadcast(t *testing.T, st store.Store) {
	ctx := t.Context()
	a, b := newFixture(t, st, "broadcast-a"), newFixture(t, st, "broadcast-b")
	appendN(t, st, a.ws.ID, 2)
	copyOf := func(e model.Event) model.NewEvent {
		return model.NewEvent{Type: e.Type, Code: e.Code, Actor: e.Actor, Reason: e.Reason,
			Data: []byte(fmt.Sprintf(`{"source_seq":%d,"source_hash":%q}`, e.Seq, e.Hash))}
	}
	orig, err := st.AppendBroadcast(ctx, model.NewEvent{Type: "tool.changed", Code: "TOL002W", Actor: "system", Data: []byte(`{"tool":"fetch"}`)}, copyOf)
	if err != nil {
		t.Fatalf("AppendBroadcast: %v", err)
	}
	if orig.WorkspaceID != "" || orig.Hash != store.ChainHash(orig) {
		t.Fatalf("the original: got %+v, want it in the unattributed chain", orig)
	}
	want := fmt.Sprintf(`{"source_seq":%d,"source_hash":%q}`, orig.Seq, orig.Hash)
	for _, f := range []fixture{a, b} {
		evs := must[store.Page[model.Event]](t, "ListEvents")(st.ListEvents(ctx, f.ws.ID, store.EventFilter{Types: []string{"tool.changed"}}))
		if len(evs.Items) != 1 || evs.Items[0].WorkspaceID != f.ws.ID || string(evs.Items[0].Data) != want || evs.Items[0].Code != "TOL002W" {
			t.Fatalf("copies in workspace %s: got %+v, want one with data %s", f.ws.Name, evs.Items, want)
		}
		wantIntact(t, st, f.ws.ID)
	}
	wantIntact(t, st, "")

	heads := map[string]model.ChainHead{}
	for _, ws := range []string{"", a.ws.ID, b.ws.ID} {
		heads[ws] = must[model.ChainHead](t, "ChainHead")(st.ChainHead(ctx, ws))
	}
	n := 0
	_, err = st.AppendBroadcast(ctx, model.NewEvent{Type: "tool.changed", Actor: "system"}, func(e model.Event) model.NewEvent {
		if n++; n == 2 {
			return model.NewEvent{} // no type: refused
		}
		return copyOf(e)
	})
	wantClass(t, "a broadcast whose second copy is invalid", err, errdefs.ErrInvalidArgument)
	for ws, h := range heads {
		if got := must[model.ChainHead](t, "ChainHead")(st.ChainHead(ctx, ws)); got != h {
			t.Errorf("chain %q after a refused broadcast: got head %+v, want %+v (nothing written)", ws, got, h)
		}
	}
	_, err = st.AppendBroadcast(ctx, model.NewEvent{WorkspaceID: a.ws.ID, Type: "tool.changed"}, copyOf)
	wantClass(t, "a broadcast of a workspace's event", err, errdefs.ErrInvalidArgument)
}
