package engine

import (
	"sync"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// WithMemoryBudget bounds the memory of the engine's sandboxes, live and
// pooled, counted by their limits: a run or a new or resumed session whose
// sandbox would take the total past budget is refused
// (ErrResourceExhausted), and a pool does not refill past it. A session
// counts from its opening (or resume) to its Close (or pause); one taken
// from a pool keeps the pool sandbox's count. The sandboxes of a remote
// driver (Capabilities.Remote) do not count: they use another machine's
// memory. Zero or less means no bound.
func WithMemoryBudget(budget int64) Option { return func(e *Engine) { e.mem.budget = budget } }

// memory accounts the memory limits of the engine's sandboxes.
type memory struct {
	mu     sync.Mutex
	budget int64 // 0: none
	used   int64
}

// reserve counts n bytes until release is called (once), or refuses them
// when the budget has no room.
func (m *memory) reserve(n int64) (release func(), err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.budget > 0 && m.used+n > m.budget {
		return nil, m.full(n)
	}
	return m.countLocked(n), nil
}

// reserveOn is reserve for a sandbox of drv: nothing is counted for a
// remote driver's, whose memory is not this host's.
func (e *Engine) reserveOn(drv sandbox.Driver, n int64) (release func(), err error) {
	if drv.Capabilities().Remote {
		return func() {}, nil
	}
	return e.mem.reserve(n)
}

// hold counts n bytes until release is called (once), whatever the budget:
// the memory of a sandbox that exists already (a session re-attached
// after a restart).
func (m *memory) hold(n int64) (release func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.countLocked(n)
}

// countLocked counts n bytes until the returned release; m.mu is held.
func (m *memory) countLocked(n int64) func() {
	m.used += n
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			m.used -= n
			m.mu.Unlock()
		})
	}
}

// room says whether n bytes would fit now; m.mu is not held.
func (m *memory) room(n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.budget > 0 && m.used+n > m.budget {
		return m.full(n)
	}
	return nil
}

// full is the refusal of n bytes; m.mu is held.
func (m *memory) full(n int64) error {
	return errdefs.Publicf("the sandboxes' memory budget (memory_budget %s) has %s left, less than the %s a sandbox needs; retry later: %w",
		sandbox.FormatSize(m.budget), sandbox.FormatSize(max(m.budget-m.used, 0)), sandbox.FormatSize(n), errdefs.ErrResourceExhausted)
}

// Room says whether req could run now within the memory budget: a pool
// sandbox that would serve it is counted already; otherwise its sandbox's
// memory limit must fit. It is ErrResourceExhausted when not, and the
// request's own mistakes are Validate's, not Room's (nil here). It holds
// nothing: an admission that must not be overtaken uses Reserve.
func (e *Engine) Room(req Request) error {
	limits, pooled, ok := e.memoryOf(req)
	if !ok || pooled {
		return nil
	}
	return e.mem.room(limits.Memory)
}

// Reservation is memory of the budget held for a run from its admission
// to its end (Reserve). Nil holds nothing. Safe for concurrent use.
type Reservation struct {
	n       int64
	release func() // nil: nothing held
}

// Release gives the memory back. It is idempotent and nil-safe; Run
// releases the reservation it is given, whatever becomes of the run.
func (r *Reservation) Release() {
	if r != nil && r.release != nil {
		r.release()
	}
}

// Reserve holds in the memory budget what req's run will need, so that
// admissions at once cannot all pass a check that only some of them fit:
// ErrResourceExhausted when the budget has no room now. The caller gives
// the reservation to Run (Request.Reservation), which uses it rather than
// take the budget again, or releases it when the run does not happen.
// When a pool sandbox that would serve req is ready, that sandbox counts
// already and nothing is held (should another run take it first, Run
// takes the budget as it would without a reservation). The request's own
// mistakes are Validate's, not Reserve's: nil, nil for them.
func (e *Engine) Reserve(req Request) (*Reservation, error) {
	limits, pooled, ok := e.memoryOf(req)
	if !ok || pooled {
		return nil, nil
	}
	release, err := e.mem.reserve(limits.Memory)
	if err != nil {
		return nil, err
	}
	return &Reservation{n: limits.Memory, release: release}, nil
}

// memoryOf returns the limits of req's sandbox and whether a pool
// sandbox that would serve it is ready now; ok is false when req does
// not resolve or its sandbox would not count (a remote driver's).
func (e *Engine) memoryOf(req Request) (limits sandbox.Limits, pooled, ok bool) {
	tool, drv, _, err := e.resolve(req)
	if err != nil || drv.Capabilities().Remote {
		return limits, false, false
	}
	limits = req.Limits.WithDefaults(e.Limits(tool))
	e.poolsMu.Lock()
	pools := e.pools
	e.poolsMu.Unlock()
	for _, p := range pools {
		if p.serves(req, tool, limits) {
			p.mu.Lock()
			n := len(p.ready)
			p.mu.Unlock()
			if n > 0 {
				return limits, true, true
			}
		}
	}
	return limits, false, true
}

// takeMemory returns the memory of a cold run of n bytes on drv: r's
// reservation when it holds that much (Run then owns it), else n bytes
// taken from the budget now (none for a remote driver), r's being
// released first.
func (e *Engine) takeMemory(r *Reservation, drv sandbox.Driver, n int64) (release func(), err error) {
	if r != nil && r.release != nil && r.n >= n {
		return r.release, nil
	}
	r.Release()
	return e.reserveOn(drv, n)
}
