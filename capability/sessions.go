package capability

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/contract"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
	"github.com/stockade-sh/stockade/wire"
)

// sessionHost keeps the sessions this daemon serves: it opens them, ends
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

// QuotaError is a session refused because its workspace has as many live
// sessions as it may (429 session_quota, with Retry-After); it is of class
// ErrResourceExhausted.
type QuotaError struct {
	Max int
	// RetryAfter is when the first of the workspace's sessions is due to
	// end by itself.
	RetryAfter time.Duration
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("the workspace has %d live sessions, its most; close one (DELETE /v1/sessions/{id}) or retry later", e.Max)
}
func (e *QuotaError) Unwrap() error { return errdefs.ErrResourceExhausted }

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

// track records that cell execution id runs ("" once it has ended).
func (ls *liveSession) track(id string) {
	ls.mu.Lock()
	ls.cell = id
	ls.mu.Unlock()
}

// CreateSessionRequest is the body of POST /v1/sessions, as the wire
// declares it; its IdempotencyKey is not read (CreateSessionOptions
// carries it).
type CreateSessionRequest = wire.SessionRequest

// CreateSessionOptions are the parts of a creation that are not its body.
type CreateSessionOptions struct {
	// IdempotencyKey makes a retried creation return the first session.
	IdempotencyKey string
}

