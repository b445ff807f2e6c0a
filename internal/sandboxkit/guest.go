// Package sandboxkit holds what every sandbox.Driver shares whose sandboxes
// run the Stockade guest agent as PID 1, whatever starts them (an OCI
// runtime CLI in internal/ocidriver, a Docker Engine in driver/docker): the
// host's end of the guest protocol (the greeting, one Exec at a time and how
// its result is classified), the sandbox's memory cgroup counters, and the
// host traces a driver's Leftovers looks for.
//
// A driver fills a Guest once it holds the guest's channel (its stdin and
// stdout, or the two pipes a runtime passes on: package guest, Channel), waits
// for the greeting, and then forwards its sandbox's Start to the Guest:
//
//	s.guest = sandboxkit.Guest{Sandbox: id, Limits: limits, In: stdin, Frames: bufio.NewReader(stdout), Kill: s.kill}
//	if err := s.guest.AwaitReady(ctx, 30*time.Second); err != nil {
//		s.guest.MarkGone()
//		return sandboxkit.StartError("runc", err, stderr.String())
//	}
//	ex, err := s.guest.Start(ctx, req)
package sandboxkit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/sandbox"
)

// Guest is the host's end of one guest agent. The driver sets the exported
// fields before the first AwaitReady or Start and does not change them
// afterwards. Guest is safe for concurrent use (one Exec runs at a time)
// and must not be copied after first use.
type Guest struct {
	// Sandbox is the sandbox's ID, for errors.
	Sandbox string
	// Limits are the sandbox's limits, defaults applied: Exec takes the
	// default timeout, the output cap and the memory limit from them.
	// Only Retune changes them after the first AwaitReady.
	Limits sandbox.Limits
	// In carries frames to the guest (the guest's stdin, or descriptor 3).
	In io.Writer
	// Frames carries the guest's frames back (the guest's stdout, or
	// descriptor 4). It
	// should be buffered: frames are read a header at a time.
	Frames io.Reader
	// Cgroup is the sandbox's cgroup on this host. The zero Cgroup (not
	// visible here) counts no OOM kill and no peak.
	Cgroup Cgroup
	// PeakFromCgroup makes Exec report the cgroup's peak memory, when it
	// has one, rather than the guest's maximum resident set size. Set it
	// when the cgroup holds exactly the sandbox's processes (not under
	// gVisor, whose Sentry is in it too).
	PeakFromCgroup bool
	// CPUFromCgroup makes Exec report the cgroup's CPU time over the Exec,
	// when it has one, rather than the guest's count of its children's.
	// Set it where the guest's count is not the host's: gVisor's Sentry
	// counts a task's time in the program as running while the host has
	// it throttled at the cgroup's quota, so the guest sees more CPU time
	// than the quota let the sandbox use (1.2-1.3 CPUs of a 1-CPU cap with
	// four busy processes). The cgroup holds what the host ran and capped
	// for the sandbox: the program, and under gVisor the Sentry and gofer
	// serving it. An Exec that asks for an exit notice and streams its
	// stdin is a pool's: its program waits for its code there, long after
	// the Exec starts, and runs once the code comes, so its cgroup count
	// starts at the first write to its stdin, not at its start (which
	// would add the wait and the pool's imports).
	CPUFromCgroup bool
	// Kill ends the sandbox's PID 1, and with it every process of the
	// sandbox and the guest's stream, without waiting: where the guest
	// holds its channel itself, also when only its runtime could be
	// killed. Required.
	Kill func(ctx context.Context)
	// ReservedIDs are the request ids earlier clients of the guest used
	// (a guest reached again through its supervisor): this Guest's ids
	// start above them (see guest.Client.ReserveIDs).
	ReservedIDs uint32
	// DiedOfOOM, if set, is asked when the guest's stream ended without an
	// exit report and the cgroup counted no OOM kill: it reports whether
	// the sandbox was OOM-killed all the same (a remote engine knows it
	// from the container's state). It may wait briefly.
	DiedOfOOM func(ctx context.Context) bool

	mu      sync.Mutex                   // guards dead, frozen, cells, ops, running and kernels
	dead    bool                         // the guest can no longer run programs
	frozen  bool                         // dead because of Freeze, until Thaw
	cells   int                          // the cells that run
	ops     int                          // the other requests in flight (begin)
	running *execHandle                  // the Exec that has not ended, nil if none
	kernels map[uint32]*kernel           // the handles of the kernels, by id
	client  atomic.Pointer[guest.Client] // set by AwaitReady
}

