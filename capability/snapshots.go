package capability

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/fsmode"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/wire"
)

// A snapshot is a live session's state saved with its sandbox left running
// (engine.SnapshotSession), kept under SessionOptions.CheckpointDir in
// snapshots/<id>/ (root-only, sealed by the driver as a checkpoint is), a
// row of its workspace (store.Snapshots) counted in its checkpoint bytes.
// New sessions of the same workspace start from it (POST /v1/sessions
// {"snapshot": id}); a fork is a snapshot and N such starts in one call.
// See docs/design.md §10 for the decisions:
//
//   - a busy session (a cell running or awaiting approval) is refused
//     (SessionBusyError, 409): a snapshot never waits for a cell, whose
//     end nobody bounds; the client retries once the cell ended;
//   - a paused session is snapshotted from its checkpoint, which stays;
//   - a snapshot outlives its source: it is deleted by DELETE
//     /v1/snapshots/{id} or at its expiry (SnapshotOptions.TTL), whichever
//     comes first; a fork's own snapshot is deleted once its forks started;
//   - a session started from a snapshot is a new session in every respect:
//     admitted as CreateSession admits one (the policy, the workspace's
//     bound of sessions, the memory budget), its own sandbox, id,
//     lifetimes and audit trail; its first cell is approved anew under
//     per_session unless the policy inherits the source's (forkapproval.go);
//   - snapshots cost no credits, but their disk is bounded: a snapshot
//     (or fork) is refused (429) while the workspace's checkpoints hold
//     SnapshotOptions.MaxCheckpointBytes (roomOnDisk); the forks' cells
//     are charged as any cell.

// SnapshotOptions bound snapshots and forks. Zero fields take the
// configuration's defaults.
type SnapshotOptions struct {
	// TTL is how long a snapshot is kept (config.DefaultSnapshotTTL).
	TTL time.Duration
	// MaxForks is the most sessions one fork starts
	// (config.DefaultMaxForks).
	MaxForks int
	// MaxCheckpointBytes bounds the disk of a workspace's checkpoints
	// (store.Sessions.CheckpointBytes: its snapshots' and its paused
	// sessions'): a snapshot or fork is refused while they hold as much
	// (config.DefaultMaxCheckpointBytes).
	MaxCheckpointBytes int64
}

func (o SnapshotOptions) filled() SnapshotOptions {
	if o.TTL <= 0 {
		o.TTL = config.DefaultSnapshotTTL
	}
	if o.MaxForks <= 0 {
		o.MaxForks = config.DefaultMaxForks
	}
	if o.MaxCheckpointBytes <= 0 {
		o.MaxCheckpointBytes = config.DefaultMaxCheckpointBytes
	}
	return o
}

// snapshotStore is what snapshots need of the store.
type snapshotStore interface {
	GetSession(ctx context.Context, workspaceID, id string) (model.Session, error)
	PendingCell(ctx context.Context, sessionID string) (string, error)
	CheckpointBytes(ctx context.Context, workspaceID string) (bytes int64, paused int, err error)
	CreateSnapshot(ctx context.Context, n store.NewSnapshot) (model.Snapshot, error)
	GetSnapshot(ctx context.Context, workspaceID, id string) (model.Snapshot, error)
	ListSnapshots(ctx context.Context, workspaceID, sessionID string) ([]model.Snapshot, error)
	DeleteSnapshot(ctx context.Context, workspaceID, id string, audit []model.NewEvent) (model.Snapshot, error)
	ListExpiredSnapshots(ctx context.Context, now time.Time) ([]model.Snapshot, error)
	HasSnapshot(ctx context.Context, id string) (bool, error)
	GetPolicy(ctx context.Context, workspaceID string) (model.Policy, error)
}

// snapshots takes sessions' snapshots and starts sessions from them.
type snapshots struct {
	*core
	st   snapshotStore
	host *sessionHost
}

// limits are the service's SnapshotOptions, their defaults filled in.
func (s *snapshots) limits() SnapshotOptions { return s.opts.Snapshots.filled() }

