package engine

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/wire"
)

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
type CellOutput = wire.CellOutput

// CellError is the exception a cell raised.
type CellError = wire.CellError

// CellResult is a cell's end: its status and the wire's cell end
// (wire.CellEnd), with its driver and runtime. Status is succeeded (the
// cell ran to its end), failed (it raised: Error), timed_out, oom_killed
// (the sandbox's memory cgroup counted an OOM kill of its kernel) or
// killed (its kernel died of another signal, or its ctx ended: see
// EndedBy); KernelRestarted says its kernel was restarted, and its state
// lost, because the cell did not stop when interrupted or the kernel
// died. A cell whose kernel died keeps the output it printed. EndedBy is
// set when Stockade itself ended the cell before its code did (status
// killed): EndedByCancel, EndedBySessionEnd or EndedByShutdown. The
// caller sets it; Cell knows only that its ctx ended.
type CellResult struct {
	Status sandbox.Status `json:"status"`
	wire.CellEnd
	Driver  string `json:"driver"`
	Runtime string `json:"runtime"`
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
func (s *Session) Cell(ctx context.Context, req CellRequest) (res *CellResult, err error) {
	if !s.cellMu.TryLock() {
		// Refused: no exec to measure.
		return nil, errdefs.Publicf("session sandbox %s is running a cell: %w", s.sb.ID(), errdefs.ErrConflict)
	}
	defer s.cellMu.Unlock()
	ctx, sp := telemetry.Start(ctx, telemetry.Exec, telemetry.Driver(s.Driver))
	defer func() {
		var st sandbox.Status
		if res != nil {
			st = res.Status
		}
		sp.EndAs(execOutcome(st, err), err)
	}()
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
func (s *Session) restartAfter(ctx context.Context, k sandbox.Kernel, cause error, out *CellResult) error {
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
func (s *Session) lost(k sandbox.Kernel, out *CellResult, err error) error {
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
