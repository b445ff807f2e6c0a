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

// timedDriver wraps a driver and remembers how long the last sandbox lived
// as seen from the engine: from the start of Create to the end of Destroy.
// That span is only meaningful while one sandbox runs at a time.
type timedDriver struct {
	sandbox.Driver
	last atomic.Int64 // nanoseconds
}

var (
	_ sandbox.HealthChecker = (*timedDriver)(nil)
	_ sandbox.Reaper        = (*timedDriver)(nil)
)

func (d *timedDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	start := time.Now()
	sb, err := d.Driver.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &timedSandbox{Sandbox: sb, d: d, start: start}, nil
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

// lastSpan returns the span of the last destroyed sandbox.
func (d *timedDriver) lastSpan() time.Duration { return time.Duration(d.last.Load()) }

type timedSandbox struct {
	sandbox.Sandbox
	d     *timedDriver
	start time.Time
}

func (s *timedSandbox) Destroy(ctx context.Context) error {
	err := s.Sandbox.Destroy(ctx)
	s.d.last.Store(int64(time.Since(s.start)))
	return err
}
