package engine

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// A warm pool holds sandboxes of one (tool, runtime), created unbound
// (sandbox.Binder) before anyone asks for them, each with its interpreter
// already started: for python, numpy and pandas imported. A one-shot run
// that the pool can serve takes one, binds it to its workspace and
// execution (Bind, once), runs its code in it, and destroys it: a pool
// sandbox serves exactly one run and is never returned. The pool refills in
// the background.
//
// How the started interpreter runs the code: it is the run's program
// itself. The pool starts, in each sandbox, the Exec a cold run would start
// (the same environment, the same /tmp/main.py, the same guest Exec with its
// output caps, OOM and signal reporting), except that its argv is
// pool.py, which imports numpy and pandas and then reads the program from
// its streamed stdin and runs it as __main__. The alternatives cost more or
// differ more: a kernel cell reports an exception as a value and has no
// exit code, signal or OOM of its own, and a fork server needs a process in
// the sandbox to carry the run's stdio to it (a Go program's start alone
// costs 10-20 ms under gVisor). The Exec asks for an exit notice
// (sandbox.ExecRequest.ExitNotice): pool.py gives its status on it and
// stops itself, and the guest reports the run once every process of the
// sandbox is stopped, without waiting the 7-15 ms the kernel takes to tear
// down an interpreter with numpy and pandas. What differs from a cold run:
// the program's sys.modules hold numpy and pandas, its memory and CPU use
// count the imports (the CPU time in clock ticks, read from /proc; on
// gVisor it is the cgroup's from the code's first write to the
// interpreter's stdin, without them: sandboxkit.Guest.CPUFromCgroup), it has
// one more descriptor open (the notice's, close-on-exec), and the run's
// timeout and duration are kept by the engine from the moment the code is
// sent (the Exec started when the pool filled).
//
// New sessions have pools of their own kind, filled from the same `pools:`
// entry (PoolSpec.Sessions beside Size): a session's sandbox differs from a
// one-shot's in what a one-shot must not have and a session must. It is
// detached (it outlives the daemon, which re-attaches it after a restart),
// it has a /workspace of the session's size, and its interpreter is a
// kernel, not one program. One kind serving both would give every pooled
// one-shot a /workspace and a supervisor, or hold two interpreters with
// numpy and pandas in each sandbox; and the two are sized by different
// loads. So a session pool sandbox is created unbound and detached, with
// the daemon's session /workspace size (PoolOptions.SessionWorkspace) and
// its python kernel started, numpy and pandas imported out of the cells'
// namespace (kernel.Options.Preimport), and ready. OpenSession takes one
// when the session's tool, runtime, driver, limits and /workspace size
// are the pool's, binds it once (the session's labels, its limits) and
// keeps it as the session's sandbox, which is then served, ended and
// re-attached as a cold one is. A kernel restarted in it (after a timeout
// or an OOM kill) is a cold kernel. Both kinds share the memory budget and
// max_concurrent; a session's sandbox stays in the budget, as the
// session's, until the session is closed or paused.

//go:embed pool.py
var poolPython string

// poolPrograms are the argv of a pool's started interpreter, by runtime:
// only python's has one.
var poolPrograms = map[string][]string{
	"python": {"/usr/bin/python3", "-c", poolPython},
}

// poolModules are what a session pool's kernel imports before it is
// ready, by runtime: the modules pool.py imports.
var poolModules = map[string][]string{
	"python": {"numpy", "pandas"},
}

// errNoBinder is a pool's driver that cannot bind; errNoTemplate a pool
// of a tool whose template is not built (yet), or whose build is stale.
var (
	errNoBinder   = errors.New("no pool on this tier")
	errNoTemplate = errors.New("no pool of a template not built of its tool's declaration")
)

// LabelPool marks a pool's sandboxes with their pool's name
// (tool/runtime, and /session for a session pool).
const LabelPool = "stockade.pool"

// PoolSpec configures one pool: Size sandboxes of Tool (empty: the default
// tool) with Runtime for one-shot runs, and Sessions for new sessions; 0
// disables either. Size and Sessions are floors: with demand the pools
// grow up to Max and SessionsMax (zero: config.DefaultPoolGrowth times the
// floor; see pooldemand.go).
type PoolSpec struct {
	Tool        string
	Runtime     string
	Size        int
	Sessions    int
	Max         int
	SessionsMax int
}

