package ocidriver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/sandbox"
)

// sbx is one sandbox: a `<runtime> run` process whose container's PID 1 is
// the guest, reached through the runtime's stdin and stdout.
type sbx struct {
	d      *Driver
	id     string
	limits sandbox.Limits
	cg     cgroup

	cmd    *exec.Cmd
	stdin  *os.File      // host -> guest frames
	stdout *os.File      // guest -> host frames
	frames *bufio.Reader // over stdout
	stderr *boundedBuffer
	exited chan struct{} // closed when the runtime process has exited

	mu   sync.Mutex // serialises Exec
	dead bool       // the guest can no longer run programs

	destroyOnce sync.Once
	destroyErr  error
}

var _ sandbox.Sandbox = (*sbx)(nil)

func (s *sbx) ID() string { return s.id }

// start launches the runtime and waits for the guest's FrameReady.
func (s *sbx) start(ctx context.Context) error {
	inR, inW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("creating pipe: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return fmt.Errorf("creating pipe: %w", err)
	}
	s.stdin, s.stdout = inW, outR
	s.frames = bufio.NewReaderSize(outR, 64<<10)
	s.stderr = &boundedBuffer{max: 16 << 10}
	// The runtime process must outlive ctx (which only bounds Create), so
	// it is not started with it; Destroy ends it.
	s.cmd = s.d.runtimeCmd(context.WithoutCancel(ctx), "run", "--bundle", s.d.bundleDir(s.id), s.id)
	s.cmd.Stdin, s.cmd.Stdout, s.cmd.Stderr = inR, outW, s.stderr
	err = s.cmd.Start()
	inR.Close()
	outW.Close()
	if err != nil {
		s.cmd = nil
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return s.d.missingBinary(err)
		}
		return fmt.Errorf("starting %s: %v: %w", s.d.cfg.Binary, err, errdefs.ErrUnavailable)
	}
	s.exited = make(chan struct{})
	go func() {
		_ = s.cmd.Wait()
		close(s.exited)
	}()

	ready := make(chan error, 1)
	go func() {
		t, p, err := guest.ReadFrame(s.frames, 4<<10)
		if err == nil {
			var r guest.Ready
			switch {
			case t != guest.FrameReady:
				err = fmt.Errorf("first frame is %q, not ready: %w", t, guest.ErrProtocol)
			case guest.DecodeJSON(p, &r) != nil || r.Version != guest.Version:
				err = fmt.Errorf("guest speaks protocol version %d, want %d: %w", r.Version, guest.Version, guest.ErrProtocol)
			}
		}
		ready <- err
	}()
	timer := time.NewTimer(s.d.cfg.ReadyTimeout)
	defer timer.Stop()
	select {
	case err = <-ready:
	case <-timer.C:
		err = fmt.Errorf("guest did not start within %s", s.d.cfg.ReadyTimeout)
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		s.dead = true
		s.kill()
		<-s.exited
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("starting sandbox: %w", err)
		}
		msg := s.stderr.String()
		if msg == "" {
			msg = err.Error()
		}
		return fmt.Errorf("starting sandbox with %s: %s: %w", s.d.cfg.Name, oneLine(msg), errdefs.ErrUnavailable)
	}
	return nil
}

// kill ends the sandbox's PID 1, and with it every process of the sandbox.
// It does not wait.
func (s *sbx) kill() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.d.runtimeCmd(ctx, "kill", s.id, "KILL").Run(); err != nil && s.cmd != nil && s.cmd.Process != nil {
		// The container may not exist (yet or any more); killing the
		// runtime process makes sure nothing waits on it.
		_ = s.cmd.Process.Kill()
	}
}

// outcome is what the frame reader saw for one Exec.
type outcome struct {
	report *guest.ExitReport
	failed *guest.ErrorReport
	err    error
}

