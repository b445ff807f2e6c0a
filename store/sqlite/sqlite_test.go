package sqlite_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"

	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/store/sqlite"
	"github.com/stockade-sh/stockade/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		st, err := sqlite.Open(t.Context(), sqlite.Config{Path: filepath.Join(t.TempDir(), "stockade.db"), AnalyticsOutbox: true})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	})
}

func TestOutboxOff(t *testing.T) {
	st, err := sqlite.Open(t.Context(), sqlite.Config{Path: filepath.Join(t.TempDir(), "stockade.db")})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer st.Close()
	storetest.CheckOutboxOff(t, st)
}

// TestReopen checks that migrations are recorded once and that data survives
// closing and reopening the file, as across a daemon restart.
func TestReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stockade.db")
	st, err := sqlite.Open(t.Context(), sqlite.Config{Path: path})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	ws, err := st.CreateWorkspace(t.Context(), "persist", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.AppendEvent(t.Context(), model.NewEvent{WorkspaceID: ws.ID, Type: "test.persist"}); err != nil {
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

// TestTwoProcesses runs admissions through two Stores on one file, as the
// daemon and the admin CLI do: their writers are separate connections, and
// BEGIN IMMEDIATE with the busy timeout must keep the balance exact.
func TestTwoProcesses(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "stockade.db")
	var sts [2]*sqlite.Store
	for i := range sts {
		st, err := sqlite.Open(ctx, sqlite.Config{Path: path})
		if err != nil {
			t.Fatalf("Open %d: %v", i, err)
		}
		defer st.Close()
		sts[i] = st
	}
	ws, err := sts[0].CreateWorkspace(ctx, "shared", nil)
	if err != nil {
		t.Fatal(err)
	}
	key, err := sts[0].CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: model.RoleAgent, Hash: model.HashKey("k")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sts[1].GrantCredits(ctx, ws.ID, 30, "", nil); err != nil {
		t.Fatal(err)
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		admitted int
		errs     []error
	)
	for i := range 40 {
		wg.Go(func() {
			_, err := sts[i%2].Admit(ctx, store.NewExecution{WorkspaceID: ws.ID, KeyID: key.ID, Runtime: "python",
				Tool: "code.execute", Request: []byte(fmt.Sprintf(`{"i":%d}`, i)),
				InputSHA256: "0000000000000000000000000000000000000000000000000000000000000000"},
				model.Step{To: model.StatusQueued, Credits: model.CreditMove{Kind: model.LedgerReserve, Amount: 1},
					Audit: []model.NewEvent{{Type: "capability.invoke_allowed"}}})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				admitted++
			case !errdefs.IsResourceExhausted(err):
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	c, err := sts[1].GetCredits(ctx, ws.ID)
	if err != nil {
		t.Fatal(err)
	}
	if admitted != 30 || c.Available != 0 || c.Reserved != 30 {
		t.Fatalf("got %d admitted, credits %+v; want 30 admitted, 0 available, 30 reserved", admitted, c)
	}
	if ok, broken, err := sts[0].VerifyChain(ctx, ws.ID); !ok || err != nil {
		t.Fatalf("chain written by two processes: ok %v broken %+v err %v", ok, broken, err)
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
		{"synchronous NORMAL", sqlite.Config{Path: "x.db", Synchronous: sqlite.SyncNormal}, true},
		{"synchronous OFF", sqlite.Config{Path: "x.db", Synchronous: "OFF"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.c.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate: got %v, want ok %v", err, tc.ok)
			}
		})
	}
}

// TestSynchronous checks that a store flushes every commit (FULL) unless
// the benchmark asks for NORMAL, and that its database, -wal and -shm are
// its owner's only.
func TestSynchronous(t *testing.T) {
	for _, c := range []struct {
		name, setting string
		want          int
	}{
		{"zero", "", 2},
		{"full", sqlite.SyncFull, 2},
		{"normal", sqlite.SyncNormal, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "stockade.db")
			st, err := sqlite.Open(t.Context(), sqlite.Config{Path: path, Synchronous: c.setting})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer st.Close()
			if got, err := st.SynchronousSetting(t.Context()); err != nil || got != c.want {
				t.Errorf("PRAGMA synchronous: got %d, %v; want %d", got, err, c.want)
			}
			for _, p := range []string{path, path + "-wal", path + "-shm"} {
				if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
					t.Errorf("%s: got %v, %v; want mode 0600", filepath.Base(p), fi.Mode(), err)
				}
			}
		})
	}
}

func BenchmarkInvocation(b *testing.B) {
	for _, parallel := range []bool{false, true} {
		for _, outbox := range []bool{false, true} {
			name := map[bool]string{false: "sequential", true: "parallel"}[parallel] + map[bool]string{false: "", true: "/outbox"}[outbox]
			b.Run(name, func(b *testing.B) {
				st, err := sqlite.Open(b.Context(), sqlite.Config{Path: filepath.Join(b.TempDir(), "bench.db"), AnalyticsOutbox: outbox})
				if err != nil {
					b.Fatal(err)
				}
				defer st.Close()
				storetest.Bench(b, st, parallel)
			})
		}
	}
}

// TestClaimDaemon checks that one daemon at a time holds a database's
// claim, through another Store on the same file (as another process would),
// and that releasing it lets the next one claim it.
func TestClaimDaemon(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stockade.db")
	var sts [2]*sqlite.Store
	for i := range sts {
		st, err := sqlite.Open(t.Context(), sqlite.Config{Path: path})
		if err != nil {
			t.Fatalf("Open %d: %v", i, err)
		}
		defer st.Close()
		sts[i] = st
	}
	storetest.ClaimDaemon(t, sts[0], sts[1])
}

// TestUpgrade opens a database made by the first schema with every
// migration (storetest.Upgrade).
func TestUpgrade(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stockade.db")
	storetest.Upgrade(t, "1764547200000000", func(t *testing.T) store.Store {
		st, err := sqlite.OpenAt(t.Context(), sqlite.Config{Path: path}, 4)
		if err != nil {
			t.Fatalf("OpenAt(4): %v", err)
		}
		return st // Upgrade closes it
	}, func(t *testing.T) store.Store {
		st, err := sqlite.Open(t.Context(), sqlite.Config{Path: path})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	})
}
