package conformance

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/sandbox"
)

// execOutcome is how an Exec run in the background ended.
type execOutcome struct {
	res *sandbox.Result
	err error
}

// startBackground runs the probe with args in b in the background, its
// Exec bounded by timeout, and returns once the probe has printed its
// "started" line: the probe's stdout up to then, and the channel that
// gets the Exec's outcome once it ends. It fails t, naming what it
// started, when the probe ends before that line or has not printed it
// within a minute.
func (b *box) startBackground(t *testing.T, timeout time.Duration, what string, args ...string) ([]byte, <-chan execOutcome) {
	t.Helper()
	done := make(chan execOutcome, 1)
	started := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	var out []byte
	go func() {
		res, err := b.exec(t.Context(), sandbox.ExecRequest{
			Timeout: timeout,
			OnOutput: func(st sandbox.Stream, p []byte) {
				mu.Lock()
				defer mu.Unlock()
				if st == sandbox.Stdout {
					out = append(out, p...)
					if bytes.Contains(out, []byte("started\n")) {
						once.Do(func() { close(started) })
					}
				}
			},
		}, args...)
		done <- execOutcome{res, err}
	}()
	select {
	case <-started:
	case o := <-done:
		t.Fatalf("%s: the probe ended before it started: %+v, %v", what, o.res, o.err)
	case <-time.After(time.Minute):
		t.Fatalf("%s: the probe did not start within a minute", what)
	}
	mu.Lock()
	defer mu.Unlock()
	return bytes.Clone(out), done
}
