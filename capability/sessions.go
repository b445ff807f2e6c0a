package capability

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/contract"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
)

// SessionOptions bound the server's sessions (the configuration's
// `sessions:`). Zero fields take the documented defaults.
type SessionOptions struct {
	// IdleTimeout ends a session no cell ran in for so long; default 10 min.
	// MaxIdleTimeout is the most a session may ask for; default 1 h.
	IdleTimeout, MaxIdleTimeout time.Duration
	// TTL is a session's hard lifetime; default 1 h. MaxTTL is the most a
	// session may ask for; default 24 h.
	TTL, MaxTTL time.Duration
	// MaxPerWorkspace bounds a workspace's live sessions; default 4. A
	// workspace policy's MaxSessions may lower it, never raise it.
	MaxPerWorkspace int
	// WorkspaceSize is the size of a session's /workspace; default 256 MiB.
	WorkspaceSize int64
	// MaxFileSize bounds one file moved in or out; default 64 MiB.
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
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.IdleTimeout, 10*time.Minute)
	def(&o.MaxIdleTimeout, max(time.Hour, o.IdleTimeout))
	def(&o.TTL, time.Hour)
	def(&o.MaxTTL, max(24*time.Hour, o.TTL))
	if o.MaxPerWorkspace <= 0 {
		o.MaxPerWorkspace = 4
	}
	if o.WorkspaceSize <= 0 {
		o.WorkspaceSize = 256 << 20
	}
	if o.MaxFileSize <= 0 {
		o.MaxFileSize = 64 << 20
	}
}

// SessionStore is what the service needs of the store for sessions.
type SessionStore interface {
	OpenSession(ctx context.Context, s store.NewSession) (store.Session, bool, error)
	EndSession(ctx context.Context, id string, e store.SessionEnd) (store.Session, error)
	GetSession(ctx context.Context, workspaceID, id string) (store.Session, error)
	ReplaySession(ctx context.Context, keyID, key string) (store.Session, error)
	ListSessions(ctx context.Context, workspaceID string, f store.SessionFilter) (store.Page[store.Session], error)
	ListActiveSessions(ctx context.Context) ([]store.Session, error)
	CountActiveSessions(ctx context.Context, workspaceID string) (int, error)
	PauseSession(ctx context.Context, id string, p store.SessionPause) (store.Session, error)
	ResumeSession(ctx context.Context, id string, r store.SessionResume) (store.Session, error)
	PendingCell(ctx context.Context, sessionID string) (string, error)
	ListPausedSessions(ctx context.Context) ([]store.Session, error)
}

