package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/kernel"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
	"github.com/stockade-sh/stockade/tools"
)

// A session's sandbox is detached (sandbox.Spec.Detached) on a driver that
// can re-attach one (Capabilities.Reattach): it outlives the daemon, which
// finds it again with ReattachSessions. On a driver that cannot, it is
// not detached and lives as long as the daemon that opened it: the next
// daemon's start ends its session (NoReattach says why) and reaps the
// sandbox by its owner label, as any orphan. It has a /workspace
// of its own and one kernel, started for its runtime, whose state carries
// from cell to cell; the kernel's working directory is /workspace.

// WorkspaceDir is a session's files' directory in its sandbox.
const WorkspaceDir = "/workspace"

// InterruptGrace is how long a cell interrupted at its timeout (SIGINT)
// may take to stop before its kernel is restarted.
const InterruptGrace = 2 * time.Second

// kernelSpec is the kernel a session of runtime rt runs, in its
// /workspace: package kernel's for the runtime, or the guest's test
// kernel for an engine made WithTestKernel.
func (e *Engine) kernelSpec(rt image.Runtime) (sandbox.KernelSpec, error) {
	if e.testKernel {
		return sandbox.KernelSpec{Argv: []string{profile.GuestPath, "stockade-kernel-test"}, Env: ProgramEnv(), Cwd: WorkspaceDir}, nil
	}
	return kernel.Spec(rt.Name, kernel.Options{Cwd: WorkspaceDir, Env: ProgramEnv()})
}

// WithTestKernel makes every session run the guest's test kernel
// (cmd/stockade-guest/testkernel.go: `set K V`, `get K`, `print T`,
// `display M T`, `sleep S`, `fail T`) instead of its runtime's: for the
// tests of the layers above, whose cells then behave exactly as they say.
func WithTestKernel() Option {
	return func(e *Engine) { e.testKernel = true }
}

// SessionSpec describes a session's sandbox.
type SessionSpec struct {
	Runtime string
	// Tool names the tool it runs as; empty means the default tool.
	Tool string
	// Driver overrides the tool's tier (the operator only, as
	// Request.Driver).
	Driver string
	// Workspace is the size of its /workspace in bytes (> 0).
	Workspace int64
	// Limits override the tool's limits where set (Timeout is the
	// default of a cell's).
	Limits sandbox.Limits
	// Labels are the sandbox's (LabelOwner, LabelSession, ...).
	Labels map[string]string
	// Kernel replaces the runtime's kernel (kernelSpec). It exists only so
	// that tests can run kernels that misbehave; the API cannot set it.
	Kernel []string
	// Deadline is when the session's sandbox ends itself if no daemon has
	// ended it before (sandbox.Spec.Deadline, where the driver's sandbox
	// can: sandbox.Deadliner): the caller passes the session's hard end.
	// Zero: never.
	Deadline time.Time
	// Network gives the sandbox egress to its tool's allowlist through
	// the egress proxy, in a network namespace of its own, as a one-shot's
	// (Request.Network): the caller must have approved it. Without it a
	// tool that lists broker operations still reaches the broker, and
	// nothing else.
	Network bool
}

// Session is a session's sandbox and its kernel. Its methods are safe
// for concurrent use; one cell runs at a time (another meanwhile is
// ErrConflict). The caller must Close it to end the session; a daemon that
// stops without closing it leaves it running, for ReattachSessions.
type Session struct {
	sb      sandbox.Sandbox
	files   sandbox.Files
	kernels sandbox.Kernels
	spec    sandbox.KernelSpec
	// Driver, Runtime and Limits are what the session runs on.
	Driver  string
	Runtime image.Runtime
	Limits  sandbox.Limits

	cellMu sync.Mutex // held by the running cell
	mu     sync.Mutex // guards kernel and mem
	kernel sandbox.Kernel
	mem    func() // releases the sandbox's memory from the budget; nil once done
	// prelude is what every kernel started in the sandbox runs before
	// the session's cells: its template's Start and Ready (template.go).
	prelude *prelude
	// net is the sandbox's network (egress to its tool's allowlist, or
	// the broker only), nil without one; Close removes it (egress.go).
	net     *sessionNet
	netOnce sync.Once
}

