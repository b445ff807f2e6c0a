package supervisor

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"
)

// A sandbox created ahead (Meta.CreateArgv) is served in two phases: the
// shim runs the create with the guest's channel and waits, holding the
// channel's other ends, until a client asks for the start (FrameStart)
// or the sandbox is to end unused.

// create runs the record's CreateArgv with the guest's channel (inR, the
// guest's input, and outW, its output), as Argv would be run, and waits
// for it. The created sandbox's processes outlive the command and hold
// its stderr: that goes to logw through a pipe of the shim's own, which
// nothing waits on.
func (s *shim) create(ctx context.Context, inR, outW *os.File, logw io.Writer) error {
	m := s.meta
	errR, errW, err := os.Pipe()
	if err != nil {
		return err
	}
	go func() {
		_, _ = io.Copy(logw, errR)
		errR.Close()
	}()
	cctx, cancel := context.WithTimeout(ctx, runtimeCmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, m.CreateArgv[0], m.CreateArgv[1:]...)
	cmd.Env = m.Env
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	if m.ChannelFDs {
		cmd.ExtraFiles = []*os.File{inR, outW}
		cmd.Stdout = errW
	} else {
		cmd.Stdin, cmd.Stdout = inR, outW
	}
	cmd.Stderr = errW
	err = cmd.Run()
	errW.Close()
	if err != nil {
		s.runRuntime(ctx, "delete", m.DeleteArgv)
		return fmt.Errorf("creating the sandbox ahead with %s: %w", m.CreateArgv[0], err)
	}
	s.log.Info("sandbox created ahead", "argv", m.CreateArgv)
	return nil
}

// awaitStart waits until a client asks a sandbox created ahead to start
// (FrameStart) and then starts it: it reads the record again (dir's,
// under key), which must name the same sandbox, the command that starts
// it (Argv) and the hello of what it restores, runs Argv and passes the
// hello on. It returns nil, having started nothing, when the sandbox is
// to end unused instead (endUnused, ctx ended, the shim unreachable with
// no client attached, its record's deadline passed: a daemon that died
// leaves no slot waiting for ever) or the start cannot be made.
func (s *shim) awaitStart(ctx context.Context, dir string, key []byte, logw io.Writer) *exec.Cmd {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for started := false; !started; {
		select {
		case <-s.start:
			started = true
		case <-s.unused:
			s.log.Info("ending the sandbox created ahead unused")
			return nil
		case <-ctx.Done():
			s.log.Info("stopping: ending the sandbox created ahead unused")
			return nil
		case <-t.C:
			s.mu.Lock()
			attached, deadline := s.client != nil, s.deadline
			s.mu.Unlock()
			if !attached && !s.reachable() {
				s.log.Warn("ending the sandbox created ahead: no client can reach it")
				return nil
			}
			if !deadline.IsZero() && !time.Now().Before(deadline) {
				s.log.Warn("ending the sandbox created ahead unused: its deadline passed", "deadline", deadline)
				return nil
			}
		}
	}
	m, err := ReadMeta(dir, key)
	switch {
	case err != nil:
		s.log.Warn("starting the sandbox created ahead: reading the record", "err", err)
		return nil
	case m.ID != s.id || len(m.Argv) == 0 || m.Hello == nil:
		s.log.Warn("starting the sandbox created ahead: the record names no start", "argv", m.Argv)
		return nil
	}
	hello, err := helloFrame(*m.Hello)
	if err != nil {
		s.log.Warn("starting the sandbox created ahead: its hello", "err", err)
		return nil
	}
	s.meta = m
	cmd := s.command(m.Argv, logw)
	cmd.Stdout = logw
	if err := cmd.Start(); err != nil {
		s.log.Warn("starting the sandbox created ahead", "argv", m.Argv, "err", err)
		return nil
	}
	s.log.Info("runtime started", "pid", cmd.Process.Pid, "argv", m.Argv)
	s.stdinMu.Lock()
	s.accepted = true
	s.stdinMu.Unlock()
	s.mu.Lock()
	// The deadline is the start's record's: the create's was the slot's
	// own (no client could move it before the start).
	s.hello, s.restored, s.lastID = hello, true, max(s.lastID, m.LastID)
	s.deadline = m.Deadline
	c := s.client
	s.mu.Unlock()
	s.setRuntime(cmd.Process)
	if c != nil {
		s.send(c, hello)
	}
	return cmd
}

// startAhead starts the sandbox created ahead, once, if it waits.
func (s *shim) startAhead() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.waiting {
		s.log.Info("a start for a sandbox that does not wait for one: ignored")
		return
	}
	s.waiting = false
	close(s.start)
}

// endUnused ends the sandbox created ahead unstarted, if it waits.
func (s *shim) endUnused() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiting {
		s.waiting = false
		close(s.unused)
	}
}
