package docker

import (
	"bufio"
	"context"
	"io"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/sandbox"
)

// sbx is one sandbox: a container whose PID 1 is the guest, reached through
// one attach connection: our writes are the guest's stdin, and the engine
// multiplexes the guest's stdout (frames) and stderr (diagnostics) back.
type sbx struct {
	d   *Driver
	id  string
	cid string // the engine's container ID

	att       *client.HijackedResponse // nil until attached
	stdout    *io.PipeReader           // the guest's stdout, demultiplexed
	stderr    *sandboxkit.BoundedBuffer
	demuxDone chan struct{} // closed when the attach stream has ended

	// Guest is the host's end of the guest, over the attach stream: it
	// serves the sandbox's Start, files and kernels. Killing the container
	// ends the stream, which ends an Exec in flight with everything read
	// so far.
	sandboxkit.Guest

	destroyed sandboxkit.UntilDone
}

var (
	_ sandbox.Sandbox = (*sbx)(nil)
	_ sandbox.Files   = (*sbx)(nil)
	_ sandbox.Kernels = (*sbx)(nil)
)

// newSbx returns sandbox id, the created container cid, before it is
// started.
func (d *Driver) newSbx(id, cid string, limits sandbox.Limits) *sbx {
	s := &sbx{d: d, id: id, cid: cid}
	s.Guest = sandboxkit.Guest{
		Sandbox: id,
		Limits:  limits,
		// The cgroup is known once the container runs (see start); the
		// peak is taken from it whenever it is.
		PeakFromCgroup: true,
		Kill:           s.kill,
		DiedOfOOM:      s.diedOfOOM,
	}
	return s
}

func (s *sbx) ID() string { return s.id }

// start attaches to the created container, starts it and waits for the
// guest's hello. Attaching first means no byte of the guest's output
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
	s.Guest.In, s.Guest.Frames = s.att.Conn, bufio.NewReaderSize(pr, 64<<10)
	s.stderr = &sandboxkit.BoundedBuffer{Max: 16 << 10}
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
		s.Guest.MarkGone()
		return s.d.engineError("starting the container in", err)
	}
	if err := s.Guest.AwaitReady(ctx, s.d.cfg.ReadyTimeout); err != nil {
		s.Guest.MarkGone()
		return sandboxkit.StartError("docker", err, s.stderr.String())
	}
	// The guest runs, so the container has a PID 1 whose cgroup tells
	// where the memory numbers are, when the engine is on this host.
	if info, err := s.d.cli.ContainerInspect(ctx, s.cid, client.ContainerInspectOptions{}); err == nil && info.Container.State != nil {
		s.Guest.Cgroup = cgroupOf(info.Container.State.Pid, s.cid)
		s.d.recent.setCgroup(s.id, s.Guest.Cgroup)
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

// Destroy kills and removes the container and closes the attach stream. It
// is idempotent, removing a container that is already gone succeeds, and a
// call after a failure tries again.
func (s *sbx) Destroy(ctx context.Context) error {
	return s.destroyed.Do(func() error { return s.destroy(ctx) })
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
		s.Guest.MarkGone()
	}
	return err
}
