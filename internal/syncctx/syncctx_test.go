package syncctx

import (
	"context"
	"errors"
	"sync"
	"testing"
)

func TestWait(t *testing.T) {
	t.Run("done", func(t *testing.T) {
		var wg sync.WaitGroup
		wg.Go(func() {})
		if err := Wait(t.Context(), &wg); err != nil {
			t.Errorf("got %v, want nil", err)
		}
	})
	t.Run("done with an ended ctx", func(t *testing.T) {
		var wg sync.WaitGroup
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := Wait(ctx, &wg); err != nil {
			t.Errorf("got %v, want nil: nothing was left to wait for", err)
		}
	})
	t.Run("ctx ends first", func(t *testing.T) {
		var wg sync.WaitGroup
		wg.Add(1)
		defer wg.Done()
		stop := errors.New("stop")
		ctx, cancel := context.WithCancelCause(t.Context())
		cancel(stop)
		if err := Wait(ctx, &wg); !errors.Is(err, stop) {
			t.Errorf("got %v, want the ctx's cause", err)
		}
	})
}