// PoolOptions configures an engine's pools.
type PoolOptions struct {
	Pools []PoolSpec
	// MaxAge is how long a pool sandbox waits at most; an older one is
	// replaced. Zero means config.DefaultPoolMaxAge.
	MaxAge time.Duration
	// MaxConcurrent bounds the sandboxes that run programs while a pool
	// refills: a refill waits while that many runs are going (the
	// service's max_concurrent). Zero means no bound.
	MaxConcurrent int
	// SessionWorkspace is the /workspace size of the session pools'
	// sandboxes, the size the daemon gives every session; a session of
	// another size opens cold. It must be positive when a pool has
	// Sessions.
	SessionWorkspace int64
	// CheckpointDir holds the session pools' checkpoints, from which a
	// tier that saves sandboxes refills them (poolsnap.go); empty means
	// cold refills only.
	CheckpointDir string
	// Unwarmed leaves a one-shot sandbox restored from its pool's
	// checkpoint unwarmed (poolsnap_exec.go): its program maps the
	// interpreter's memory in as it touches it. Only for a benchmark
	// that compares the two.
	Unwarmed bool
}

// PoolObserver is told what the pools do (the daemon's /metrics).
// Its methods must be safe for concurrent use and not block.
type PoolObserver interface {
	// PoolSize reports the sandboxes of pool ready now.
	PoolSize(pool string, n int)
	// PoolHit counts a run or session served from pool, PoolMiss one of
	// the pool's tool and runtime that it could not serve (cold instead).
	PoolHit(pool string)
	PoolMiss(pool string)
	// PoolRefill reports how long one sandbox of pool took to create.
	PoolRefill(pool string, d time.Duration)
}

// WithPools makes the engine keep warm pools (see StartPools).
func WithPools(o PoolOptions) Option { return func(e *Engine) { e.poolOpts = o } }

// SetPoolObserver makes the pools report to o. Call it before StartPools.
func (e *Engine) SetPoolObserver(o PoolObserver) { e.poolObs = o }

// StartPools checks the configured pools and starts filling them in the
// background, with sandboxes carrying labels (the daemon's owner label, so
// that a restarted daemon reaps them), until ctx ends or stop is called;
// stop destroys every pool sandbox not taken and returns once they are
// gone. A pool whose tool or
// runtime cannot pool (no started interpreter for the runtime, a tool with
// mounts or credentials) is an error; one on a driver without Binder
// (docker), or a session pool on one that cannot keep sessions or
// re-attach a sandbox, is logged and left out.
func (e *Engine) StartPools(ctx context.Context, labels map[string]string) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	e.poolsMu.Lock()
	e.ownerLabels = maps.Clone(labels)
	e.poolsMu.Unlock()
	var pools []*pool
	for _, s := range e.poolOpts.Pools {
		for _, session := range []bool{false, true} {
			if (session && s.Sessions <= 0) || (!session && s.Size <= 0) {
				continue
			}
			p, err := e.newPool(s, labels, session)
			if errors.Is(err, errNoBinder) || errors.Is(err, errNoTemplate) {
				// The default pool on a tier that cannot pool (docker):
				// its runs are all cold. So are a template's until it
				// is built (of the tool's declaration: not stale) and the
				// daemon restarted.
				e.log.Warn("not pooling", "err", err)
				continue
			}
			if err != nil {
				cancel()
				return nil, err
			}
			pools = append(pools, p)
		}
	}
	e.removeStaleSnaps(pools)
	var wg sync.WaitGroup
	for _, p := range pools {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.fill(ctx)
		}()
	}
	e.poolsMu.Lock()
	e.pools = pools
	e.poolsMu.Unlock()
	return func() {
		cancel()
		wg.Wait()
		e.poolsMu.Lock()
		e.pools = nil
		e.poolsMu.Unlock()
		for _, p := range pools {
			p.drain(ctx)
		}
		e.removeSnaps()
	}, nil
}

