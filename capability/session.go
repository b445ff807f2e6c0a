package capability

import (
	"fmt"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/store"
)

// A session is a grant of many runs in one sandbox. Its record opens with
// OpenSession and closes with EndSession; each of its cells is a run with
// a grant of kind Session of its own (GrantOfCell), which Transition moves
// as a one-shot grant, but for three rules:
//   - a cell is admitted only into an active session (ErrFailedPrecondition:
//     the session has expired);
//   - approval follows the session's approval mode: required asks for every
//     cell, per_session for the first one, whose approval then covers the
//     session's later cells (their decision event names it: covered_by),
//     none for no cell; a session with network needs a human for its first
//     cell at least, as per_session;
//   - the service runs a cell in the session's sandbox, not a new one.

// SessionOf is what a cell's transitions read of its session.
type SessionOf struct {
	ID    string
	State model.SessionState
	// EndReason, EndDetail and EndedAt say how an ended session ended.
	EndReason model.SessionEndReason
	EndDetail string
	EndedAt   time.Time
	// Approval is the session's approval mode, Network whether it has
	// egress, and CoveredBy the approval that covers its cells (empty
	// until one does).
	Approval  model.ApprovalMode
	Network   bool
	CoveredBy string
	// Cells is how many cells it has had.
	Cells int
	// PausedAt is when a paused session was paused.
	PausedAt time.Time
}

// sessionOf returns what a cell's transitions read of ss.
func sessionOf(ss model.Session) *SessionOf {
	return &SessionOf{ID: ss.ID, State: ss.State, EndReason: ss.EndReason, EndDetail: ss.EndDetail, EndedAt: ss.EndedAt, Approval: ss.Approval,
		Network: ss.Network, CoveredBy: ss.ApprovalID, Cells: ss.Cells, PausedAt: ss.PausedAt}
}

// sessionGrant is the grant of session ss itself, which its transitions
// (pause, resume, snapshot, end) are decided on.
func sessionGrant(ss model.Session) Grant {
	return Grant{ID: ss.ID, Kind: Session, WorkspaceID: ss.WorkspaceID, KeyID: ss.KeyID, Session: sessionOf(ss)}
}

// GrantOfCell returns the grant of cell e of session ss (see GrantOf).
func GrantOfCell(e model.Execution, a *model.Approval, ss model.Session) Grant {
	g := GrantOf(e, a)
	g.Kind, g.Session = Session, sessionOf(ss)
	return g
}

// OpenSession opens a session: the rules decide it on the facts of Admit
// (the tool's record, the key's role, the policy, a review, network), and
// it is refused (a denial of no grant) or opened as Record says.
type OpenSession struct {
	Admit Admit
	// Record is the session to open; its Audit is the step's.
	Record store.NewSession
}

// EndSession ends an active session for Reason: By closes it (the key
// that opened it or an admin key of its workspace: EndClosed), or the
// system ends it (By is zero) for any other reason.
type EndSession struct {
	By     Principal
	Reason model.SessionEndReason
	// Detail says in words why, where Reason alone does not
	// (model.Session.EndDetail); it is the system's to give.
	Detail string
	Cells  int
	At     time.Time
}

// PauseSession pauses an active session whose sandbox was saved, to a
// checkpoint of CheckpointBytes: By is the key that opened it or an admin
// key of its workspace, or zero for the system (pause_after_idle).
type PauseSession struct {
	By              Principal
	SandboxID       string
	CheckpointBytes int64
	At              time.Time
}

// ResumeSession resumes a paused session, restored in sandbox SandboxID:
// By as for PauseSession; the system resumes none by itself, but a cell
// or a file operation of By's resumes it (sessionHost.usable).
type ResumeSession struct {
	By        Principal
	SandboxID string
	At        time.Time
}

func (OpenSession) verb() string   { return "open" }
func (EndSession) verb() string    { return "end" }
func (PauseSession) verb() string  { return "pause" }
func (ResumeSession) verb() string { return "resume" }

// sessionTransition moves a session itself: its opening and its end.
func sessionTransition(g Grant, in Input) (Step, error) {
	switch in := in.(type) {
	case OpenSession:
		return openSession(g, in)
	case EndSession:
		return endSession(g, in)
	case PauseSession:
		return pauseSession(g, in)
	case ResumeSession:
		return resumeSession(g, in)
	}
	return Step{}, errdefs.Publicf("cannot %s a session: a session opens, pauses, resumes and ends; its cells are runs: %w", in.verb(), errdefs.ErrFailedPrecondition)
}

