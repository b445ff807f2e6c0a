// Package syncctx waits for a sync.WaitGroup within a context's bound:
// what a Close or Wait that takes a ctx does with the goroutines it waits
// for.
package syncctx

import (
	"context"
	"sync"
	"time"
)

// grace is how long Wait still waits, once ctx has ended, for a group
// that is done already: an ended ctx does not hide that nothing was left
// to wait for.
const grace = 10 * time.Millisecond

// Wait waits until wg's counter is zero, and returns nil, or until ctx
// ends first, and returns its cause; the goroutine waiting for wg then
// goes on until the group is done.
func Wait(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	select {
	case <-done:
		return nil
	case <-time.After(grace):
		return context.Cause(ctx)
	}
}