// newPool is the pool of s for one-shot runs, or for sessions.
func (e *Engine) newPool(s PoolSpec, owner map[string]string, session bool) (*pool, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("pool of tool %q, runtime %q: %s: %w", s.Tool, s.Runtime, fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
	}
	if t, err := e.tools.Get(s.Tool); err == nil && t.Template != "" {
		if _, _, err := e.templateOf(t); errdefs.IsNotFound(err) || isStale(err) {
			return nil, fmt.Errorf("pool of tool %q: %v: %w", s.Tool, err, errNoTemplate)
		}
	}
	tool, drv, rt, err := e.resolve(Request{Tool: s.Tool, Runtime: s.Runtime})
	if err != nil {
		return nil, bad("%v", err)
	}
	argv, ok := poolPrograms[rt.Name]
	if !ok {
		return nil, bad("only python has a pool interpreter")
	}
	b, ok := drv.(sandbox.Binder)
	if !ok {
		return nil, fmt.Errorf("pool of tool %q, runtime %q: the %s driver cannot create unbound sandboxes: %s: %w",
			s.Tool, s.Runtime, drv.Name(), drv.Capabilities().Lacks["Bind"], errNoBinder)
	}
	if len(tool.Filesystem.Mounts) > 0 || len(tool.Credentials) > 0 {
		return nil, bad("its tool mounts data or reaches the broker; a pool sandbox holds nothing of anyone's")
	}
	maxAge := e.poolOpts.MaxAge
	if maxAge <= 0 {
		maxAge = config.DefaultPoolMaxAge
	}
	p := &pool{e: e, name: tool.Name + "/" + rt.Name, tool: tool, drv: drv, binder: b, rt: rt,
		base: e.Limits(tool), maxAge: maxAge, wake: make(chan struct{}, 1)}
	p.created = p.base
	p.initDemand(s.Size, ceilingOf(s.Size, s.Max))
	if session {
		if err := e.sessionKind(p, s); err != nil {
			return nil, err
		}
	} else {
		// The sandbox's own timeout covers its wait in the pool and the
		// longest run; the engine keeps the run's (runWarm).
		p.argv, p.created.Timeout = argv, maxAge+e.ceiling.Timeout+time.Minute
	}
	p.labels = map[string]string{LabelPool: p.name}
	for k, v := range owner {
		p.labels[k] = v
	}
	p.snap = e.snapOf(p)
	return p, nil
}

// sessionKind makes p, of s, a session pool: its sandboxes have the limits
// of a cold session's (the tool's) and the daemon's session /workspace,
// and their kernels import poolModules.
//
// A session pool needs a driver that keeps sessions (keepsSessions) and
// re-attaches a sandbox: its sandboxes are detached, to outlive a daemon
// that restarts, as a cold session's are where the driver can.
func (e *Engine) sessionKind(p *pool, s PoolSpec) error {
	c := p.drv.Capabilities()
	if !keepsSessions(c) {
		return fmt.Errorf("session pool of tool %q, runtime %q: the %s driver cannot keep sessions (%s): %w",
			s.Tool, s.Runtime, p.drv.Name(), lacksForSessions(c), errNoBinder)
	}
	if why := noReattach(c); why != "" {
		return fmt.Errorf("session pool of tool %q, runtime %q: session pools need a driver that re-attaches a sandbox, and the %s driver cannot (%s): %w",
			s.Tool, s.Runtime, p.drv.Name(), why, errNoBinder)
	}
	if e.poolOpts.SessionWorkspace <= 0 {
		return fmt.Errorf("session pool of tool %q, runtime %q: the sessions' /workspace size is not set: %w", s.Tool, s.Runtime, errdefs.ErrInvalidArgument)
	}
	p.name += "/session"
	p.session, p.workspace = true, e.poolOpts.SessionWorkspace
	p.initDemand(s.Sessions, ceilingOf(s.Sessions, s.SessionsMax))
	return nil
}

// pool is one warm pool.
type pool struct {
	e       *Engine
	name    string
	tool    tools.Tool
	drv     sandbox.Driver
	binder  sandbox.Binder
	rt      image.Runtime
	argv    []string
	base    sandbox.Limits // a run's limits, from the tool and the defaults
	created sandbox.Limits // the sandboxes' limits (base, a longer timeout)
	maxAge  time.Duration
	labels  map[string]string
	wake    chan struct{} // a sandbox was taken

	// session is true for a session pool: its sandboxes are detached,
	// have a /workspace of workspace bytes and run kernel (not argv).
	session   bool
	workspace int64
	// snap is the pool's checkpoint, nil for cold refills (poolsnap.go).
	snap *poolSnap
	// now is the pools' clock (time.Now; a test's).
	now func() time.Time

	mu sync.Mutex
	// d is the pool's demand: its floor (size), ceiling and target.
	d     demand
	ready []*warm // oldest first
	// taken are the sandboxes runs took and have not given back
	// (destroyed) yet, with when each was taken (see wanted).
	taken map[*warm]time.Time
}

