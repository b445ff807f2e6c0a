package capability

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
)

// A session pauses to a checkpoint under SessionOptions.CheckpointDir
// (one directory per session, named by its id, root-only) and resumes
// from it in a new sandbox. Pause and resume are transitions of the
// session (PauseSession, ResumeSession: audited, by the key that opened
// it, an admin key, or the system for pause_after_idle); a cell or a file
// operation on a paused session resumes it first, transparently, so that
// an agent need not know its session slept; an interrupt finds no cell
// running and resumes nothing. The checkpoint is deleted once the resume
// is recorded, and when the session ends, paused or not.
//
// A session's transitions (pause, resume, end) hold its lock
// (transitions.lock); its operations (admitting a cell, a file operation)
// hold it shared, so that a pause never saves a sandbox under an
// operation and a cell is either tracked as running before a pause looks
// or admitted after the session is active again.

// transitions are the sessions' locks, by session id.
type transitions struct {
	mu sync.Mutex
	m  map[string]*transition
}

type transition struct {
	sync.RWMutex
	users int
}

// lock locks session id's transitions, exclusively or shared, and returns
// the unlock.
func (t *transitions) lock(id string, exclusive bool) (unlock func()) {
	t.mu.Lock()
	if t.m == nil {
		t.m = map[string]*transition{}
	}
	l := t.m[id]
	if l == nil {
		l = &transition{}
		t.m[id] = l
	}
	l.users++
	t.mu.Unlock()
	if exclusive {
		l.Lock()
	} else {
		l.RLock()
	}
	return func() {
		if exclusive {
			l.Unlock()
		} else {
			l.RUnlock()
		}
		t.mu.Lock()
		if l.users--; l.users == 0 {
			delete(t.m, id)
		}
		t.mu.Unlock()
	}
}

// checkpointDir is where session id's checkpoint is kept.
func (s *sessionHost) checkpointDir(id string) string {
	return filepath.Join(s.opts.Sessions.CheckpointDir, id)
}

// PauseSession pauses session id for p: its sandbox is saved, with its
// kernel and /workspace, to a checkpoint on disk, and ended. Pausing a
// paused session answers it as it is. A session whose driver cannot save
// a sandbox (runc), or with a cell that has not ended, is refused
// (ErrFailedPrecondition with the driver's reason; SessionBusyError).
func (s *sessionHost) PauseSession(ctx context.Context, p Principal, id string) (model.Session, error) {
	unlock := s.trans.lock(id, true)
	defer unlock()
	ss, err := s.st.GetSession(ctx, p.WorkspaceID, id)
	if err != nil {
		return ss, err
	}
	return s.pauseLocked(ctx, ss, p)
}