// NewSnapshotID returns a fresh snapshot id.
func NewSnapshotID() string { return newID("snp_") }

// maxSnapshotName bounds a snapshot's name.
const maxSnapshotName = 128

// snapshotDir is where snapshot id is kept.
func (s *snapshots) snapshotDir(id string) string {
	return filepath.Join(s.opts.Sessions.CheckpointDir, "snapshots", id)
}

// taken is a snapshot saved on disk but not yet recorded.
type taken struct {
	id, dir string
	bytes   int64
	stall   time.Duration
	source  model.Session
}

// take saves session id of p's workspace into a new snapshot directory:
// from its sandbox, left running, or from its checkpoint when it is
// paused. The caller records or removes it. The session's lock is held
// until its sandbox serves again, not while the driver digests and seals
// what it saved: the session's cells run meanwhile, so that stall_ms is
// what a client waits.
func (s *snapshots) take(ctx context.Context, p Principal, id string) (*taken, error) {
	unlock := sync.OnceFunc(s.host.trans.lock(id, true))
	defer unlock()
	ss, err := s.st.GetSession(ctx, p.WorkspaceID, id)
	if err != nil {
		return nil, err
	}
	if err := s.mayTake(p, ss); err != nil {
		return nil, err
	}
	if err := s.roomOnDisk(ctx, p.WorkspaceID); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(s.opts.Sessions.CheckpointDir, "snapshots"), fsmode.Dir); err != nil {
		return nil, fmt.Errorf("creating the snapshots' directory: %w", err)
	}
	t := &taken{id: NewSnapshotID(), source: ss}
	t.dir = s.snapshotDir(t.id)
	// Once started, a snapshot is carried through whatever becomes of its
	// caller, as a pause is: the source stalls for it either way.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pauseTimeout)
	defer cancel()
	if ss.State == model.SessionPaused {
		labels := map[string]string{engine.LabelOwner: s.opts.Owner, engine.LabelSession: ss.ID, engine.LabelWorkspace: ss.WorkspaceID}
		t.bytes, err = s.runner.SnapshotCheckpoint(ctx, engine.SessionSpec{Driver: ss.Driver, Runtime: ss.Runtime, Tool: ss.Tool, Labels: labels},
			s.host.checkpointDir(ss.ID), t.dir)
		if err != nil {
			os.RemoveAll(t.dir)
			return nil, err
		}
		return t, nil
	}
	live := s.host.sessions.get(ss.ID)
	if live == nil {
		return nil, errdefs.Publicf("session %s is active but its sandbox is not served by this daemon; retry: %w", ss.ID, errdefs.ErrUnavailable)
	}
	// Busy by the store's pending cell, as a pause (pause.go).
	if cell, err := s.st.PendingCell(ctx, ss.ID); err != nil {
		return nil, err
	} else if cell != "" {
		return nil, errdefs.Public(&SessionBusyError{SessionID: ss.ID})
	}
	t.bytes, t.stall, err = s.runner.SnapshotSession(ctx, live.Session, t.dir, unlock)
	if err != nil {
		os.RemoveAll(t.dir)
		if errdefs.IsConflict(err) {
			return nil, errdefs.Public(&SessionBusyError{SessionID: ss.ID})
		}
		return nil, err
	}
	return t, nil
}

// mayTake refuses p a snapshot of ss that no retry would give: another
// key's session (403), an ended one (410), one the driver, the runtime,
// the tool or the network cannot save, or a server without checkpoints
// (409). Fork asks it before it counts room, so that these are not
// answered as a quota.
func (s *snapshots) mayTake(p Principal, ss model.Session) error {
	g := sessionGrant(ss)
	if err := mayTransition(g, p, "snapshot"); err != nil {
		return err
	}
	if ss.State == model.SessionEnded {
		return expiredError(g.Session)
	}
	if err := s.runner.CanSnapshot(ss.Driver, ss.Runtime, ss.Tool); err != nil {
		return err
	}
	if err := s.host.canSaveNetwork(ss, "be snapshotted"); err != nil {
		return err
	}
	if s.opts.Sessions.CheckpointDir == "" {
		return errdefs.Publicf("this server keeps no checkpoints, so sessions cannot be snapshotted: %w", errdefs.ErrFailedPrecondition)
	}
	return nil
}

