// Package sandboxfake is a sandbox.Driver that runs nothing, for the unit
// tests of the layers above the drivers (engine, capability): each Exec
// succeeds at once with the code as its output. The drivers themselves are
// proven by sandbox/conformance.
package sandboxfake

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"sync"
	"syscall"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/templates"
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
	// closed (or its context ends, which fails it), so that a test can
	// act while a sandbox is being destroyed.
	HoldDestroy chan struct{}
	// Down, when not nil, is what Health answers.
	Down error
	// CreateErr, when not nil, is what Create answers.
	CreateErr error
	// Echo makes each Exec pass the code on as output (OnOutput) before
	// it holds.
	Echo bool
	// Sessions makes its sandboxes keep sessions: they have Files (that
	// keep nothing) and Kernels, and the driver says it can re-attach
	// (though it finds nothing to). A kernel runs a cell as Exec runs
	// code (Echo, Hold); an interrupt ends the cell raising.
	Sessions bool
	// NoReattach, with Sessions, makes the driver one that keeps sessions
	// without re-attaching them (no Capabilities.Reattach): it refuses a
	// detached sandbox, as the docker and kubernetes drivers do.
	NoReattach bool
	// Lose, when not nil, is closed to end every session sandbox by
	// itself, as its shim does at its deadline: the kernel of a running
	// cell dies, and no kernel starts any more.
	Lose chan struct{}
	// Remote makes it a remote driver (Capabilities.Remote), whose
	// sandboxes run off this host.
	Remote bool
	// BindFixedLimits makes it say that its Bind cannot change memory and
	// CPU (Capabilities.BindFixedLimits), as the kubernetes driver's.
	BindFixedLimits bool

	mu        sync.Mutex
	specs     []sandbox.Spec
	destroyed int
}

func (d *Driver) Name() string { return d.ID }

func (d *Driver) Capabilities() sandbox.Capabilities {
	c := sandbox.Capabilities{Tier: d.Tier, Sessions: true, Remote: d.Remote, BindFixedLimits: d.BindFixedLimits}
	if d.Sessions {
		c.Reattach, c.Files, c.Kernels = !d.NoReattach, true, true
	}
	if !c.Reattach {
		c.Lacks = map[string]string{"Reattach": "the fake driver keeps no sandbox beyond its creator"}
	}
	return c
}

func (d *Driver) Health(context.Context) error { return d.Down }

func (d *Driver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.specs = append(d.specs, spec)
	if spec.Detached && d.NoReattach {
		return nil, fmt.Errorf("the fake driver cannot detach a sandbox: %w", errdefs.ErrInvalidArgument)
	}
	if d.CreateErr != nil {
		return nil, d.CreateErr
	}
	sb := fakeSandbox{drv: d, hold: d.Hold, holdDestroy: d.HoldDestroy, echo: d.Echo}
	if d.Sessions {
		return sessionSandbox{fakeSandbox: sb, lose: d.Lose}, nil
	}
	return sb, nil
}

// Specs returns the specs of the sandboxes Create was asked for, in order.
func (d *Driver) Specs() []sandbox.Spec {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]sandbox.Spec(nil), d.specs...)
}

// Destroyed returns how many of its sandboxes were destroyed (Destroy
// called and returned).
func (d *Driver) Destroyed() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.destroyed
}

