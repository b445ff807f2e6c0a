package ocidriver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/internal/hostids"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/sandbox"
)

// sbx is one sandbox: a `<runtime> run` process whose container's PID 1 is
// the guest, reached through the runtime's stdin and stdout, or two pipes
// it passes on (Config.ChannelFDs).
type sbx struct {
	d       *Driver
	id      string
	cg      cgroup
	network sandbox.NetworkMode

	cmd    *exec.Cmd
	stdin  *os.File // host -> guest frames (the guest's stdin or descriptor 3)
	stdout *os.File // guest -> host frames (the guest's stdout or descriptor 4)
	stderr *sandboxkit.BoundedBuffer
	exited chan struct{} // closed when the runtime process has exited

	// Guest is the host's end of the guest, over stdin and stdout (the
	// channel's two pipes): it serves the sandbox's Start, files and
	// kernels.
	sandboxkit.Guest

	destroyed sandboxkit.UntilDone

	// ids are the host ids of the sandbox's own user namespace, when this
	// process allocated them; a reaped sandbox's are found in its bundle.
	ids *hostids.Lease

	// shim is set for a detached sandbox, which a shim serves (see
	// detached.go); cmd, stdin and stdout are then nil.
	shim *shimState

	// bindMu guards labels and unbound, which Bind changes (bind.go).
	bindMu  sync.Mutex
	labels  map[string]string
	unbound bool
}

var (
	_ sandbox.Sandbox = (*sbx)(nil)
	_ sandbox.Files   = (*sbx)(nil)
	_ sandbox.Kernels = (*sbx)(nil)
)

// newSbx returns sandbox id, with limits, before it is started.
func (d *Driver) newSbx(id string, limits sandbox.Limits) *sbx {
	s := &sbx{d: d, id: id, cg: d.cgroupOf(id)}
	s.Guest = sandboxkit.Guest{
		Sandbox:        id,
		Limits:         limits,
		Cgroup:         s.cg.Cgroup,
		PeakFromCgroup: d.cfg.PeakFromCgroup,
		CPUFromCgroup:  d.cfg.CPUFromCgroup,
		Kill:           s.kill,
	}
	return s
}

func (s *sbx) ID() string { return s.id }