// releaseMemory takes the session's sandbox out of the memory budget.
func (s *Session) releaseMemory() {
	s.mu.Lock()
	release := s.mem
	s.mem = nil
	s.mu.Unlock()
	if release != nil {
		release()
	}
}

// SandboxID is the session's sandbox's ID.
func (s *Session) SandboxID() string { return s.sb.ID() }

// Network is the session's network, as a one-shot's Result.Network:
// NetworkAllowlist, NetworkBroker or NetworkNone.
func (s *Session) Network() string {
	if s.net == nil {
		return NetworkNone
	}
	return networkOf(s.net.allow, !s.net.allow)
}

// CheckSession checks a session's spec without creating anything and
// returns its tool, driver and runtime (see Validate).
func (e *Engine) CheckSession(spec SessionSpec) (tools.Tool, sandbox.Driver, image.Runtime, error) {
	req := Request{Runtime: spec.Runtime, Tool: spec.Tool, Driver: spec.Driver, Limits: spec.Limits}
	tool, drv, rt, err := e.resolve(req)
	if err == nil {
		err = checkRecordLimits(tool, spec.Limits)
	}
	if err != nil {
		return tools.Tool{}, nil, image.Runtime{}, err
	}
	c := drv.Capabilities()
	if !keepsSessions(c) {
		return tools.Tool{}, nil, image.Runtime{}, errdefs.Publicf("the %s driver cannot keep sessions (%s); %s: %w",
			drv.Name(), lacksForSessions(c), e.sessionDrivers(), errdefs.ErrFailedPrecondition)
	}
	if spec.Workspace <= 0 {
		return tools.Tool{}, nil, image.Runtime{}, errdefs.Publicf("a session's workspace size must be positive, got %d: %w", spec.Workspace, errdefs.ErrInvalidArgument)
	}
	if spec.Network && !slices.Contains(c.NetworkModes, sandbox.NetworkEgress) {
		// Whether this host gives egress at all, and the tool an
		// allowlist, are the admission's to decide (and record).
		return tools.Tool{}, nil, image.Runtime{}, errdefs.Publicf("the %s driver cannot give a session's sandbox egress; use a tool on a tier whose driver does: %w", drv.Name(), errdefs.ErrFailedPrecondition)
	}
	return tool, drv, rt, nil
}

// sessionDrivers says, for a refusal, which of e's drivers keep sessions:
// a server whose drivers all run elsewhere (a cluster, a provider) may
// have none.
func (e *Engine) sessionDrivers() string {
	var names []string
	for name, d := range e.drivers {
		if keepsSessions(d.Capabilities()) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return "no driver of this server keeps sessions"
	}
	slices.Sort(names)
	return "use a tool on the tier of a driver that keeps them (" + strings.Join(names, ", ") + ")"
}

// keepsSessions says whether a driver of capabilities c can keep a
// session: start more than one process in a sandbox (Sessions), with
// kernels and files. Re-attaching its sandbox after a restart
// (Reattach) is not needed: without it, a session ends with its daemon
// (NoReattach).
func keepsSessions(c sandbox.Capabilities) bool { return c.Sessions && c.Kernels && c.Files }

// lacksForSessions says why a driver of capabilities c cannot keep a
// session (keepsSessions).
func lacksForSessions(c sandbox.Capabilities) string {
	var why []string
	for _, f := range []struct {
		name string
		has  bool
	}{{"Sessions", c.Sessions}, {"Kernels", c.Kernels}, {"Files", c.Files}} {
		if !f.has {
			r := c.Lacks[f.name]
			if r == "" {
				r = "it lacks " + f.name
			}
			why = append(why, r)
		}
	}
	return strings.Join(why, "; ")
}

// NoReattach says why the sessions of driver end with the daemon that
// opened them: the driver cannot re-attach a sandbox
// (Capabilities.Reattach), so a restarted daemon cannot serve them again
// and reaps their sandboxes. It is "" for a driver that re-attaches, or
// one this engine does not have.
func (e *Engine) NoReattach(driver string) string {
	d, ok := e.drivers[driver]
	if !ok {
		return ""
	}
	return noReattach(d.Capabilities())
}

