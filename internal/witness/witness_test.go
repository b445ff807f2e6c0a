package witness

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/store"
)

func TestRecordRead(t *testing.T) {
	d := Dir(filepath.Join(t.TempDir(), "w"))
	h := func(ws string, seq int64, c string) store.ChainHead {
		return store.ChainHead{WorkspaceID: ws, Seq: seq, Hash: strings.Repeat(c, 64)}
	}
	for _, w := range []store.ChainHead{h("ws_a", 3, "a"), h("ws_a", 5, "b"), h("ws_a", 4, "c"), h("", 2, "d"), h("ws_b", 0, "e")} {
		if err := d.Record(w); err != nil {
			t.Fatalf("Record(%+v): %v", w, err)
		}
	}
	// The head only moves forward; an empty chain is not witnessed.
	for ws, want := range map[string]store.ChainHead{"ws_a": h("ws_a", 5, "b"), "": h("", 2, "d")} {
		if got, ok, err := d.Read(ws); err != nil || !ok || got != want {
			t.Errorf("Read(%q): got %+v, %v, %v; want %+v", ws, got, ok, err, want)
		}
	}
	if _, ok, err := d.Read("ws_b"); ok || err != nil {
		t.Errorf("Read of an unwitnessed chain: got %v, %v", ok, err)
	}
	chains, err := d.Chains()
	slices.Sort(chains)
	if err != nil || !slices.Equal(chains, []string{"", "ws_a"}) {
		t.Errorf("Chains: got %q, %v", chains, err)
	}
	if err := d.Record(h("../x", 1, "f")); err == nil {
		t.Error("Record of a workspace id with a slash: got nil, want an error")
	}
	if err := os.WriteFile(filepath.Join(string(d), "ws_c"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Read("ws_c"); err == nil {
		t.Error("Read of a damaged witness: got nil, want an error")
	}
	if Default("sqlite:/var/lib/stockade/stockade.db") != "/var/lib/stockade/stockade.db.witness" || Default("postgres://db/x") != "" {
		t.Errorf("Default: got %q and %q", Default("sqlite:/var/lib/stockade/stockade.db"), Default("postgres://db/x"))
	}
}
