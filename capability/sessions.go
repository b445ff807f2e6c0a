package capability

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// sessionHost keeps the sessions this daemon serves: it opens them
// (sessionopen.go, under the workspace's bound: sessionquota.go), ends
// them (closed, by the sweep, at shutdown), pauses and resumes them
// (pause.go), sweeps them and adopts them at start (sessionsweep.go).
type sessionHost struct {
	*core
	st sessionStore
	// sessions are the sessions this daemon serves, and trans their
	// transitions' locks (pause.go).
	sessions liveSessions
	trans    transitions
	runs     *runs
	gate     *gate
	// egress audits the refusals of the sessions' sandboxes.
	egress *egressAudit
}

// runningCell is the cell running in session id, "" when none or when
// this daemon does not serve the session.
func (s *sessionHost) runningCell(id string) string {
	if live := s.sessions.get(id); live != nil {
		return live.runningCell()
	}
	return ""
}

// SessionOptions bound the server's sessions (the configuration's
// `sessions:`). Zero fields take the configuration's defaults
// (config.DefaultSessions).
type SessionOptions struct {
	// IdleTimeout ends a session no cell ran in for so long. MaxIdleTimeout
	// is the most a session may ask for, and at least IdleTimeout.
	IdleTimeout, MaxIdleTimeout time.Duration
	// TTL is a session's hard lifetime. MaxTTL is the most a session may
	// ask for, and at least TTL.
	TTL, MaxTTL time.Duration
	// MaxPerWorkspace bounds a workspace's live sessions. A workspace
	// policy's MaxSessions may lower it, never raise it.
	MaxPerWorkspace int
	// WorkspaceSize is the size of a session's /workspace.
	WorkspaceSize int64
	// MaxFileSize bounds one file moved in or out.
	MaxFileSize int64
	// CheckpointDir holds the checkpoints of paused sessions, one
	// directory each, root-only; empty means sessions cannot pause.
	CheckpointDir string
	// PauseAfterIdle, when positive, pauses a session no cell ran in for
	// so long instead of ending it at its idle timeout, if its driver can
	// save it; a paused session ends at its TTL. Zero (the default) never
	// pauses one by itself.
	PauseAfterIdle time.Duration
}

func (o *SessionOptions) fill() {
	d := config.DefaultSessions()
	def := func(v *time.Duration, dv time.Duration) {
		if *v <= 0 {
			*v = dv
		}
	}
	def(&o.IdleTimeout, d.IdleTimeout)
	def(&o.MaxIdleTimeout, max(d.MaxIdleTimeout, o.IdleTimeout))
	def(&o.TTL, d.TTL)
	def(&o.MaxTTL, max(d.MaxTTL, o.TTL))
	if o.MaxPerWorkspace <= 0 {
		o.MaxPerWorkspace = d.MaxPerWorkspace
	}
	if o.WorkspaceSize <= 0 {
		o.WorkspaceSize = int64(d.WorkspaceSize)
	}
	if o.MaxFileSize <= 0 {
		o.MaxFileSize = int64(d.MaxFileSize)
	}
}

// sessionStore is what sessionHost needs of the store.
type sessionStore interface {
	// GetExecution reads the cell a session's end cancels.
	GetExecution(ctx context.Context, workspaceID, executionID string) (model.Execution, error)
	OpenSession(ctx context.Context, s store.NewSession) (model.Session, bool, error)
	EndSession(ctx context.Context, id string, e store.SessionEnd) (model.Session, error)
	GetSession(ctx context.Context, workspaceID, id string) (model.Session, error)
	ReplaySession(ctx context.Context, keyID, key string) (model.Session, error)
	ListSessions(ctx context.Context, workspaceID string, f store.SessionFilter) (store.Page[model.Session], error)
	ListActiveSessions(ctx context.Context) ([]model.Session, error)
	CountActiveSessions(ctx context.Context, workspaceID string) (int, error)
	PauseSession(ctx context.Context, id string, p store.SessionPause) (model.Session, error)
	ResumeSession(ctx context.Context, id string, r store.SessionResume) (model.Session, error)
	PendingCell(ctx context.Context, sessionID string) (string, error)
	ListPausedSessions(ctx context.Context) ([]model.Session, error)
	// GetApproval reads the approval a fork may inherit (forkapproval.go).
	GetApproval(ctx context.Context, workspaceID, approvalID string) (model.Approval, error)
}