// Exec sends one program to the guest and collects its output and exit.
func (s *sbx) Exec(ctx context.Context, req sandbox.ExecRequest) (*sandbox.Result, error) {
	if err := checkExec(req); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return nil, fmt.Errorf("sandbox %s is no longer running: %w", s.id, errdefs.ErrFailedPrecondition)
	}
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = s.limits.Timeout
	}
	mode := req.File.Mode
	if mode == 0 {
		mode = 0o644
	}
	oomBefore := s.cg.oomKills()
	s.cg.resetPeak()
	start := time.Now()
	err := guest.WriteJSON(s.stdin, guest.FrameExec, guest.ExecRequest{
		File:      guest.FileSpec{Path: "/tmp/" + req.File.Name, Data: req.File.Data, Mode: mode},
		Argv:      req.Argv,
		Env:       req.Env,
		Stdin:     req.Stdin,
		OutputCap: s.limits.OutputCap + 1,
	})
	if err != nil {
		s.dead = true
		return nil, fmt.Errorf("sending program to sandbox %s: %v: %w", s.id, err, errdefs.ErrUnavailable)
	}

	res := &sandbox.Result{ExitCode: -1}
	done := make(chan outcome, 1)
	go func() { done <- s.collect(res, req.OnOutput) }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var o outcome
	var timedOut bool
	select {
	case o = <-done:
	case <-timer.C:
		timedOut = true
		s.dead = true
		s.kill()
		o = <-done
	case <-ctx.Done():
		s.dead = true
		s.kill()
		<-done
		return nil, fmt.Errorf("running in sandbox %s: %w", s.id, ctx.Err())
	}
	res.Duration = time.Since(start)
	oomKilled := s.cg.oomKills() > oomBefore

	switch {
	case timedOut:
		res.Status = sandbox.StatusTimedOut
	case o.failed != nil:
		return nil, fmt.Errorf("starting %s in sandbox: %s: %w", req.Argv[0], oneLine(o.failed.Message), errdefs.ErrFailedPrecondition)
	case o.err != nil:
		// The guest died or broke the protocol: nothing it says is
		// trusted any more, and the sandbox cannot be reused.
		s.dead = true
		s.kill()
		res.Status = sandbox.StatusKilled
		if oomKilled {
			res.Status = sandbox.StatusOOMKilled
		}
	default:
		r := o.report
		res.ExitCode, res.Signal = r.ExitCode, r.Signal
		res.CPUTime = time.Duration(r.CPUUserUs+r.CPUSysUs) * time.Microsecond
		res.PeakMemory = min(r.MaxRSSBytes, s.limits.Memory)
		switch {
		case oomKilled && r.Signal != 0:
			res.Status = sandbox.StatusOOMKilled
		case r.Signal != 0:
			res.Status = sandbox.StatusKilled
		case r.ExitCode == 0:
			res.Status = sandbox.StatusSucceeded
		default:
			res.Status = sandbox.StatusFailed
		}
	}
	if s.d.cfg.PeakFromCgroup {
		if p := s.cg.peak(); p > 0 {
			res.PeakMemory = p
		}
	}
	return res, nil
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
	case len(req.Argv) == 0 || !strings.HasPrefix(req.Argv[0], "/"):
		return fmt.Errorf("argv must start with an absolute path: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// collect reads frames until the program's exit report, keeping at most the
// output cap of each stream in res.
func (s *sbx) collect(res *sandbox.Result, onOutput func(sandbox.Stream, []byte)) outcome {
	r, failed, err := Collect(s.frames, s.limits.OutputCap, res, onOutput)
	return outcome{report: r, failed: failed, err: err}
}

// Collect reads the guest's frames of one Exec from frames until the
// program's end. It keeps at most outputCap bytes of each stream in res
// (setting the truncation flags) and passes what it keeps to onOutput, if
// set. It returns the validated exit report, or the guest's error report when
// the program could not be started, or an error when the stream ended or the
// guest broke the protocol (the sandbox must then not be used again). Every
// driver that speaks to the guest over a byte stream shares it (driver/docker
// does, over the Docker attach stream).
func Collect(frames io.Reader, outputCap int64, res *sandbox.Result, onOutput func(sandbox.Stream, []byte)) (*guest.ExitReport, *guest.ErrorReport, error) {
	limit := outputCap
	for {
		t, p, err := guest.ReadFrame(frames, 0)
		if err != nil {
			return nil, nil, err
		}
		switch t {
		case guest.FrameStdout, guest.FrameStderr:
			if len(p) > guest.MaxChunk {
				return nil, nil, fmt.Errorf("output chunk of %d bytes: %w", len(p), guest.ErrProtocol)
			}
			buf, trunc, stream := &res.Stdout, &res.StdoutTruncated, sandbox.Stdout
			if t == guest.FrameStderr {
				buf, trunc, stream = &res.Stderr, &res.StderrTruncated, sandbox.Stderr
			}
			room := limit - int64(len(*buf))
			if int64(len(p)) > room {
				p = p[:max(room, 0)]
				*trunc = true
			}
			if len(p) > 0 {
				*buf = append(*buf, p...)
				if onOutput != nil {
					onOutput(stream, p)
				}
			}
		case guest.FrameExit:
			var r guest.ExitReport
			if err := guest.DecodeJSON(p, &r); err != nil {
				return nil, nil, err
			}
			if err := r.Validate(); err != nil {
				return nil, nil, err
			}
			// The guest stops forwarding at the cap and reports nothing
			// about the rest, so reaching the cap exactly means truncation.
			if int64(len(res.Stdout)) >= limit {
				res.StdoutTruncated = true
			}
			if int64(len(res.Stderr)) >= limit {
				res.StderrTruncated = true
			}
			return &r, nil, nil
		case guest.FrameError:
			var r guest.ErrorReport
			if err := guest.DecodeJSON(p, &r); err != nil {
				return nil, nil, err
			}
			if len(r.Message) > 1024 {
				r.Message = r.Message[:1024]
			}
			return nil, &r, nil
		default:
			return nil, nil, fmt.Errorf("unexpected frame %q: %w", t, guest.ErrProtocol)
		}
	}
}

// Destroy ends the sandbox and removes its runtime state, cgroups and
// bundle. It is idempotent and safe to call on a sandbox that never started.
func (s *sbx) Destroy(ctx context.Context) error {
	s.destroyOnce.Do(func() { s.destroyErr = s.destroy(ctx) })
	return s.destroyErr
}

func (s *sbx) destroy(ctx context.Context) error {
	if s.cmd != nil {
		// EOF on its stdin makes the guest kill everything and exit, and
		// the runtime then removes the container by itself. That is the
		// fast path; the kill below is for a guest that does not comply.
		s.stdin.Close()
		select {
		case <-s.exited:
		case <-time.After(2 * time.Second):
			s.kill()
			select {
			case <-s.exited:
			case <-time.After(10 * time.Second):
				_ = s.cmd.Process.Kill()
				<-s.exited
			}
		}
		s.stdout.Close()
		// An Exec in flight sees the guest gone and returns soon; waiting
		// for it means none of its clean-up (a runtime kill) outlives
		// Destroy.
		s.mu.Lock()
		s.dead = true
		s.mu.Unlock()
	}
	var errs []error
	if _, err := os.Stat(s.d.runtimeDir(s.id)); err == nil {
		out, err := s.d.runtimeCmd(ctx, "delete", "--force", s.id).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "not exist") && !strings.Contains(string(out), "not found") {
			errs = append(errs, fmt.Errorf("deleting container %s: %s", s.id, oneLine(string(out))))
		}
	}
	s.cg.remove()
	if err := os.RemoveAll(s.d.bundleDir(s.id)); err != nil {
		errs = append(errs, fmt.Errorf("removing bundle: %w", err))
	}
	return errors.Join(errs...)
}

// oneLine folds a multi-line message for a one-line error.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		// Runtimes put the decisive message last.
		s = strings.TrimSpace(s[i+1:])
	}
	if len(s) > 512 {
		s = s[:512]
	}
	return s
}