func openSession(g Grant, in OpenSession) (Step, error) {
	if g.Session != nil && g.Session.State != "" {
		return Step{}, errdefs.Publicf("cannot open session %s: it is %s: %w", g.Session.ID, g.Session.State, errdefs.ErrFailedPrecondition)
	}
	if err := needTime(in, in.Admit.At); err != nil {
		return Step{}, err
	}
	if r := refusalOf(in.Admit); r != nil {
		return denial(in.Admit, r), nil
	}
	n := in.Record
	switch {
	case n.ID == "" || n.IdleTimeout <= 0 || !n.ExpiresAt.After(in.Admit.At):
		return Step{}, errdefs.Publicf("open: a session needs its id, an idle timeout and an expiry after its opening: %w", errdefs.ErrInvalidArgument)
	case n.WorkspaceID != in.Admit.By.WorkspaceID || n.KeyID != in.Admit.By.KeyID:
		return Step{}, errdefs.Publicf("open: a session is its opening key's, in its workspace: %w", errdefs.ErrInvalidArgument)
	}
	ev := audit.SessionCreatedEvent{Meta: audit.Meta{Actor: in.Admit.By.KeyID, Reason: "allowed by workspace policy"},
		Approval: n.Approval, Driver: n.Driver, ExpiresAt: n.ExpiresAt.UTC().Format(time.RFC3339Nano), IdleTimeoutMS: n.IdleTimeout.Milliseconds(),
		Network: policy.NetworkWord(n.Network), Runtime: n.Runtime, SandboxID: n.SandboxID, SessionID: n.ID, Tool: n.Tool,
		WorkspaceBytes: n.WorkspaceBytes}
	n.At = in.Admit.At
	n.Audit = audit.NewEvents(ev)
	return Step{From: Requested, To: Approved, Events: []audit.Event{ev}, Open: &n}, nil
}

func endSession(g Grant, in EndSession) (Step, error) {
	s := g.Session
	if s == nil || s.State == "" {
		return Step{}, errdefs.Publicf("cannot end a session that never opened: %w", errdefs.ErrFailedPrecondition)
	}
	if err := needTime(in, in.At); err != nil {
		return Step{}, err
	}
	switch {
	case !in.Reason.Valid():
		return Step{}, errdefs.Publicf("end: reason %q: %w", in.Reason, errdefs.ErrInvalidArgument)
	case in.Reason == model.EndClosed && (in.By.WorkspaceID != g.WorkspaceID || (in.By.KeyID != g.KeyID && in.By.Role != model.RoleAdmin)):
		return Step{}, errdefs.Publicf("only the key that opened a session or an admin key may close it: %w", errdefs.ErrPermissionDenied)
	case in.Detail != "" && in.By != (Principal{}):
		return Step{}, errdefs.Publicf("only the system gives a session's end a detail: %w", errdefs.ErrInvalidArgument)
	case in.Reason != model.EndClosed && in.By != (Principal{}):
		return Step{}, errdefs.Publicf("a key closes a session (reason closed); the system ends it for %s: %w", in.Reason, errdefs.ErrInvalidArgument)
	case s.State == model.SessionEnded:
		return Step{}, expiredError(s)
	}
	why := "session ended: " + string(in.Reason)
	if in.Detail != "" {
		why += ": " + in.Detail
	}
	ev := audit.SessionEndedEvent{Meta: audit.Meta{Actor: actorOf(in.By), Reason: why},
		Cells: in.Cells, EndReason: in.Reason, SessionID: s.ID}
	return Step{From: Approved, To: Settled, Events: []audit.Event{ev},
		End: &store.SessionEnd{Reason: in.Reason, Detail: in.Detail, At: in.At, Audit: audit.NewEvents(ev)}}, nil
}

// actorOf names the actor of a session's transition by p: its key, or
// the system.
func actorOf(p Principal) string {
	if p.KeyID == "" {
		return "system"
	}
	return p.KeyID
}

// mayTransition checks that p may move session grant g itself: the key
// that opened it or an admin key of its workspace, or the system (the
// zero Principal).
func mayTransition(g Grant, p Principal, verb string) error {
	if p == (Principal{}) || p.WorkspaceID == g.WorkspaceID && (p.KeyID == g.KeyID || p.Role == model.RoleAdmin) {
		return nil
	}
	return errdefs.Publicf("only the key that opened a session or an admin key may %s it: %w", verb, errdefs.ErrPermissionDenied)
}

