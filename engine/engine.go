// Package engine turns an invocation (runtime, code, limits) into a sandbox
// run: it validates the request, resolves the runtime image, picks the
// driver from the tool's record and runs Create, Exec, Destroy, or takes a
// sandbox of a warm pool whose interpreter waits already (pool.go; the
// daemon's, StartPools) and accounts the sandboxes' memory (memory.go). It sees the
// drivers only through the sandbox.Driver contract: which drivers, images
// and egress host exist is the caller's choice (internal/wiring builds them
// from the configuration), and the layers above never see a driver.
//
//	e, err := engine.New(map[string]sandbox.Driver{"runc": rc}, "runc", images, sandbox.DefaultLimits(), sandbox.DefaultCeiling())
//	res, err := e.Run(ctx, engine.Request{Runtime: "python", Code: []byte("print(1)")})
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/netns"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
	"github.com/stockade-sh/stockade/tools"
	"github.com/stockade-sh/stockade/wire"
)

// Images resolves a runtime name to its image.
type Images interface {
	Resolve(name string) (sandbox.Image, error)
}

// Engine runs invocations. It is safe for concurrent use.
type Engine struct {
	drivers       map[string]sandbox.Driver
	defaultDriver string
	images        Images
	defaults      sandbox.Limits
	ceiling       sandbox.Limits
	tools         *tools.Set
	mounts        *tools.MountChecker
	egress        *EgressHost // nil: no sandbox gets network
	log           *slog.Logger
	// testKernel makes sessions run the guest's test kernel
	// (WithTestKernel).
	testKernel bool

	// golden configures golden checkpoints (golden.go); goldenMu makes
	// one at a time.
	golden   GoldenOptions
	goldenMu sync.Mutex
	// goldenRemakes holds the checkpoint directories remakeGolden made
	// or tried to, each once.
	goldenRemakes sync.Map
	// ownerLabels are the labels StartPools gave the pools' sandboxes
	// (the daemon's owner label), guarded by poolsMu: a golden sandbox
	// carries them when GoldenOptions.Labels is nil.
	ownerLabels map[string]string

	// closing tracks the background removals of destroyed sessions'
	// networks; closeErrs collects their failures for Wait.
	closing   sync.WaitGroup
	closeMu   sync.Mutex
	closeErrs []error

	// The warm pools (pool.go) and the memory of the sandboxes
	// (memory.go); running counts the runs going on.
	poolOpts PoolOptions
	poolObs  PoolObserver
	poolsMu  sync.Mutex
	pools    []*pool
	mem      memory
	// inUse counts the live sandboxes of each image (imageuse.go).
	inUse   imageUse
	running atomic.Int64
}

// Option configures New.
type Option func(*Engine)

// WithTools makes the engine run invocations as the tools of set, whose
// mounts are resolved with opts. Without it only the default tool exists.
func WithTools(set *tools.Set, opts tools.Options) Option {
	return func(e *Engine) { e.tools, e.mounts = set, tools.NewMountChecker(opts) }
}

// WithLogger makes the engine log to l; without it, slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(e *Engine) { e.log = l }
}

// New returns an engine over the given drivers and images. The caller
// should call Wait before exiting (see Session.Destroy).
func New(drivers map[string]sandbox.Driver, defaultDriver string, images Images, defaults, ceiling sandbox.Limits, opts ...Option) (*Engine, error) {
	drv, ok := drivers[defaultDriver]
	if !ok {
		return nil, errdefs.Publicf("default driver %q is not configured: %w", defaultDriver, errdefs.ErrInvalidArgument)
	}
	e := &Engine{drivers: drivers, defaultDriver: defaultDriver, images: images, defaults: defaults, ceiling: ceiling}
	for _, o := range opts {
		o(e)
	}
	if e.log == nil {
		e.log = slog.Default()
	}
	if e.tools == nil {
		// The default tool runs on the default driver's tier.
		opts := tools.Options{DefaultTier: drv.Capabilities().Tier}
		set, err := tools.Load("", opts)
		if err != nil {
			return nil, err
		}
		e.tools, e.mounts = set, tools.NewMountChecker(opts)
	}
	if err := e.checkCredentials(); err != nil {
		return nil, err
	}
	return e, nil
}