// AwaitReady waits at most timeout for the guest's hello and agrees on a
// protocol version with it (see guest.NewClient). It fails when the guest
// sends anything else first, speaks no version this host speaks, or its
// stream ends, and returns ctx's error when ctx ends first. After a failure
// a goroutine still reads Frames until the stream ends: the caller kills the
// sandbox (and StartError explains the failure).
func (g *Guest) AwaitReady(ctx context.Context, timeout time.Duration) error {
	type hello struct {
		h   *guest.Hello
		err error
	}
	ready := make(chan hello, 1)
	go func() {
		h, err := guest.ReadHello(g.Frames)
		ready <- hello{h, err}
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case r := <-ready:
		if r.err != nil {
			return r.err
		}
		c, err := guest.NewClient(g.Frames, g.In, r.h)
		if err != nil {
			return err
		}
		c.ReserveIDs(g.ReservedIDs)
		g.client.Store(c)
		return nil
	case <-timer.C:
		return fmt.Errorf("guest did not start within %s", timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Client is the guest's protocol client once AwaitReady succeeded, nil
// before: for the guest's own tests, which drive it below the contract.
func (g *Guest) Client() *guest.Client { return g.client.Load() }

// Retune replaces the guest's limits with l once apply, which changes what
// enforces them on the host (the cgroup), has succeeded: a binding
// tightens an unbound sandbox's limits. No Exec starts meanwhile. While one
// runs (a warm pool's interpreter, waiting for its program), only the
// limits the host enforces (memory, CPU, pids) may change: the running
// Exec keeps the timeout and output cap it started with, and a change of
// those fails (ErrFailedPrecondition) without calling apply.
func (g *Guest) Retune(l sandbox.Limits, apply func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.dead:
		return fmt.Errorf("sandbox %s is no longer running: %w", g.Sandbox, errdefs.ErrFailedPrecondition)
	case g.running != nil && (l.Timeout != g.Limits.Timeout || l.OutputCap != g.Limits.OutputCap):
		return fmt.Errorf("sandbox %s runs a program; its timeout and output cap change only between programs: %w", g.Sandbox, errdefs.ErrFailedPrecondition)
	}
	if err := apply(); err != nil {
		return err
	}
	g.Limits = l
	return nil
}

// Freeze makes the guest refuse everything from now on (as MarkGone does)
// when nothing runs in it, for a checkpoint of the sandbox: an Exec, a
// cell, a file operation or a kernel's start or listing in flight is
// ErrFailedPrecondition, and nothing changes (a file half written would
// be saved so). The one Exec it saves is a pool's interpreter that still
// waits for its program (an Exec with an exit notice and streamed stdin,
// nothing written to it yet): a guest restored from the checkpoint keeps
// it, and ResumeExec adopts it. It
// returns the guest's hello and the highest request id used so far, which
// a client of the restored guest needs (supervisor.Meta). Thaw undoes it
// when the checkpoint fails.
func (g *Guest) Freeze() (guest.Hello, uint32, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.client.Load()
	switch {
	case g.dead || c == nil:
		return guest.Hello{}, 0, fmt.Errorf("sandbox %s is no longer running: %w", g.Sandbox, errdefs.ErrFailedPrecondition)
	case (g.running != nil && !g.running.waiting()) || g.cells > 0 || g.ops > 0:
		return guest.Hello{}, 0, fmt.Errorf("sandbox %s runs a program, a cell or a file operation; it is saved only when idle: %w", g.Sandbox, errdefs.ErrFailedPrecondition)
	}
	g.dead, g.frozen = true, true
	return c.Hello(), c.LastID(), nil
}

// Thaw undoes a Freeze: the guest serves again.
func (g *Guest) Thaw() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.frozen {
		g.dead, g.frozen = false, false
	}
}

// beginCell counts a cell that starts, unless the guest is gone or frozen.
func (g *Guest) beginCell() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dead {
		return fmt.Errorf("sandbox %s is no longer running: %w", g.Sandbox, errdefs.ErrFailedPrecondition)
	}
	g.cells++
	return nil
}

