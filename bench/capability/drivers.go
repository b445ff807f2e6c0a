package main

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/sandbox"
)

// fakeDriver is a sandbox.Driver whose sandboxes answer at once with a
// succeeded run printing out. With it under both variants, what remains of
// a call is Stockade's own work: the engine's, and the capability layer's.
type fakeDriver struct{ out []byte }

var _ sandbox.Driver = fakeDriver{}

func (fakeDriver) Name() string { return "fake" }

// Capabilities reports the container tier, so that the default tool, whose
// tier is the default driver's, maps to the name the fake is registered as
// ("runc").
func (fakeDriver) Capabilities() sandbox.Capabilities {
	return sandbox.Capabilities{Tier: sandbox.TierContainer}
}

func (d fakeDriver) Create(context.Context, sandbox.Spec) (sandbox.Sandbox, error) {
	return fakeSandbox{out: d.out}, nil
}

type fakeSandbox struct{ out []byte }

func (fakeSandbox) ID() string { return "fake" }

func (s fakeSandbox) Start(_ context.Context, req sandbox.ExecRequest) (sandbox.Exec, error) {
	// The capability layer streams output to subscribers; feed it as a
	// real driver would.
	if req.OnOutput != nil {
		req.OnOutput(sandbox.Stdout, s.out)
	}
	return doneExec{&sandbox.Result{Status: sandbox.StatusSucceeded, Stdout: s.out}}, nil
}

// doneExec is a program that has ended with res.
type doneExec struct{ res *sandbox.Result }

func (e doneExec) Wait(context.Context) (*sandbox.Result, error) { return e.res, nil }
func (doneExec) Signal(syscall.Signal) error                     { return nil }
func (doneExec) Cancel() error                                   { return nil }
func (doneExec) Stdin() io.WriteCloser                           { return nil }

func (fakeSandbox) Destroy(context.Context) error { return nil }

// timedDriver wraps a driver and adds up the time spent in its calls
// (Create, and the sandbox's Exec, from Start to its end, and Destroy), so that the rest of an
// invocation's time can be told apart from the sandbox's. The sum is only
// meaningful while one invocation runs at a time.
type timedDriver struct {
	sandbox.Driver
	spent atomic.Int64 // nanoseconds since the last take
}

var (
	_ sandbox.HealthChecker = (*timedDriver)(nil)
	_ sandbox.Reaper        = (*timedDriver)(nil)
)

// take returns the time spent in driver calls since the last take and
// starts counting again.
func (d *timedDriver) take() time.Duration { return time.Duration(d.spent.Swap(0)) }

func (d *timedDriver) since(start time.Time) { d.spent.Add(int64(time.Since(start))) }

func (d *timedDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	defer d.since(time.Now())
	sb, err := d.Driver.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &timedSandbox{Sandbox: sb, d: d}, nil
}

// Health and Reap keep the wrapped driver's optional abilities visible to
// the engine and the service, which find them by type assertion.
func (d *timedDriver) Health(ctx context.Context) error {
	if hc, ok := d.Driver.(sandbox.HealthChecker); ok {
		return hc.Health(ctx)
	}
	return nil
}

func (d *timedDriver) Reap(ctx context.Context, match map[string]string) ([]string, error) {
	if r, ok := d.Driver.(sandbox.Reaper); ok {
		return r.Reap(ctx, match)
	}
	return nil, nil
}

type timedSandbox struct {
	sandbox.Sandbox
	d *timedDriver
}

func (s *timedSandbox) Start(ctx context.Context, req sandbox.ExecRequest) (sandbox.Exec, error) {
	start := time.Now()
	ex, err := s.Sandbox.Start(ctx, req)
	if err != nil {
		s.d.since(start)
		return nil, err
	}
	return &timedExec{Exec: ex, d: s.d, start: start}, nil
}

// timedExec counts the time from Start to the first Wait that returns the
// program's end.
type timedExec struct {
	sandbox.Exec
	d     *timedDriver
	start time.Time
	once  sync.Once
}

func (e *timedExec) Wait(ctx context.Context) (*sandbox.Result, error) {
	res, err := e.Exec.Wait(ctx)
	if ctx.Err() == nil {
		e.once.Do(func() { e.d.since(e.start) })
	}
	return res, err
}

func (s *timedSandbox) Destroy(ctx context.Context) error {
	defer s.d.since(time.Now())
	return s.Sandbox.Destroy(ctx)
}
