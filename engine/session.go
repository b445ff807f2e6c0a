package engine

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/kernel"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
	"github.com/stockade-sh/stockade/tools"
)

// A session's sandbox is detached (sandbox.Spec.Detached): it outlives the
// daemon, which finds it again with ReattachSessions. It has a /workspace
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
}

// LiveSession is a session's sandbox and its kernel. Its methods are safe
// for concurrent use; one cell runs at a time (another meanwhile is
// ErrConflict). The caller must Close it to end the session; a daemon that
// stops without closing it leaves it running, for ReattachSessions.
type LiveSession struct {
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
}

// releaseMemory takes the session's sandbox out of the memory budget.
func (s *LiveSession) releaseMemory() {
	s.mu.Lock()
	release := s.mem
	s.mem = nil
	s.mu.Unlock()
	if release != nil {
		release()
	}
}

// SandboxID is the session's sandbox's ID.
func (s *LiveSession) SandboxID() string { return s.sb.ID() }

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
	if !c.Reattach || !c.Kernels || !c.Files {
		why := c.Lacks["Reattach"] + c.Lacks["Kernels"] + c.Lacks["Files"]
		return tools.Tool{}, nil, image.Runtime{}, errdefs.Publicf("the %s driver cannot keep sessions (%s); use a tool on the container or gvisor tier: %w",
			drv.Name(), strings.TrimSpace(why), errdefs.ErrFailedPrecondition)
	}
	if spec.Workspace <= 0 {
		return tools.Tool{}, nil, image.Runtime{}, errdefs.Publicf("a session's workspace size must be positive, got %d: %w", spec.Workspace, errdefs.ErrInvalidArgument)
	}
	return tool, drv, rt, nil
}

// OpenSession creates a session's detached sandbox and starts its
// kernel, or takes a session pool's sandbox whose kernel is ready when
// one serves spec (pool.go). Nothing is left behind on error.
func (e *Engine) OpenSession(ctx context.Context, spec SessionSpec) (_ *LiveSession, err error) {
	tool, drv, rt, err := e.CheckSession(spec)
	if err != nil {
		return nil, err
	}
	if s := e.acquireSession(ctx, spec, tool, drv, rt); s != nil {
		return s, nil
	}
	sspec, err := e.specFor(ctx, tool, drv, rt, spec.Limits)
	if err != nil {
		return nil, err
	}
	limits := sspec.Limits
	sspec.Labels, sspec.Detached, sspec.Workspace, sspec.Deadline = spec.Labels, true, spec.Workspace, spec.Deadline
	release, err := e.mem.reserve(limits.Memory)
	if err != nil {
		return nil, err
	}
	sb, err := drv.Create(ctx, sspec)
	if err != nil {
		release()
		return nil, fmt.Errorf("creating %s sandbox for a session: %w", drv.Name(), err)
	}
	defer func() {
		if err != nil {
			_ = sb.Destroy(context.WithoutCancel(ctx))
			release()
		}
	}()
	ks, err := e.kernelSpec(rt)
	if err != nil {
		return nil, err
	}
	s, err := newLiveSession(sb, drv.Name(), rt, limits, ks)
	if err != nil {
		return nil, err
	}
	if spec.Kernel != nil {
		s.spec.Argv = spec.Kernel
	}
	if err := s.startKernel(ctx); err != nil {
		return nil, err
	}
	s.mem = release
	return s, nil
}

func newLiveSession(sb sandbox.Sandbox, driver string, rt image.Runtime, limits sandbox.Limits, ks sandbox.KernelSpec) (*LiveSession, error) {
	files, fok := sb.(sandbox.Files)
	kernels, kok := sb.(sandbox.Kernels)
	if !fok || !kok {
		return nil, errdefs.Publicf("the %s sandbox %s has no files or kernels: %w", driver, sb.ID(), errdefs.ErrFailedPrecondition)
	}
	return &LiveSession{sb: sb, files: files, kernels: kernels, Driver: driver, Runtime: rt, Limits: limits,
		spec: ks}, nil
}