func (g *Guest) endCell() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cells--
}

// limits returns the guest's limits.
func (g *Guest) limits() sandbox.Limits {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.Limits
}

// StartError is Create's error for a guest that did not start (err, from
// AwaitReady): ctx's cancellation or deadline as such, anything else as
// ErrUnavailable explained by the last line of stderr (what the runtime or
// the guest said before it ended) or, when that is empty, of err. runtime
// names what started the sandbox ("runc", "docker").
func StartError(runtime string, err error, stderr string) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("starting sandbox: %w", err)
	}
	msg := stderr
	if msg == "" {
		msg = err.Error()
	}
	return fmt.Errorf("starting sandbox with %s: %s: %w", runtime, OneLine(msg), errdefs.ErrUnavailable)
}

// MarkGone records that the guest can no longer run programs: every later
// Start fails with ErrFailedPrecondition. It waits for an Exec in flight to
// return, so that none of that Exec's clean-up (a kill) outlives the
// caller; the caller must first end the guest's stream so that it returns.
func (g *Guest) MarkGone() {
	g.mu.Lock()
	g.dead, g.frozen = true, false
	h := g.running
	g.mu.Unlock()
	if h != nil {
		<-h.done
	}
}

// killGrace is how long an Exec waits for the guest's stream to end once it
// has killed the sandbox, and cancelGrace how long a guest has to end an
// exec it was asked to cancel before the sandbox is killed (tests shorten
// both).
var (
	killGrace   = 30 * time.Second
	cancelGrace = 5 * time.Second
)

// outcome is what the guest said of one Exec.
type outcome struct {
	report *guest.ExitReport
	failed *guest.Error // the program could not be started
	err    error
}

// Start sends one program to the guest and returns its handle, as
// sandbox.Sandbox's Start. A program that fails, is killed, OOM-killed or
// times out is a Result. After a timeout, a cancelled ctx or Cancel the
// guest is asked to cancel the exec (it kills the exec's processes): when
// it reports the end within cancelGrace the sandbox serves the next Exec,
// otherwise it is killed. After a guest that died or broke the protocol the
// sandbox is killed. A killed sandbox's Guest is gone.
func (g *Guest) Start(ctx context.Context, req sandbox.ExecRequest) (sandbox.Exec, error) {
	if err := checkExec(req); err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dead {
		return nil, fmt.Errorf("sandbox %s is no longer running: %w", g.Sandbox, errdefs.ErrFailedPrecondition)
	}
	if g.running != nil {
		return nil, fmt.Errorf("sandbox %s runs another program; one runs at a time: %w", g.Sandbox, errdefs.ErrConflict)
	}
	c := g.client.Load()
	if c == nil {
		return nil, fmt.Errorf("sandbox %s: the guest is not ready: %w", g.Sandbox, errdefs.ErrFailedPrecondition)
	}
	// The sandbox's limit is also the ceiling of one Exec's.
	timeout := req.Timeout
	if timeout <= 0 || (g.Limits.Timeout > 0 && timeout > g.Limits.Timeout) {
		timeout = g.Limits.Timeout
	}
	mode := req.File.Mode
	if mode == 0 {
		mode = 0o644
	}
	h := &execHandle{g: g, req: req, cancel: make(chan struct{}), done: make(chan struct{})}
	h.oomBefore = g.Cgroup.OOMKills()
	h.cpuBefore.Store(int64(g.Cgroup.CPUUsage()))
	g.Cgroup.ResetPeak()
	h.start = time.Now()
	var onOutput func(guest.Stream, []byte)
	if req.OnOutput != nil {
		onOutput = func(s guest.Stream, p []byte) { req.OnOutput(stream(s), p) }
	}
	// The request (up to a few MiB) is queued, not written, here: a guest
	// that stops reading cannot hold the host past the timer and ctx.
	ex, err := c.Exec(ctx, guest.ExecRequest{
		File:        &guest.FileSpec{Path: "/tmp/" + req.File.Name, Data: req.File.Data, Mode: mode},
		Argv:        req.Argv,
		Env:         req.Env,
		Stdin:       req.Stdin,
		StdinStream: req.StdinStream,
		ExitNotice:  req.ExitNotice,
		OutputCap:   g.Limits.OutputCap + 1, // see guest.ExecRequest.OutputCap
	}, guest.ExecOptions{OutputCap: g.Limits.OutputCap, OnOutput: onOutput})
	if err != nil {
		return nil, g.lost(ctx, err)
	}
	g.track(ctx, h, ex, timeout)
	return h, nil
}

