// Package sandboxfake is a sandbox.Driver that runs nothing, for the unit
// tests of the layers above the drivers (engine, capability): each Exec
// succeeds at once with the code as its output. The drivers themselves are
// proven by sandbox/conformance.
package sandboxfake

import (
	"context"
	"io"
	"sync"
	"syscall"

	"github.com/stockade-sh/stockade/sandbox"
)

// Driver is a sandbox.Driver that runs nothing. Its zero value with an ID
// and a Tier is a driver whose sandboxes succeed at once.
type Driver struct {
	// ID is the driver's name.
	ID   string
	Tier sandbox.Tier
	// Hold, when not nil, makes each Exec wait until it is closed (or its
	// context ends), so that a test can keep executions running.
	Hold chan struct{}
	// HoldDestroy, when not nil, makes each Destroy wait until it is
	// closed, so that a test can act while a sandbox is being destroyed.
	HoldDestroy chan struct{}
	// Down, when not nil, is what Health answers.
	Down error
	// CreateErr, when not nil, is what Create answers.
	CreateErr error
	// Echo makes each Exec pass the code on as output (OnOutput) before
	// it holds.
	Echo bool

	mu    sync.Mutex
	specs []sandbox.Spec
}

func (d *Driver) Name() string { return d.ID }

func (d *Driver) Capabilities() sandbox.Capabilities {
	return sandbox.Capabilities{Tier: d.Tier, Sessions: true}
}

func (d *Driver) Health(context.Context) error { return d.Down }

func (d *Driver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.specs = append(d.specs, spec)
	if d.CreateErr != nil {
		return nil, d.CreateErr
	}
	return fakeSandbox{hold: d.Hold, holdDestroy: d.HoldDestroy, echo: d.Echo}, nil
}

// Specs returns the specs of the sandboxes Create was asked for, in order.
func (d *Driver) Specs() []sandbox.Spec {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]sandbox.Spec(nil), d.specs...)
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

// Images resolves every runtime to a placeholder image.
type Images struct{}

func (Images) Resolve(name string) (sandbox.Image, error) {
	return sandbox.Image{Name: name, Rootfs: "/nonexistent"}, nil
}
