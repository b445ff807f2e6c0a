package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/bench/internal/table"
	"github.com/stockade-sh/stockade/sandbox"
)

// rateResult is one driver's pods-per-minute loop.
type rateResult struct {
	done    int
	elapsed time.Duration
	each    []time.Duration // each sandbox's create, run and destroy
}

// rate creates a sandbox on t, runs python print(1) in it and destroys
// it, concurrency at once, until pods have run or limit has passed since
// the start (no new one starts then); the first error stops it.
func rate(ctx context.Context, t target, img sandbox.Image, pods, concurrency int, limit time.Duration) (rateResult, error) {
	var (
		mu    sync.Mutex
		r     rateResult
		next  int
		first error
		wg    sync.WaitGroup
	)
	start := time.Now()
	take := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if first != nil || next >= pods || time.Since(start) >= limit || ctx.Err() != nil {
			return false
		}
		next++
		return true
	}
	for range min(concurrency, pods) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for take() {
				p, err := timed(ctx, t, sandbox.Spec{Image: img}, cold, oneShot)
				mu.Lock()
				if err != nil && first == nil {
					first = err
				}
				if err == nil {
					r.done++
					r.each = append(r.each, p.create+p.first+p.destroy)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	r.elapsed = time.Since(start)
	if first == nil {
		first = ctx.Err()
	}
	return r, first
}

// rateTable runs rate on each target at each concurrency, the targets in
// turn at each, and prints the sandboxes per minute each sustained.
func rateTable(ctx context.Context, ts []target, img sandbox.Image, pods int, concurrency []int, limit time.Duration) error {
	fmt.Printf("\nSandboxes per minute: create, python print(1), destroy; at most %d each or none started after %s; one loop after the other\n\n", pods, limit)
	t := table.New("driver", "at once", "sandboxes", "elapsed", "per minute", "vs local gvisor", "each, median", "p95")
	perMin := func(r rateResult) float64 {
		if r.elapsed <= 0 {
			return 0
		}
		return float64(r.done) / r.elapsed.Minutes()
	}
	for _, c := range concurrency {
		rs := make([]rateResult, len(ts))
		for i, tg := range ts {
			var err error
			if rs[i], err = rate(ctx, tg, img, pods, c, limit); err != nil {
				return fmt.Errorf("%s: pods per minute, %d at once: %w", tg.name, c, err)
			}
		}
		local := rs[len(rs)-1]
		for i, r := range rs {
			t.Row(ts[i].name, fmt.Sprint(c), fmt.Sprint(r.done), fmt.Sprintf("%.1f s", r.elapsed.Seconds()), fmt.Sprintf("%.1f", perMin(r)),
				rateRatio(perMin(r), perMin(local)), table.MS(table.Pct(r.each, 50)), table.MS(table.Pct(r.each, 95)))
		}
	}
	t.Print(os.Stdout)
	return nil
}

// rateRatio formats a/b as "1.23x", or "-" when b is 0 (no local sandbox
// finished within a very short -pods-time).
func rateRatio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}