// Created is the outcome of CreateSession.
type Created struct {
	Session model.Session
	// Replayed is set when an Idempotency-Key matched an earlier
	// creation.
	Replayed bool
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

func durationOf(name string, ms int64, def, ceiling time.Duration) (time.Duration, error) {
	switch {
	case ms == 0:
		return def, nil
	case ms < 0 || ms > math.MaxInt64/int64(time.Millisecond):
		return 0, errdefs.Publicf("%s %d is out of range: %w", name, ms, errdefs.ErrInvalidArgument)
	}
	d := time.Duration(ms) * time.Millisecond
	if d > ceiling {
		return 0, errdefs.Publicf("%s %d is above this server's ceiling of %d: %w", name, ms, ceiling.Milliseconds(), errdefs.ErrInvalidArgument)
	}
	return d, nil
}

// CreateSession opens a session for p: a decision of the workspace policy
// like an invocation's (recorded as session.created, or as
// capability.invoke_denied when refused), the workspace's bound of live
// sessions (QuotaError), then its sandbox and kernel. Nothing is left
// behind when it fails. A session costs nothing; its cells are charged as
// invocations.
func (s *sessionHost) CreateSession(ctx context.Context, p Principal, req CreateSessionRequest, o CreateSessionOptions) (*Created, error) {
	so := s.opts.Sessions
	network, err := policy.ParseNetwork(req.Network)
	if err != nil {
		return nil, err
	}
	idle, err := durationOf("idle_timeout_ms", req.IdleTimeoutMS, so.IdleTimeout, so.MaxIdleTimeout)
	if err != nil {
		return nil, err
	}
	ttl, err := durationOf("ttl_ms", req.TTLMS, so.TTL, so.MaxTTL)
	if err != nil {
		return nil, err
	}
	rec := &opening{h: s, id: NewSessionID(), reqSum: sha256Hex(mustJSON(req)), idle: idle, ttl: ttl,
		spec: engine.SessionSpec{Runtime: req.Runtime, Tool: req.Tool, Workspace: so.WorkspaceSize, Network: network}}
	// The decision first, before anything is created: a refusal leaves
	// only its event. (The record's driver and sandbox are filled in once
	// the sandbox exists, and the opening decided again with them.)
	if err := s.gate.admit(ctx, s.openingClaim(p, o, rec, rec, nil)); err != nil {
		return nil, err
	}
	return rec.created, nil
}

// openingClaim is the claim of op, a session's opening for p recorded by
// rec (op itself, or a start from a snapshot): its runtime, tool and
// network are op.spec's; its room is a place under the workspace's bound
// of live sessions (QuotaError), then more's when set (nil or the
// refusal), then the service's health.
func (s *sessionHost) openingClaim(p Principal, o CreateSessionOptions, op *opening, rec record, more func(context.Context, *claim, Admit) error) *claim {
	network := op.spec.Network
	c := &claim{by: p, grant: openingGrant(op.id), idempotencyKey: o.IdempotencyKey, replayFirst: true, egress: true, review: true, record: rec,
		ask:   policy.Request{Capability: contract.CodeExecute, Runtime: op.spec.Runtime, Network: network},
		asked: audit.Invocation{Capability: contract.CodeExecute.Name, Runtime: op.spec.Runtime, Network: policy.NetworkWord(network)},
		check: func() (tools.Tool, sandbox.Driver, error) {
			tool, drv, _, err := s.runner.CheckSession(op.spec)
			return tool, drv, err
		},
	}
	c.room = func(ctx context.Context, _ Step, in Admit) (*ticket, error) {
		most := s.maxSessions(c.facts.pol)
		if n, err := s.st.CountActiveSessions(ctx, p.WorkspaceID); err != nil {
			return nil, err
		} else if n >= most {
			return nil, s.refuseQuota(ctx, c, in, most)
		}
		if more != nil {
			if err := more(ctx, c, in); err != nil {
				return nil, err
			}
		}
		return nil, s.gate.healthy(ctx, c, in)
	}
	return c
}

// opening records a session's opening (see claim): once the rules
// allowed it, its sandbox and kernel are made, then its record; nothing
// is left behind when that fails.
type opening struct {
	h  *sessionHost
	id string
	// reqSum is the hash of the request, which a retry must match.
	reqSum    string
	idle, ttl time.Duration
	spec      engine.SessionSpec

	// created is the outcome.
	created *Created
}

func (o *opening) replay(ctx context.Context, c *claim) (bool, error) {
	ss, err := o.h.st.ReplaySession(ctx, c.by.KeyID, c.idempotencyKey)
	if err == nil {
		if ss.RequestSHA256 != o.reqSum {
			return true, errdefs.Publicf("idempotency key %q was used for a different request (session %s): %w", c.idempotencyKey, ss.ID, errdefs.ErrConflict)
		}
		o.created = &Created{Session: ss, Replayed: true}
		return true, nil
	}
	if !errdefs.IsNotFound(err) {
		return false, fmt.Errorf("looking up the idempotency key: %w", err)
	}
	return false, nil
}

// input is the opening of the session that c asks for, decided in.
func (o *opening) input(c *claim, in Admit) Input {
	return OpenSession{Admit: in, Record: store.NewSession{ID: o.id, WorkspaceID: c.by.WorkspaceID, KeyID: c.by.KeyID, Tool: c.facts.tool.Name,
		Runtime: c.ask.Runtime, Network: c.ask.Network, Approval: c.facts.pol.Approval, IdleTimeout: o.idle, ExpiresAt: in.At.Add(o.ttl),
		WorkspaceBytes: o.h.opts.Sessions.WorkspaceSize, IdempotencyKey: c.idempotencyKey, RequestSHA256: o.reqSum, MaxLive: o.h.maxSessions(c.facts.pol)}}
}

// write makes the session's sandbox and records the session.
func (o *opening) write(ctx context.Context, c *claim, _ Step, in Admit, _ *ticket) error {
	open, spec := o.prepare(c, in)
	live, err := o.h.runner.OpenSession(ctx, spec)
	if err != nil {
		return fmt.Errorf("opening the session's sandbox: %w", err)
	}
	return o.record(ctx, c, in, open, live, nil)
}

// prepare is the opening c asks for, decided in, and the spec of its
// sandbox: the session's deadline and labels.
func (o *opening) prepare(c *claim, in Admit) (OpenSession, engine.SessionSpec) {
	open := o.input(c, in).(OpenSession)
	spec := o.spec
	spec.Deadline = sandboxDeadline(open.Record.ExpiresAt)
	spec.Labels = map[string]string{engine.LabelOwner: o.h.opts.Owner, engine.LabelSession: o.id, engine.LabelWorkspace: c.by.WorkspaceID, engine.LabelTool: open.Record.Tool}
	return open, spec
}

// record records open, whose sandbox live is made, decided again with
// the sandbox's driver and id, and completed by complete when set (a
// start from a snapshot adds its session.forked and what approval it
// inherits), and serves it; live is closed when that fails or the
// opening was a retry's.
func (o *opening) record(ctx context.Context, c *claim, in Admit, open OpenSession, live *engine.Session, complete func(*store.NewSession) error) error {
	s := o.h
	open.Record.Driver, open.Record.SandboxID = live.Driver, live.SandboxID()
	step, err := Transition(c.grant, open)
	if err == nil && step.Open == nil {
		err = fmt.Errorf("the session's decision changed while its sandbox was made")
	}
	var (
		ss       model.Session
		replayed bool
	)
	if err == nil {
		rec := *step.Open
		if complete != nil {
			err = complete(&rec)
		}
		if err == nil {
			ss, replayed, err = s.st.OpenSession(ctx, rec)
		}
	}
	if err != nil || replayed {
		_ = live.Close(context.WithoutCancel(ctx))
		switch {
		case replayed:
			o.created = &Created{Session: ss, Replayed: true}
			return nil
		case errdefs.IsResourceExhausted(err):
			return s.refuseQuota(ctx, c, in, open.Record.MaxLive)
		}
		return fmt.Errorf("recording the session: %w", err)
	}
	s.sessions.put(ss.ID, live)
	s.sessionObserver().SessionsLive(1)
	o.created = &Created{Session: ss}
	return nil
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

// maxSessions is the bound of the live sessions of a workspace under pol.
func (s *sessionHost) maxSessions(pol model.Policy) int {
	if pol.MaxSessions > 0 {
		return min(pol.MaxSessions, s.opts.Sessions.MaxPerWorkspace)
	}
	return s.opts.Sessions.MaxPerWorkspace
}

// refuseQuota records the refusal of a session over the workspace's
// bound and answers with a QuotaError saying when to retry.
func (s *sessionHost) refuseQuota(ctx context.Context, c *claim, in Admit, most int) error {
	err := s.gate.refuse(ctx, c, in, &Refusal{Code: "session_quota", Reason: fmt.Sprintf("the workspace has %d live sessions, its most", most), Class: errdefs.ErrResourceExhausted})
	if !errdefs.IsResourceExhausted(err) {
		return err
	}
	retry := time.Minute
	page, err := s.st.ListSessions(ctx, c.by.WorkspaceID, store.SessionFilter{States: []model.SessionState{model.SessionActive, model.SessionPaused},
		PageRequest: store.PageRequest{Limit: store.MaxPageLimit}})
	if err == nil {
		now := s.opts.Now()
		for _, ss := range page.Items {
			retry = min(retry, ss.ExpiresAt.Sub(now))
			if ss.State == model.SessionActive {
				retry = min(retry, ss.IdleExpiresAt().Sub(now)) // a paused one does not idle out
			}
		}
	}
	return errdefs.Public(&QuotaError{Max: most, RetryAfter: max(retry, time.Second)})
}

// openingGrant is the grant of session id before it opened.
func openingGrant(id string) Grant { return Grant{Kind: Session, Session: &SessionOf{ID: id}} }

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
	return s.endSession(ctx, ss, p, model.EndClosed, engine.EndedBySessionEnd)
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
// and destroys its sandbox. A cell that runs is cut short with it: it
// ends killed with ended_by cut (engine.EndedBySessionEnd, or
// engine.EndedByShutdown when the daemon's shutdown ends the session),
// charged as launched, with the output it had made.
func (s *sessionHost) endSession(ctx context.Context, ss model.Session, by Principal, reason model.SessionEndReason, cut string) (model.Session, error) {
	unlock := s.trans.lock(ss.ID, true)
	defer unlock()
	return s.endLocked(ctx, ss, by, reason, cut)
}

// endLocked is endSession with the session's lock held; it removes the
// checkpoint of a paused session too.
func (s *sessionHost) endLocked(ctx context.Context, ss model.Session, by Principal, reason model.SessionEndReason, cut string) (model.Session, error) {
	g := Grant{ID: ss.ID, Kind: Session, WorkspaceID: ss.WorkspaceID, KeyID: ss.KeyID, Session: sessionOf(ss)}
	step, err := Transition(g, EndSession{By: by, Reason: reason, Cells: ss.Cells, At: s.opts.Now()})
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
		if err := live.Close(context.WithoutCancel(ctx)); err != nil {
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
