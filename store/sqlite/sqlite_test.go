package sqlite_test

import (
	"path/filepath"
	"testing"

	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/store/sqlite"
	"github.com/stockade-sh/stockade/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		st, err := sqlite.Open(t.Context(), sqlite.Config{Path: filepath.Join(t.TempDir(), "stockade.db")})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	})
}

// TestReopen checks that migrations are recorded once and that data survives
// closing and reopening the file, as across a daemon restart.
func TestReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stockade.db")
	st, err := sqlite.Open(t.Context(), sqlite.Config{Path: path})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	ws, err := st.CreateWorkspace(t.Context(), "persist")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.AppendEvent(t.Context(), store.NewEvent{WorkspaceID: ws.ID, Type: "test.persist"}); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	st, err = sqlite.Open(t.Context(), sqlite.Config{Path: path})
	if err != nil {
		t.Fatalf("reopening: %v", err)
	}
	defer st.Close()
	if _, err := st.GetWorkspaceByName(t.Context(), "persist"); err != nil {
		t.Fatalf("workspace after reopening: %v", err)
	}
	if ok, broken, err := st.VerifyChain(t.Context(), ws.ID); !ok || err != nil {
		t.Fatalf("chain after reopening: ok %v broken %+v err %v", ok, broken, err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    sqlite.Config
		ok   bool
	}{
		{"path", sqlite.Config{Path: "/tmp/x.db"}, true},
		{"no path", sqlite.Config{}, false},
		{"memory", sqlite.Config{Path: ":memory:"}, false},
		{"uri", sqlite.Config{Path: "file:x.db?mode=ro"}, false},
		{"negative timeout", sqlite.Config{Path: "x.db", BusyTimeout: -1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.c.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate: got %v, want ok %v", err, tc.ok)
			}
		})
	}
}

func BenchmarkInvocation(b *testing.B) {
	for _, parallel := range []bool{false, true} {
		b.Run(map[bool]string{false: "sequential", true: "parallel"}[parallel], func(b *testing.B) {
			st, err := sqlite.Open(b.Context(), sqlite.Config{Path: filepath.Join(b.TempDir(), "bench.db")})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			storetest.Bench(b, st, parallel)
		})
	}
}