// start launches the runtime and waits for the guest's hello.
func (s *sbx) start(ctx context.Context) error {
	if s.shim != nil {
		return s.startShim(ctx)
	}
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
	s.Guest.In, s.Guest.Frames = inW, bufio.NewReaderSize(outR, 64<<10)
	s.stderr = &sandboxkit.BoundedBuffer{Max: 16 << 10}
	// The runtime process must outlive ctx (which only bounds Create), so
	// it is not started with it; Destroy ends it.
	s.cmd = s.d.runtimeCmd(context.WithoutCancel(ctx), s.network, s.d.runArgs(s.id)...)
	if s.d.cfg.ChannelFDs {
		// The runtime's stdio is the guest's, which carries only its
		// diagnostics.
		s.cmd.ExtraFiles = []*os.File{inR, outW}
		s.cmd.Stdout = s.stderr
	} else {
		s.cmd.Stdin, s.cmd.Stdout = inR, outW
	}
	s.cmd.Stderr = s.stderr
	// The runtime's stderr is copied through a pipe that the container's
	// processes inherit; if killing the runtime did not end them, Wait
	// must not wait for that pipe forever.
	s.cmd.WaitDelay = 5 * time.Second
	err = s.cmd.Start()
	inR.Close()
	outW.Close()
	if err != nil {
		s.cmd = nil
		inW.Close()
		outR.Close()
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

	if err := s.Guest.AwaitReady(ctx, s.d.cfg.ReadyTimeout); err != nil {
		s.Guest.MarkGone()
		s.kill(ctx)
		<-s.exited
		return sandboxkit.StartError(s.d.cfg.Name, err, s.stderr.String())
	}
	return nil
}

// kill ends the sandbox's PID 1, and with it every process of the sandbox.
// It does not wait.
func (s *sbx) kill(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := s.d.runtimeCmd(ctx, s.network, "kill", s.id, "KILL").Run(); err != nil {
		// The container may not exist (yet or any more); killing the
		// runtime process makes sure nothing waits on it. A guest that
		// holds its channel itself (Config.ChannelFDs) outlives its
		// runtime: the end of its input makes it end everything.
		switch {
		case s.cmd != nil && s.cmd.Process != nil:
			_ = s.cmd.Process.Kill()
			_ = s.stdin.Close()
		case s.shim != nil && s.shim.conn != nil:
			_ = s.shim.conn.Kill()
		}
	}
}

// GuestClient is the guest's protocol client, nil until the sandbox has
// started: the guest's own tests drive the guest with it, below the
// contract.
func (s *sbx) GuestClient() *guest.Client { return s.Guest.Client() }

// Destroy ends the sandbox and removes its runtime state, cgroups and
// bundle. It is idempotent, safe to call on a sandbox that never started,
// and tries again when called after a failure.
func (s *sbx) Destroy(ctx context.Context) error {
	return s.destroyed.Do(func() error { return s.destroy(ctx) })
}

func (s *sbx) destroy(ctx context.Context) error {
	if s.cmd != nil {
		// The end of its input makes the guest kill everything and exit, and
		// the runtime then removes the container by itself. That is the
		// fast path; the kill below is for a guest that does not comply.
		s.stdin.Close()
		select {
		case <-s.exited:
		case <-time.After(2 * time.Second):
			s.kill(ctx)
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
		s.Guest.MarkGone()
	}
	// A detached sandbox's shim, also one this process never connected to
	// (Reap, Reattach), is ended first: it would restart nothing, but its
	// runtime holds the container.
	shimDir := s.d.shimDir(s.id)
	if _, err := os.Stat(shimDir); err == nil {
		s.stopShim(ctx)
		s.Guest.MarkGone()
	}
	var errs []error
	// The runtime removes its state when its run ends normally; after a
	// kill it is left, and only the runtime knows how to remove it.
	if len(s.d.runtimeState(s.id)) > 0 {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		out, err := s.d.runtimeCmd(dctx, s.network, "delete", "--force", s.id).CombinedOutput()
		cancel()
		if err != nil && !strings.Contains(string(out), "not exist") && !strings.Contains(string(out), "not found") &&
			!s.d.removeUnreadableState(ctx, s.id) {
			errs = append(errs, fmt.Errorf("deleting container %s: %v: %s", s.id, err, sandboxkit.OneLine(string(out))))
		}
	}
	if err := s.cg.remove(); err != nil {
		errs = append(errs, err)
	}
	// The private root must be gone before the bundle is removed: removing
	// through a mounted overlay would only whiteout, never reach the image,
	// but it would leave the mount behind.
	bundle := s.d.bundleDir(s.id)
	if err := unmountPrivateRoot(bundle); err != nil {
		return errors.Join(append(errs, err)...)
	}
	// The ids are free once the bundle, which holds them, is gone: this
	// process's lease, or the slot recorded for a reaped sandbox.
	var adopted uint32
	if s.ids == nil && s.d.cfg.UserNamespace {
		adopted = readBundle(bundle).hostIDBase()
	}
	if err := os.RemoveAll(bundle); err != nil {
		return errors.Join(append(errs, fmt.Errorf("removing bundle: %w", err))...)
	}
	if s.ids != nil {
		errs = append(errs, s.ids.Release())
	} else if adopted != 0 {
		errs = append(errs, s.d.cfg.HostIDs.Forget(adopted, bundle))
	}
	if err := os.RemoveAll(shimDir); err != nil {
		errs = append(errs, fmt.Errorf("removing the shim's directory: %w", err))
	}
	s.d.spare(s.id, false)
	return errors.Join(errs...)
}
