package capability

import (
	"context"
	"sync"

	"github.com/stockade-sh/stockade/engine"
)

// admission bounds the sandboxes running at once (slots) and the
// invocations waiting for one (the queue). New invocations that find both
// full are refused; approved executions, which a human already waited for,
// always queue.
type admission struct {
	slots chan struct{}

	mu          sync.Mutex
	outstanding int // tickets not yet released: running or queued
	limit       int // slots + queue
}

func newAdmission(slots, queue int) *admission {
	return &admission{slots: make(chan struct{}, slots), limit: slots + queue}
}

// ticket is one invocation's place in admission. The zero of *ticket (nil)
// is a valid no-op ticket for release.
type ticket struct {
	a    *admission
	once sync.Once
	held bool
	// mem is the memory reserved for the execution at its admission
	// (nil: none); the run hands it to the runner, release gives it back
	// if the runner has not.
	mem *engine.Reservation
}

// reserve returns a ticket, or nil when the running and queued invocations
// already fill the limit.
func (a *admission) reserve() *ticket {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.outstanding >= a.limit {
		return nil
	}
	a.outstanding++
	return &ticket{a: a}
}

// enqueue returns a ticket regardless of the limit.
func (a *admission) enqueue() *ticket {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.outstanding++
	return &ticket{a: a}
}

// wait blocks until the ticket holds a slot.
func (t *ticket) wait(ctx context.Context) error {
	// A cancelled ctx wins over a free slot, which select would pick at
	// random.
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case t.a.slots <- struct{}{}:
		t.held = true
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// release gives back the slot, the place and the memory. It is
// idempotent and nil-safe.
func (t *ticket) release() {
	if t == nil {
		return
	}
	t.mem.Release()
	t.once.Do(func() {
		if t.held {
			<-t.a.slots
		}
		t.a.mu.Lock()
		t.a.outstanding--
		t.a.mu.Unlock()
	})
}
