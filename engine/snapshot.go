package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// A session's snapshot is its sandbox saved with the sandbox left running
// (sandbox.LiveSnapshotter: gVisor's checkpoint -leave-running): its
// kernel's memory and /workspace, as a pause saves them, but the session
// serves on once saved, having stalled only while its memory was
// written. A snapshot starts any number of new sessions
// (StartFromSnapshot), each a new sandbox with a new id and its own copy
// of the saved memory, /tmp and /workspace, so that nothing one does
// reaches its source or its siblings.
//
// The snapshot is bound, under the driver's MAC, to the labels its source
// had but LabelSession: it restores only as a session of the same
// workspace (LabelWorkspace) and daemon (LabelOwner), any session of it.
//
// Each start reseeds what every restore would otherwise share, as a
// golden checkpoint's restore does (golden.go's reseedCells): python's
// random module, numpy's global RandomState, tempfile's name sequence;
// the shell's $RANDOM. os.urandom, uuid4 and secrets read the kernel's
// random source, which a restored gVisor sandbox draws from the host
// afresh. What cannot change is what the interpreter fixed when the
// source's kernel started and what the session's own code holds: python's
// str and bytes hash seed (every fork hashes strings as its source does),
// a random.Random or numpy Generator the code made, ids the code derived
// before the snapshot. A node session gets no snapshot: V8's Math.random
// and OpenSSL's generator cannot be reseeded from outside.

// CanSnapshot says whether sessions of the named driver, runtime and tool
// ("": not checked) can be snapshotted: nil, or ErrFailedPrecondition
// with the reason (templateSnapshotRefuses for a template's tool).
func (e *Engine) CanSnapshot(driver, runtime, tool string) error {
	if _, err := e.liveSnapshotter(driver); err != nil {
		return err
	}
	if err := e.templateSnapshotRefuses(tool); err != nil {
		return err
	}
	if _, ok := reseedCells[runtime]; !ok {
		return errdefs.Publicf("a %s session's random state cannot be reseeded after a restore, so it cannot be snapshotted: %w", runtime, errdefs.ErrFailedPrecondition)
	}
	return nil
}

func (e *Engine) liveSnapshotter(driver string) (sandbox.LiveSnapshotter, error) {
	d, ok := e.drivers[driver]
	if !ok {
		return nil, errdefs.Publicf("driver %q is not configured on this server: %w", driver, errdefs.ErrFailedPrecondition)
	}
	l, ok := d.(sandbox.LiveSnapshotter)
	if !ok || !d.Capabilities().Snapshots {
		why := d.Capabilities().Lacks["Snapshots"]
		if why == "" {
			why = "it cannot save a sandbox and leave it running"
		}
		return nil, errdefs.Publicf("sessions on the %s driver cannot be snapshotted or forked: %s: %w", driver, why, errdefs.ErrFailedPrecondition)
	}
	return l, nil
}

// SnapshotSession saves s's sandbox into dir, which must not exist (the
// driver creates it, root-only), and leaves it running. It returns the
// snapshot's size on disk and how long s could not run a cell (its
// stall: from the save's start until the sandbox serves again; the
// driver then digests and seals the image while cells may run). s must be
// idle: a cell that runs is ErrConflict; the caller waits for none (a
// snapshot of a busy session is refused, not queued). thawed, if not
// nil, is called once the sandbox serves again (or the save failed),
// for the caller to let its own cells through. When saving fails, dir is
// gone and s serves on.
func (e *Engine) SnapshotSession(ctx context.Context, s *Session, dir string, thawed func()) (bytes int64, stall time.Duration, err error) {
	if err := e.CanSnapshot(s.Driver, s.Runtime.Name, ""); err != nil {
		return 0, 0, err
	}
	if s.net != nil {
		return 0, 0, errdefs.Publicf("session sandbox %s has a network, which a snapshot cannot save: %w", s.sb.ID(), errdefs.ErrFailedPrecondition)
	}
	snap, _ := e.liveSnapshotter(s.Driver)
	if !s.cellMu.TryLock() {
		return 0, 0, errdefs.Publicf("session sandbox %s is running a cell: %w", s.sb.ID(), errdefs.ErrConflict)
	}
	// The cell lock is held until the sandbox serves again, not while
	// the driver digests and seals what it saved.
	t0 := time.Now()
	frozen, err := snap.Snapshot(ctx, s.sb, dir, sandbox.SnapshotOptions{Unbind: []string{LabelSession}, Thawed: func() {
		stall = time.Since(t0)
		s.cellMu.Unlock()
		if thawed != nil {
			thawed()
		}
	}})
	if err != nil {
		return 0, 0, fmt.Errorf("snapshotting session sandbox %s: %w", s.sb.ID(), err)
	}
	snapshotTaken(frozen, stall)
	n, err := DiskUsage(dir)
	if err != nil {
		return 0, 0, fmt.Errorf("measuring the snapshot of session sandbox %s: %w", s.sb.ID(), err)
	}
	return n, stall, nil
}