// ReattachSessions finds the live session sandboxes of every driver that
// can re-attach, whose labels contain match (the daemon's owner label),
// each with its kernel (a kernel that died meanwhile is started again,
// empty); the drivers destroy the sandboxes they cannot prove their own.
// specOf gives each sandbox's session (by the sandbox's ID) from its
// record: its runtime and tool (Runtime, Tool); a sandbox it does not know
// is destroyed. The caller must Close what it returns or keep it.
func (e *Engine) ReattachSessions(ctx context.Context, match map[string]string, specOf func(sandboxID string) (SessionSpec, bool)) ([]*LiveSession, error) {
	var (
		out  []*LiveSession
		errs []error
	)
	for name, d := range e.drivers {
		r, ok := d.(sandbox.Reattacher)
		if !ok {
			continue
		}
		sbs, err := r.Reattach(ctx, match)
		if err != nil {
			errs = append(errs, fmt.Errorf("re-attaching %s sandboxes: %w", name, err))
			continue
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
	return out, errors.Join(errs...)
}

func (e *Engine) adopt(ctx context.Context, sb sandbox.Sandbox, driver string, specOf func(string) (SessionSpec, bool)) (*LiveSession, error) {
	spec, ok := specOf(sb.ID())
	if !ok {
		return nil, errors.New("no active session has it")
	}
	spec.Driver = driver
	s, err := e.liveOf(sb, driver, spec.Runtime)
	if err != nil {
		return nil, err
	}
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
	s.mem = e.mem.hold(e.sessionMemory(spec))
	return s, nil
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

// liveOf is the session of runtime name that sandbox sb, which has
// processes already, serves.
func (e *Engine) liveOf(sb sandbox.Sandbox, driver, name string) (*LiveSession, error) {
	rt, ok := image.Runtimes[name]
	if !ok {
		return nil, fmt.Errorf("unknown runtime %q", name)
	}
	spec, err := e.kernelSpec(rt)
	if err != nil {
		return nil, err
	}
	return newLiveSession(sb, driver, rt, sandbox.Limits{}, spec)
}

// takeKernel makes the first live kernel of the sandbox the session's,
// stops any other (a session has one), and reports whether there was
// one.
func (s *LiveSession) takeKernel(ctx context.Context) (bool, error) {
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

func (s *LiveSession) startKernel(ctx context.Context) error {
	k, err := s.kernels.StartKernel(ctx, s.spec)
	if err != nil {
		return fmt.Errorf("starting the %s kernel of sandbox %s: %w", s.Runtime.Name, s.sb.ID(), err)
	}
	s.mu.Lock()
	s.kernel = k
	s.mu.Unlock()
	return nil
}

func (s *LiveSession) currentKernel() sandbox.Kernel {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kernel
}

// CellRequest is one cell to run.
type CellRequest struct {
	Code  string
	Stdin string
	// Timeout bounds the cell; zero means the session's limit.
	Timeout time.Duration
	// OnOutput and OnDisplay receive the cell's output and displays as
	// they come (see sandbox.Cell).
	OnOutput  func(sandbox.Stream, []byte)
	OnDisplay func(sandbox.Display)
}

// CellOutput is one rich output of a cell: its data is the text itself
// for a text/* type, base64 otherwise (image/png).
type CellOutput struct {
	MimeType string `json:"mime_type"`
	Data     string `json:"data"`
}

// CellError is the exception a cell raised.
type CellError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// CellResult is a cell's end, in the shape of the wire format. Status is
// succeeded (the cell ran to its end), failed (it raised: Error), timed_out,
// oom_killed (the sandbox's memory cgroup counted an OOM kill of its
// kernel) or killed (its kernel died of another signal, or its ctx ended:
// see EndedBy); KernelRestarted says its kernel was restarted, and its
// state lost, because the cell did not stop when interrupted or the
// kernel died. A cell whose kernel died keeps the output it printed.
type CellResult struct {
	Status          sandbox.Status `json:"status"`
	Stdout          string         `json:"stdout"`
	Stderr          string         `json:"stderr"`
	StdoutTruncated bool           `json:"stdout_truncated"`
	StderrTruncated bool           `json:"stderr_truncated"`
	Outputs         []CellOutput   `json:"outputs"`
	OutputsDropped  int            `json:"outputs_dropped,omitempty"`
	Error           *CellError     `json:"error,omitempty"`
	KernelRestarted bool           `json:"kernel_restarted"`
	DurationMS      int64          `json:"duration_ms"`
	Driver          string         `json:"driver"`
	Runtime         string         `json:"runtime"`
	// EndedBy is set when Stockade itself ended the cell before its code
	// did (status killed): EndedByCancel, EndedBySessionEnd or
	// EndedByShutdown. The caller sets it; Cell knows only that its ctx
	// ended.
	EndedBy string `json:"ended_by,omitempty"`
}

// exiter is a kernel that says how it ended, and whether the sandbox's
// memory cgroup counted an OOM kill in its last cell
// (internal/sandboxkit's).
type exiter interface {
	Exit() (code, signal int, ok bool)
	OOMKilled() bool
}

// Cell runs one cell in the session's kernel. A cell that runs past its
// timeout, or whose ctx ends, is interrupted (SIGINT); if it has not
// stopped InterruptGrace later, the kernel is restarted (the session
// stays, its state is lost). A kernel that dies in the cell (an OOM kill)
// is restarted too. An error means the session's sandbox is gone: a
// *SandboxLostError when the host knows how the cell ended (an OOM kill
// of the whole sandbox), any other when it could not run the cell.
func (s *LiveSession) Cell(ctx context.Context, req CellRequest) (*CellResult, error) {
	if !s.cellMu.TryLock() {
		return nil, errdefs.Publicf("session sandbox %s is running a cell: %w", s.sb.ID(), errdefs.ErrConflict)
	}
	defer s.cellMu.Unlock()
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = s.Limits.Timeout
	}
	if timeout <= 0 {
		timeout = sandbox.DefaultLimits().Timeout
	}
	k := s.currentKernel()
	if k == nil {
		return nil, errdefs.Publicf("session sandbox %s has no kernel: %w", s.sb.ID(), errdefs.ErrFailedPrecondition)
	}
	type ran struct {
		res *sandbox.CellResult
		err error
	}
	start := time.Now()
	done := make(chan ran, 1)
	kctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	// What the cell printed is kept here too: a kernel that dies in the
	// cell returns nothing of it.
	capOut := s.Limits.OutputCap
	if capOut <= 0 {
		capOut = sandbox.DefaultLimits().OutputCap
	}
	kept := &keptOutput{max: capOut, next: req.OnOutput}
	go func() {
		r, err := k.Run(kctx, sandbox.Cell{Code: req.Code, Stdin: req.Stdin, OnOutput: kept.add, OnDisplay: req.OnDisplay})
		done <- ran{r, err}
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	out := &CellResult{Driver: s.Driver, Runtime: s.Runtime.Name}
	var r ran
	select {
	case r = <-done:
	case <-timer.C:
		out.Status = sandbox.StatusTimedOut
	case <-ctx.Done():
		out.Status = sandbox.StatusKilled
	}
	if out.Status != "" {
		// Interrupted: the cell may stop (a KeyboardInterrupt), or the
		// kernel is restarted.
		_ = k.Interrupt()
		grace := time.NewTimer(InterruptGrace)
		defer grace.Stop()
		select {
		case r = <-done:
		case <-grace.C:
			r = ran{err: errKernelStuck}
		}
	}
	out.DurationMS = time.Since(start).Milliseconds()
	if r.err != nil {
		kept.fill(out)
		if err := s.restartAfter(ctx, k, r.err, out); err != nil {
			return nil, err
		}
		return out, nil
	}
	fill(out, r.res)
	if out.Status == "" {
		out.Status = sandbox.StatusSucceeded
		if r.res.Status == sandbox.CellRaised {
			out.Status = sandbox.StatusFailed
		}
	}
	return out, nil
}

var errKernelStuck = errors.New("the cell did not stop when interrupted")

// restartAfter restarts kernel k after the cell it ran ended with err
// (stuck past its interrupt, or the kernel died), and completes out. An
// error means the sandbox itself is lost.
func (s *LiveSession) restartAfter(ctx context.Context, k sandbox.Kernel, cause error, out *CellResult) error {
	ctx = context.WithoutCancel(ctx)
	wait := time.NewTimer(time.Second)
	defer wait.Stop()
	if cause == errKernelStuck {
		wait.Reset(0)
	}
	select {
	case <-k.Done():
	case <-wait.C:
		if cause != errKernelStuck {
			// The kernel lives, or the guest connection failed with the
			// whole sandbox.
			return s.lost(k, out, fmt.Errorf("running a cell in session sandbox %s: %w", s.sb.ID(), cause))
		}
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := k.Stop(stopCtx)
		cancel()
		if err != nil {
			return fmt.Errorf("stopping the stuck kernel of session sandbox %s: %w", s.sb.ID(), err)
		}
	}
	if out.Status == "" {
		out.Status = sandbox.StatusFailed
		out.Error = &CellError{Name: "KernelDied", Value: "the kernel exited during the cell"}
		if x, ok := k.(exiter); ok {
			code, sig, exited := x.Exit()
			if exited {
				out.Error.Value = fmt.Sprintf("the kernel exited during the cell (exit code %d, signal %d)", code, sig)
			}
			switch {
			case x.OOMKilled():
				// The kernel's evidence, not the signal: a cell may
				// SIGKILL its own kernel.
				oomKilled(out)
			case exited && sig != 0:
				out.Status = sandbox.StatusKilled
				out.Error.Name = "KernelKilled"
				out.Error.Value = fmt.Sprintf("the kernel was killed by signal %d (%s) during the cell", sig, syscall.Signal(sig))
			}
		}
	}
	if err := s.startKernel(ctx); err != nil {
		return s.lost(k, out, err)
	}
	out.KernelRestarted = true
	return nil
}

// oomKilled makes out the end of a cell whose kernel the OOM killer
// ended.
func oomKilled(out *CellResult) {
	out.Status, out.Error = sandbox.StatusOOMKilled, &CellError{Name: "MemoryError",
		Value: "the kernel was killed for using more memory than the session's limit"}
}

// lost is the error of a cell whose session's sandbox is gone (err):
// a *SandboxLostError with out completed when the sandbox's memory
// cgroup counted an OOM kill during the cell (under gVisor the host's OOM
// killer ends the Sentry, the whole sandbox), err as it is otherwise.
func (s *LiveSession) lost(k sandbox.Kernel, out *CellResult, err error) error {
	x, ok := k.(exiter)
	if !ok || !x.OOMKilled() {
		return err
	}
	if out.Status == "" || out.Status == sandbox.StatusFailed {
		oomKilled(out)
	}
	return &SandboxLostError{Result: out, Err: err}
}

// SandboxLostError is Cell's error when the cell ran and its session's
// sandbox is gone with it, and the host knows how the cell ended: Result,
// with the output the cell printed.
type SandboxLostError struct {
	Result *CellResult
	Err    error
}

func (e *SandboxLostError) Error() string {
	return fmt.Sprintf("the cell ended %s and its session's sandbox is gone: %v", e.Result.Status, e.Err)
}

func (e *SandboxLostError) Unwrap() error { return e.Err }

// keptOutput keeps the start of a cell's output, up to max bytes a
// stream, and passes every chunk on to next. It is called one chunk at a
// time (sandbox.Cell.OnOutput).
type keptOutput struct {
	max    int64
	next   func(sandbox.Stream, []byte)
	mu     sync.Mutex
	stdout []byte
	stderr []byte
	trunc  [2]bool
}

func (o *keptOutput) add(st sandbox.Stream, p []byte) {
	o.mu.Lock()
	b, i := &o.stdout, 0
	if st == sandbox.Stderr {
		b, i = &o.stderr, 1
	}
	room := max(o.max-int64(len(*b)), 0)
	*b = append(*b, p[:min(int64(len(p)), room)]...)
	o.trunc[i] = o.trunc[i] || int64(len(p)) > room
	o.mu.Unlock()
	if o.next != nil {
		o.next(st, p)
	}
}

// fill sets out's output to what was kept.
func (o *keptOutput) fill(out *CellResult) {
	o.mu.Lock()
	defer o.mu.Unlock()
	out.Stdout, out.Stderr = string(o.stdout), string(o.stderr)
	out.StdoutTruncated, out.StderrTruncated = o.trunc[0], o.trunc[1]
}

// fill copies what the kernel returned of a cell into out.
func fill(out *CellResult, r *sandbox.CellResult) {
	out.Stdout, out.Stderr = string(r.Stdout), string(r.Stderr)
	out.StdoutTruncated, out.StderrTruncated = r.StdoutTruncated, r.StderrTruncated
	out.Outputs = []CellOutput{}
	for _, d := range r.Displays {
		out.Outputs = append(out.Outputs, OutputOf(d))
	}
	if r.Value != nil {
		out.Outputs = append(out.Outputs, OutputOf(*r.Value))
	}
	out.OutputsDropped = r.DisplaysDropped
	if e := r.Error; e != nil {
		out.Error = &CellError{Name: e.Name, Value: e.Value, Traceback: e.Traceback}
	}
}

// OutputOf is display d as a cell's output.
func OutputOf(d sandbox.Display) CellOutput {
	if strings.HasPrefix(d.MimeType, "text/") && utf8.Valid(d.Data) {
		return CellOutput{MimeType: d.MimeType, Data: string(d.Data)}
	}
	return CellOutput{MimeType: d.MimeType, Data: base64.StdEncoding.EncodeToString(d.Data)}
}

// Interrupt interrupts the running cell (SIGINT to the kernel) and
// reports whether one was running.
func (s *LiveSession) Interrupt() (bool, error) {
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

// WorkspacePath returns the path in the sandbox of p, a path of a
// session's files: absolute below /workspace, or relative to it. A path
// with a NUL, a ".." component, or outside /workspace is
// ErrInvalidArgument.
func WorkspacePath(p string) (string, error) {
	switch {
	case p == "":
		return "", errdefs.Publicf("a path is required: %w", errdefs.ErrInvalidArgument)
	case strings.ContainsRune(p, 0):
		return "", errdefs.Publicf("path %q has a NUL byte: %w", p, errdefs.ErrInvalidArgument)
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return "", errdefs.Publicf("path %q has a \"..\" component: %w", p, errdefs.ErrInvalidArgument)
		}
	}
	if !strings.HasPrefix(p, "/") {
		p = WorkspaceDir + "/" + p
	}
	p = path.Clean(p)
	if p != WorkspaceDir && !strings.HasPrefix(p, WorkspaceDir+"/") {
		return "", errdefs.Publicf("path %q is outside %s: %w", p, WorkspaceDir, errdefs.ErrInvalidArgument)
	}
	return p, nil
}

// WriteFile writes what r yields, at most max bytes (ErrTooLarge past
// it, leaving no file), to p below /workspace and returns its size and
// SHA-256 (hex).
func (s *LiveSession) WriteFile(ctx context.Context, p string, r io.Reader, max int64) (int64, string, error) {
	p, err := WorkspacePath(p)
	if err != nil {
		return 0, "", err
	}
	h := sha256.New()
	n, err := s.files.WriteFile(ctx, p, 0o644, io.TeeReader(r, h), max)
	if err != nil {
		return 0, "", err
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// ReadFile reads the regular file p below /workspace: at most max bytes
// (a longer one is ErrTooLarge).
func (s *LiveSession) ReadFile(ctx context.Context, p string, max int64) ([]byte, sandbox.FileInfo, error) {
	p, err := WorkspacePath(p)
	if err != nil {
		return nil, sandbox.FileInfo{}, err
	}
	b, info, err := s.files.ReadFile(ctx, p, max)
	if err != nil {
		return nil, info, err
	}
	if info.Size > int64(len(b)) {
		return nil, info, errdefs.Publicf("%s is %d bytes, more than the limit of %d: %w", p, info.Size, max, errdefs.ErrTooLarge)
	}
	return b, info, nil
}

// ListDir lists the directory p below /workspace (or /workspace itself).
func (s *LiveSession) ListDir(ctx context.Context, p string) ([]sandbox.FileInfo, bool, error) {
	p, err := WorkspacePath(p)
	if err != nil {
		return nil, false, err
	}
	return s.files.ListDir(ctx, p)
}

// Stat describes the file p below /workspace, a symlink as itself.
func (s *LiveSession) Stat(ctx context.Context, p string) (sandbox.FileInfo, error) {
	p, err := WorkspacePath(p)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	return s.files.Stat(ctx, p)
}

// Remove removes the file, symlink or empty directory p below
// /workspace (not /workspace itself).
func (s *LiveSession) Remove(ctx context.Context, p string) error {
	p, err := WorkspacePath(p)
	if err != nil {
		return err
	}
	if p == WorkspaceDir {
		return errdefs.Publicf("%s itself cannot be removed: %w", WorkspaceDir, errdefs.ErrInvalidArgument)
	}
	return s.files.Remove(ctx, p)
}

// Close ends the session: its kernel and sandbox are destroyed.
// Closing twice is success.
func (s *LiveSession) Close(ctx context.Context) error {
	err := s.sb.Destroy(context.WithoutCancel(ctx))
	s.releaseMemory()
	return err
}