// SessionObserver, when the service's Observer implements it, is told
// about sessions, for metrics.
type SessionObserver interface {
	SessionsLive(delta int)
	SessionCell(status store.ExecutionStatus)
	SessionEnded(reason store.SessionEndReason)
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
	*engine.LiveSession
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

func (l *liveSessions) put(id string, s *engine.LiveSession) *liveSession {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byID == nil {
		l.byID = map[string]*liveSession{}
	}
	ls := &liveSession{LiveSession: s}
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

// CreateSessionRequest is the body of POST /v1/sessions.
type CreateSessionRequest struct {
	Runtime string `json:"runtime"`
	// Tool names the tool the session runs as; empty means the default
	// tool.
	Tool string `json:"tool,omitempty"`
	// IdleTimeoutMS and TTLMS ask for other lifetimes than the server's
	// defaults, within its ceilings; zero takes the defaults.
	IdleTimeoutMS int64 `json:"idle_timeout_ms,omitempty"`
	TTLMS         int64 `json:"ttl_ms,omitempty"`
	// Network is "deny" (the default) or "allow".
	Network string `json:"network,omitempty"`
}

// CreateSessionOptions are the parts of a creation that are not its body.
type CreateSessionOptions struct {
	// IdempotencyKey makes a retried creation return the first session.
	IdempotencyKey string
}

// Created is the outcome of CreateSession.
type Created struct {
	Session store.Session
	// Replayed is set when an Idempotency-Key matched an earlier
	// creation.
	Replayed bool
}

// NewSessionID returns a fresh session id.
func NewSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "ses_" + hex.EncodeToString(b[:])
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
func (s *Service) CreateSession(ctx context.Context, p Principal, req CreateSessionRequest, o CreateSessionOptions) (*Created, error) {
	so := s.opts.Sessions
	network, err := policy.ParseNetwork(req.Network)
	if err != nil {
		return nil, err
	}
	if network {
		// A sandbox's egress network and proxy are the daemon's, and would
		// not survive its restart as the session does.
		return nil, errdefs.Publicf("network \"allow\" is not available for sessions yet; use a one-shot execution: %w", errdefs.ErrInvalidArgument)
	}
	idle, err := durationOf("idle_timeout_ms", req.IdleTimeoutMS, so.IdleTimeout, so.MaxIdleTimeout)
	if err != nil {
		return nil, err
	}
	ttl, err := durationOf("ttl_ms", req.TTLMS, so.TTL, so.MaxTTL)
	if err != nil {
		return nil, err
	}
	reqSum := sha256Hex(mustJSON(req))
	if o.IdempotencyKey != "" && mayInvoke(p) {
		ss, err := s.st.ReplaySession(ctx, p.KeyID, o.IdempotencyKey)
		if err == nil {
			if ss.RequestSHA256 != reqSum {
				return nil, errdefs.Publicf("idempotency key %q was used for a different request (session %s): %w", o.IdempotencyKey, ss.ID, errdefs.ErrConflict)
			}
			return &Created{Session: ss, Replayed: true}, nil
		}
		if !errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("looking up the idempotency key: %w", err)
		}
	}
	spec := engine.SessionSpec{Runtime: req.Runtime, Tool: req.Tool, Workspace: so.WorkspaceSize}
	tool, drv, _, verr := s.runner.CheckSession(spec)
	if verr != nil && !errdefs.IsPermissionDenied(verr) {
		return nil, verr
	}
	pol, err := s.st.GetPolicy(ctx, p.WorkspaceID)
	if err != nil {
		return nil, fmt.Errorf("loading workspace policy: %w", err)
	}
	d := policy.Decide(pol, policy.Request{Capability: contract.CodeExecute, Runtime: req.Runtime, Network: network}, s.runner.Ceiling().Timeout)
	now := s.opts.Now()
	id := NewSessionID()
	spec.Deadline = sandboxDeadline(now.Add(ttl))
	in := OpenSession{
		Admit: Admit{By: p, Policy: d, Network: network, Tool: tool.Name, ToolEgress: !tool.Egress.None(), EgressAvailable: s.runner.EgressAvailable(), At: now,
			Asked: audit.Invocation{Capability: contract.CodeExecute.Name, Runtime: req.Runtime, Network: policy.NetworkWord(network)}},
		Record: store.NewSession{ID: id, WorkspaceID: p.WorkspaceID, KeyID: p.KeyID, Tool: tool.Name, Runtime: req.Runtime,
			Network: network, Approval: pol.Approval, IdleTimeout: idle, ExpiresAt: now.Add(ttl), WorkspaceBytes: so.WorkspaceSize,
			IdempotencyKey: o.IdempotencyKey, RequestSHA256: reqSum, MaxLive: s.maxSessions(pol)},
	}
	if verr != nil {
		in.Admit.ToolRefusal = strings.TrimSuffix(verr.Error(), ": "+errdefs.ErrPermissionDenied.Error())
	}
	if pol.ToolChanges == store.ToolChangesRequireReview {
		if in.Admit.ReviewPending, err = s.reviewBlocks(ctx, p.WorkspaceID, tool.Name); err != nil {
			return nil, err
		}
	}
	// The decision first, before anything is created: a refusal leaves
	// only its event. (The record's driver and sandbox are filled in once
	// the sandbox exists, and the opening decided again with them.)
	step, err := Transition(openingGrant(id), in)
	if err != nil {
		return nil, err
	}
	if step.Open == nil {
		_, err := s.deny(ctx, step)
		return nil, err
	}
	if n, err := s.st.CountActiveSessions(ctx, p.WorkspaceID); err != nil {
		return nil, err
	} else if n >= in.Record.MaxLive {
		return nil, s.refuseQuota(ctx, in, in.Record.MaxLive)
	}
	if hc, ok := drv.(sandbox.HealthChecker); ok {
		if err := hc.Health(ctx); err != nil {
			s.log.Warn("driver unavailable", "driver", drv.Name(), "err", err)
			return nil, s.denyOpening(ctx, in, &Refusal{Code: "driver_unavailable",
				Reason: fmt.Sprintf("the %s sandbox driver is unavailable; retry later", drv.Name()), Class: errdefs.ErrUnavailable})
		}
	}
	spec.Labels = map[string]string{engine.LabelOwner: s.opts.Owner, engine.LabelSession: id, engine.LabelWorkspace: p.WorkspaceID, engine.LabelTool: tool.Name}
	live, err := s.runner.OpenSession(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("opening the session's sandbox: %w", err)
	}
	in.Record.Driver, in.Record.SandboxID = live.Driver, live.SandboxID()
	if step, err = Transition(openingGrant(id), in); err == nil && step.Open == nil {
		err = fmt.Errorf("the session's decision changed while its sandbox was made")
	}
	var (
		ss       store.Session
		replayed bool
	)
	if err == nil {
		ss, replayed, err = s.st.OpenSession(ctx, *step.Open)
	}
	if err != nil || replayed {
		_ = live.Close(context.WithoutCancel(ctx))
		switch {
		case replayed:
			return &Created{Session: ss, Replayed: true}, nil
		case errdefs.IsResourceExhausted(err):
			return nil, s.refuseQuota(ctx, in, in.Record.MaxLive)
		}
		return nil, fmt.Errorf("recording the session: %w", err)
	}
	s.sessions.put(ss.ID, live)
	s.sessionObserver().SessionsLive(1)
	return &Created{Session: ss}, nil
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
func (s *Service) maxSessions(pol store.Policy) int {
	if pol.MaxSessions > 0 {
		return min(pol.MaxSessions, s.opts.Sessions.MaxPerWorkspace)
	}
	return s.opts.Sessions.MaxPerWorkspace
}

// refuseQuota records the refusal of a session over the workspace's
// bound and answers with a QuotaError saying when to retry.
func (s *Service) refuseQuota(ctx context.Context, in OpenSession, most int) error {
	err := s.denyOpening(ctx, in, &Refusal{Code: "session_quota", Reason: fmt.Sprintf("the workspace has %d live sessions, its most", most), Class: errdefs.ErrResourceExhausted})
	if !errdefs.IsResourceExhausted(err) {
		return err
	}
	retry := time.Minute
	page, err := s.st.ListSessions(ctx, in.Record.WorkspaceID, store.SessionFilter{States: []store.SessionState{store.SessionActive, store.SessionPaused},
		PageRequest: store.PageRequest{Limit: store.MaxPageLimit}})
	if err == nil {
		now := s.opts.Now()
		for _, ss := range page.Items {
			retry = min(retry, ss.ExpiresAt.Sub(now))
			if ss.State == store.SessionActive {
				retry = min(retry, ss.IdleExpiresAt().Sub(now)) // a paused one does not idle out
			}
		}
	}
	return errdefs.Public(&QuotaError{Max: most, RetryAfter: max(retry, time.Second)})
}

// openingGrant is the grant of session id before it opened.
func openingGrant(id string) Grant { return Grant{Kind: Session, Session: &SessionOf{ID: id}} }

// denyOpening records the refusal r of opening in, which the rules
// allowed, and returns the refusal's answer.
func (s *Service) denyOpening(ctx context.Context, in OpenSession, r *Refusal) error {
	in.Admit.Refusal = r
	step, err := Transition(openingGrant(in.Record.ID), in)
	if err != nil {
		return err
	}
	_, err = s.deny(ctx, step)
	return err
}

func (s *Service) sessionObserver() SessionObserver {
	if o, ok := s.opts.Observer.(SessionObserver); ok {
		return o
	}
	return nopSessionObserver{}
}

type nopSessionObserver struct{}

func (nopSessionObserver) SessionsLive(int)                    {}
func (nopSessionObserver) SessionCell(store.ExecutionStatus)   {}
func (nopSessionObserver) SessionEnded(store.SessionEndReason) {}

// GetSession returns session id of p's workspace: another workspace's
// is ErrNotFound.
func (s *Service) GetSession(ctx context.Context, p Principal, id string) (store.Session, error) {
	return s.st.GetSession(ctx, p.WorkspaceID, id)
}

// ListSessions lists the sessions of p's workspace, newest first.
func (s *Service) ListSessions(ctx context.Context, p Principal, f store.SessionFilter) (store.Page[store.Session], error) {
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
func (s *Service) usable(ctx context.Context, p Principal, id string) (store.Session, *liveSession, func(), error) {
	for {
		unlock := s.trans.lock(id, false)
		ss, err := s.st.GetSession(ctx, p.WorkspaceID, id)
		if err != nil {
			unlock()
			return ss, nil, nil, err
		}
		if p.KeyID != ss.KeyID && p.Role != store.RoleAdmin {
			unlock()
			return ss, nil, nil, errdefs.Publicf("only the key that opened session %s or an admin key may use it: %w", id, errdefs.ErrPermissionDenied)
		}
		switch ss.State {
		case store.SessionPaused:
			unlock()
			if _, err := s.ResumeSession(ctx, p, id); err != nil {
				return ss, nil, nil, err
			}
			continue
		case store.SessionEnded:
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
func (s *Service) CloseSession(ctx context.Context, p Principal, id string) (store.Session, error) {
	ss, err := s.st.GetSession(ctx, p.WorkspaceID, id)
	if err != nil {
		return ss, err
	}
	return s.endSession(ctx, ss, p, store.EndClosed, engine.EndedBySessionEnd)
}

// cancelWaitingCell cancels the cell of ended session ss that waits for
// its approval or its turn, which would otherwise wait on (an approval
// that could still be granted, credits reserved) for a session that is
// gone. A running cell is ended by its sandbox's destruction.
func (s *Service) cancelWaitingCell(ctx context.Context, ss store.Session, reason store.SessionEndReason) {
	id, err := s.st.PendingCell(ctx, ss.ID)
	if err == nil && id != "" {
		var e store.Execution
		if e, err = s.st.GetExecution(ctx, ss.WorkspaceID, id); err == nil && e.Status != store.StatusRunning {
			_, err = s.cancelAs(ctx, Principal{}, ss.WorkspaceID, id, fmt.Sprintf("its session %s ended (%s)", ss.ID, reason))
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
func (s *Service) endSession(ctx context.Context, ss store.Session, by Principal, reason store.SessionEndReason, cut string) (store.Session, error) {
	unlock := s.trans.lock(ss.ID, true)
	defer unlock()
	return s.endLocked(ctx, ss, by, reason, cut)
}

// endLocked is endSession with the session's lock held; it removes the
// checkpoint of a paused session too.
func (s *Service) endLocked(ctx context.Context, ss store.Session, by Principal, reason store.SessionEndReason, cut string) (store.Session, error) {
	g := Grant{ID: ss.ID, Kind: Session, WorkspaceID: ss.WorkspaceID, KeyID: ss.KeyID, Session: sessionOf(ss)}
	step, err := Transition(g, EndSession{By: by, Reason: reason, Cells: ss.Cells, At: s.opts.Now()})
	if err != nil {
		return store.Session{}, err
	}
	ended, err := s.st.EndSession(ctx, ss.ID, *step.End)
	if errdefs.IsConflict(err) {
		// Another end won: answer as for an ended session.
		if cur, gerr := s.st.GetSession(ctx, ss.WorkspaceID, ss.ID); gerr == nil {
			return store.Session{}, expiredError(sessionOf(cur))
		}
	}
	if err != nil {
		return store.Session{}, err
	}
	if live := s.sessions.take(ss.ID); live != nil {
		if cell := live.runningCell(); cell != "" {
			// The cell that runs is cut short with its sandbox: it ends
			// killed, charged as launched, with the output it had made.
			s.stopRun(cell, &Cancellation{Reason: fmt.Sprintf("its session %s ended (%s)", ss.ID, reason), EndedBy: cut})
		}
		if err := live.Close(context.WithoutCancel(ctx)); err != nil {
			s.log.Error("destroying a session's sandbox", "session", ss.ID, "sandbox", ss.SandboxID, "err", err)
		}
		s.sessionObserver().SessionsLive(-1)
	}
	s.cancelWaitingCell(context.WithoutCancel(ctx), ss, reason)
	s.removeCheckpoint(ss.ID)
	s.sessionObserver().SessionEnded(reason)
	return ended, nil
}

// CellRequest is the body of POST /v1/sessions/{id}/exec.
type CellRequest struct {
	Code  string `json:"code"`
	Stdin string `json:"stdin,omitempty"`
	// TimeoutMS bounds the cell; zero means the tool's limit (within the
	// policy's).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
}

// cellRecord is a cell's stored request (the execution's request): the
// cell and its session's runtime, in the shape of an InvokeRequest's
// fields where they mean the same (the console shows it as one).
type cellRecord struct {
	SessionID string `json:"session_id"`
	Runtime   string `json:"runtime"`
	CellRequest
}

// ExecCell admits a cell of session id, which runs in the session's
// kernel in the background: a decision of the workspace policy, credits
// reserved and charged as any invocation's, the approval the session's
// mode asks for (see session.go), its tool_calls row and audit events.
// Use Wait or Subscribe for the outcome, whose result is the cell's
// (engine.CellResult). A cell while another of the session has not ended
// is a SessionBusyError; a retry of an admitted cell (the same
// IdempotencyKey and body) returns the first.
func (s *Service) ExecCell(ctx context.Context, p Principal, id string, req CellRequest, o InvokeOptions) (*Invocation, error) {
	ss, live, done, err := s.usable(ctx, p, id)
	if err != nil {
		return nil, err
	}
	defer done()
	if req.TimeoutMS < 0 || req.TimeoutMS > math.MaxInt64/int64(time.Millisecond) {
		return nil, errdefs.Publicf("timeout_ms %d is out of range: %w", req.TimeoutMS, errdefs.ErrInvalidArgument)
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	tool, _, _, verr := s.runner.Validate(engine.Request{Runtime: ss.Runtime, Tool: ss.Tool, Driver: ss.Driver, Code: []byte(req.Code),
		Stdin: []byte(req.Stdin), Limits: sandbox.Limits{Timeout: timeout}})
	if verr != nil && !errdefs.IsPermissionDenied(verr) {
		return nil, verr
	}
	pol, err := s.st.GetPolicy(ctx, p.WorkspaceID)
	if err != nil {
		return nil, fmt.Errorf("loading workspace policy: %w", err)
	}
	d := policy.Decide(pol, policy.Request{Capability: contract.CodeExecute, Runtime: ss.Runtime, Timeout: timeout, Network: ss.Network}, s.runner.Ceiling().Timeout)
	if timeout == 0 {
		timeout = min(s.runner.Limits(tool).Timeout, d.MaxTimeout)
	}
	ne := store.NewExecution{ID: o.ExecutionID, WorkspaceID: p.WorkspaceID, KeyID: p.KeyID, Runtime: ss.Runtime, Tool: ss.Tool,
		Request: mustJSON(cellRecord{SessionID: ss.ID, Runtime: ss.Runtime, CellRequest: req}), InputSHA256: InputHash(ss.Runtime, req.Code),
		IdempotencyKey: o.IdempotencyKey, SessionID: ss.ID}
	if o.IdempotencyKey != "" && mayInvoke(p) {
		adm, err := s.st.ReplayExecution(ctx, ne)
		if err == nil {
			return &Invocation{Execution: adm.Execution, Approval: adm.Approval, Replayed: true}, nil
		}
		if !errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("looking up the idempotency key: %w", err)
		}
	}
	g := Grant{Kind: Session, Session: sessionOf(ss)}
	in := Admit{By: p, Policy: d, Network: ss.Network, Tool: ss.Tool, Price: s.price, At: s.opts.Now(),
		Asked: audit.Invocation{Capability: contract.CodeExecute.Name, Runtime: ss.Runtime, TimeoutMS: req.TimeoutMS,
			Network: policy.NetworkWord(ss.Network), InputSHA256: ne.InputSHA256, StdinSHA256: sha256Hex([]byte(req.Stdin))}}
	if verr != nil {
		in.ToolRefusal = strings.TrimSuffix(verr.Error(), ": "+errdefs.ErrPermissionDenied.Error())
	}
	if wait, _ := cellApproval(g, in); wait {
		t, _ := s.runner.Tools().Get(ss.Tool)
		card := ApprovalCard{
			Capability: contract.CodeExecute.Name, RiskLevel: string(contract.CodeExecute.Risk), Runtime: ss.Runtime,
			Code: req.Code, Stdin: req.Stdin, Network: policy.NetworkWord(ss.Network), TimeoutMS: timeout.Milliseconds(), RequestedBy: p.KeyID,
			ExpiresAt: in.At.Add(s.opts.ApprovalTTL).UTC().Truncate(time.Microsecond), Tool: ss.Tool, ToolFingerprint: tools.Fingerprint(t),
			SessionID: ss.ID, Cell: ss.Cells + 1, CoversSession: coversSession(g),
		}
		in.Card, in.ExpiresAt = mustJSON(card), card.ExpiresAt
	}
	step, err := Transition(g, in)
	if err != nil {
		return nil, err
	}
	if step.Write == nil {
		return s.deny(ctx, step)
	}
	adm, err := s.st.Admit(ctx, ne, *step.Write)
	if err != nil {
		switch {
		case errdefs.IsResourceExhausted(err):
			return s.refuse(ctx, in, "insufficient_credits", fmt.Sprintf("insufficient credits: a cell costs %d", s.price), errdefs.ErrPaymentRequired)
		case errdefs.IsConflict(err):
			return nil, errdefs.Public(&SessionBusyError{SessionID: ss.ID})
		case errdefs.IsFailedPrecondition(err):
			if cur, gerr := s.st.GetSession(ctx, p.WorkspaceID, ss.ID); gerr == nil {
				return nil, expiredError(sessionOf(cur))
			}
		}
		return nil, fmt.Errorf("admitting a cell: %w", err)
	}
	inv := &Invocation{Execution: adm.Execution, Approval: adm.Approval, Replayed: adm.Replayed}
	switch {
	case adm.Replayed:
	case step.Next.Dispatch:
		s.dispatchCell(adm.Execution, live, timeout)
	default:
		s.notify(step, adm.Execution)
	}
	return inv, nil
}

// dispatchCell runs an admitted cell in the background, in live.
func (s *Service) dispatchCell(e store.Execution, live *liveSession, timeout time.Duration) {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		return // the next start of the daemon ends it failed, uncharged
	}
	ctx, cancel := context.WithCancelCause(s.ctx)
	s.liveMu.Lock()
	s.live[e.ID] = cancel
	s.liveMu.Unlock()
	live.track(e.ID)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() {
			live.track("")
			s.liveMu.Lock()
			delete(s.live, e.ID)
			s.liveMu.Unlock()
			cancel(nil)
		}()
		s.runCell(ctx, e, live, timeout)
	}()
}

// runCell runs cell e in live's kernel and records its outcome.
func (s *Service) runCell(ctx context.Context, e store.Execution, live *liveSession, timeout time.Duration) {
	g := GrantOf(e, nil)
	end := func(in Input) { s.end(context.WithoutCancel(ctx), g, in) }
	var req cellRecord
	if err := json.Unmarshal(e.Request, &req); err != nil {
		end(LaunchFailed{Err: fmt.Errorf("decoding stored cell: %w", err), At: s.opts.Now()})
		return
	}
	step, err := Transition(g, Start{Driver: live.Driver, At: s.opts.Now()})
	if err != nil {
		s.endUnstarted(e, cancellationOf(ctx))
		return
	}
	ex, err := s.st.Apply(ctx, e.ID, *step.Write)
	if err != nil {
		// Cancelled before it started, or the store failed.
		if c := cancellationOf(ctx); c != nil || errdefs.IsConflict(err) {
			s.endUnstarted(e, c)
			return
		}
		end(LaunchFailed{Err: err, At: s.opts.Now()})
		return
	}
	g = GrantOf(ex, nil)
	s.hub.publish(e.ID, StreamEvent{Type: "started", Data: mustJSON(map[string]any{"execution_id": e.ID, "driver": live.Driver, "session_id": req.SessionID, "cell": e.Cell})})
	s.notify(step, ex)
	out := outputChunks{keep: sandbox.DefaultLimits().OutputCap, publish: func(st sandbox.Stream, p []byte) {
		s.hub.publish(e.ID, StreamEvent{Type: st.String(), Data: mustJSON(map[string]string{"data": string(p)})})
	}}
	res, err := live.Cell(ctx, engine.CellRequest{Code: req.Code, Stdin: req.Stdin, Timeout: timeout, OnOutput: out.add,
		OnDisplay: func(d sandbox.Display) {
			s.hub.publish(e.ID, StreamEvent{Type: "output", Data: mustJSON(engine.OutputOf(d))})
		}})
	out.flush()
	at := s.opts.Now()
	cut, c := ctx.Err() != nil, cancellationOf(ctx)
	lost := err != nil
	var ended *engine.SandboxLostError
	known := errors.As(err, &ended)
	// expired: the sandbox ended itself at its deadline, past the
	// session's TTL, before the daemon ended the session (a slow sweep).
	expired := lost && !known && !cut && s.pastTTL(ctx, e.WorkspaceID, req.SessionID, at)
	switch {
	case known:
		// It ran, and the host knows how it ended (an OOM kill of the
		// whole sandbox): charged as any cell that ran.
		s.log.Warn("a cell's session lost its sandbox", "execution", e.ID, "status", ended.Result.Status, "err", err)
		res = ended.Result
	case err != nil && !cut && !expired:
		// The sandbox could not run the cell: the session has lost it.
		end(LaunchFailed{Err: err, At: at})
		s.endLost(ctx, e.WorkspaceID, req.SessionID, store.EndFailed)
		return
	case err != nil:
		// Cut short after it launched (a cancel, its session's end, the
		// daemon's shutdown, its sandbox's own end past the session's
		// TTL) and its sandbox lost or destroyed under it: it ends killed
		// as below, with the output it had made.
		s.log.Info("a cell cut short lost its sandbox", "execution", e.ID, "cancel", c, "expired", expired, "err", err)
		stdout, stderr := out.kept[sandbox.Stdout], out.kept[sandbox.Stderr]
		res = &engine.CellResult{Status: sandbox.StatusKilled, Stdout: string(stdout.data), Stderr: string(stderr.data),
			StdoutTruncated: stdout.truncated, StderrTruncated: stderr.truncated, Outputs: []engine.CellOutput{},
			DurationMS: max(at.Sub(ex.StartedAt), 0).Milliseconds(), Driver: live.Driver, Runtime: live.Runtime.Name}
	}
	switch {
	case cut && res.Status == sandbox.StatusKilled:
		// Stockade ended it: charged as any launched run, as a one-shot
		// run cut short is.
		res.EndedBy = endedBy(ctx)
	case expired:
		// Its session's TTL ended it: the session ends ttl first, as the
		// sweep would have ended it.
		res.EndedBy = engine.EndedBySessionEnd
		s.endLost(ctx, e.WorkspaceID, req.SessionID, store.EndTTL)
	}
	status := store.ExecutionStatus(res.Status)
	s.sessionObserver().SessionCell(status)
	end(Finish{Status: status, Driver: live.Driver, Cancel: c, At: at,
		Result: mustJSON(CellResultDoc{ExecutionID: e.ID, SessionID: req.SessionID, Cell: e.Cell, CellResult: *res}),
		Output: store.Output{Stdout: []byte(res.Stdout), Stderr: []byte(res.Stderr), StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated}})
	if lost && !expired && (c != nil || !cut) {
		// The sandbox is gone (a session's end has ended the session
		// already); a shutdown leaves the session to the next start of
		// the daemon, which re-attaches its sandbox or ends it.
		s.endLost(ctx, e.WorkspaceID, req.SessionID, store.EndFailed)
	}
}

// pastTTL says whether session id is past its TTL at at.
func (s *Service) pastTTL(ctx context.Context, workspaceID, id string, at time.Time) bool {
	ss, err := s.st.GetSession(context.WithoutCancel(ctx), workspaceID, id)
	return err == nil && !at.Before(ss.ExpiresAt)
}

// endLost ends session id, whose sandbox is lost, for reason (failed, or
// ttl when its sandbox ended itself past the TTL), if it is still active.
func (s *Service) endLost(ctx context.Context, workspaceID, id string, reason store.SessionEndReason) {
	ctx = context.WithoutCancel(ctx)
	if ss, err := s.st.GetSession(ctx, workspaceID, id); err == nil && ss.State == store.SessionActive {
		if _, err := s.endSession(ctx, ss, Principal{}, reason, engine.EndedBySessionEnd); err != nil {
			s.log.Error("ending a session whose sandbox is lost", "session", ss.ID, "reason", reason, "err", err)
		}
	}
}

// CellResultDoc is a cell's result document: its execution's result.
type CellResultDoc struct {
	ExecutionID string `json:"execution_id"`
	SessionID   string `json:"session_id"`
	Cell        int    `json:"cell"`
	engine.CellResult
}

// InterruptCell interrupts the running cell of session id (SIGINT to its
// kernel) and reports whether one ran.
//
// A paused session runs no cell: it is not resumed, and the answer is
// false.
func (s *Service) InterruptCell(ctx context.Context, p Principal, id string) (bool, error) {
	if ss, err := s.st.GetSession(ctx, p.WorkspaceID, id); err == nil && ss.State == store.SessionPaused {
		return false, mayTransition(Grant{WorkspaceID: ss.WorkspaceID, KeyID: ss.KeyID}, p, "interrupt")
	}
	_, live, done, err := s.usable(ctx, p, id)
	if err != nil {
		return false, err
	}
	defer done()
	return live.Interrupt()
}

// dispatchApproved runs execution e, just approved, for timeout: a cell in
// its session's sandbox, any other in a sandbox of its own. A cell whose
// session's sandbox this daemon does not serve ends launch_failed.
func (s *Service) dispatchApproved(ctx context.Context, e store.Execution, timeout time.Duration) {
	if e.SessionID == "" {
		s.dispatch(e, timeout, nil)
		return
	}
	live := s.sessions.get(e.SessionID)
	if live == nil {
		s.end(context.WithoutCancel(ctx), GrantOf(e, nil), LaunchFailed{Err: fmt.Errorf("session %s has no sandbox on this daemon", e.SessionID), At: s.opts.Now()})
		return
	}
	s.dispatchCell(e, live, timeout)
}