// SnapshotSession takes a named snapshot of session id for p (see the
// comment at the top of snapshots.go) and records it, audited
// (session.snapshotted). It costs nothing.
func (s *snapshots) SnapshotSession(ctx context.Context, p Principal, id string, req wire.SnapshotRequest) (model.Snapshot, time.Duration, error) {
	if len(req.Name) > maxSnapshotName {
		return model.Snapshot{}, 0, errdefs.Publicf("a snapshot's name is at most %d bytes: %w", maxSnapshotName, errdefs.ErrInvalidArgument)
	}
	t, err := s.take(ctx, p, id)
	if err != nil {
		return model.Snapshot{}, 0, err
	}
	now := s.opts.Now()
	expires := now.Add(s.limits().TTL)
	ev := audit.SessionSnapshottedEvent{Meta: audit.Meta{Actor: actorOf(p), Reason: "session snapshotted"}, Bytes: t.bytes,
		ExpiresAt: expires.UTC().Format(time.RFC3339), Name: req.Name, SessionID: t.source.ID, SnapshotID: t.id, StallMS: t.stall.Milliseconds()}
	sn, err := s.st.CreateSnapshot(context.WithoutCancel(ctx), store.NewSnapshot{ID: t.id, WorkspaceID: p.WorkspaceID, SessionID: t.source.ID,
		KeyID: p.KeyID, Name: req.Name, Tool: t.source.Tool, Runtime: t.source.Runtime, Driver: t.source.Driver, Dir: t.dir,
		Bytes: t.bytes, At: now, ExpiresAt: expires, Audit: audit.NewEvents(ev)})
	if err != nil {
		os.RemoveAll(t.dir)
		return model.Snapshot{}, 0, fmt.Errorf("recording the snapshot of session %s: %w", id, err)
	}
	return sn, t.stall, nil
}

// ListSnapshots lists the snapshots of session id of p's workspace that p
// may use (mayUseSnapshot): an admin key sees them all, another key only
// those it took.
func (s *snapshots) ListSnapshots(ctx context.Context, p Principal, id string) ([]model.Snapshot, error) {
	if _, err := s.st.GetSession(ctx, p.WorkspaceID, id); err != nil {
		return nil, err
	}
	l, err := s.st.ListSnapshots(ctx, p.WorkspaceID, id)
	if err != nil {
		return nil, err
	}
	now := s.opts.Now()
	out := l[:0]
	for _, sn := range l {
		if now.Before(sn.ExpiresAt) && mayUseSnapshot(p, sn) == nil {
			out = append(out, sn)
		}
	}
	return out, nil
}

// DeleteSnapshot deletes snapshot id of p's workspace and its files,
// audited; the key that took it or an admin key may.
func (s *snapshots) DeleteSnapshot(ctx context.Context, p Principal, id string) error {
	sn, err := s.st.GetSnapshot(ctx, p.WorkspaceID, id)
	if err != nil {
		return err
	}
	if err := mayUseSnapshot(p, sn); err != nil {
		return err
	}
	return s.remove(ctx, sn, p)
}

// mayUseSnapshot refuses p a snapshot another key took
// (ErrPermissionDenied) unless p is an admin key: a snapshot holds its
// session's memory and files, and a session belongs to the key that
// opened it (usable), so only that key or an admin may start from, list
// or delete it.
func mayUseSnapshot(p Principal, sn model.Snapshot) error {
	if p.KeyID != sn.KeyID && p.Role != model.RoleAdmin {
		return errdefs.Publicf("only the key that took snapshot %s or an admin key may use it: %w", sn.ID, errdefs.ErrPermissionDenied)
	}
	return nil
}