// noReattach says why a driver of capabilities c cannot re-attach a
// sandbox; "" when it can.
func noReattach(c sandbox.Capabilities) string {
	if c.Reattach {
		return ""
	}
	if why := c.Lacks["Reattach"]; why != "" {
		return why
	}
	return "it keeps no sandbox beyond the process that created it"
}

// OpenSession creates a session's sandbox (detached where its driver can
// re-attach it) and starts its kernel, or takes a session pool's sandbox
// whose kernel is ready when one serves spec (pool.go), or restores its
// template's golden checkpoint when it has one (golden.go). Nothing is
// left behind on error.
func (e *Engine) OpenSession(ctx context.Context, spec SessionSpec) (_ *Session, err error) {
	tool, drv, rt, err := e.CheckSession(spec)
	if err != nil {
		return nil, err
	}
	// A pool's sandboxes and a golden checkpoint have no network, and no
	// driver here gives an unbound sandbox one at bind time
	// (Capabilities.BindEgress) that a pool asks for: a session with a
	// network is always made cold.
	networked := spec.Network || len(tool.Credentials) > 0
	if !networked {
		if s := e.acquireSession(ctx, spec, tool, drv, rt); s != nil {
			return s, nil
		}
	}
	// Made: restored from a golden checkpoint, or cold.
	ctx, sp := telemetry.Start(ctx, telemetry.SandboxCreate, telemetry.Driver(drv.Name()))
	defer sp.End(&err)
	if !networked {
		if s := e.restoreGolden(ctx, spec, tool, drv); s != nil {
			sp.Set(telemetry.Restored())
			return s, nil
		}
	}
	sspec, err := e.specFor(ctx, tool, drv, rt, spec.Limits)
	if err != nil {
		return nil, err
	}
	limits := sspec.Limits
	// A driver that cannot re-attach keeps the sandbox for as long as
	// this daemon runs (see NoReattach); the deadline is then the
	// driver's to use or ignore (sandbox.Spec.Deadline).
	detached := drv.Capabilities().Reattach
	sspec.Labels, sspec.Detached, sspec.Workspace, sspec.Deadline = withImage(spec.Labels, sspec.Image.Digest), detached, spec.Workspace, spec.Deadline
	release, err := e.reserveOn(drv, limits.Memory)
	if err != nil {
		return nil, err
	}
	var net *sessionNet
	if networked {
		if net, err = e.openSessionNet(ctx, tool, drv, spec.Network, &sspec); err != nil {
			release()
			return nil, err
		}
	}
	release = e.inUse.hold(sspec.Image.Digest, release)
	sb, err := drv.Create(ctx, sspec)
	if err != nil {
		release()
		if net != nil {
			err = errors.Join(err, e.closeEgress(sspec.ID, net.Egress))
		}
		return nil, fmt.Errorf("creating %s sandbox for a session: %w", drv.Name(), err)
	}
	defer func() {
		if err != nil {
			_ = sb.Destroy(context.WithoutCancel(ctx))
			if net != nil {
				e.closeEgressLater(sb.ID(), net.Egress)
			}
			release()
		}
	}()
	ks, pre, err := e.sessionKernel(tool, rt, nil)
	if err != nil {
		return nil, err
	}
	s, err := newSession(sb, drv.Name(), rt, limits, ks)
	if err != nil {
		return nil, err
	}
	s.prelude, s.net = pre, net
	if spec.Kernel != nil {
		s.spec.Argv = spec.Kernel
	}
	if err := s.startKernel(ctx); err != nil {
		return nil, err
	}
	s.mem = release
	return s, nil
}

func newSession(sb sandbox.Sandbox, driver string, rt image.Runtime, limits sandbox.Limits, ks sandbox.KernelSpec) (*Session, error) {
	files, fok := sb.(sandbox.Files)
	kernels, kok := sb.(sandbox.Kernels)
	if !fok || !kok {
		return nil, errdefs.Publicf("the %s sandbox %s has no files or kernels: %w", driver, sb.ID(), errdefs.ErrFailedPrecondition)
	}
	return &Session{sb: sb, files: files, kernels: kernels, Driver: driver, Runtime: rt, Limits: limits,
		spec: ks}, nil
}