func (s *sessionHost) pauseLocked(ctx context.Context, ss model.Session, by Principal) (model.Session, error) {
	g := sessionGrant(ss)
	if ss.State == model.SessionPaused {
		return ss, mayTransition(g, by, "pause")
	}
	// The rules are asked first, with the facts known before the sandbox
	// is saved, so that a refused pause saves nothing.
	if _, err := Transition(g, PauseSession{By: by, SandboxID: ss.SandboxID, At: s.opts.Now()}); err != nil {
		return model.Session{}, err
	}
	if err := s.canSaveNetwork(ss, "pause"); err != nil {
		return model.Session{}, err
	}
	if err := s.runner.CanPause(ss.Driver); err != nil {
		return model.Session{}, err
	}
	if s.opts.Sessions.CheckpointDir == "" {
		return model.Session{}, errdefs.Publicf("this server keeps no checkpoints, so sessions cannot pause: %w", errdefs.ErrFailedPrecondition)
	}
	live := s.sessions.get(ss.ID)
	if live == nil {
		return model.Session{}, errdefs.Publicf("session %s is active but its sandbox is not served by this daemon; retry: %w", ss.ID, errdefs.ErrUnavailable)
	}
	// The store's pending cell is the session's busy state (a cell
	// awaiting its approval would find no sandbox), not liveSession's:
	// a cell's end is recorded before its goroutine lets go of the
	// session, and a client that saw the end may pause at once. The
	// engine refuses a session whose sandbox still runs a cell.
	if cell, err := s.st.PendingCell(ctx, ss.ID); err != nil {
		return model.Session{}, err
	} else if cell != "" {
		return model.Session{}, errdefs.Public(&SessionBusyError{SessionID: ss.ID})
	}
	if err := os.MkdirAll(s.opts.Sessions.CheckpointDir, 0o700); err != nil {
		return model.Session{}, fmt.Errorf("creating the checkpoint directory: %w", err)
	}
	dir := s.checkpointDir(ss.ID)
	// What a crash left of an earlier pause of this active session is
	// not its checkpoint.
	if err := os.RemoveAll(dir); err != nil {
		return model.Session{}, fmt.Errorf("removing a stale checkpoint of session %s: %w", ss.ID, err)
	}
	// Once started, a pause is carried through and recorded whatever
	// becomes of its caller (a client gone, the daemon stopping): a
	// checkpoint cut short or saved but unrecorded would end the session.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pauseTimeout)
	defer cancel()
	n, err := s.runner.PauseSession(ctx, live.Session, dir)
	if err != nil {
		if errdefs.IsConflict(err) {
			return model.Session{}, errdefs.Public(&SessionBusyError{SessionID: ss.ID})
		}
		return model.Session{}, err
	}
	s.sessions.take(ss.ID)
	s.sessionObserver().SessionsLive(-1)
	step, err := Transition(g, PauseSession{By: by, SandboxID: ss.SandboxID, CheckpointBytes: n, At: s.opts.Now()})
	if err == nil {
		var paused model.Session
		if paused, err = s.st.PauseSession(ctx, ss.ID, *step.Pause); err == nil {
			return paused, nil
		}
	}
	// The sandbox is saved and gone, but the pause is not recorded (no
	// cell could start meanwhile: the session's lock is held). The session
	// cannot be served again: it ends failed, and its checkpoint with it.
	s.log.Error("recording a session's pause", "session", ss.ID, "err", err)
	if _, eerr := s.endLocked(context.WithoutCancel(ctx), ss, Principal{}, model.EndFailed, "", engine.EndedBySessionEnd); eerr != nil {
		s.log.Error("ending a session whose pause was not recorded", "session", ss.ID, "err", eerr)
	}
	return model.Session{}, fmt.Errorf("recording the pause of session %s, which has ended: %w", ss.ID, err)
}

// ResumeSession resumes paused session id for p, from its checkpoint, in a
// new sandbox whose kernel has the state it had. Resuming an active
// session answers it as it is. A checkpoint the driver cannot prove its
// own, or that is gone, cannot be resumed: the session ends failed and the
// answer says so (ErrFailedPrecondition); any other failure leaves it
// paused, for a retry.
func (s *sessionHost) ResumeSession(ctx context.Context, p Principal, id string) (model.Session, error) {
	unlock := s.trans.lock(id, true)
	defer unlock()
	ss, err := s.st.GetSession(ctx, p.WorkspaceID, id)
	if err != nil {
		return ss, err
	}
	return s.resumeLocked(ctx, ss, p)
}

