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
// from a pool keeps the pool sandbox's count. Zero or less means no bound.
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
// request's own mistakes are Validate's, not Room's (nil here).
func (e *Engine) Room(req Request) error {
	tool, _, _, err := e.resolve(req)
	if err != nil {
		return nil
	}
	limits := req.Limits.WithDefaults(e.Limits(tool))
	e.poolsMu.Lock()
	pools := e.pools
	e.poolsMu.Unlock()
	for _, p := range pools {
		if p.serves(req, tool, limits) {
			p.mu.Lock()
			n := len(p.ready)
			p.mu.Unlock()
			if n > 0 {
				return nil
			}
		}
	}
	return e.mem.room(limits.Memory)
}