// SessionObserver, when the service's Observer implements it, is told
// about sessions, for metrics.
type SessionObserver interface {
	SessionsLive(delta int)
	SessionCell(status model.ExecutionStatus)
	SessionEnded(reason model.SessionEndReason)
}

// The errors of sessions that the API answers with codes of their own.
var (
	// ErrInvalidPath is a file path of a session that is not below
	// /workspace, or has "..", or NUL (400 invalid_path).
	ErrInvalidPath = errdefs.Public(errors.New("invalid path"))
)

// SessionBusyError is a cell asked for while another cell of the session
// has not ended (409 session_busy); it is of class ErrConflict.
type SessionBusyError struct{ SessionID string }

func (e *SessionBusyError) Error() string {
	return fmt.Sprintf("session %s is running a cell; wait for it to end or interrupt it", e.SessionID)
}
func (e *SessionBusyError) Unwrap() error { return errdefs.ErrConflict }

// liveSessions are the sessions whose sandboxes this daemon serves, by
// session id.
type liveSessions struct {
	mu   sync.Mutex
	byID map[string]*liveSession
}

type liveSession struct {
	*engine.Session
	// cell is the execution of the cell running, "" when none: for the
	// idle sweep, and for the session's end, which stops it.
	mu   sync.Mutex
	cell string
}

func (l *liveSessions) get(id string) *liveSession {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byID[id]
}

func (l *liveSessions) put(id string, s *engine.Session) *liveSession {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byID == nil {
		l.byID = map[string]*liveSession{}
	}
	ls := &liveSession{Session: s}
	l.byID[id] = ls
	return ls
}

func (l *liveSessions) take(id string) *liveSession {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.byID[id]
	delete(l.byID, id)
	return s
}

func (ls *liveSession) running() bool { return ls.runningCell() != "" }

// runningCell is the execution of the cell running, "" when none.
func (ls *liveSession) runningCell() string {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.cell
}

// track records that cell execution id runs.
func (ls *liveSession) track(id string) {
	ls.mu.Lock()
	ls.cell = id
	ls.mu.Unlock()
}

// untrack records that cell execution id has ended, unless another cell
// is tracked already: a cell's end is recorded (the store's) before its
// goroutine lets go, and the next cell may be admitted and tracked in
// between.
func (ls *liveSession) untrack(id string) {
	ls.mu.Lock()
	if ls.cell == id {
		ls.cell = ""
	}
	ls.mu.Unlock()
}

// NewSessionID returns a fresh session id.
func NewSessionID() string { return newID("ses_") }

// newID returns a fresh id of prefix: 16 random bytes in hex after it.
func newID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// hasIDForm reports whether name has the form newID(prefix) gives.
func hasIDForm(name, prefix string) bool {
	h, ok := strings.CutPrefix(name, prefix)
	if !ok || len(h) != 32 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil
}

// canSaveNetwork refuses to save (pause, snapshot, fork) a session whose
// sandbox has a network (ErrFailedPrecondition, 409): a checkpoint does
// not save a sandbox's network namespace, and the drivers refuse to save
// a sandbox that has one. A session has one when it asked for network
// (ss.Network) and also when its tool lists broker operations, which its
// live sandbox knows (engine.Session.Network).
func (s *sessionHost) canSaveNetwork(ss model.Session, what string) error {
	if !ss.Network {
		live := s.sessions.get(ss.ID)
		if live == nil || live.Network() == engine.NetworkNone {
			return nil
		}
	}
	return errdefs.Publicf("session %s has network (egress or the credential broker through the proxy), and a sandbox with a network cannot be saved, so it cannot %s; it stays active until it is closed or ends: %w",
		ss.ID, what, errdefs.ErrFailedPrecondition)
}