// remove deletes sn's row, audited as by, then its files.
func (s *snapshots) remove(ctx context.Context, sn model.Snapshot, by Principal) error {
	ev := audit.SnapshotDeletedEvent{Meta: audit.Meta{Actor: actorOf(by), Reason: "snapshot deleted"}, SessionID: sn.SessionID, SnapshotID: sn.ID}
	if by == (Principal{}) {
		ev.Reason = "snapshot expired"
	}
	if _, err := s.st.DeleteSnapshot(ctx, sn.WorkspaceID, sn.ID, audit.NewEvents(ev)); err != nil {
		return err
	}
	if err := os.RemoveAll(sn.Dir); err != nil {
		s.log.Error("removing a deleted snapshot's files", "snapshot", sn.ID, "err", err)
	}
	return nil
}

// sweepSnapshots deletes the snapshots past their expiry, and the
// snapshot directories no row records that are older than a snapshot or
// fork may take (pauseTimeout): those a crash left between saving and
// recording, or of a fork whose end was cut short.
func (s *snapshots) sweepSnapshots(ctx context.Context) {
	due, err := s.st.ListExpiredSnapshots(ctx, s.opts.Now())
	if err != nil {
		s.log.Error("listing expired snapshots", "err", err)
		return
	}
	for _, sn := range due {
		if err := s.remove(ctx, sn, Principal{}); err != nil && !errdefs.IsNotFound(err) {
			s.log.Error("deleting an expired snapshot", "snapshot", sn.ID, "err", err)
		}
	}
	if s.opts.Sessions.CheckpointDir == "" {
		return
	}
	entries, _ := os.ReadDir(filepath.Join(s.opts.Sessions.CheckpointDir, "snapshots"))
	for _, e := range entries {
		fi, err := e.Info()
		// A file's time is the wall clock's, and so is this age (not
		// s.opts.Now's).
		if err != nil || !e.IsDir() || !isSnapshotID(e.Name()) || time.Since(fi.ModTime()) < pauseTimeout {
			continue
		}
		if ok, err := s.st.HasSnapshot(ctx, e.Name()); err != nil || ok {
			continue
		}
		if err := os.RemoveAll(s.snapshotDir(e.Name())); err != nil {
			s.log.Error("removing an unrecorded snapshot", "snapshot", e.Name(), "err", err)
		}
	}
}

// isSnapshotID reports whether name has the form NewSnapshotID gives.
func isSnapshotID(name string) bool { return hasIDForm(name, "snp_") }