// track makes h, an Exec of ex that the guest runs, the guest's running
// Exec, supervised until its end or timeout, with g.mu held.
func (g *Guest) track(ctx context.Context, h *execHandle, ex *guest.Exec, timeout time.Duration) {
	req := h.req
	h.ex = ex
	if w := ex.Stdin(); w != nil {
		h.stdin = w
		if req.ExitNotice {
			h.stdin = &codeStdin{WriteCloser: w, h: h}
		}
	}
	g.running = h
	go h.supervise(ctx, time.NewTimer(timeout))
}

// execHandle is one Exec of a Guest: supervise follows it to its end and
// leaves the outcome for Wait.
type execHandle struct {
	g   *Guest
	req sandbox.ExecRequest
	ex  *guest.Exec

	stdin io.WriteCloser // nil without StdinStream

	start     time.Time
	oomBefore int64
	// cpuBefore is the cgroup's CPU time, in nanoseconds, when the program
	// began: at Start, or for a pool's Exec when its code came (codeStdin).
	cpuBefore atomic.Int64
	// fed is set once a pool's Exec was written its program (codeStdin).
	fed        atomic.Bool
	cancelOnce sync.Once
	cancel     chan struct{} // closed by Cancel
	done       chan struct{} // closed once res and err are set
	res        *sandbox.Result
	err        error
}