func pauseSession(g Grant, in PauseSession) (Step, error) {
	s := g.Session
	if s == nil || s.State == "" {
		return Step{}, errdefs.Publicf("cannot pause a session that never opened: %w", errdefs.ErrFailedPrecondition)
	}
	if err := needTime(in, in.At); err != nil {
		return Step{}, err
	}
	if err := mayTransition(g, in.By, "pause"); err != nil {
		return Step{}, err
	}
	switch {
	case s.State == model.SessionEnded:
		return Step{}, expiredError(s)
	case s.State != model.SessionActive:
		return Step{}, errdefs.Publicf("session %s is %s, not active: %w", s.ID, s.State, errdefs.ErrFailedPrecondition)
	case in.CheckpointBytes < 0 || in.SandboxID == "":
		return Step{}, errdefs.Publicf("pause: a pause names the saved sandbox and its checkpoint's size: %w", errdefs.ErrInvalidArgument)
	}
	ev := audit.SessionPausedEvent{Meta: audit.Meta{Actor: actorOf(in.By), Reason: "session paused"},
		CheckpointBytes: in.CheckpointBytes, SandboxID: in.SandboxID, SessionID: s.ID}
	return Step{From: Approved, To: Approved, Events: []audit.Event{ev},
		Pause: &store.SessionPause{CheckpointBytes: in.CheckpointBytes, At: in.At, Audit: audit.NewEvents(ev)}}, nil
}

func resumeSession(g Grant, in ResumeSession) (Step, error) {
	s := g.Session
	if s == nil || s.State == "" {
		return Step{}, errdefs.Publicf("cannot resume a session that never opened: %w", errdefs.ErrFailedPrecondition)
	}
	if err := needTime(in, in.At); err != nil {
		return Step{}, err
	}
	if err := mayTransition(g, in.By, "resume"); err != nil {
		return Step{}, err
	}
	switch {
	case s.State == model.SessionEnded:
		return Step{}, expiredError(s)
	case s.State != model.SessionPaused:
		return Step{}, errdefs.Publicf("session %s is %s, not paused: %w", s.ID, s.State, errdefs.ErrFailedPrecondition)
	case in.SandboxID == "":
		return Step{}, errdefs.Publicf("resume: a resume names the restored sandbox: %w", errdefs.ErrInvalidArgument)
	}
	ev := audit.SessionResumedEvent{Meta: audit.Meta{Actor: actorOf(in.By), Reason: "session resumed"},
		PausedMS: max(in.At.Sub(s.PausedAt).Milliseconds(), 0), SandboxID: in.SandboxID, SessionID: s.ID}
	return Step{From: Approved, To: Approved, Events: []audit.Event{ev},
		Resume: &store.SessionResume{SandboxID: in.SandboxID, At: in.At, Audit: audit.NewEvents(ev)}}, nil
}

// expiredError is the refusal of what an ended session cannot do: of
// class ErrGone (a FailedPrecondition for good), answered 410
// session_expired with when and why.
func expiredError(s *SessionOf) error {
	return errdefs.Public(&SessionExpiredError{SessionID: s.ID, EndedAt: s.EndedAt, Reason: s.EndReason, Detail: s.EndDetail})
}

// SessionExpiredError says a session has ended; it is of class ErrGone,
// which is of class ErrFailedPrecondition too.
type SessionExpiredError struct {
	SessionID string
	EndedAt   time.Time
	Reason    model.SessionEndReason
	// Detail says in words why, where Reason alone does not; may be
	// empty.
	Detail string
}

func (e *SessionExpiredError) Error() string {
	msg := fmt.Sprintf("session %s ended (%s) at %s", e.SessionID, e.Reason, e.EndedAt.UTC().Format(time.RFC3339))
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

func (e *SessionExpiredError) Unwrap() error { return errdefs.ErrGone }

// cellApproval says whether cell g, admitted with in, waits for a human,
// and which approval covers it instead when none is needed because of
// one.
func cellApproval(g Grant, in Admit) (wait bool, coveredBy string) {
	s := g.Session
	switch {
	case s.Approval == model.ApprovalRequired && in.Policy.ApprovalRequired:
		return true, ""
	case s.Approval == model.ApprovalPerSession && in.Policy.ApprovalRequired, in.Network || s.Network:
		if s.CoveredBy != "" {
			return false, s.CoveredBy
		}
		return true, ""
	}
	return false, ""
}

// coversSession says whether approving cell g makes its approval cover the
// session's later cells.
func coversSession(g Grant) bool {
	if g.Kind != Session || g.Session.CoveredBy != "" {
		return false
	}
	return g.Session.Approval == model.ApprovalPerSession || (g.Session.Approval == model.ApprovalNone && g.Session.Network)
}
