package main

import (
	"context"
	"sync/atomic"
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

func (s fakeSandbox) Exec(_ context.Context, req sandbox.ExecRequest) (*sandbox.Result, error) {
	// The capability layer streams output to subscribers; feed it as a
	// real driver would.
	if req.OnOutput != nil {
		req.OnOutput(sandbox.Stdout, s.out)
	}
	return &sandbox.Result{Status: sandbox.StatusSucceeded, Stdout: s.out}, nil
}

func (fakeSandbox) Destroy(context.Context) error { return nil }

// timedDriver wraps a driver and adds up the time spent in its calls
// (Create, and the sandbox's Exec and Destroy), so that the rest of an
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

func (s *timedSandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (*sandbox.Result, error) {
	defer s.d.since(time.Now())
	return s.Sandbox.Exec(ctx, req)
}

func (s *timedSandbox) Destroy(ctx context.Context) error {
	defer s.d.since(time.Now())
	return s.Sandbox.Destroy(ctx)
}