func (h *execHandle) Wait(ctx context.Context) (*sandbox.Result, error) {
	select {
	case <-h.done:
		return h.res, h.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (h *execHandle) Signal(sig syscall.Signal) error {
	select {
	case <-h.done:
		return nil
	default:
	}
	if err := h.ex.Signal(sig); err != nil && !errors.Is(err, guest.ErrClosed) {
		return err
	}
	return nil
}

func (h *execHandle) Cancel() error {
	h.cancelOnce.Do(func() { close(h.cancel) })
	return nil
}

func (h *execHandle) Stdin() io.WriteCloser { return h.stdin }

// supervise waits for the exec's end, its timer, its ctx or Cancel, and
// records its outcome. It runs once per Exec, in a goroutine of its own.
func (h *execHandle) supervise(ctx context.Context, timer *time.Timer) {
	defer timer.Stop()
	g := h.g
	res := &sandbox.Result{ExitCode: -1}
	o, err := h.run(ctx, timer.C, res)
	if err == nil {
		err = h.classify(ctx, o, res)
	}
	if err != nil {
		res = nil
	}
	g.mu.Lock()
	g.running = nil
	g.mu.Unlock()
	h.res, h.err = res, err
	close(h.done)
}

// classify turns what the guest said into res, the program's Result, or
// into Start's error for a program that could not be started. It kills the
// sandbox where the guest can no longer be trusted with another Exec.
func (h *execHandle) classify(ctx context.Context, o outcome, res *sandbox.Result) error {
	g := h.g
	res.Duration = time.Since(h.start)
	oomKilled := g.Cgroup.OOMKills() > h.oomBefore

	// The guest's numbers are bounded by what the sandbox could have
	// used: its CPU share over the wall clock, with slack for rounding.
	maxCPU := time.Duration(float64(res.Duration)*max(g.Limits.CPU, 1)) + time.Second
	switch {
	case res.Status == sandbox.StatusTimedOut:
		res.CPUTime = min(max(res.CPUTime, 0), maxCPU)
		return nil
	case o.failed != nil:
		// Nothing ran; the sandbox is not trusted with another Exec.
		g.markDead()
		g.Kill(ctx)
		return fmt.Errorf("starting %s in sandbox: %s: %w", h.req.Argv[0], OneLine(o.failed.Message), errdefs.ErrFailedPrecondition)
	case o.err != nil:
		// The guest died or broke the protocol: nothing it says is
		// trusted any more, and the sandbox cannot be reused. What the
		// sandbox used is read from its cgroup before it is killed, as
		// for a timeout: under gVisor an OOM kill ends the Sentry, and
		// the guest with it, before it can report.
		res.CPUTime, res.PeakMemory = min(max(g.Cgroup.CPUUsage()-h.cpuUsedBefore(), 0), maxCPU), g.Cgroup.Peak()
		g.markDead()
		g.Kill(ctx)
		// The OOM killer counts its kill after it sends SIGKILL, so a
		// guest that died of it may be seen gone before the count is:
		// it is read again once the sandbox is killed (a count of a
		// cgroup already removed reads 0, never a kill that was not).
		oomKilled = oomKilled || g.Cgroup.OOMKills() > h.oomBefore
		res.Status = sandbox.StatusKilled
		if oomKilled || (g.DiedOfOOM != nil && g.DiedOfOOM(ctx)) {
			// The kernel's OOM killer ended the sandbox's processes,
			// and it ends them with SIGKILL; the cgroup (or the
			// engine) counted it.
			res.Status, res.Signal = sandbox.StatusOOMKilled, int(syscall.SIGKILL)
		}
	default:
		r := o.report
		res.ExitCode, res.Signal = r.ExitCode, r.Signal
		res.CPUTime = min(time.Duration(min(r.CPUUserUs, int64(maxCPU/time.Microsecond))+min(r.CPUSysUs, int64(maxCPU/time.Microsecond)))*time.Microsecond, maxCPU)
		res.PeakMemory = min(r.MaxRSSBytes, g.Limits.Memory)
		res.Status = exitStatus(r, oomKilled)
	}
	if g.PeakFromCgroup {
		if p := g.Cgroup.Peak(); p > 0 {
			res.PeakMemory = p
		}
	}
	if g.CPUFromCgroup {
		// A cgroup already gone (the runtime removed it) reads zero.
		if now, before := g.Cgroup.CPUUsage(), h.cpuUsedBefore(); now > 0 && now >= before {
			res.CPUTime = now - before
		}
	}
	return nil
}

// cpuUsedBefore is the cgroup's CPU time when the program began.
func (h *execHandle) cpuUsedBefore() time.Duration { return time.Duration(h.cpuBefore.Load()) }

// markDead records that the guest can serve no more Execs.
func (g *Guest) markDead() {
	g.mu.Lock()
	g.dead, g.frozen = true, false
	g.mu.Unlock()
}

// run waits for the exec's end, the timer, ctx or Cancel, filling res
// with the output kept. On the timer, ctx or Cancel it cancels the exec
// and gives the guest cancelGrace to end it, then kills the sandbox. It
// returns what the guest said (on the timer with res.Status set to timed
// out), or an error when ctx ended or the sandbox could not be killed.
func (h *execHandle) run(ctx context.Context, timer <-chan time.Time, res *sandbox.Result) (outcome, error) {
	g, ex := h.g, h.ex
	// end kills the sandbox: the guest's stream then ends, and with it the
	// exec, with everything read so far. If the stream does not end (a
	// kill that failed), only an error is returned; Destroy closes it.
	end := func() error {
		g.markDead()
		g.Kill(ctx)
		select {
		case <-ex.Done():
			return nil
		case <-time.After(killGrace):
			return fmt.Errorf("sandbox %s did not end within %s of being killed: %w", g.Sandbox, killGrace, errdefs.ErrUnavailable)
		}
	}
	// stop cancels the exec and waits for the guest to end it.
	stop := func() error {
		if ex.Cancel() == nil {
			select {
			case <-ex.Done():
				return nil
			case <-time.After(cancelGrace):
			}
		}
		return end()
	}
	// What a program cut short by its timer or ctx used is read from the
	// sandbox's cgroup before it is stopped: the guest may not live to
	// report it (after a kill the runtime may remove the cgroup). Under
	// gVisor the cgroup also holds the Sentry, whose own CPU time and
	// memory are counted with the program's.
	measure := func() {
		res.CPUTime, res.PeakMemory = g.Cgroup.CPUUsage()-h.cpuUsedBefore(), g.Cgroup.Peak()
	}
	timedOut, cut := false, false
	select {
	case <-ex.Done():
	case <-timer:
		measure()
		if err := stop(); err != nil {
			return outcome{}, err
		}
		timedOut = true
	case <-h.cancel:
		if err := stop(); err != nil {
			return outcome{}, err
		}
	case <-ctx.Done():
		measure()
		if err := stop(); err != nil {
			return outcome{}, err
		}
		cut = true
	}
	r, err := ex.Wait(context.WithoutCancel(ctx))
	res.Stdout, res.Stderr = r.Stdout, r.Stderr
	res.StdoutTruncated, res.StderrTruncated = r.StdoutTruncated, r.StderrTruncated
	if cut {
		res.Status, res.Duration = sandbox.StatusKilled, time.Since(h.start)
		res.CPUTime = min(max(res.CPUTime, 0), time.Duration(float64(res.Duration)*max(g.Limits.CPU, 1))+time.Second)
		return outcome{}, &sandbox.CutShortError{Result: res, Err: fmt.Errorf("running in sandbox %s: %w", g.Sandbox, ctx.Err())}
	}
	var o outcome
	var gerr *guest.Error
	switch {
	case err == nil:
		o.report = r.Exit
	case errors.As(err, &gerr) && !timedOut:
		o.failed = gerr
	default:
		o.err = err
	}
	if timedOut {
		res.Status = sandbox.StatusTimedOut
	}
	return o, nil
}

// lost handles a request that could not be queued: ctx's end, or a guest
// that is gone. The sandbox is killed. g.mu is held.
func (g *Guest) lost(ctx context.Context, err error) error {
	g.dead = true
	g.Kill(ctx)
	if ctx.Err() != nil {
		return fmt.Errorf("running in sandbox %s: %w", g.Sandbox, ctx.Err())
	}
	return fmt.Errorf("sending program to sandbox %s: %v: %w", g.Sandbox, err, errdefs.ErrUnavailable)
}

// exitStatus classifies a program the guest reported as ended. A signal is
// an OOM kill when the cgroup counted one during the Exec.
func exitStatus(r *guest.ExitReport, oomKilled bool) sandbox.Status {
	switch {
	case oomKilled && r.Signal != 0:
		return sandbox.StatusOOMKilled
	case r.Signal != 0:
		return sandbox.StatusKilled
	case r.ExitCode == 0:
		return sandbox.StatusSucceeded
	default:
		return sandbox.StatusFailed
	}
}

// checkExec validates a request before anything is sent to the guest.
func checkExec(req sandbox.ExecRequest) error {
	name := req.File.Name
	switch {
	case name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("file name %q must be a plain file name: %w", name, errdefs.ErrInvalidArgument)
	case len(req.File.Data) > sandbox.MaxCodeSize:
		return fmt.Errorf("code is %d bytes, more than the limit of %d: %w", len(req.File.Data), sandbox.MaxCodeSize, errdefs.ErrInvalidArgument)
	case len(req.Stdin) > sandbox.MaxCodeSize:
		return fmt.Errorf("stdin is %d bytes, more than the limit of %d: %w", len(req.Stdin), sandbox.MaxCodeSize, errdefs.ErrInvalidArgument)
	case req.StdinStream && req.Stdin != nil:
		return fmt.Errorf("stdin is both given and streamed: %w", errdefs.ErrInvalidArgument)
	case len(req.Argv) == 0 || !strings.HasPrefix(req.Argv[0], "/"):
		return fmt.Errorf("argv must start with an absolute path: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}