func (s *sessionHost) resumeLocked(ctx context.Context, ss model.Session, by Principal) (model.Session, error) {
	g := sessionGrant(ss)
	if ss.State == model.SessionActive {
		return ss, mayTransition(g, by, "resume")
	}
	if _, err := Transition(g, ResumeSession{By: by, SandboxID: ss.SandboxID, At: s.opts.Now()}); err != nil {
		return model.Session{}, err
	}
	dir := s.checkpointDir(ss.ID)
	// The session's and its workspace's labels bind the checkpoint, under
	// its MAC: another session's checkpoint copied in its place is
	// refused (sandbox.ErrForeignCheckpoint), not resumed with the other
	// session's variables and files.
	labels := map[string]string{engine.LabelOwner: s.opts.Owner, engine.LabelSession: ss.ID, engine.LabelWorkspace: ss.WorkspaceID}
	live, err := s.runner.ResumeSession(ctx, engine.SessionSpec{Driver: ss.Driver, Runtime: ss.Runtime, Tool: ss.Tool, Labels: labels,
		Deadline: sandboxDeadline(ss.ExpiresAt)}, dir)
	if err != nil {
		// Only a checkpoint refused (not proven the daemon's: invalid;
		// saved for another session), gone, or restored without its
		// kernel ends the session; any other failure (a sandbox that died
		// starting, a guest not ready) keeps it paused, its checkpoint
		// kept, for a retry.
		var why string
		switch {
		case errors.Is(err, sandbox.ErrForeignCheckpoint):
			why = "its checkpoint was saved for another session"
		case errors.Is(err, fs.ErrNotExist):
			why = "its checkpoint is gone"
		case errors.Is(err, engine.ErrKernelLost):
			why = "its kernel did not come back from its checkpoint"
		case errdefs.IsInvalidArgument(err):
			why = "its checkpoint was refused: this daemon cannot prove it its own"
		default:
			return model.Session{}, err
		}
		s.log.Error("a paused session's checkpoint cannot be restored", "session", ss.ID, "err", err)
		if _, eerr := s.endLocked(context.WithoutCancel(ctx), ss, Principal{}, model.EndFailed, "", engine.EndedBySessionEnd); eerr != nil {
			return model.Session{}, fmt.Errorf("ending session %s, whose checkpoint cannot be restored: %w", ss.ID, eerr)
		}
		// The cause (with the checkpoint's path) is logged above; the
		// answer names none.
		return model.Session{}, errdefs.Publicf("session %s cannot resume: %s; it has ended (failed): %w",
			ss.ID, why, errdefs.ErrFailedPrecondition)
	}
	step, err := Transition(g, ResumeSession{By: by, SandboxID: live.SandboxID(), At: s.opts.Now()})
	var resumed model.Session
	if err == nil {
		resumed, err = s.st.ResumeSession(ctx, ss.ID, *step.Resume)
	}
	if err != nil {
		// Not recorded: the session stays paused, its checkpoint kept.
		_ = live.Close(context.WithoutCancel(ctx))
		return model.Session{}, fmt.Errorf("recording the resume of session %s: %w", ss.ID, err)
	}
	s.sessions.put(ss.ID, live)
	s.sessionObserver().SessionsLive(1)
	if err := os.RemoveAll(dir); err != nil {
		s.log.Error("removing a resumed session's checkpoint", "session", ss.ID, "err", err)
	}
	return resumed, nil
}

// removeCheckpoint removes session id's checkpoint, if it has one.
func (s *sessionHost) removeCheckpoint(id string) {
	if s.opts.Sessions.CheckpointDir == "" {
		return
	}
	if err := os.RemoveAll(s.checkpointDir(id)); err != nil {
		s.log.Error("removing an ended session's checkpoint", "session", id, "err", err)
	}
}

// pauseTimeout bounds a pause, from the checkpoint to its record.
const pauseTimeout = 5 * time.Minute

// sweepCheckpoints removes, at the daemon's start, the checkpoints of
// sessions that are not paused: those a crash left between saving a
// sandbox and recording the pause, or between recording an end or a
// resume and removing the checkpoint. Only entries named as a session's
// checkpoint are: whatever else the directory holds (it is the
// operator's choice, sessions.checkpoint_dir) is not the daemon's.
func (s *sessionHost) sweepCheckpoints(ctx context.Context) error {
	if s.opts.Sessions.CheckpointDir == "" {
		return nil
	}
	entries, err := os.ReadDir(s.opts.Sessions.CheckpointDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing checkpoints: %w", err)
	}
	paused, err := s.st.ListPausedSessions(ctx)
	if err != nil {
		return fmt.Errorf("listing paused sessions: %w", err)
	}
	keep := map[string]bool{}
	for _, ss := range paused {
		keep[ss.ID] = true
	}
	for _, e := range entries {
		if e.IsDir() && isSessionID(e.Name()) && !keep[e.Name()] {
			s.removeCheckpoint(e.Name())
		}
	}
	return nil
}

// isSessionID reports whether name has the form NewSessionID gives.
func isSessionID(name string) bool { return hasIDForm(name, "ses_") }
