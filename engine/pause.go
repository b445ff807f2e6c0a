package engine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"syscall"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// A paused session is a checkpoint on disk instead of a sandbox: its
// driver's Snapshotter saves the sandbox, with its kernel's memory and
// /workspace (a tmpfs, part of the sandbox's memory), and ends it;
// resuming restores a new sandbox from the checkpoint and adopts its
// kernel as ReattachSessions adopts a re-attached sandbox's.

// CanPause says whether the sessions of the named driver can pause: nil,
// or ErrFailedPrecondition with the driver's reason
// (Capabilities.Lacks["Snapshots"]).
func (e *Engine) CanPause(driver string) error {
	_, err := e.snapshotter(driver)
	return err
}

func (e *Engine) snapshotter(driver string) (sandbox.Snapshotter, error) {
	d, ok := e.drivers[driver]
	if !ok {
		return nil, errdefs.Publicf("driver %q is not configured on this server: %w", driver, errdefs.ErrFailedPrecondition)
	}
	s, ok := d.(sandbox.Snapshotter)
	if !ok || !d.Capabilities().Snapshots {
		why := d.Capabilities().Lacks["Snapshots"]
		if why == "" {
			why = "it cannot save a running sandbox"
		}
		return nil, errdefs.Publicf("sessions on the %s driver cannot pause: %s: %w", driver, why, errdefs.ErrFailedPrecondition)
	}
	return s, nil
}

// PauseSession saves s's sandbox into dir, which must not exist (the
// driver creates it, root-only), ends the sandbox, and returns the
// checkpoint's size on disk. s must be idle: a cell that runs is
// ErrConflict. Once it returns nil, s has no sandbox: its cells fail and
// Close is a no-op; ResumeSession serves the session again. When saving
// fails, dir is gone and s serves on, unless its sandbox was lost too.
func (e *Engine) PauseSession(ctx context.Context, s *Session, dir string) (int64, error) {
	snap, err := e.snapshotter(s.Driver)
	if err != nil {
		return 0, err
	}
	if !s.cellMu.TryLock() {
		return 0, errdefs.Publicf("session sandbox %s is running a cell: %w", s.sb.ID(), errdefs.ErrConflict)
	}
	defer s.cellMu.Unlock()
	if err := snap.Checkpoint(ctx, s.sb, dir); err != nil {
		return 0, fmt.Errorf("pausing session sandbox %s: %w", s.sb.ID(), err)
	}
	s.mu.Lock()
	s.kernel = nil
	s.mu.Unlock()
	s.releaseMemory()
	n, err := DiskUsage(dir)
	if err != nil {
		return 0, fmt.Errorf("measuring the checkpoint of session sandbox %s: %w", s.sb.ID(), err)
	}
	return n, nil
}

// ResumeSession starts the session spec (its Driver, Runtime and Tool, as
// recorded) again from the checkpoint PauseSession saved in dir, in a new
// detached sandbox with the saved labels and then spec.Labels (a label
// the checkpoint was saved with another value of, such as another
// session's LabelSession, is sandbox.ErrForeignCheckpoint), and adopts
// the kernel it had; it counts in the memory budget at its tool's limit. A
// checkpoint the driver cannot prove its own is refused
// (sandbox.Snapshotter.Restore) and nothing is started; so is one whose
// kernel did not come back, since its state would be lost. dir stays:
// the caller removes it once the resume is recorded. The caller must
// Close what it returns or keep it.
func (e *Engine) ResumeSession(ctx context.Context, spec SessionSpec, dir string) (*Session, error) {
	return e.restoreSession(ctx, spec, dir, false)
}

// ErrKernelLost is a resume whose sandbox came back without the kernel it
// was saved with: the session's state is gone, unlike a resume that a
// retry may bring.
var ErrKernelLost = errdefs.Public(errors.New("its kernel did not come back from the checkpoint"))

// DiskUsage is the disk the files under dir take, in bytes (their
// allocated blocks, as du counts them).
func DiskUsage(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		} else {
			n += fi.Size()
		}
		return nil
	})
	return n, err
}