// StartFromSnapshot opens a session for p from snapshot req.Snapshot of
// p's workspace (another workspace's, or one expired, is ErrNotFound;
// another key's is ErrPermissionDenied unless p is an admin key),
// admitted as CreateSession admits a session, audited as session.created
// and session.forked.
func (s *snapshots) StartFromSnapshot(ctx context.Context, p Principal, req CreateSessionRequest, o CreateSessionOptions) (*Created, error) {
	sn, err := s.st.GetSnapshot(ctx, p.WorkspaceID, req.Snapshot)
	if err == nil && !s.opts.Now().Before(sn.ExpiresAt) {
		err = errdefs.Publicf("snapshot %q not found: %w", req.Snapshot, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if err := mayUseSnapshot(p, sn); err != nil {
		return nil, err
	}
	switch {
	case req.Runtime != "" && req.Runtime != sn.Runtime, req.Tool != "" && req.Tool != sn.Tool:
		return nil, errdefs.Publicf("snapshot %s is of a %s session of tool %q; a session started from it runs as that: %w", sn.ID, sn.Runtime, sn.Tool, errdefs.ErrInvalidArgument)
	}
	return s.start(ctx, p, req, o, sn.Dir, sn.ID, sn.SessionID, sn)
}

// start admits and opens a session of p from the snapshot in dir (of
// session source, recorded as sn when it is one).
func (s *snapshots) start(ctx context.Context, p Principal, req CreateSessionRequest, o CreateSessionOptions, dir, snapshotID, source string, sn model.Snapshot) (*Created, error) {
	so := s.opts.Sessions
	if req.Network != "" && req.Network != "deny" {
		return nil, errdefs.Publicf("a session started from a snapshot has no network: %w", errdefs.ErrInvalidArgument)
	}
	idle, ttl, err := lifetimes(so, req)
	if err != nil {
		return nil, err
	}
	req.Runtime, req.Tool = sn.Runtime, sn.Tool
	op := &opening{h: s.host, id: NewSessionID(), reqSum: sha256Hex(mustJSON(req)), idle: idle, ttl: ttl,
		spec: engine.SessionSpec{Runtime: sn.Runtime, Tool: sn.Tool, Driver: sn.Driver, Workspace: so.WorkspaceSize}}
	rec := &fromSnapshot{opening: op, dir: dir, snapshotID: snapshotID, source: source, taken: sn.CreatedAt}
	// The memory budget is asked before the restore, so that a start it
	// cannot hold is refused as such, recorded.
	budget := func(ctx context.Context, c *claim, in Admit) error {
		if err := s.runner.HasRoom(op.spec, 1); err != nil {
			return s.host.gate.refuse(ctx, c, in, &Refusal{Code: "memory_budget", Reason: "the sandboxes' memory budget is spent", Class: errdefs.ErrResourceExhausted})
		}
		return nil
	}
	if err := s.host.gate.admit(ctx, s.host.openingClaim(p, o, op, rec, budget)); err != nil {
		return nil, err
	}
	return op.created, nil
}

// fromSnapshot records a session's opening from a snapshot: an opening
// whose sandbox is restored from the snapshot instead of made.
type fromSnapshot struct {
	*opening
	dir, snapshotID, source string
	// taken bounds when the snapshot was taken (forkapproval.go).
	taken time.Time
}

// write restores the session's sandbox from the snapshot and records the
// session with session.forked beside session.created; nothing is left
// behind when that fails. A snapshot the driver cannot prove its own
// (tampered, truncated) is refused, the source untouched.
func (f *fromSnapshot) write(ctx context.Context, c *claim, _ Step, in Admit, _ *ticket) error {
	s := f.h
	open, spec := f.prepare(c, in)
	live, err := s.runner.StartFromSnapshot(ctx, spec, f.dir)
	if err != nil {
		switch {
		case errors.Is(err, sandbox.ErrForeignCheckpoint), errors.Is(err, os.ErrNotExist):
			s.log.Warn("a snapshot cannot start a session of this workspace", "snapshot", f.snapshotID, "err", err)
			return errdefs.Publicf("snapshot %q not found: %w", f.snapshotID, errdefs.ErrNotFound)
		case errdefs.IsInvalidArgument(err), errors.Is(err, engine.ErrKernelLost):
			s.log.Error("a snapshot was refused", "snapshot", f.snapshotID, "err", err)
			return errdefs.Publicf("snapshot %s was refused: this daemon cannot prove it its own, or its kernel did not come back: %w", f.snapshotID, errdefs.ErrFailedPrecondition)
		}
		return fmt.Errorf("starting a session from snapshot %s: %w", f.snapshotID, err)
	}
	return f.record(ctx, c, in, open, live, func(rec *store.NewSession) error { return f.inheritApproval(ctx, c, rec) })
}

// Forked is the outcome of Fork.
type Forked struct {
	Source     model.Session
	SnapshotID string
	Stall      time.Duration
	Sessions   []model.Session
}

// Fork snapshots session id for p and starts req.Count sessions from the
// snapshot, all of them or none: a fork p may not take (mayTake) is
// refused first, then one over the workspace's bound of sessions or the
// memory budget (429, nothing taken); a start that fails after others
// started ends those (failed) and answers its error. The snapshot is
// deleted once the forks started. All or none holds while the daemon
// lives: a daemon killed mid-fork leaves the forks that started active,
// each with its session.forked event naming the fork's snapshot id.
func (s *snapshots) Fork(ctx context.Context, p Principal, id string, req wire.ForkRequest) (*Forked, error) {
	most := s.limits().MaxForks
	if req.Count < 1 || req.Count > most {
		return nil, errdefs.Publicf("count %d is out of range: 1 to %d (sessions.max_forks): %w", req.Count, most, errdefs.ErrInvalidArgument)
	}
	ss, err := s.st.GetSession(ctx, p.WorkspaceID, id)
	if err != nil {
		return nil, err
	}
	if err := s.mayTake(p, ss); err != nil {
		return nil, err
	}
	if err := s.roomFor(ctx, p, ss, req.Count); err != nil {
		return nil, err
	}
	began := s.opts.Now()
	t, err := s.take(ctx, p, id)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(t.dir)
	out := &Forked{Source: t.source, SnapshotID: t.id, Stall: t.stall, Sessions: make([]model.Session, req.Count)}
	sn := model.Snapshot{ID: t.id, SessionID: t.source.ID, Tool: t.source.Tool, Runtime: t.source.Runtime, Driver: t.source.Driver, CreatedAt: began}
	// The starts run at once: each restores its own sandbox from the same
	// files, which the first brings into the page cache.
	errs := make([]error, req.Count)
	var wg sync.WaitGroup
	for i := range req.Count {
		wg.Go(func() {
			c, err := s.start(ctx, p, CreateSessionRequest{IdleTimeoutMS: req.IdleTimeoutMS, TTLMS: req.TTLMS}, CreateSessionOptions{}, t.dir, t.id, t.source.ID, sn)
			if err != nil {
				errs[i] = err
				return
			}
			out.Sessions[i] = c.Session
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, f := range out.Sessions {
			if f.ID == "" {
				continue
			}
			if _, eerr := s.host.endSession(context.WithoutCancel(ctx), f, Principal{}, model.EndFailed, "", engine.EndedBySessionEnd); eerr != nil {
				s.log.Error("ending a fork of a fork that failed", "session", f.ID, "err", eerr)
			}
		}
		for _, e := range errs {
			if e != nil {
				// The first failure, with its class (a quota, the budget).
				return nil, e
			}
		}
	}
	return out, nil
}

// roomOnDisk refuses a snapshot of workspace ws (ErrResourceExhausted,
// 429) while its checkpoints hold MaxCheckpointBytes or more. A
// snapshot's size is known only once it is saved, so the last one
// admitted may take the workspace past the bound by its own size.
func (s *snapshots) roomOnDisk(ctx context.Context, ws string) error {
	used, _, err := s.st.CheckpointBytes(ctx, ws)
	if err != nil {
		return err
	}
	if most := s.limits().MaxCheckpointBytes; used >= most {
		return errdefs.Publicf("the workspace's snapshots and paused sessions hold %d bytes of checkpoints, at or over its bound of %d (sessions.max_checkpoint_bytes); delete a snapshot (DELETE /v1/snapshots/{id}) or end a paused session, or retry once one expired: %w",
			used, most, errdefs.ErrResourceExhausted)
	}
	return nil
}

// roomFor refuses a fork of n sessions of ss that the workspace's bound of
// live sessions or the memory budget cannot hold, with a QuotaError (or
// the budget's error) of class ErrResourceExhausted.
func (s *snapshots) roomFor(ctx context.Context, p Principal, ss model.Session, n int) error {
	pol, err := s.st.GetPolicy(ctx, p.WorkspaceID)
	if err != nil {
		return err
	}
	most, fits, err := s.host.sessionRoom(ctx, p.WorkspaceID, pol, n)
	if err != nil {
		return err
	}
	if !fits {
		return errdefs.Public(&QuotaError{Max: most, RetryAfter: time.Minute})
	}
	return s.runner.HasRoom(engine.SessionSpec{Runtime: ss.Runtime, Tool: ss.Tool, Driver: ss.Driver}, n)
}