// refillDelay is how long at most a pool waits for a run that took one of
// its sandboxes before it creates the replacement: on a host of few cores
// creating one (the runtime, then python importing numpy and pandas,
// about 0.3 s of CPU under runc and more under gVisor) competes for the
// CPU with the run that took it, which a run of a few milliseconds feels
// most. So a pool replaces a sandbox once its run has ended and the
// sandbox is destroyed, or, for a longer run, once refillDelay has
// passed since it was taken, whichever comes first. A session pool's
// sandbox is the session's once taken: the pool replaces it at once.
const refillDelay = time.Second

// warm is one pool sandbox, its interpreter waiting: the Exec of a
// one-shot pool's, the kernel of a session pool's.
type warm struct {
	sb      sandbox.Sandbox
	ex      sandbox.Exec
	k       sandbox.Kernel
	born    time.Time
	image   string // its image's digest
	release func() // its memory
	log     *slog.Logger
	// out is the output callback of the run that took it.
	out atomic.Pointer[func(sandbox.Stream, []byte)]
}

// destroy destroys the sandbox and frees its memory; a failure is logged
// (the next daemon's Reap finds what is left by the sandbox's labels).
func (w *warm) destroy(ctx context.Context) {
	if err := w.sb.Destroy(context.WithoutCancel(ctx)); err != nil {
		w.log.Error("destroying a pool sandbox", "sandbox", w.sb.ID(), "err", err)
	}
	w.release()
}

// fill keeps the pool at its size until ctx ends: it replaces sandboxes
// past the maximum age, and creates one at a time while runs leave room
// (max concurrent) and the memory budget has room for it.
func (p *pool) fill(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	// After a failure to create (a missing image, a driver down) the pool
	// waits, doubling up to a minute, rather than log every second.
	var backoff time.Duration
	p.observeTarget(p.target())
	for {
		p.retire(ctx)
		for _, w := range p.shrinkIdle() {
			w.destroy(ctx)
		}
		for p.wanted() && ctx.Err() == nil {
			failed, ok := p.grow(ctx)
			switch {
			case failed:
				backoff = min(max(2*backoff, time.Second), time.Minute)
			case ok:
				backoff = 0
			}
			if !ok {
				break
			}
		}
		wait := tick.C
		if backoff > 0 {
			wait = time.After(backoff)
		}
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
			if backoff > 0 {
				continue
			}
		case <-wait:
		}
	}
}

// wanted says whether the pool should create a sandbox now: it holds
// fewer than its target size, counting those taken less than refillDelay
// ago whose runs go on.
func (p *pool) wanted() bool {
	p.mu.Lock()
	n, waiting, target := len(p.ready), 0, p.d.target
	for _, at := range p.taken {
		if time.Since(at) < refillDelay {
			waiting++
		}
	}
	p.mu.Unlock()
	p.e.observeSize(p.name, n)
	mc := p.e.poolOpts.MaxConcurrent
	return n+waiting < target && (mc <= 0 || int(p.e.running.Load()) < mc)
}

// giveBack destroys w, which take returned, and lets the pool replace it.
func (p *pool) giveBack(ctx context.Context, w *warm) {
	w.destroy(ctx)
	p.mu.Lock()
	delete(p.taken, w)
	p.mu.Unlock()
	p.wakeFill()
}

// handOver lets the pool replace w, which take returned and which is no
// longer the pool's to destroy (a session's sandbox now).
func (p *pool) handOver(w *warm) {
	p.mu.Lock()
	delete(p.taken, w)
	p.mu.Unlock()
	p.wakeFill()
}

// wakeFill makes the filling loop look at the pool now.
func (p *pool) wakeFill() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// retire destroys the sandboxes past the maximum age.
func (p *pool) retire(ctx context.Context) {
	p.mu.Lock()
	var old []*warm
	for len(p.ready) > 0 && time.Since(p.ready[0].born) > p.maxAge {
		old, p.ready = append(old, p.ready[0]), p.ready[1:]
	}
	p.mu.Unlock()
	for _, w := range old {
		w.destroy(ctx)
	}
}

