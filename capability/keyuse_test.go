package capability

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
)

// countingUses is a store that counts RecordKeyUses calls and can refuse
// them.
type countingUses struct {
	testStore
	mu     sync.Mutex
	calls  int
	refuse bool
}

func (c *countingUses) RecordKeyUses(ctx context.Context, uses map[string]time.Time) error {
	c.mu.Lock()
	c.calls++
	refuse := c.refuse
	c.mu.Unlock()
	if refuse {
		return fmt.Errorf("database is locked")
	}
	return c.testStore.RecordKeyUses(ctx, uses)
}

// TestKeyLastUse checks that authenticating records the key's last use in
// the store, without a write of its own: the uses are written in one batch
// by the service's tick or its Close, and a batch the store refuses is
// written at the next flush.
func TestKeyLastUse(t *testing.T) {
	ctx := t.Context()
	st := &countingUses{testStore: openSQLite(t)}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	env := newServiceEnv(t, st, &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}, noApprovalPolicy(), ServiceOptions{Now: clock})
	lastUse := func() time.Time {
		t.Helper()
		k, err := st.GetAPIKey(ctx, env.agent.KeyID)
		if err != nil {
			t.Fatal(err)
		}
		return k.LastUsedAt
	}
	if got := lastUse(); !got.IsZero() {
		t.Fatalf("last use of a new key: got %v, want none", got)
	}
	// While the store refuses the batches (the service's tick may try too),
	// nothing is recorded, and nothing is lost.
	st.mu.Lock()
	st.refuse = true
	st.mu.Unlock()
	for range 100 {
		if _, err := env.svc.Authenticate(ctx, "svc agent"); err != nil {
			t.Fatal(err)
		}
	}
	env.svc.keys.flushKeyUses(ctx)
	st.mu.Lock()
	st.refuse = false
	st.mu.Unlock()
	if got := lastUse(); !got.IsZero() {
		t.Fatalf("last use after a refused flush: got %v, want none yet", got)
	}
	env.svc.Close(t.Context())
	if got := lastUse(); !got.Equal(now) {
		t.Errorf("last use after Close: got %v, want %v", got, now)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	// The service's tick may have tried too, but 100 authentications
	// never cost 100 writes.
	if st.calls < 2 || st.calls > 10 {
		t.Errorf("RecordKeyUses calls: got %d, want the refused one, the one at Close and at most a few ticks", st.calls)
	}
}

// BenchmarkAuthenticate measures Authenticate on SQLite, 8 callers at
// once, as it is (the key's lookup, and its use noted in memory), against
// the lookup alone and against writing the use in the request
// (RecordKeyUses per call, the design this avoids), interleaved. Run it
// with -benchtime=1x: each variant makes rounds×calls calls.
func BenchmarkAuthenticate(b *testing.B) {
	ctx := context.Background()
	st := openSQLite(b)
	ws, err := st.CreateWorkspace(ctx, "bench", nil)
	if err != nil {
		b.Fatal(err)
	}
	k, err := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: model.RoleAgent, Hash: model.HashKey("bench agent")})
	if err != nil {
		b.Fatal(err)
	}
	eng, err := engine.New(map[string]sandbox.Driver{"gvisor": &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}}, "gvisor", sandboxfake.Images{}, sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		b.Fatal(err)
	}
	svc := NewService(eng, st, ServiceOptions{})
	const callers, calls, rounds = 8, 200, 10
	parallel := func(f func() error) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		for range callers {
			wg.Go(func() {
				for range calls / callers {
					if err := f(); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
		return time.Since(start) / calls
	}
	variants := []struct {
		name string
		f    func() error
		d    []time.Duration
	}{
		{name: "lookup only (before)", f: func() error {
			_, err := st.LookupAPIKey(ctx, model.HashKey("bench agent"))
			return err
		}},
		{name: "Authenticate (use noted in memory)", f: func() error {
			_, err := svc.Authenticate(ctx, "bench agent")
			return err
		}},
		{name: "lookup + write per call (avoided)", f: func() error {
			if _, err := st.LookupAPIKey(ctx, model.HashKey("bench agent")); err != nil {
				return err
			}
			return st.RecordKeyUses(ctx, map[string]time.Time{k.ID: time.Now()})
		}},
	}
	for b.Loop() {
		for r := range rounds {
			for i := range variants {
				v := &variants[(r+i)%len(variants)]
				v.d = append(v.d, parallel(v.f))
			}
		}
	}
	base := median(variants[0].d)
	out := fmt.Sprintf("Authenticate on SQLite, %d callers, median of %d rounds of %d calls (time per call):\n", callers, len(variants[0].d), calls)
	for _, v := range variants {
		m := median(v.d)
		out += fmt.Sprintf("  %-36s %8.1f µs  %5.2fx\n", v.name, float64(m)/float64(time.Microsecond), float64(m)/float64(base))
	}
	b.Log(out)
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
