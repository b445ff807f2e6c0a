package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/stockade-sh/stockade/bench/internal/daemon"
	"github.com/stockade-sh/stockade/bench/internal/table"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/sandbox"
)

// firstCell is the new session's first cell: it uses pandas, which a cold
// kernel imports in it and a pooled one has imported already.
const firstCell = "import pandas as pd\npd.DataFrame({'a': range(1000)}).describe()"

// sessionWorkspace is the daemon's default sessions.workspace_size, which
// the session pool's sandboxes have.
const sessionWorkspace = 256 << 20

// sessionVariants are one kind of session's timings: the session's
// opening (POST /v1/sessions), its first cell, and the two together.
type sessionVariants struct {
	open, cell, total table.Variant
}

// sessions times, on runc and gVisor, a new python session and its first
// cell using pandas through a daemon over HTTP with approval none, from a
// session pool and cold (a daemon without pools), in interleaved rounds. A
// pooled sample is timed once the pool has a sandbox that has settled for
// settle (the wait is not timed); the session is ended after each sample,
// untimed.
func sessions(ctx context.Context, n int, settle time.Duration, dataDir string) error {
	tmp, err := os.MkdirTemp("", "stockade-bench-pool-sessions-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	shim, guest, err := daemon.Binaries(tmp)
	if err != nil {
		return err
	}
	// Each daemon has drivers of its own over a state directory of its
	// own, as `stockade serve` has: a daemon's start destroys the detached
	// sandboxes there that are not its own.
	newDriver := func(name, kind string) (map[string]sandbox.Driver, error) {
		dir := filepath.Join(tmp, kind, name)
		var (
			d   sandbox.Driver
			err error
		)
		if name == "runc" {
			d, err = runc.New(runc.Config{StateDir: dir, GuestPath: guest, Shim: shim})
		} else {
			d, err = gvisor.New(gvisor.Config{StateDir: dir, GuestPath: guest, Shim: shim})
		}
		return map[string]sandbox.Driver{name: d}, err
	}
	type tierSessions struct {
		driver       string
		pooled, cold sessionVariants
		pc, cc       daemon.Client
		state        *readiness
	}
	var tiers []*tierSessions
	for _, name := range []string{"runc", "gvisor"} {
		ts := &tierSessions{driver: name, state: &readiness{}}
		drivers, err := newDriver(name, "pooled")
		if err != nil {
			return err
		}
		pooled, err := engine.New(drivers, name, image.Open(dataDir), sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
			engine.WithPools(engine.PoolOptions{Pools: []engine.PoolSpec{{Runtime: "python", Sessions: 1}}, SessionWorkspace: sessionWorkspace}))
		if err != nil {
			return err
		}
		owner := "bench-pool-sessions-" + name
		credits := int64(2*n + 20)
		var stop func()
		if ts.pc, stop, err = daemon.Serve(ctx, pooled, filepath.Join(tmp, name+"-pooled.db"), owner, credits); err != nil {
			return err
		}
		defer stop()
		// As `stockade serve`, the pool fills once the service has started
		// (and reaped the sandboxes of its owner), and its sandboxes carry
		// the service's owner label, which a session's labels repeat.
		pooled.SetPoolObserver(ts.state)
		stopPools, err := pooled.StartPools(ctx, map[string]string{engine.LabelOwner: owner})
		if err != nil {
			return err
		}
		defer stopPools()
		if drivers, err = newDriver(name, "cold"); err != nil {
			return err
		}
		cold, err := engine.New(drivers, name, image.Open(dataDir), sandbox.DefaultLimits(), sandbox.DefaultCeiling())
		if err != nil {
			return err
		}
		if ts.cc, stop, err = daemon.Serve(ctx, cold, filepath.Join(tmp, name+"-cold.db"), "bench-cold-sessions-"+name, credits); err != nil {
			return err
		}
		defer stop()
		tiers = append(tiers, ts)
	}
	// sample opens a session of c, runs the first cell, ends the session
	// and appends the timings to vs (timed when timed).
	sample := func(c daemon.Client, vs *sessionVariants, timed bool) error {
		start := time.Now()
		id, err := c.Session()
		if err != nil {
			return err
		}
		opened := time.Now()
		err = c.Cell(id, firstCell, "")
		done := time.Now()
		if err := c.EndSession(id); err != nil {
			return err
		}
		if err == nil && timed {
			vs.open.Samples = append(vs.open.Samples, opened.Sub(start))
			vs.cell.Samples = append(vs.cell.Samples, done.Sub(opened))
			vs.total.Samples = append(vs.total.Samples, done.Sub(start))
		}
		return err
	}
	// One untimed round first (images and caches warm), then n rounds,
	// each tier's pooled and cold in turn, the order swapped every round.
	for i := -1; i < n; i++ {
		for _, ts := range tiers {
			kinds := []func() error{
				func() error {
					if err := ts.state.wait(1, settle); err != nil {
						return err
					}
					return sample(ts.pc, &ts.pooled, i >= 0)
				},
				func() error { return sample(ts.cc, &ts.cold, i >= 0) },
			}
			if i%2 != 0 {
				kinds[0], kinds[1] = kinds[1], kinds[0]
			}
			for _, k := range kinds {
				if err := k(); err != nil {
					return fmt.Errorf("%s sessions: %w", ts.driver, err)
				}
			}
		}
	}
	fmt.Printf("\na new python session and its first cell using pandas (%q), over HTTP with approval none: %d sessions of each kind, interleaved; a pooled session is opened once its pool sandbox has settled %s\n\n", firstCell, n, settle)
	tb := table.New("driver", "timed", "pooled p50", "pooled p95", "cold p50", "cold p95", "pooled p50 vs cold").Labels(2)
	for _, ts := range tiers {
		for _, r := range []struct {
			name         string
			pooled, cold *table.Variant
		}{
			{"POST /v1/sessions", &ts.pooled.open, &ts.cold.open},
			{"first cell", &ts.pooled.cell, &ts.cold.cell},
			{"both", &ts.pooled.total, &ts.cold.total},
		} {
			tb.Row(ts.driver, r.name, table.MS(r.pooled.Pct(50)), table.MS(r.pooled.Pct(95)), table.MS(r.cold.Pct(50)), table.MS(r.cold.Pct(95)), table.Ratio(r.pooled.Pct(50), r.cold.Pct(50)))
		}
	}
	tb.Print(os.Stdout)
	return nil
}