type fakeSandbox struct {
	drv               *Driver
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

func (s fakeSandbox) Destroy(ctx context.Context) error {
	if s.holdDestroy != nil {
		select {
		case <-s.holdDestroy:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.drv.mu.Lock()
	s.drv.destroyed++
	s.drv.mu.Unlock()
	return nil
}

// Images resolves every runtime to a placeholder image, and each of
// Templates to a placeholder build of its declaration. The nil Templates
// has none.
type Images struct {
	Templates *templates.Set
}

func (Images) Resolve(name string) (sandbox.Image, error) {
	return sandbox.Image{Name: name, Rootfs: "/nonexistent"}, nil
}

// ResolveTemplate returns a placeholder image of the template name, whose
// manifest carries its declaration's base and start, as a build's does.
func (i Images) ResolveTemplate(name string) (sandbox.Image, image.Manifest, error) {
	t, err := i.Templates.Get(name)
	if err != nil {
		return sandbox.Image{}, image.Manifest{}, err
	}
	img := sandbox.Image{Name: name, Digest: templates.Key(t), Rootfs: "/nonexistent"}
	return img, image.Manifest{Name: name, Digest: img.Digest, Template: &image.TemplateManifest{
		Name: t.Name, Base: t.Base, Declaration: templates.Key(t),
		Env: t.Env, Workdir: t.Workdir, Start: t.Start, Ready: t.Ready, Golden: t.Golden,
	}}, nil
}

// sessionSandbox is a fakeSandbox that keeps sessions (Driver.Sessions).
type sessionSandbox struct {
	fakeSandbox
	lose chan struct{}
}

var (
	_ sandbox.Files   = sessionSandbox{}
	_ sandbox.Kernels = sessionSandbox{}
	_ sandbox.Kernel  = (*fakeKernel)(nil)
)

// lost says whether the sandbox has ended by itself (Driver.Lose).
func (s sessionSandbox) lost() bool {
	select {
	case <-s.lose:
		return true
	default:
		return false
	}
}

func (s sessionSandbox) WriteFile(_ context.Context, _ string, _ fs.FileMode, r io.Reader, _ int64) (int64, error) {
	return io.Copy(io.Discard, r)
}

func (sessionSandbox) ReadFile(context.Context, string, int64) ([]byte, sandbox.FileInfo, error) {
	return nil, sandbox.FileInfo{}, errdefs.ErrNotFound
}

func (sessionSandbox) ListDir(context.Context, string) ([]sandbox.FileInfo, bool, error) {
	return nil, false, nil
}

func (sessionSandbox) Stat(context.Context, string) (sandbox.FileInfo, error) {
	return sandbox.FileInfo{}, errdefs.ErrNotFound
}

func (sessionSandbox) Remove(context.Context, string) error { return nil }

func (sessionSandbox) Mkdir(context.Context, string, fs.FileMode) error { return nil }

func (s sessionSandbox) StartKernel(context.Context, sandbox.KernelSpec) (sandbox.Kernel, error) {
	if s.lost() {
		return nil, fmt.Errorf("the fake sandbox is gone: %w", errdefs.ErrFailedPrecondition)
	}
	return &fakeKernel{sb: s, done: make(chan struct{}), interrupt: make(chan struct{}, 1)}, nil
}

func (sessionSandbox) ListKernels(context.Context) ([]sandbox.Kernel, error) { return nil, nil }

// closed is a closed channel: a Hold that holds nothing.
var closed = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// fakeKernel is a sessionSandbox's kernel.
type fakeKernel struct {
	sb        sessionSandbox
	done      chan struct{}
	interrupt chan struct{}
	stop      sync.Once
}

func (*fakeKernel) ID() string { return "fake-kernel" }

func (k *fakeKernel) Run(ctx context.Context, c sandbox.Cell) (*sandbox.CellResult, error) {
	if k.sb.echo && c.OnOutput != nil {
		c.OnOutput(sandbox.Stdout, []byte(c.Code))
	}
	hold := k.sb.hold
	if hold == nil {
		hold = closed
	}
	select {
	case <-hold:
	case <-k.interrupt:
		return &sandbox.CellResult{Status: sandbox.CellRaised, Error: &sandbox.CellError{Name: "KeyboardInterrupt"}}, nil
	case <-k.sb.lose:
		k.end()
		return nil, fmt.Errorf("the fake kernel died with its sandbox: %w", errdefs.ErrFailedPrecondition)
	case <-k.done:
		return nil, fmt.Errorf("the fake kernel was stopped: %w", errdefs.ErrFailedPrecondition)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &sandbox.CellResult{Status: sandbox.CellOK, Stdout: []byte(c.Code)}, nil
}

func (k *fakeKernel) Interrupt() error {
	select {
	case k.interrupt <- struct{}{}:
	default:
	}
	return nil
}

func (k *fakeKernel) end() { k.stop.Do(func() { close(k.done) }) }

func (k *fakeKernel) Stop(context.Context) error {
	k.end()
	return nil
}

func (k *fakeKernel) Done() <-chan struct{} { return k.done }