// snapshotTaken is called with the guest's freeze and the stall of each
// snapshot (BenchmarkSessionSnapshot reads it).
var snapshotTaken = func(frozen, stall time.Duration) {}

// StartFromSnapshot starts a new session of spec (its Driver, Runtime and
// Tool, the source's) from the snapshot SnapshotSession saved in dir: a
// new detached sandbox with the snapshot's labels and then spec.Labels
// (its own LabelSession; another LabelWorkspace is
// sandbox.ErrForeignCheckpoint), the kernel it had, reseeded. It counts
// in the memory budget at its tool's limit (ErrResourceExhausted when the
// budget is spent). A snapshot the driver cannot prove its own is refused
// and nothing is started. dir stays. The caller must Close what it
// returns or keep it.
func (e *Engine) StartFromSnapshot(ctx context.Context, spec SessionSpec, dir string) (*Session, error) {
	if _, err := e.liveSnapshotter(spec.Driver); err != nil {
		return nil, err
	}
	return e.restoreSession(ctx, spec, dir, true)
}

// restoreSession restores the session of spec from the checkpoint or
// snapshot in dir and adopts its kernel; with fresh, the kernel's random
// state is reseeded (a snapshot's restore: the saved session may still
// run, or other sessions come from the same snapshot), without it the
// kernel goes on as saved (a pause's resume: the one session goes on).
func (e *Engine) restoreSession(ctx context.Context, spec SessionSpec, dir string, fresh bool) (_ *Session, err error) {
	snap, err := e.snapshotter(spec.Driver)
	if err != nil {
		return nil, err
	}
	release, err := e.mem.reserve(e.sessionMemory(spec))
	if err != nil {
		return nil, err
	}
	sb, err := snap.Restore(ctx, dir, spec.Labels)
	if err != nil {
		release()
		return nil, fmt.Errorf("restoring a %s session: %w", spec.Driver, err)
	}
	defer func() {
		if err != nil {
			_ = sb.Destroy(context.WithoutCancel(ctx))
			release()
		}
	}()
	if err := setDeadline(ctx, sb, spec.Deadline); err != nil {
		return nil, err
	}
	s, err := e.liveOf(sb, spec.Driver, spec)
	if err != nil {
		return nil, err
	}
	found, err := s.takeKernel(ctx)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, errdefs.Publicf("restoring session sandbox %s: %w: %w", sb.ID(), ErrKernelLost, errdefs.ErrFailedPrecondition)
	}
	if fresh {
		if err := reseed(ctx, s.currentKernel(), s.Runtime.Name); err != nil {
			return nil, err
		}
	}
	s.mem = e.inUse.hold(e.sessionImage(sb, spec), release)
	return s, nil
}

// SnapshotCheckpoint takes a snapshot, into dir, of the paused session of
// spec from its checkpoint (PauseSession's): the checkpoint is restored in
// a sandbox of its own (spec.Labels must be the session's, which bind the
// checkpoint), saved as SnapshotSession saves, and that sandbox ended.
// The checkpoint is left as it was and the session stays paused. It
// counts in the memory budget while it runs (ErrResourceExhausted when
// the budget is spent).
func (e *Engine) SnapshotCheckpoint(ctx context.Context, spec SessionSpec, checkpoint, dir string) (int64, error) {
	snap, err := e.liveSnapshotter(spec.Driver)
	if err != nil {
		return 0, err
	}
	release, err := e.mem.reserve(e.sessionMemory(spec))
	if err != nil {
		return 0, err
	}
	defer release()
	sb, err := snap.Restore(ctx, checkpoint, spec.Labels)
	if err != nil {
		return 0, fmt.Errorf("restoring a paused session's checkpoint to snapshot it: %w", err)
	}
	defer sb.Destroy(context.WithoutCancel(ctx))
	// A daemon killed meanwhile leaves the aside sandbox, with the
	// session's labels: it ends itself shortly after the call's deadline.
	if dl, ok := ctx.Deadline(); ok {
		if err := setDeadline(ctx, sb, dl.Add(time.Minute)); err != nil {
			return 0, fmt.Errorf("bounding a paused session's sandbox restored to snapshot it: %w", err)
		}
	}
	if _, err := snap.Snapshot(ctx, sb, dir, sandbox.SnapshotOptions{Unbind: []string{LabelSession}}); err != nil {
		return 0, fmt.Errorf("snapshotting a paused session: %w", err)
	}
	return DiskUsage(dir)
}

// HasRoom says whether the memory budget has room for n more sessions of
// spec besides what it holds now: nil, or ErrResourceExhausted. It
// reserves nothing; a fork asks it first so that it refuses all of its
// sessions rather than some.
func (e *Engine) HasRoom(spec SessionSpec, n int) error {
	release, err := e.mem.reserve(e.sessionMemory(spec) * int64(n))
	if err != nil {
		return err
	}
	release()
	return nil
}