// ReattachSessions finds the live session sandboxes of every driver that
// can re-attach, whose labels contain match (the daemon's owner label),
// each with its kernel (a kernel that died meanwhile is started again,
// empty) and its network (sessionnet.go); the drivers destroy the
// sandboxes they cannot prove their own. specOf gives each sandbox's
// session (by the sandbox's ID) from its record: its runtime, tool and
// network (Runtime, Tool, Network); a sandbox it does not know is
// destroyed, and the networks of the sandboxes not re-attached are
// removed, unless a driver's Reattach failed. The caller must Close what it returns or keep it.
func (e *Engine) ReattachSessions(ctx context.Context, match map[string]string, specOf func(sandboxID string) (SessionSpec, bool)) ([]*Session, error) {
	var (
		out  []*Session
		errs []error
	)
	for name, d := range e.drivers {
		r, ok := d.(sandbox.Reattacher)
		if !ok {
			continue
		}
		sbs, err := r.Reattach(ctx, match)
		if err != nil {
			// The sandboxes it proved its own are served still.
			errs = append(errs, fmt.Errorf("re-attaching %s sandboxes: %w", name, err))
		}
		for _, sb := range sbs {
			s, err := e.adopt(ctx, sb, name, specOf)
			if err != nil {
				e.log.Warn("destroying a session sandbox that cannot be served again", "driver", name, "sandbox", sb.ID(), "err", err)
				_ = sb.Destroy(context.WithoutCancel(ctx))
				continue
			}
			out = append(out, s)
		}
	}
	// A driver that could not list its sandboxes (a transient error of its
	// runtime) may still have live ones, whose networks must stay: they
	// are removed at a start whose every Reattach succeeded.
	if len(errs) == 0 {
		e.removeUnusedNets(out)
	}
	return out, errors.Join(errs...)
}

func (e *Engine) adopt(ctx context.Context, sb sandbox.Sandbox, driver string, specOf func(string) (SessionSpec, bool)) (_ *Session, err error) {
	spec, ok := specOf(sb.ID())
	if !ok {
		return nil, errors.New("no active session has it")
	}
	spec.Driver = driver
	s, err := e.liveOf(sb, driver, spec)
	if err != nil {
		return nil, err
	}
	// Its network first: a kernel started again may reach out at once.
	if s.net, err = e.adoptNet(ctx, sb, spec); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil && s.net != nil {
			// The caller destroys the sandbox.
			e.closeEgressLater(sb.ID(), s.net.Egress)
		}
	}()
	// A sandbox made before sandboxes had deadlines gets its session's; one
	// that cannot take it is served still, as it was before.
	if err := setDeadline(ctx, sb, spec.Deadline); err != nil {
		e.log.Warn("moving a re-attached session sandbox's deadline", "driver", driver, "sandbox", sb.ID(), "err", err)
	}
	found, err := s.takeKernel(ctx)
	if err == nil && !found {
		err = s.startKernel(ctx)
	}
	if err != nil {
		return nil, err
	}
	s.mem = e.inUse.hold(e.sessionImage(sb, spec), e.mem.hold(e.sessionMemory(spec)))
	return s, nil
}

// sessionImage is the digest of the image session sandbox sb of spec
// runs: its label's (LabelImage), or, for a sandbox made before sandboxes
// had it, its tool's current one.
func (e *Engine) sessionImage(sb sandbox.Sandbox, spec SessionSpec) string {
	digest := ""
	if tool, _, rt, err := e.resolve(Request{Runtime: spec.Runtime, Tool: spec.Tool, Driver: spec.Driver}); err == nil {
		if img, _, err := e.imageOf(tool, rt); err == nil {
			digest = img.Digest
		}
	}
	return imageLabel(sb, digest)
}

