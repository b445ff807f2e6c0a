package engine

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/config"
)

// fakeClock is a clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// demandPool is a pool with no driver, of floor and ceiling, on clock:
// enough for its sizing.
func demandPool(floor, ceiling int, clock *fakeClock) *pool {
	p := &pool{e: &Engine{}, name: "test/python", wake: make(chan struct{}, 1), now: clock.Now}
	p.initDemand(floor, ceiling)
	return p
}

// TestPoolDemandGrowsAndShrinks drives a pool's target with demand on a
// fake clock: misses grow it by one each up to the ceiling, and each
// poolShrinkAfter without demand shrinks it by one down to the floor,
// while demand within that time holds it.
func TestPoolDemandGrowsAndShrinks(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	p := demandPool(2, 4, clock)
	if got := p.target(); got != 2 {
		t.Fatalf("got target %d at start, want the floor 2", got)
	}
	if !p.wanted() {
		t.Fatal("an empty pool of target 2 does not want a sandbox")
	}
	var got []int
	for range 4 {
		p.demanded()
		got = append(got, p.target())
	}
	if want := []int{3, 4, 4, 4}; !equalInts(got, want) {
		t.Fatalf("targets after each miss: got %v, want %v (grow by one up to the ceiling)", got, want)
	}
	// Demand within poolShrinkAfter holds the target.
	clock.advance(poolShrinkAfter / 2)
	if extra := p.shrinkIdle(); extra != nil || p.target() != 4 {
		t.Fatalf("shrank to %d after %v without demand, want 4 held", p.target(), poolShrinkAfter/2)
	}
	p.demanded()
	clock.advance(poolShrinkAfter - time.Second)
	if p.shrinkIdle(); p.target() != 4 {
		t.Fatalf("shrank to %d within %v of the last demand, want 4", p.target(), poolShrinkAfter)
	}
	got = nil
	for range 4 {
		clock.advance(poolShrinkAfter)
		p.shrinkIdle()
		got = append(got, p.target())
	}
	if want := []int{3, 2, 2, 2}; !equalInts(got, want) {
		t.Fatalf("targets after each idle %v: got %v, want %v (shrink by one down to the floor)", poolShrinkAfter, got, want)
	}
}

// TestPoolDemandShrinkDestroysExtra checks that a pool shrinking below
// what it holds hands back its oldest ready sandboxes, keeping the target.
func TestPoolDemandShrinkDestroysExtra(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	p := demandPool(1, 3, clock)
	p.demanded()
	p.demanded()
	ws := []*warm{{}, {}, {}} // oldest first
	p.ready = append([]*warm(nil), ws...)
	if p.wanted() {
		t.Fatal("a pool holding its target wants more")
	}
	clock.advance(poolShrinkAfter)
	extra := p.shrinkIdle()
	if len(extra) != 1 || extra[0] != ws[0] || len(p.ready) != 2 || p.ready[0] != ws[1] {
		t.Fatalf("shrinking 3 to 2: got %d extra (oldest first: %v), %d kept; want the oldest handed back", len(extra), len(extra) > 0 && extra[0] == ws[0], len(p.ready))
	}
}

// TestPoolDemandCeilingOf checks the ceilings of the configuration: the
// default multiple of the floor, never below the floor nor above
// config.MaxPoolSize.
func TestPoolDemandCeilingOf(t *testing.T) {
	for _, c := range []struct{ floor, max, want int }{
		{2, 0, 2 * config.DefaultPoolGrowth},
		{2, 5, 5},
		{3, 1, 3},
		{40, 0, config.MaxPoolSize},
	} {
		if got := ceilingOf(c.floor, c.max); got != c.want {
			t.Errorf("ceilingOf(%d, %d) = %d, want %d", c.floor, c.max, got, c.want)
		}
	}
}

// TestPoolAwaitsRefill checks admission's wait: an empty pool with a
// refill expected within the bound waits for it and is served when it
// lands; one whose refill is expected later, or that has none, does not
// wait. No time is asserted: the refill lands from another goroutine.
func TestPoolAwaitsRefill(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	p := demandPool(1, 2, clock)
	if p.awaitRefill(t.Context()) {
		t.Fatal("an empty pool with no refill in progress served a wait")
	}
	// A first refill sets the mean: 40 ms, within the one-shot bound.
	p.refillBegins()
	p.refillEnds(40*time.Millisecond, true)
	p.refillBegins()
	clock.advance(10 * time.Millisecond)
	landed := make(chan struct{})
	go func() {
		defer close(landed)
		p.mu.Lock()
		p.ready = append(p.ready, &warm{})
		p.mu.Unlock()
		p.refillEnds(40*time.Millisecond, true)
	}()
	if !p.awaitRefill(t.Context()) {
		t.Fatal("a wait for a refill expected within the bound was not served")
	}
	<-landed
	// A refill expected past the bound is not waited for.
	p.ready = nil
	p.refillEnds(10*time.Second, true) // the mean grows past the bound
	p.refillBegins()
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // were it to wait, it would end at once, unserved
	if p.awaitRefill(ctx) {
		t.Fatal("served by a refill expected past the bound")
	}
	p.mu.Lock()
	mean := p.d.mean
	p.mu.Unlock()
	if mean <= poolWaitBound {
		t.Fatalf("mean refill %v, want above the bound %v for this check to mean anything", mean, poolWaitBound)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestPoolGrowsOnDemand runs two programs at once from a runc pool of one
// (ceiling two): one is served, the other finds the pool empty and either
// runs cold (a miss) or waits for the refill in progress and is served by
// it (awaitRefill); either is demand, and the pool grows to two and fills
// to two. A second run that the scheduler held back until the refill had
// landed found a full pool and made no demand: the pair is run again, at
// most three times. Its only bound is waitReady's.
func TestPoolGrowsOnDemand(t *testing.T) {
	e, counts := pooledEngine(t, realDrivers(t), "runc", 1)
	waitReady(t, e, 1)
	p := e.pools[0]
	if got := p.target(); got != 1 {
		t.Fatalf("got target %d before any demand, want the floor 1", got)
	}
	for pair := 1; ; pair++ {
		hits0, misses0 := counts.get()
		counts.smu.Lock()
		served0 := counts.waitServed
		counts.smu.Unlock()
		errs := make(chan error, 2)
		for range 2 {
			go func() {
				res, err := e.Run(context.Background(), Request{Runtime: "python", Code: []byte("import time\ntime.sleep(0.5)\nprint('done')")})
				if err == nil && res.Stdout != "done\n" {
					err = fmt.Errorf("got stdout %q", res.Stdout)
				}
				errs <- err
			}()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		hits, misses := counts.get()
		hits, misses = hits-hits0, misses-misses0
		counts.smu.Lock()
		served := counts.waitServed - served0
		counts.smu.Unlock()
		if hits+misses != 2 {
			t.Fatalf("got %d hits and %d misses for two runs", hits, misses)
		}
		if misses == 1 || served == 1 {
			break // one run found the pool empty
		}
		if misses != 0 || served != 0 || pair == 3 {
			t.Fatalf("pair %d: got %d hits, %d misses, %d served by a refill they waited for; want one run to find the pool empty", pair, hits, misses, served)
		}
		t.Logf("pair %d: both runs found a sandbox ready; running the pair again", pair)
		waitReady(t, e, 1)
	}
	if got := p.target(); got != 2 {
		t.Fatalf("got target %d after a miss, want 2", got)
	}
	waitReady(t, e, 2)
}
