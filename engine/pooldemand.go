package engine

import (
	"context"
	"time"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/sandbox"
)

// A pool's size follows its demand, between a floor (PoolSpec.Size or
// Sessions: what the pool holds however idle) and a ceiling (PoolSpec.Max
// or SessionsMax, by default config.DefaultPoolGrowth times the floor).
// Its target starts at the floor. A run (or new session) that the pool
// could serve but found empty (a miss for want of a sandbox), or that
// waited for a refill (awaitRefill), is demand: the target grows by one,
// up to the ceiling. A pool that saw no demand for poolShrinkAfter
// shrinks by one, down to the floor, and destroys the ready sandboxes
// above its target, oldest first; each further poolShrinkAfter without
// demand shrinks it by one more. The memory budget bounds the growth as
// it bounds every refill: a pool whose next sandbox does not fit the
// budget waits (grow).
//
// Admission prefers a refill that is about to end to a cold start: a
// run that finds the pool empty while a refill is in progress waits for
// it when the refill's expected end (its start plus the mean of the
// pool's recent refills) is at most poolWaitBound away, and for at most
// that long; a run still without a sandbox then runs cold. The bound is
// below the cold start it would otherwise pay: 50 ms for a one-shot pool
// (a cold one-shot takes about 70 ms under runc and 300 ms under gVisor
// on the machine of BENCHMARKS.md), 500 ms for a session pool (a cold
// session, its kernel importing numpy and pandas, takes 1-2.5 s).

const (
	// poolShrinkAfter is how long a pool above its floor waits without
	// demand before it shrinks by one.
	poolShrinkAfter = time.Minute
	// poolWaitBound and sessionWaitBound are the longest a run, or a new
	// session, waits for a refill in progress rather than start cold.
	poolWaitBound    = 50 * time.Millisecond
	sessionWaitBound = 500 * time.Millisecond
)

// PoolDemandObserver is told, besides what a PoolObserver is, how the
// pools' demand and refills go (the daemon's /metrics). A PoolObserver
// given to SetPoolObserver that implements it is told. Its methods must be
// safe for concurrent use and not block.
type PoolDemandObserver interface {
	// PoolTarget reports the size pool grows or shrinks toward now.
	PoolTarget(pool string, n int)
	// PoolWait reports a run or session that waited d for one of pool's
	// refills in progress, and whether the refill served it.
	PoolWait(pool string, d time.Duration, served bool)
	// PoolRefillCPU reports the CPU time one refill of pool used (the
	// sandbox's cgroup from its creation, or restore, to its readiness),
	// and whether the sandbox came from the pool's checkpoint.
	PoolRefillCPU(pool string, cpu time.Duration, restored bool)
	// PoolRestoreFailed counts a refill from the pool's checkpoint that
	// failed and fell back to a cold start.
	PoolRestoreFailed(pool string)
}

// demand is a pool's sizing state, guarded by the pool's mu.
type demand struct {
	floor, ceiling, target int
	// last is when the pool last saw demand, or shrank.
	last time.Time
	// refilling counts the refills in progress; started is when the
	// latest began, and mean the mean duration of recent refills (an
	// exponential average; zero until one has ended).
	refilling int
	started   time.Time
	mean      time.Duration
	// added is closed, and replaced, when a sandbox is added.
	added chan struct{}
}

// ceilingOf is the ceiling of a pool of floor with max configured (zero:
// the default).
func ceilingOf(floor, configured int) int {
	if configured <= 0 {
		configured = config.DefaultPoolGrowth * floor
	}
	return max(floor, min(config.MaxPoolSize, configured))
}

// initDemand sets p's floor and ceiling, its target at the floor.
func (p *pool) initDemand(floor, ceiling int) {
	if p.now == nil {
		p.now = time.Now
	}
	p.d = demand{floor: floor, ceiling: max(ceiling, floor), target: floor, last: p.now(), added: make(chan struct{})}
}