// setDeadline moves the deadline of session sandbox sb to t, where its
// driver's sandboxes have one (sandbox.Deadliner); the zero t leaves it.
func setDeadline(ctx context.Context, sb sandbox.Sandbox, t time.Time) error {
	d, ok := sb.(sandbox.Deadliner)
	if !ok || t.IsZero() {
		return nil
	}
	return d.SetDeadline(ctx, t)
}

// sessionMemory is the memory limit a session counts in the budget when
// it is served again (re-attached, resumed): its tool's for its runtime,
// as OpenSession counted it (a session has no limits of its own beyond
// its tool's), or the defaults' for a tool no longer configured.
func (e *Engine) sessionMemory(spec SessionSpec) int64 {
	tool, _, _, err := e.resolve(Request{Runtime: spec.Runtime, Tool: spec.Tool, Driver: spec.Driver})
	if err != nil {
		return e.defaults.Memory
	}
	return e.Limits(tool).Memory
}

// liveOf is the session of spec (its Runtime and Tool) that sandbox sb,
// which has processes already, serves. A kernel it starts is its tool's
// (its template's, with Start), or the runtime's for a tool no longer
// configured.
func (e *Engine) liveOf(sb sandbox.Sandbox, driver string, spec SessionSpec) (*Session, error) {
	tool, err := e.tools.Get(spec.Tool)
	if err != nil {
		tool = tools.Tool{}
	}
	name := spec.Runtime
	if name == "" {
		// A template's session may have been recorded without its base.
		name, _ = e.templateRuntime(tool, name)
	}
	rt, ok := image.Runtimes[name]
	if !ok {
		return nil, fmt.Errorf("unknown runtime %q", spec.Runtime)
	}
	ks, pre, err := e.sessionKernel(tool, rt, nil)
	if err != nil {
		return nil, err
	}
	s, err := newSession(sb, driver, rt, sandbox.Limits{}, ks)
	if err != nil {
		return nil, err
	}
	s.prelude = pre
	return s, nil
}

// takeKernel makes the first live kernel of the sandbox the session's,
// stops any other (a session has one), and reports whether there was
// one.
func (s *Session) takeKernel(ctx context.Context) (bool, error) {
	ks, err := s.kernels.ListKernels(ctx)
	if err != nil || len(ks) == 0 {
		return false, err
	}
	s.mu.Lock()
	s.kernel = ks[0]
	s.mu.Unlock()
	for _, k := range ks[1:] {
		_ = k.Stop(ctx)
	}
	return true, nil
}

func (s *Session) startKernel(ctx context.Context) error {
	k, err := s.kernels.StartKernel(ctx, s.spec)
	if err != nil {
		return fmt.Errorf("starting the %s kernel of sandbox %s: %w", s.Runtime.Name, s.sb.ID(), err)
	}
	if err := s.prelude.run(ctx, k); err != nil {
		_ = k.Stop(context.WithoutCancel(ctx))
		return err
	}
	s.mu.Lock()
	s.kernel = k
	s.mu.Unlock()
	return nil
}

func (s *Session) currentKernel() sandbox.Kernel {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kernel
}

// Interrupt interrupts the running cell (SIGINT to the kernel) and
// reports whether one was running.
func (s *Session) Interrupt() (bool, error) {
	if s.cellMu.TryLock() {
		s.cellMu.Unlock()
		return false, nil
	}
	k := s.currentKernel()
	if k == nil {
		return false, nil
	}
	return true, k.Interrupt()
}

// Close ends the session: its kernel and sandbox are destroyed, and its
// network with them (as Sandbox.Destroy's: the proxy has decided every
// request of the sandbox when Close returns; the namespace is removed in
// the background, and the engine's Wait waits for it). ctx's deadline
// bounds the destroy, its cancellation does not: a client gone leaves no
// sandbox behind. Closing twice is success.
func (s *Session) Close(ctx context.Context) (err error) {
	dctx := context.WithoutCancel(ctx)
	if by, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		dctx, cancel = context.WithDeadline(dctx, by)
		defer cancel()
	}
	ctx, sp := telemetry.Start(dctx, telemetry.SandboxDestroy, telemetry.Driver(s.Driver))
	defer sp.End(&err)
	err = s.sb.Destroy(ctx)
	s.releaseMemory()
	s.closeNet()
	return err
}