// SandboxGrace is how long after a session's hard end (its TTL) its
// sandbox ends itself (engine.SessionSpec.Deadline) when no daemon has
// ended the session: a daemon that runs ends it at its TTL, audited
// (sweepSessions), well within the grace; the sandbox's own end is for a
// daemon stopped for good, whose sandboxes would otherwise run on. A
// sweep later than the grace finds the sandbox gone: its running cell
// and its session end as the sweep would have ended them (runCell), and
// a daemon that starts later ends the session ttl (adoptSessions).
const SandboxGrace = 10 * time.Second

// sandboxDeadline is the deadline of the sandbox of a session that ends at
// expires.
func sandboxDeadline(expires time.Time) time.Time { return expires.Add(SandboxGrace) }

func (s *sessionHost) sessionObserver() SessionObserver {
	if o, ok := s.opts.Observer.(SessionObserver); ok {
		return o
	}
	return nopSessionObserver{}
}

type nopSessionObserver struct{}

func (nopSessionObserver) SessionsLive(int)                    {}
func (nopSessionObserver) SessionCell(model.ExecutionStatus)   {}
func (nopSessionObserver) SessionEnded(model.SessionEndReason) {}

// GetSession returns session id of p's workspace: another workspace's
// is ErrNotFound.
func (s *sessionHost) GetSession(ctx context.Context, p Principal, id string) (model.Session, error) {
	return s.st.GetSession(ctx, p.WorkspaceID, id)
}

// ListSessions lists the sessions of p's workspace, newest first.
func (s *sessionHost) ListSessions(ctx context.Context, p Principal, f store.SessionFilter) (store.Page[model.Session], error) {
	return s.st.ListSessions(ctx, p.WorkspaceID, f)
}

// usable returns session id of p's workspace and its sandbox, for an
// operation of p's on it: only the key that opened it or an admin key of
// the workspace may (ErrPermissionDenied), an ended one is a
// SessionExpiredError.
//
// A paused session is resumed first (see pause.go). The func it returns
// (nil on error) releases the session's lock, which it holds shared
// until the caller calls it, so that no pause saves the sandbox under the
// operation.
func (s *sessionHost) usable(ctx context.Context, p Principal, id string) (model.Session, *liveSession, func(), error) {
	for {
		unlock := s.trans.lock(id, false)
		ss, err := s.st.GetSession(ctx, p.WorkspaceID, id)
		if err != nil {
			unlock()
			return ss, nil, nil, err
		}
		if p.KeyID != ss.KeyID && p.Role != model.RoleAdmin {
			unlock()
			return ss, nil, nil, errdefs.Publicf("only the key that opened session %s or an admin key may use it: %w", id, errdefs.ErrPermissionDenied)
		}
		switch ss.State {
		case model.SessionPaused:
			unlock()
			if _, err := s.ResumeSession(ctx, p, id); err != nil {
				return ss, nil, nil, err
			}
			continue
		case model.SessionEnded:
			unlock()
			return ss, nil, nil, expiredError(sessionOf(ss))
		}
		live := s.sessions.get(id)
		if live == nil {
			unlock()
			return ss, nil, nil, errdefs.Publicf("session %s is active but its sandbox is not served by this daemon; retry: %w", id, errdefs.ErrUnavailable)
		}
		return ss, live, unlock, nil
	}
}

// CloseSession ends session id for p (reason closed) and destroys its
// sandbox; only the key that opened it or an admin key may. An ended
// session is a SessionExpiredError.
func (s *sessionHost) CloseSession(ctx context.Context, p Principal, id string) (model.Session, error) {
	ss, err := s.st.GetSession(ctx, p.WorkspaceID, id)
	if err != nil {
		return ss, err
	}
	return s.endSession(ctx, ss, p, model.EndClosed, "", engine.EndedBySessionEnd)
}

