package capability

import (
	"context"
	"io"
	"sync"
	"syscall"

	"github.com/stockade-sh/stockade/sandbox"
)

// fakeDriver is a sandbox.Driver that runs nothing: each Exec succeeds at
// once with the code as its output. It unit-tests the capability layer over the real
// engine; the drivers themselves are proven by sandbox/conformance.
type fakeDriver struct {
	name string
	tier sandbox.Tier
	// hold, when not nil, makes each Exec wait until it is closed (or its
	// context ends), so that a test can keep executions running.
	hold chan struct{}
	// holdDestroy, when not nil, makes each Destroy wait until it is
	// closed, so that a test can act while a sandbox is being destroyed.
	holdDestroy chan struct{}
	// down, when not nil, is what Health answers.
	down error
	// createErr, when not nil, is what Create answers.
	createErr error
	// echo makes each Exec pass the code on as output (OnOutput) before
	// it holds.
	echo bool

	mu    sync.Mutex
	specs []sandbox.Spec
}

func (d *fakeDriver) Name() string { return d.name }

func (d *fakeDriver) Capabilities() sandbox.Capabilities {
	return sandbox.Capabilities{Tier: d.tier, Sessions: true}
}

func (d *fakeDriver) Health(context.Context) error { return d.down }

func (d *fakeDriver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.specs = append(d.specs, spec)
	if d.createErr != nil {
		return nil, d.createErr
	}
	return fakeSandbox{hold: d.hold, holdDestroy: d.holdDestroy, echo: d.echo}, nil
}

type fakeSandbox struct {
	hold, holdDestroy chan struct{}
	echo              bool
}

func (fakeSandbox) ID() string { return "fake" }

func (s fakeSandbox) Start(ctx context.Context, req sandbox.ExecRequest) (sandbox.Exec, error) {
	ex := &fakeExec{done: make(chan struct{})}
	go func() {
		ex.res, ex.err = s.run(ctx, req)
		close(ex.done)
	}()
	return ex, nil
}

func (s fakeSandbox) run(ctx context.Context, req sandbox.ExecRequest) (*sandbox.Result, error) {
	if s.echo && req.OnOutput != nil {
		req.OnOutput(sandbox.Stdout, req.File.Data)
	}
	if s.hold != nil {
		select {
		case <-s.hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &sandbox.Result{Status: sandbox.StatusSucceeded, Stdout: req.File.Data}, nil
}

// fakeExec is a fakeSandbox's program: it ends when run returns.
type fakeExec struct {
	done chan struct{}
	res  *sandbox.Result
	err  error
}

func (e *fakeExec) Wait(ctx context.Context) (*sandbox.Result, error) {
	select {
	case <-e.done:
		return e.res, e.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (*fakeExec) Signal(syscall.Signal) error { return nil }
func (*fakeExec) Cancel() error               { return nil }
func (*fakeExec) Stdin() io.WriteCloser       { return nil }

func (s fakeSandbox) Destroy(context.Context) error {
	if s.holdDestroy != nil {
		<-s.holdDestroy
	}
	return nil
}

// fakeImages resolves every runtime to a placeholder image.
type fakeImages struct{}

func (fakeImages) Resolve(name string) (sandbox.Image, error) {
	return sandbox.Image{Name: name, Rootfs: "/nonexistent"}, nil
}
