package witness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store/sqlite"
)

// chains is a SQLite store with a workspace's chain to witness.
type chains struct {
	*sqlite.Store
	ws string
}

func newChains(t testing.TB) *chains {
	t.Helper()
	st, err := sqlite.Open(t.Context(), sqlite.Config{Path: filepath.Join(t.TempDir(), "db.sqlite")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ws, err := st.CreateWorkspace(t.Context(), "w", nil)
	if err != nil {
		t.Fatal(err)
	}
	return &chains{Store: st, ws: ws.ID}
}

// add appends n events to the workspace's chain ("" for the unattributed
// one) and returns its head.
func (c *chains) add(t testing.TB, ws string, n int) model.ChainHead {
	t.Helper()
	for i := range n {
		if _, err := c.AppendEvent(t.Context(), model.NewEvent{WorkspaceID: ws, Type: "test.event", Reason: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	h, err := c.ChainHead(t.Context(), ws)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// rewrite replaces the chain from seq on with n other events, through the
// store itself, so that every hash and link is right: what an attacker
// with the database who knows the format can do.
func (c *chains) rewrite(t *testing.T, seq int64, n int) model.ChainHead {
	t.Helper()
	ctx := t.Context()
	for _, q := range []string{
		fmt.Sprintf("DELETE FROM audit_events WHERE workspace_id = '%s' AND seq >= %d", c.ws, seq),
		fmt.Sprintf("UPDATE audit_chain_heads SET seq = %d, hash = (SELECT hash FROM audit_events WHERE workspace_id = '%s' AND seq = %d) WHERE workspace_id = '%s'",
			seq-1, c.ws, seq-1, c.ws),
	} {
		if err := c.UnsafeExec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	h := c.add(t, c.ws, n)
	if ok, broken, err := c.VerifyChain(ctx, c.ws); !ok || err != nil {
		t.Fatalf("the rewritten chain alone: got a break %+v, %v; want it to look intact", broken, err)
	}
	return h
}

func (d Dir) mustRead(t *testing.T, ws string) model.ChainHead {
	t.Helper()
	h, ok, err := d.Read(ws)
	if err != nil || !ok {
		t.Fatalf("Read(%q): got %v, %v; want a witnessed head", ws, ok, err)
	}
	return h
}

func TestRecordFollowsTheChain(t *testing.T) {
	ctx := t.Context()
	c := newChains(t)
	d := Dir(filepath.Join(t.TempDir(), "w"))
	// An empty chain is not witnessed; a chain never witnessed is
	// witnessed at its head.
	if err := d.Record(ctx, c, ""); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := d.Read(""); ok || err != nil {
		t.Errorf("Read of an empty chain's witness: got %v, %v; want none", ok, err)
	}
	h3 := c.add(t, c.ws, 3)
	if err := d.Record(ctx, c, c.ws); err != nil {
		t.Fatal(err)
	}
	if got := d.mustRead(t, c.ws); got != h3 {
		t.Fatalf("first witness: got %+v, want %+v", got, h3)
	}
	// The chain grows: the witness follows.
	h5 := c.add(t, c.ws, 2)
	if err := d.Record(ctx, c, c.ws); err != nil {
		t.Fatal(err)
	}
	if got := d.mustRead(t, c.ws); got != h5 {
		t.Fatalf("witness after growth: got %+v, want %+v", got, h5)
	}
	u := c.add(t, "", 2)
	refused, err := d.RecordAll(ctx, c)
	if err != nil || len(refused) != 0 {
		t.Fatalf("RecordAll: got %v, %v", refused, err)
	}
	if got := d.mustRead(t, ""); got != u {
		t.Errorf("unattributed witness: got %+v, want %+v", got, u)
	}
	chains, err := d.Chains()
	slices.Sort(chains)
	if err != nil || !slices.Equal(chains, []string{"", c.ws}) {
		t.Errorf("Chains: got %q, %v", chains, err)
	}
}

// TestRecordRefusesARewrittenChain rewrites a witnessed chain from before
// its witnessed head, consistently, and pads it past that head: the
// witness is not moved, and stays so while the rewritten chain grows.
func TestRecordRefusesARewrittenChain(t *testing.T) {
	ctx := t.Context()
	for _, from := range []int64{2, 5} {
		t.Run(fmt.Sprintf("from seq %d", from), func(t *testing.T) {
			c := newChains(t)
			d := Dir(t.TempDir())
			witnessed := c.add(t, c.ws, 5)
			if err := d.Record(ctx, c, c.ws); err != nil {
				t.Fatal(err)
			}
			forged := c.rewrite(t, from, 8)
			if forged.Seq <= witnessed.Seq {
				t.Fatalf("the forged chain ends at seq %d, want past the witness at %d", forged.Seq, witnessed.Seq)
			}
			for range 2 {
				err := d.Record(ctx, c, c.ws)
				var nl *NotLinkedError
				if !errors.As(err, &nl) || !errdefs.IsFailedPrecondition(err) {
					t.Fatalf("Record of the rewritten chain: got %v, want a NotLinkedError (failed precondition)", err)
				}
				if nl.Witnessed != witnessed || nl.Broken.Seq != witnessed.Seq {
					t.Errorf("refusal: got witnessed %+v, break at %d; want %+v and the break at its seq", nl.Witnessed, nl.Broken.Seq, witnessed)
				}
				if got := d.mustRead(t, c.ws); got != witnessed {
					t.Fatalf("witness after the refusal: got %+v, want the old %+v kept", got, witnessed)
				}
				c.add(t, c.ws, 1)
			}
			refused, err := d.RecordAll(ctx, c)
			if err != nil || len(refused) != 1 || refused[0].Witnessed != witnessed {
				t.Errorf("RecordAll: got %+v, %v; want the chain refused", refused, err)
			}
		})
	}
}

func TestRecordAndReadRefuse(t *testing.T) {
	c := newChains(t)
	d := Dir(t.TempDir())
	if err := d.Record(t.Context(), c, "../x"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Record of a workspace id with a slash: got %v, want an invalid argument", err)
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

// BenchmarkRecord times a witness tick ten events after the last witness
// beside a full walk of the same chain, for chains of growing length, and
// reports the ratio: the tick reads only the events since the last
// witness, so its cost stays flat while the walk's grows with the chain.
func BenchmarkRecord(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("chain=%d", n), func(b *testing.B) {
			ctx := b.Context()
			c := newChains(b)
			c.add(b, c.ws, n)
			d := Dir(b.TempDir())
			if err := d.Record(ctx, c, c.ws); err != nil {
				b.Fatal(err)
			}
			var tick, walk time.Duration
			for b.Loop() {
				b.StopTimer()
				c.add(b, c.ws, 10)
				b.StartTimer()
				t0 := time.Now()
				if err := d.Record(ctx, c, c.ws); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if ok, _, err := c.VerifyChain(ctx, c.ws); !ok || err != nil {
					b.Fatal(ok, err)
				}
				tick, walk = tick+t1.Sub(t0), walk+time.Since(t1)
			}
			b.ReportMetric(float64(tick.Microseconds())/float64(b.N), "tick-µs")
			b.ReportMetric(float64(walk.Microseconds())/float64(b.N), "walk-µs")
			b.ReportMetric(walk.Seconds()/tick.Seconds(), "walk/tick")
		})
	}
}