// cancelWaitingCell cancels the cell of ended session ss that waits for
// its approval or its turn, which would otherwise wait on (an approval
// that could still be granted, credits reserved) for a session that is
// gone. A running cell is ended by its sandbox's destruction.
func (s *sessionHost) cancelWaitingCell(ctx context.Context, ss model.Session, reason model.SessionEndReason) {
	id, err := s.st.PendingCell(ctx, ss.ID)
	if err == nil && id != "" {
		var e model.Execution
		if e, err = s.st.GetExecution(ctx, ss.WorkspaceID, id); err == nil && e.Status != model.StatusRunning {
			_, err = s.runs.cancelAs(ctx, Principal{}, ss.WorkspaceID, id, fmt.Sprintf("its session %s ended (%s)", ss.ID, reason))
		}
	}
	if err != nil {
		s.log.Error("cancelling the waiting cell of an ended session", "session", ss.ID, "execution", id, "err", err)
	}
}

// endSession ends ss for reason, as by (the zero Principal: the system),
// and destroys its sandbox. detail, which only the system gives, says in
// words why the session ends (EndSession.Detail; "" for none). A cell
// that runs is cut short with it: it ends killed with ended_by cut
// (engine.EndedBySessionEnd, or engine.EndedByShutdown when the daemon's
// shutdown ends the session), charged as launched, with the output it
// had made.
func (s *sessionHost) endSession(ctx context.Context, ss model.Session, by Principal, reason model.SessionEndReason, detail, cut string) (model.Session, error) {
	unlock := s.trans.lock(ss.ID, true)
	defer unlock()
	return s.endLocked(ctx, ss, by, reason, detail, cut)
}

// endLocked is endSession with the session's lock held; it removes the
// checkpoint of a paused session too.
func (s *sessionHost) endLocked(ctx context.Context, ss model.Session, by Principal, reason model.SessionEndReason, detail, cut string) (model.Session, error) {
	g := sessionGrant(ss)
	step, err := Transition(g, EndSession{By: by, Reason: reason, Detail: detail, Cells: ss.Cells, At: s.opts.Now()})
	if err != nil {
		return model.Session{}, err
	}
	ended, err := s.st.EndSession(ctx, ss.ID, *step.End)
	if errdefs.IsConflict(err) {
		// Another end won: answer as for an ended session.
		if cur, gerr := s.st.GetSession(ctx, ss.WorkspaceID, ss.ID); gerr == nil {
			return model.Session{}, expiredError(sessionOf(cur))
		}
	}
	if err != nil {
		return model.Session{}, err
	}
	if live := s.sessions.take(ss.ID); live != nil {
		if cell := live.runningCell(); cell != "" {
			// The cell that runs is cut short with its sandbox: it ends
			// killed, charged as launched, with the output it had made.
			s.runs.stopRun(cell, &Cancellation{Reason: fmt.Sprintf("its session %s ended (%s)", ss.ID, reason), EndedBy: cut})
		}
		dctx, cancel := destroyContext(ctx)
		err := live.Close(dctx)
		cancel()
		switch {
		case err != nil && dctx.Err() != nil:
			s.log.Error("destroying an ended session's sandbox took too long; the next start reaps it", "session", ss.ID, "sandbox", ss.SandboxID, "err", err)
		case err != nil:
			s.log.Error("destroying a session's sandbox", "session", ss.ID, "sandbox", ss.SandboxID, "err", err)
		}
		s.sessionObserver().SessionsLive(-1)
	}
	s.cancelWaitingCell(context.WithoutCancel(ctx), ss, reason)
	if s.egress != nil {
		s.egress.endSession(ss.ID, ss.WorkspaceID)
	}
	s.removeCheckpoint(ss.ID)
	s.sessionObserver().SessionEnded(reason)
	return ended, nil
}