// checkCredentials refuses tools whose credentials name a broker operation
// the engine's broker does not have. Without egress a daemon cannot load
// such tools at all (tools.Options.EgressSupported), and the CLI's engines
// never run them.
func (e *Engine) checkCredentials() error {
	if e.egress == nil {
		return nil
	}
	var errs []error
	for _, t := range e.tools.Tools() {
		for _, op := range t.Credentials {
			if e.egress.broker == nil || !e.egress.broker.Has(op) {
				errs = append(errs, fmt.Errorf("tool %q lists broker operation %q, which is not configured (broker.operations in the config)", t.Name, op))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Tools returns the tools the engine runs invocations as.
func (e *Engine) Tools() *tools.Set { return e.tools }

// Drivers returns the configured drivers by name.
func (e *Engine) Drivers() map[string]sandbox.Driver { return maps.Clone(e.drivers) }

// DefaultDriver is the name of the driver used when a request names none.
func (e *Engine) DefaultDriver() string { return e.defaultDriver }

// Request is one invocation.
type Request struct {
	Runtime string // "python", "node", "shell"
	Code    []byte
	// Tool names the tool the code runs as; empty means the default tool.
	// The tool's record picks the driver, the mounts and the limits.
	Tool string
	// Driver overrides the tool's tier with a driver by name. Only the
	// operator (the CLI) sets it, never an invocation from the API.
	Driver string
	// Limits override the tool's limits and the defaults where set. The
	// tool's limits are also the most an invocation (Validate, Run) may
	// ask for: a field above its counterpart there is refused, as one above
	// the engine's ceiling is.
	Limits sandbox.Limits
	// Network asks for egress to the tool's allowlist, through the egress
	// proxy. The caller must have approved it (the service's approval
	// gate); false means no network, except the credential broker for a
	// tool that lists broker operations.
	Network bool
	Stdin   []byte
	// Labels are attached to the sandbox to find it after a crash.
	Labels map[string]string
	// Reservation is the memory Reserve held for this run at its
	// admission; Run uses it rather than take the budget again, and
	// releases it. Nil: Run takes the budget when the sandbox is made.
	Reservation *Reservation
	// OnOutput receives output as it is produced; see sandbox.ExecRequest.
	OnOutput func(sandbox.Stream, []byte)
	// OnStart, if set, is called once the sandbox has launched, before the
	// code runs, with the driver's name. If it fails, the code does not run:
	// the sandbox is destroyed and Run returns the error.
	OnStart func(driver string) error
	// ExtraMounts widens the sandbox beyond the tool's record. It exists
	// only so that tests can prove the blast-radius audit notices such a
	// sandbox; nothing outside tests sets it, and the API cannot.
	ExtraMounts []sandbox.Mount
}

// Result is a finished invocation: its status and the wire's run (the
// result document of a one-shot, wire.Run), whose EndedBy is
// EndedByShutdown or EndedByCancel and whose Network is NetworkNone,
// NetworkBroker or NetworkAllowlist (empty in results recorded before it
// existed, and where no sandbox ran).
type Result struct {
	Status sandbox.Status `json:"status"`
	wire.Run
}

// The values of Result.Network, so that a program's failure to resolve a
// name ("Temporary failure in name resolution") is explained in its
// result.
const (
	// NetworkNone: no network at all; every name lookup fails.
	NetworkNone = "none"
	// NetworkBroker: only the credential broker of the tool's record.
	NetworkBroker = "broker"
	// NetworkAllowlist: the tool's egress allowlist, through the egress
	// proxy.
	NetworkAllowlist = "allowlist"
)

// networkOf is the Result.Network of a sandbox given egress (the tool's
// allowlist) or, without it, a broker for the tool's credentials.
func networkOf(egress, credentials bool) string {
	switch {
	case egress:
		return NetworkAllowlist
	case credentials:
		return NetworkBroker
	}
	return NetworkNone
}

// The values of Result.EndedBy.
const (
	// EndedByShutdown: the daemon stopped while the code ran, and
	// destroyed its sandbox.
	EndedByShutdown = "daemon_shutdown"
	// EndedByCancel: the execution was cancelled while the code ran, and
	// its sandbox destroyed (a cell: interrupted).
	EndedByCancel = "cancel"
	// EndedBySessionEnd: a cell's session ended (closed, or past its
	// TTL) while the cell ran, and its sandbox was destroyed.
	EndedBySessionEnd = "session_ended"
)

// ProgramEnv is the whole environment of the code, the profile's
// (profile.Profile.Env).
func ProgramEnv() []string { return profile.Default().Env }

// Validate checks a request without running anything, and returns the
// tool, driver and runtime it would use.
func (e *Engine) Validate(req Request) (tools.Tool, sandbox.Driver, image.Runtime, error) {
	if err := checkInput(req); err != nil {
		return tools.Tool{}, nil, image.Runtime{}, err
	}
	tool, drv, rt, err := e.resolve(req)
	if err == nil {
		err = checkRecordLimits(tool, req.Limits)
	}
	if err != nil {
		return tools.Tool{}, nil, image.Runtime{}, err
	}
	return tool, drv, rt, nil
}

// checkRecordLimits refuses limits above the tool's record: the record
// bounds every invocation of the tool.
func checkRecordLimits(tool tools.Tool, l sandbox.Limits) error {
	if err := l.Check(tool.Limits); err != nil {
		return errdefs.Publicf("tool %q's record bounds what an invocation may ask for: %w", tool.Name, err)
	}
	return nil
}

// checkInput checks the code and stdin of an invocation.
func checkInput(req Request) error {
	switch {
	case len(req.Code) == 0:
		return errdefs.Publicf("code is empty: %w", errdefs.ErrInvalidArgument)
	case len(req.Code) > sandbox.MaxCodeSize:
		return errdefs.Publicf("code is %d bytes, more than the limit of 1 MiB: %w", len(req.Code), errdefs.ErrTooLarge)
	case len(req.Stdin) > sandbox.MaxCodeSize:
		return errdefs.Publicf("stdin is %d bytes, more than the limit of 1 MiB: %w", len(req.Stdin), errdefs.ErrTooLarge)
	}
	return nil
}

// Tier is the isolation tier of the driver that runs req (its Driver, or
// its Tool's tier's with its Runtime), or "" when none would: the tier
// label of a run's phases, known from its stored request.
func (e *Engine) Tier(req Request) sandbox.Tier {
	if d, ok := e.drivers[req.Driver]; ok {
		return d.Capabilities().Tier
	}
	_, drv, _, err := e.resolve(Request{Runtime: req.Runtime, Tool: req.Tool, Driver: req.Driver})
	if err != nil {
		return ""
	}
	return drv.Capabilities().Tier
}

// resolve finds the runtime, tool and driver of a request and checks its
// limits against the ceiling.
func (e *Engine) resolve(req Request) (tools.Tool, sandbox.Driver, image.Runtime, error) {
	fail := func(err error) (tools.Tool, sandbox.Driver, image.Runtime, error) {
		return tools.Tool{}, nil, image.Runtime{}, err
	}
	runtime := req.Runtime
	if t, err := e.tools.Get(req.Tool); err == nil && t.Template != "" {
		// The template's base is the runtime; the request may leave it
		// out.
		if runtime, err = e.templateRuntime(t, runtime); err != nil {
			return fail(err)
		}
	}
	rt, ok := image.Runtimes[runtime]
	if !ok {
		return fail(errdefs.Publicf("unknown runtime %q (known: %s): %w", req.Runtime, strings.Join(runtimeNames(), ", "), errdefs.ErrInvalidArgument))
	}
	tool, err := e.tools.Get(req.Tool)
	if err != nil {
		return fail(errdefs.Publicf("%v: %w", err, errdefs.ErrInvalidArgument))
	}
	if !tool.AllowsRuntime(rt.Name) {
		return fail(errdefs.Publicf("tool %q does not allow runtime %q (allowed: %s): %w", tool.Name, rt.Name, strings.Join(tool.Runtimes, ", "), errdefs.ErrPermissionDenied))
	}
	name := req.Driver
	if name == "" {
		if name, _, ok = tools.DriverFor(tools.CapabilitiesOf(e.drivers), tool.Tier); !ok {
			return fail(errdefs.Publicf("tool %q runs on the %s tier, which this host cannot run: %w", tool.Name, tool.Tier, errdefs.ErrFailedPrecondition))
		}
	}
	drv, ok := e.drivers[name]
	if !ok {
		return fail(errdefs.Publicf("unknown driver %q (known: %s): %w", name, strings.Join(slices.Sorted(maps.Keys(e.drivers)), ", "), errdefs.ErrInvalidArgument))
	}
	if err := req.Limits.Check(e.ceiling); err != nil {
		return fail(err)
	}
	return tool, drv, rt, nil
}

// Limits returns the limits a sandbox of the tool gets when the request
// sets none: the tool's record, then the engine's defaults.
func (e *Engine) Limits(t tools.Tool) sandbox.Limits { return t.Limits.WithDefaults(e.defaults) }

// Sandbox is a sandbox created for one request's tool, with what it was
// created from. The caller must Destroy it.
type Sandbox struct {
	sandbox.Sandbox
	Tool    tools.Tool
	Runtime image.Runtime
	Driver  string
	Limits  sandbox.Limits
	// Network is true when the sandbox has egress (its tool's allowlist).
	Network bool

	eng     *Engine
	net     *netns.Egress // nil without egress
	netOnce sync.Once
	// unhold ends the sandbox's count of its image (imageuse.go).
	unhold func()
}

// NewSandbox creates the sandbox req's tool (or req.Driver) calls for, with
// the record's mounts and limits, without running anything: the caller
// Execs in it and must Destroy it. req.Code and req.Stdin are not used.
// Unlike Validate and Run, it holds req.Limits to the engine's ceiling
// only, not to the record's: the blast-radius audit gives its probe the
// time and output it needs, whatever the record allows, and says so.
func (e *Engine) NewSandbox(ctx context.Context, req Request) (*Sandbox, error) {
	tool, drv, rt, err := e.resolve(req)
	if err != nil {
		return nil, err
	}
	spec, err := e.specFor(ctx, tool, drv, rt, req.Limits)
	if err != nil {
		return nil, err
	}
	limits := spec.Limits
	spec.Mounts, spec.Labels = append(spec.Mounts, req.ExtraMounts...), req.Labels
	var net *netns.Egress
	if allow, ports, ok, err := providerAllowlist(tool, drv, req.Network); ok {
		// A remote driver's provider enforces the allowlist itself.
		if err != nil {
			return nil, err
		}
		if req.Network {
			spec.Network, spec.Allow, spec.AllowPorts = sandbox.NetworkAllowlist, allow, ports
		}
	} else if req.Network || len(tool.Credentials) > 0 {
		// Without network a tool that lists broker operations still
		// reaches the broker, and nothing else.
		spec.ID, net, err = e.openEgress(ctx, tool, drv, req.Network, req.Labels)
		if err != nil {
			return nil, err
		}
		spec.Network = sandbox.NetworkEgress
		spec.Egress = &sandbox.EgressNet{NetNSPath: net.Path, ResolvConf: net.ResolvConf, UserNSPath: net.UserNSPath, HostIDBase: net.HostUIDBase}
	}
	sb, err := drv.Create(ctx, spec)
	if err != nil {
		if net != nil {
			err = errors.Join(err, e.closeEgress(spec.ID, net))
		}
		return nil, fmt.Errorf("creating %s sandbox: %w", drv.Name(), err)
	}
	return &Sandbox{Sandbox: sb, Tool: tool, Runtime: rt, Driver: drv.Name(), Limits: limits, Network: req.Network, eng: e, net: net,
		unhold: e.inUse.hold(spec.Image.Digest, nil)}, nil
}

// specFor is the spec of a sandbox of tool on drv for runtime rt, with
// limits over the tool's: the driver must be healthy, the image there,
// and the record's mounts are resolved and checked again now, so that a
// symlink swapped in since the tools were loaded, or a socket or a
// credentials directory put below a mount, is caught.
func (e *Engine) specFor(ctx context.Context, tool tools.Tool, drv sandbox.Driver, rt image.Runtime, limits sandbox.Limits) (sandbox.Spec, error) {
	if hc, ok := drv.(sandbox.HealthChecker); ok {
		if err := hc.Health(ctx); err != nil {
			return sandbox.Spec{}, err
		}
	}
	img, _, err := e.imageOf(tool, rt)
	if err != nil {
		return sandbox.Spec{}, err
	}
	mounts, err := e.mounts.Resolve(tool)
	if err != nil {
		return sandbox.Spec{}, fmt.Errorf("tool %q: %v: %w", tool.Name, err, errdefs.ErrFailedPrecondition)
	}
	return sandbox.Spec{Image: img, Limits: limits.WithDefaults(e.Limits(tool)), Mounts: mounts}, nil
}

// Run validates req, runs it in a fresh sandbox that is destroyed
// afterwards (one of a warm pool when a pool serves req: see pool.go), and
// returns the result. A program that fails is a Result; an
// error means the run could not happen (bad request, missing image or
// runtime, driver failure) or ctx ended while it ran: then a
// *sandbox.CutShortError, when the driver kept what the program had
// printed and used.
func (e *Engine) Run(ctx context.Context, req Request) (*Result, error) {
	defer req.Reservation.Release()
	tool, drv, rt, err := e.Validate(req)
	if err != nil {
		return nil, err
	}
	// A template's tool may leave the runtime out: it is its base.
	req.Runtime = rt.Name
	_, tm, err := e.imageOf(tool, rt)
	if err != nil {
		return nil, err
	}
	loader := needsLoader(tm)
	e.running.Add(1)
	defer e.running.Add(-1)
	limits := req.Limits.WithDefaults(e.Limits(tool))
	if p, w := e.acquire(ctx, req, tool, limits); w != nil {
		// The pool sandbox counts in the budget already.
		req.Reservation.Release()
		ctx, sp := telemetry.Start(ctx, telemetry.Exec, telemetry.Driver(p.drv.Name()))
		r, err := e.runWarm(ctx, req, p, w, limits)
		var st sandbox.Status
		if r != nil {
			st = r.Status
		}
		sp.EndAs(execOutcome(st, err), err)
		return r, err
	}
	release, err := e.takeMemory(req.Reservation, drv, limits.Memory)
	if err != nil {
		return nil, err
	}
	defer release()
	cctx, sp := telemetry.Start(ctx, telemetry.SandboxCreate)
	sb, err := e.NewSandbox(cctx, req)
	if sp.End(&err); err != nil {
		return nil, err
	}
	defer func() {
		// Destroy must run even when ctx is cancelled; it bounds itself.
		dctx, sp := telemetry.Start(context.WithoutCancel(ctx), telemetry.SandboxDestroy, telemetry.Driver(sb.Driver))
		err := sb.Destroy(dctx)
		sp.End(&err)
	}()
	if req.OnStart != nil {
		if err := req.OnStart(sb.Driver); err != nil {
			return nil, fmt.Errorf("recording the start: %w", err)
		}
	}
	var res *sandbox.Result
	ctx, sp = telemetry.Start(ctx, telemetry.Exec, telemetry.Driver(sb.Driver))
	defer func() {
		var st sandbox.Status
		if res != nil {
			st = res.Status
		}
		sp.EndAs(execOutcome(st, err), err)
	}()
	if loader && sb.Runtime.Name == "python" {
		res, err = e.runLoader(ctx, sb, req, tm)
	} else {
		argv := sb.Runtime.Interpreter
		if loader {
			argv = loaderInterpreter(tm, sb.Runtime)
		}
		res, err = sandbox.Run(ctx, sb, sandbox.ExecRequest{
			File:     sandbox.File{Name: sb.Runtime.FileName, Data: req.Code},
			Argv:     argv,
			Env:      templateEnv(tm),
			Stdin:    req.Stdin,
			Timeout:  sb.Limits.Timeout,
			OnOutput: req.OnOutput,
		})
		if err == nil && loader {
			err = startFailure(tm.Name, res)
		}
	}
	if err != nil {
		return nil, err
	}
	r := resultOf(res, sb.Driver, sb.Runtime.Name)
	r.Network = networkOf(sb.Network, len(sb.Tool.Credentials) > 0)
	return r, nil
}

// execOutcome is how a run ended for its exec span: the program's status
// (succeeded, failed, timed_out, oom_killed, killed), or error when it
// could not run.
func execOutcome(st sandbox.Status, err error) string {
	if err != nil || st == "" {
		return telemetry.OutcomeError
	}
	return string(st)
}

// resultOf is the Result of a program's sandbox.Result.
func resultOf(res *sandbox.Result, driver, runtime string) *Result {
	return &Result{Status: res.Status, Run: wire.Run{
		ExitCode:        res.ExitCode,
		Signal:          res.Signal,
		Stdout:          string(res.Stdout),
		Stderr:          string(res.Stderr),
		StdoutTruncated: res.StdoutTruncated,
		StderrTruncated: res.StderrTruncated,
		DurationMS:      res.Duration.Milliseconds(),
		CPUMS:           res.CPUTime.Milliseconds(),
		PeakMemoryBytes: res.PeakMemory,
		Driver:          driver,
		Runtime:         runtime,
	}}
}

func runtimeNames() []string {
	names := slices.Collect(maps.Keys(image.Runtimes))
	sort.Strings(names)
	return names
}

// Ceiling is the highest limits a request may ask for.
func (e *Engine) Ceiling() sandbox.Limits { return e.ceiling }