// grow creates one sandbox and adds it (ok); failed says it could not
// because creating failed (logged), rather than for want of memory.
func (p *pool) grow(ctx context.Context) (failed, ok bool) {
	release, err := p.e.reserveOn(p.drv, p.created.Memory)
	if err != nil {
		return false, false
	}
	start := time.Now()
	p.refillBegins()
	w, restored, err := p.refill(ctx)
	if err != nil {
		p.refillEnds(0, false)
		release()
		if ctx.Err() == nil {
			p.e.log.Warn("filling pool", "pool", p.name, "err", err)
		}
		return true, false
	}
	took := time.Since(start)
	w.release = p.e.inUse.hold(w.image, release)
	if o := p.e.poolObs; o != nil {
		o.PoolRefill(p.name, took)
	}
	if cpu, ok := cpuOf(w.sb); ok {
		p.observeRefill(cpu, restored)
	}
	p.mu.Lock()
	p.ready = append(p.ready, w)
	p.mu.Unlock()
	p.refillEnds(took, true)
	return false, true
}

// create creates an unbound sandbox and starts its interpreter: for a
// template's tool, of the template's current build, its Start and Ready
// run in the interpreter (a one-shot pool's loader, pool.py, runs them
// before it reads its program).
func (p *pool) create(ctx context.Context) (*warm, error) {
	img, tm, err := p.e.imageOf(p.tool, p.rt)
	if err != nil {
		return nil, err
	}
	argv := p.argv
	if tm != nil {
		argv = loaderArgv(tm, poolModules[p.rt.Name])
	}
	spec := sandbox.Spec{Image: img, Limits: p.created, Labels: withImage(p.labels, img.Digest), Detached: p.session, Workspace: p.workspace}
	if p.session {
		// A session pool's sandbox outlives the daemon (detached): one
		// that a daemon killed left behind ends by itself a minute after
		// the pool would have retired it; a session it is bound to moves
		// its deadline to the session's (acquireSession), within that
		// minute, as take never hands out one older than maxAge.
		spec.Deadline = time.Now().Add(p.maxAge + time.Minute)
	}
	sb, err := p.binder.CreateUnbound(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("creating %s sandbox: %w", p.drv.Name(), err)
	}
	w := &warm{sb: sb, born: time.Now(), image: img.Digest, log: p.e.log}
	if p.session {
		// sessionKind checked that the driver's sandboxes have kernels.
		ks, pre, err := p.e.sessionKernel(p.tool, p.rt, poolModules[p.rt.Name])
		if err == nil {
			w.k, err = sb.(sandbox.Kernels).StartKernel(ctx, ks)
		}
		if err != nil {
			_ = sb.Destroy(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("starting the pool's %s kernel: %w", p.rt.Name, err)
		}
		if err := pre.run(ctx, w.k); err != nil {
			_ = sb.Destroy(context.WithoutCancel(ctx))
			return nil, err
		}
		return w, nil
	}
	// The Exec lives as long as the sandbox: its ctx is the pool's, and a
	// run ends it through Cancel (runWarm).
	ex, err := sb.Start(context.WithoutCancel(ctx), p.interpreter(w, argv, templateEnv(tm)))
	if err != nil {
		_ = sb.Destroy(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("starting the pool's interpreter: %w", err)
	}
	w.ex = ex
	return w, nil
}

// interpreter is the Exec of a one-shot pool's interpreter in w, argv
// with env: its output goes to the run that took w.
func (p *pool) interpreter(w *warm, argv, env []string) sandbox.ExecRequest {
	return sandbox.ExecRequest{
		File:        sandbox.File{Name: p.rt.FileName},
		Argv:        argv,
		Env:         env,
		StdinStream: true,
		ExitNotice:  true,
		OnOutput: func(s sandbox.Stream, b []byte) {
			if f := w.out.Load(); f != nil && *f != nil {
				(*f)(s, b)
			}
		},
	}
}

// drain destroys the sandboxes not taken. ctx may have ended: the
// sandboxes are destroyed regardless (warm.destroy).
func (p *pool) drain(ctx context.Context) {
	p.mu.Lock()
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	for _, w := range ready {
		w.destroy(ctx)
	}
	p.e.observeSize(p.name, 0)
}
