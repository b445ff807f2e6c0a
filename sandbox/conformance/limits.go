package conformance

import (
	"bytes"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/sandbox"
)

// The checks of resource limits: pids, memory, wall clock and output
// (the CPU limit: cpu.go).

func (s *suite) forkBomb(t *testing.T) {
	b := s.start(t, sandbox.Limits{Pids: pidsLimit})

	// While the bomb runs, measure how late a 10 ms timer fires on the host.
	stop := make(chan struct{})
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }) }
	t.Cleanup(halt)
	worst := make(chan time.Duration, 1)
	go func() {
		var w time.Duration
		for {
			select {
			case <-stop:
				worst <- w
				return
			default:
			}
			t0 := time.Now()
			time.Sleep(10 * time.Millisecond)
			_ = os.Getpid()
			w = max(w, time.Since(t0))
		}
	}()
	res := b.run(t, sandbox.ExecRequest{Timeout: time.Minute}, "forkbomb", "1000", "3000")
	halt()
	w := <-worst
	t.Logf("host: a 10ms sleep took at most %v while the fork bomb ran", w)
	if w > 5*time.Second {
		t.Errorf("host: a 10ms sleep took %v during the fork bomb, want under 5s", w)
	}
	var r struct {
		errno
		Forked         int   `json:"forked"`
		LimitReachedMs int64 `json:"limit_reached_ms"`
	}
	decode(t, res, &r, "forkbomb")
	t.Logf("fork bomb: %d children, then %s after %d ms", r.Forked, r.errno, r.LimitReachedMs)
	if r.Forked >= pidsLimit {
		t.Errorf("fork bomb: got %d children, want fewer than the pids limit %d", r.Forked, pidsLimit)
	}
	if !r.is(syscall.EAGAIN) {
		t.Errorf("fork bomb: fork failed with %s, want EAGAIN (the pids limit)", r.errno)
	}
}

func (s *suite) oom(t *testing.T) {
	b := s.start(t, sandbox.Limits{Memory: memLimit})
	res := b.run(t, sandbox.ExecRequest{Timeout: time.Minute}, "alloc", "1024")
	if res.Status != sandbox.StatusOOMKilled {
		t.Errorf("allocating 1 GiB under a %d MiB limit: got status %s (exit code %d, signal %d), want %s; stderr: %q",
			memLimit>>20, res.Status, res.ExitCode, res.Signal, sandbox.StatusOOMKilled, tail(res.Stderr))
	}
	t.Logf("peak memory %d MiB", res.PeakMemory>>20)
}

func (s *suite) timeout(t *testing.T) {
	for _, args := range [][]string{{"spin"}, {"sleep", "60"}} {
		t.Run(args[0], func(t *testing.T) {
			const limit = 2 * time.Second
			b := s.start(t, sandbox.Limits{})
			start := time.Now()
			res := b.run(t, sandbox.ExecRequest{Timeout: limit}, args...)
			elapsed := time.Since(start)
			if res.Status != sandbox.StatusTimedOut {
				t.Errorf("got status %s (exit code %d), want %s", res.Status, res.ExitCode, sandbox.StatusTimedOut)
			}
			if !bytes.Contains(res.Stdout, []byte("started\n")) {
				t.Errorf("got stdout %q, want the output printed before the timeout (started)", tail(res.Stdout))
			}
			if res.Duration < limit {
				t.Errorf("got Duration %v, want at least the timeout %v", res.Duration, limit)
			}
			if elapsed > limit+10*time.Second {
				t.Errorf("Exec returned after %v, want soon after the timeout %v", elapsed, limit)
			}
			if s.caps.Sessions {
				// The timeout ended the exec, not the sandbox: the next
				// one runs.
				res, err := b.exec(t.Context(), sandbox.ExecRequest{}, "exit", "0")
				if err != nil || res.Status != sandbox.StatusSucceeded {
					t.Errorf("Exec after a timeout: got %+v, %v; want it to run and succeed", res, err)
				}
			}
		})
	}
}

func (s *suite) outputFlood(t *testing.T) {
	b := s.start(t, sandbox.Limits{OutputCap: outputCap})
	res := b.run(t, sandbox.ExecRequest{}, "flood", strconv.Itoa(3*outputCap), "both")
	if res.Status != sandbox.StatusSucceeded {
		t.Errorf("got status %s (exit code %d), want %s: the output beyond the cap is dropped, not fatal", res.Status, res.ExitCode, sandbox.StatusSucceeded)
	}
	for _, o := range []struct {
		name      string
		out       []byte
		truncated bool
	}{{"stdout", res.Stdout, res.StdoutTruncated}, {"stderr", res.Stderr, res.StderrTruncated}} {
		if len(o.out) != outputCap || !o.truncated {
			t.Errorf("%s: got %d bytes, truncated %t; want %d bytes, truncated", o.name, len(o.out), o.truncated, outputCap)
		}
		if len(bytes.Trim(o.out, "x")) != 0 {
			t.Errorf("%s: got bytes other than the probe's output", o.name)
		}
	}
}