// target is the size the pool fills to now.
func (p *pool) target() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.d.target
}

// demanded records demand: the target grows by one, up to the ceiling.
func (p *pool) demanded() {
	p.mu.Lock()
	p.d.last = p.now()
	grew := p.d.target < p.d.ceiling
	if grew {
		p.d.target++
	}
	n := p.d.target
	p.mu.Unlock()
	p.observeTarget(n)
	if grew {
		p.wakeFill()
	}
}

// shrinkIdle shrinks the target by one when the pool saw no demand for
// poolShrinkAfter, down to the floor, and returns the ready sandboxes
// above the target, oldest first, which the caller destroys.
func (p *pool) shrinkIdle() []*warm {
	p.mu.Lock()
	now := p.now()
	if p.d.target <= p.d.floor || now.Sub(p.d.last) < poolShrinkAfter {
		p.mu.Unlock()
		return nil
	}
	p.d.target--
	p.d.last = now
	n := p.d.target
	var extra []*warm
	if k := len(p.ready) - n; k > 0 {
		extra = append(extra, p.ready[:k]...)
		p.ready = append([]*warm(nil), p.ready[k:]...)
	}
	p.mu.Unlock()
	p.observeTarget(n)
	return extra
}

// refillBegins and refillEnds bracket one refill; a refill that made a
// sandbox (took d) feeds the mean and wakes those awaitRefill holds.
func (p *pool) refillBegins() {
	p.mu.Lock()
	p.d.refilling++
	p.d.started = p.now()
	p.mu.Unlock()
}

func (p *pool) refillEnds(d time.Duration, made bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.d.refilling--
	if !made {
		return
	}
	if p.d.mean == 0 {
		p.d.mean = d
	} else {
		p.d.mean = (3*p.d.mean + d) / 4
	}
	close(p.d.added)
	p.d.added = make(chan struct{})
}

// waitBound is the longest a run waits for one of p's refills.
func (p *pool) waitBound() time.Duration {
	if p.session {
		return sessionWaitBound
	}
	return poolWaitBound
}

// awaitRefill waits, when p is empty and a refill in progress is expected
// to end within the wait bound, for a sandbox to be added, and says
// whether one was; it returns at once (false) otherwise.
func (p *pool) awaitRefill(ctx context.Context) bool {
	bound := p.waitBound()
	p.mu.Lock()
	if len(p.ready) > 0 {
		p.mu.Unlock()
		return true
	}
	left := p.d.started.Add(p.d.mean).Sub(p.now())
	if p.d.refilling == 0 || p.d.mean == 0 || left > bound {
		p.mu.Unlock()
		return false
	}
	added := p.d.added
	p.mu.Unlock()
	start := time.Now()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	served := false
	select {
	case <-added:
		served = true
	case <-timer.C:
	case <-ctx.Done():
	}
	if o, ok := p.e.poolObs.(PoolDemandObserver); ok {
		o.PoolWait(p.name, time.Since(start), served)
	}
	return served
}

func (p *pool) observeTarget(n int) {
	if o, ok := p.e.poolObs.(PoolDemandObserver); ok {
		o.PoolTarget(p.name, n)
	}
}

// observeRefill reports one refill's CPU time.
func (p *pool) observeRefill(cpu time.Duration, restored bool) {
	if o, ok := p.e.poolObs.(PoolDemandObserver); ok {
		o.PoolRefillCPU(p.name, cpu, restored)
	}
}

// cpuMeter is a sandbox that reads its cgroup's CPU time (ocidriver's).
type cpuMeter interface{ CPUUsage() time.Duration }

// cpuOf is the CPU time sb's cgroup has used, and whether it can tell.
func cpuOf(sb sandbox.Sandbox) (time.Duration, bool) {
	m, ok := sb.(cpuMeter)
	if !ok {
		return 0, false
	}
	return m.CPUUsage(), true
}
