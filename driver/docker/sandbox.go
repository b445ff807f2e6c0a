package docker

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/sandbox"
)

// sbx is one sandbox: a container whose PID 1 is the guest, reached through
// one attach connection: our writes are the guest's stdin, and the engine
// multiplexes the guest's stdout (frames) and stderr (diagnostics) back.
type sbx struct {
	d      *Driver
	id     string
	cid    string // the engine's container ID
	limits sandbox.Limits
	cg     cgroup

	att       *client.HijackedResponse // nil until attached
	stdout    *io.PipeReader           // the guest's stdout, demultiplexed
	frames    *bufio.Reader            // over stdout
	stderr    *boundedBuffer
	demuxDone chan struct{} // closed when the attach stream has ended

	mu   sync.Mutex // serialises Exec
	dead bool       // the guest can no longer run programs

	destroyOnce sync.Once
	destroyErr  error
}

var _ sandbox.Sandbox = (*sbx)(nil)

func (s *sbx) ID() string { return s.id }

// start attaches to the created container, starts it and waits for the
// guest's FrameReady. Attaching first means no byte of the guest's output
// is missed.
func (s *sbx) start(ctx context.Context) error {
	att, err := s.d.cli.ContainerAttach(ctx, s.cid, client.ContainerAttachOptions{
		Stream: true, Stdin: true, Stdout: true, Stderr: true,
	})
	if err != nil {
		return s.d.engineError("attaching to the container in", err)
	}
	s.att = &att.HijackedResponse
	pr, pw := io.Pipe()
	s.stdout = pr
	s.frames = bufio.NewReaderSize(pr, 64<<10)
	s.stderr = &boundedBuffer{max: 16 << 10}
	s.demuxDone = make(chan struct{})
	go func() {
		defer close(s.demuxDone)
		// The stream is multiplexed (no TTY). Its framing comes from the
		// engine, not from the sandbox; the guest's frames inside it are
		// checked by guest.ReadFrame.
		_, err := stdcopy.StdCopy(pw, s.stderr, att.Reader)
		if err == nil {
			err = io.EOF
		}
		pw.CloseWithError(err)
	}()
	if _, err := s.d.cli.ContainerStart(ctx, s.cid, client.ContainerStartOptions{}); err != nil {
		s.dead = true
		return s.d.engineError("starting the container in", err)
	}

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
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("starting sandbox: %w", err)
		}
		msg := s.stderr.String()
		if msg == "" {
			msg = err.Error()
		}
		return fmt.Errorf("starting sandbox with docker: %s: %w", oneLine(msg), errdefs.ErrUnavailable)
	}
	// The guest runs, so the container has a PID 1 whose cgroup tells
	// where the memory numbers are, when the engine is on this host.
	if info, err := s.d.cli.ContainerInspect(ctx, s.cid, client.ContainerInspectOptions{}); err == nil && info.Container.State != nil {
		s.cg = cgroupOf(info.Container.State.Pid, s.cid)
		s.d.recent.setCgroup(s.id, s.cg)
	}
	return nil
}

// kill ends the container's PID 1, and with it every process of the
// sandbox. It does not wait.
func (s *sbx) kill(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, _ = s.d.cli.ContainerKill(ctx, s.cid, client.ContainerKillOptions{Signal: "KILL"})
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
	err := guest.WriteJSON(s.att.Conn, guest.FrameExec, guest.ExecRequest{
		File:      guest.FileSpec{Path: "/tmp/" + req.File.Name, Data: req.File.Data, Mode: mode},
		Argv:      req.Argv,
		Env:       req.Env,
		Stdin:     req.Stdin,
		OutputCap: s.limits.OutputCap + 1, // see guest.ExecRequest.OutputCap
	})
	if err != nil {
		s.dead = true
		return nil, fmt.Errorf("sending program to sandbox %s: %v: %w", s.id, err, errdefs.ErrUnavailable)
	}

	res := &sandbox.Result{ExitCode: -1}
	done := make(chan outcome, 1)
	go func() {
		r, failed, err := ocidriver.Collect(s.frames, s.limits.OutputCap, res, req.OnOutput)
		done <- outcome{report: r, failed: failed, err: err}
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var o outcome
	var timedOut bool
	select {
	case o = <-done:
	case <-timer.C:
		// Killing the container ends the attach stream, so the collector
		// returns with everything read so far.
		timedOut = true
		s.dead = true
		s.kill(ctx)
		o = <-done
	case <-ctx.Done():
		s.dead = true
		s.kill(ctx)
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
		s.kill(ctx)
		res.Status = sandbox.StatusKilled
		if oomKilled || s.diedOfOOM(ctx) {
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
	if p := s.cg.peak(); p > 0 {
		res.PeakMemory = p
	}
	return res, nil
}

// diedOfOOM waits (briefly) for the container to stop and reports whether
// the engine saw the kernel OOM-kill it. This is how an OOM kill is known
// when the engine is on another host; on this one the cgroup's counter says
// it first.
func (s *sbx) diedOfOOM(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	w := s.d.cli.ContainerWait(ctx, s.cid, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	select {
	case <-w.Result:
	case <-w.Error:
	}
	info, err := s.d.cli.ContainerInspect(ctx, s.cid, client.ContainerInspectOptions{})
	return err == nil && info.Container.State != nil && info.Container.State.OOMKilled
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

// Destroy kills and removes the container and closes the attach stream. It
// is idempotent, and removing a container that is already gone succeeds.
func (s *sbx) Destroy(ctx context.Context) error {
	s.destroyOnce.Do(func() { s.destroyErr = s.destroy(ctx) })
	return s.destroyErr
}

func (s *sbx) destroy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// Removal with force kills PID 1 first, which ends every process of
	// the sandbox: no grace period is needed, the guest keeps no state.
	err := s.d.remove(ctx, s.cid)
	if s.att != nil {
		s.att.Close()
		// Unblock the demultiplexer if it is writing output nobody reads.
		s.stdout.Close()
		<-s.demuxDone
		// An Exec in flight sees the stream end and returns soon; waiting
		// for it means none of its clean-up (a kill, an inspect) outlives
		// Destroy.
		s.mu.Lock()
		s.dead = true
		s.mu.Unlock()
	}
	return err
}

// boundedBuffer keeps the first max bytes written to it. The guest's stderr
// goes here: it explains failed starts without letting a chatty guest use
// unbounded memory.
type boundedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *boundedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(b.buf.String())
}

// oneLine folds a multi-line message for a one-line error.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = strings.TrimSpace(s[i+1:])
	}
	if len(s) > 512 {
		s = s[:512]
	}
	return s
}
