package capability

import (
	"errors"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// activeSession is an active session of agent's under approval mode mode.
func activeSession(mode model.ApprovalMode) *SessionOf {
	return &SessionOf{ID: "ses_1", State: model.SessionActive, Approval: mode, Cells: 2}
}

func endedSession() *SessionOf {
	return &SessionOf{ID: "ses_1", State: model.SessionEnded, EndReason: model.EndIdle, EndedAt: t0, Approval: model.ApprovalNone}
}

func pausedSession() *SessionOf {
	return &SessionOf{ID: "ses_1", State: model.SessionPaused, PausedAt: t0, Approval: model.ApprovalNone, Cells: 2}
}

// cellIn is a cell of session s in state.
func cellIn(state State, s *SessionOf) Grant {
	g := grantIn(state)
	g.Kind, g.Session = Session, s
	if state == Requested {
		g.WorkspaceID, g.KeyID = "ws_1", agent.KeyID
	}
	return g
}

func openInput() OpenSession {
	in := admitInput()
	in.Card, in.ExpiresAt = nil, time.Time{}
	return OpenSession{Admit: in, Record: store.NewSession{ID: "ses_1", WorkspaceID: "ws_1", KeyID: agent.KeyID, Tool: "code.execute",
		Runtime: "python", Driver: "runc", SandboxID: "sb_1", Approval: model.ApprovalPerSession, IdleTimeout: 10 * time.Minute,
		ExpiresAt: t0.Add(time.Hour), RequestSHA256: sha256Hex(nil)}}
}

// TestSessionTransitions tables the inputs of a session itself, opening
// and ending, in each state of its session, the refused ones with their
// class.
func TestSessionTransitions(t *testing.T) {
	never := &SessionOf{ID: "ses_1"}
	denied := openInput()
	denied.Admit.Policy.Allowed, denied.Admit.Policy.Code, denied.Admit.Policy.Reason = false, "code_execution_disabled", "off"
	approver := openInput()
	approver.Admit.By = apprv
	quota := openInput()
	quota.Admit.Refusal = &Refusal{Code: "session_quota", Reason: "too many", Class: errdefs.ErrResourceExhausted}
	noTTL := openInput()
	noTTL.Record.ExpiresAt = t0
	for _, tc := range []struct {
		name    string
		session *SessionOf
		in      Input
		class   error  // nil: a step
		event   string // the step's event
		open    bool   // the step opens a session record
		refusal error  // the class of a denial's refusal
	}{
		{"open", never, openInput(), nil, audit.SessionCreated, true, nil},
		{"open, policy refuses", never, denied, nil, audit.InvokeDenied, false, errdefs.ErrPermissionDenied},
		{"open, an approver key", never, approver, nil, audit.InvokeDenied, false, errdefs.ErrPermissionDenied},
		{"open, over the quota", never, quota, nil, audit.InvokeDenied, false, errdefs.ErrResourceExhausted},
		{"open, no ttl", never, noTTL, errdefs.ErrInvalidArgument, "", false, nil},
		{"open an active one", activeSession(model.ApprovalNone), openInput(), errdefs.ErrFailedPrecondition, "", false, nil},
		{"open an ended one", endedSession(), openInput(), errdefs.ErrFailedPrecondition, "", false, nil},
		{"close by its key", activeSession(model.ApprovalNone), EndSession{By: agent, Reason: model.EndClosed, At: at}, nil, audit.SessionEnded, false, nil},
		{"close by an admin", activeSession(model.ApprovalNone), EndSession{By: admin, Reason: model.EndClosed, At: at}, nil, audit.SessionEnded, false, nil},
		{"close by another agent", activeSession(model.ApprovalNone), EndSession{By: agent2, Reason: model.EndClosed, At: at}, errdefs.ErrPermissionDenied, "", false, nil},
		{"close by another workspace", activeSession(model.ApprovalNone), EndSession{By: outside, Reason: model.EndClosed, At: at}, errdefs.ErrPermissionDenied, "", false, nil},
		{"idle end", activeSession(model.ApprovalNone), EndSession{Reason: model.EndIdle, At: at}, nil, audit.SessionEnded, false, nil},
		{"ttl end", activeSession(model.ApprovalNone), EndSession{Reason: model.EndTTL, At: at}, nil, audit.SessionEnded, false, nil},
		{"interrupted end", activeSession(model.ApprovalNone), EndSession{Reason: model.EndInterrupted, At: at}, nil, audit.SessionEnded, false, nil},
		{"a key ends it idle", activeSession(model.ApprovalNone), EndSession{By: agent, Reason: model.EndIdle, At: at}, errdefs.ErrInvalidArgument, "", false, nil},
		{"an unknown reason", activeSession(model.ApprovalNone), EndSession{Reason: "bored", At: at}, errdefs.ErrInvalidArgument, "", false, nil},
		{"no time", activeSession(model.ApprovalNone), EndSession{Reason: model.EndTTL}, errdefs.ErrInvalidArgument, "", false, nil},
		{"end an ended one", endedSession(), EndSession{Reason: model.EndTTL, At: at}, errdefs.ErrFailedPrecondition, "", false, nil},
		{"end one never opened", never, EndSession{Reason: model.EndTTL, At: at}, errdefs.ErrFailedPrecondition, "", false, nil},
		{"admit into an ended one", endedSession(), admitInput(), errdefs.ErrFailedPrecondition, "", false, nil},
		{"admit into a paused one", pausedSession(), admitInput(), errdefs.ErrFailedPrecondition, "", false, nil},
		{"pause by its key", activeSession(model.ApprovalNone), PauseSession{By: agent, SandboxID: "sb_1", CheckpointBytes: 1, At: at}, nil, audit.SessionPaused, false, nil},
		{"pause by the system", activeSession(model.ApprovalNone), PauseSession{SandboxID: "sb_1", At: at}, nil, audit.SessionPaused, false, nil},
		{"pause by an admin", activeSession(model.ApprovalNone), PauseSession{By: admin, SandboxID: "sb_1", At: at}, nil, audit.SessionPaused, false, nil},
		{"pause by another agent", activeSession(model.ApprovalNone), PauseSession{By: agent2, SandboxID: "sb_1", At: at}, errdefs.ErrPermissionDenied, "", false, nil},
		{"pause by another workspace", activeSession(model.ApprovalNone), PauseSession{By: outside, SandboxID: "sb_1", At: at}, errdefs.ErrPermissionDenied, "", false, nil},
		{"pause a paused one", pausedSession(), PauseSession{By: agent, SandboxID: "sb_1", At: at}, errdefs.ErrFailedPrecondition, "", false, nil},
		{"pause an ended one", endedSession(), PauseSession{By: agent, SandboxID: "sb_1", At: at}, errdefs.ErrFailedPrecondition, "", false, nil},
		{"pause, negative size", activeSession(model.ApprovalNone), PauseSession{By: agent, SandboxID: "sb_1", CheckpointBytes: -1, At: at}, errdefs.ErrInvalidArgument, "", false, nil},
		{"pause, no time", activeSession(model.ApprovalNone), PauseSession{By: agent, SandboxID: "sb_1"}, errdefs.ErrInvalidArgument, "", false, nil},
		{"resume by its key", pausedSession(), ResumeSession{By: agent, SandboxID: "sb_2", At: at}, nil, audit.SessionResumed, false, nil},
		{"resume by another agent", pausedSession(), ResumeSession{By: agent2, SandboxID: "sb_2", At: at}, errdefs.ErrPermissionDenied, "", false, nil},
		{"resume an active one", activeSession(model.ApprovalNone), ResumeSession{By: agent, SandboxID: "sb_2", At: at}, errdefs.ErrFailedPrecondition, "", false, nil},
		{"resume an ended one", endedSession(), ResumeSession{By: agent, SandboxID: "sb_2", At: at}, errdefs.ErrFailedPrecondition, "", false, nil},
		{"resume, no sandbox", pausedSession(), ResumeSession{By: agent, At: at}, errdefs.ErrInvalidArgument, "", false, nil},
		{"end a paused one", pausedSession(), EndSession{Reason: model.EndTTL, At: at}, nil, audit.SessionEnded, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := cellIn(Requested, tc.session)
			s, err := Transition(g, tc.in)
			if tc.class != nil {
				if !errors.Is(err, tc.class) {
					t.Fatalf("got step %+v, error %v; want an error of class %v", s, err, tc.class)
				}
				return
			}
			if err != nil {
				t.Fatalf("got error %v, want a step", err)
			}
			if len(s.Events) != 1 || s.Events[0].Type() != tc.event {
				t.Fatalf("events: got %v, want one %s", s.Events, tc.event)
			}
			if (s.Open != nil) != tc.open || s.Write != nil {
				t.Fatalf("got open %+v, write %+v; want an opening: %v, no write", s.Open, s.Write, tc.open)
			}
			if tc.open && (len(s.Open.Audit) != 1 || s.Open.Audit[0].Code != audit.SessionCreatedCode || !s.Open.At.Equal(t0)) {
				t.Fatalf("opening: got %+v, want its event encoded and its time", s.Open)
			}
			if _, ok := tc.in.(PauseSession); ok && (s.Pause == nil || len(s.Pause.Audit) != 1) {
				t.Fatalf("pause: got %+v, want the session's pause with its event", s.Pause)
			}
			if _, ok := tc.in.(ResumeSession); ok && (s.Resume == nil || len(s.Resume.Audit) != 1 || s.Resume.SandboxID != "sb_2") {
				t.Fatalf("resume: got %+v, want the session's resume in sb_2 with its event", s.Resume)
			}
			if _, ok := tc.in.(EndSession); ok && (s.End == nil || len(s.End.Audit) != 1) {
				t.Fatalf("end: got %+v, want the session's end with its event", s.End)
			}
			if (s.Refusal == nil) != (tc.refusal == nil) || tc.refusal != nil && !errors.Is(s.Refusal, tc.refusal) {
				t.Fatalf("refusal: got %v, want class %v", s.Refusal, tc.refusal)
			}
		})
	}
	var expired *SessionExpiredError
	if _, err := Transition(cellIn(Requested, endedSession()), admitInput()); !errors.As(err, &expired) || expired.Reason != model.EndIdle || !expired.EndedAt.Equal(t0) {
		t.Fatalf("a cell of an ended session: got %v, want a SessionExpiredError saying when and why", err)
	}
}

// TestCellApproval tables how a cell is admitted under each approval mode
// of its session, before and after an approval covers it, and what
// approving it records.
func TestCellApproval(t *testing.T) {
	for _, tc := range []struct {
		name      string
		mode      model.ApprovalMode
		network   bool
		covered   string
		policy    bool // the policy decision asks for approval
		wait      bool
		coveredBy string
		covers    bool // approving it covers the session
	}{
		{"none", model.ApprovalNone, false, "", false, false, "", false},
		{"required, first cell", model.ApprovalRequired, false, "", true, true, "", false},
		{"required, every cell", model.ApprovalRequired, false, "apr_0", true, true, "", false},
		{"per_session, first cell", model.ApprovalPerSession, false, "", true, true, "", true},
		{"per_session, a later cell", model.ApprovalPerSession, false, "apr_0", true, false, "apr_0", false},
		{"none with network, first cell", model.ApprovalNone, true, "", true, true, "", true},
		{"none with network, a later cell", model.ApprovalNone, true, "apr_0", true, false, "apr_0", false},
		{"required with network, every cell", model.ApprovalRequired, true, "apr_0", true, true, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := activeSession(tc.mode)
			s.Network, s.CoveredBy = tc.network, tc.covered
			in := admitInput()
			in.Policy = allowed(tc.policy)
			step, err := Transition(cellIn(Requested, s), in)
			if err != nil {
				t.Fatal(err)
			}
			if got := step.To == AwaitingApproval; got != tc.wait {
				t.Fatalf("waits for approval: got %v (step to %s), want %v", got, step.To, tc.wait)
			}
			ev := step.Events[0].(audit.InvokeAllowedEvent)
			if ev.CoveredBy != tc.coveredBy || ev.SessionID != "ses_1" || ev.Cell != 3 || ev.ApprovalRequired != tc.wait {
				t.Fatalf("decision event: got %+v, want covered_by %q, session ses_1, cell 3, approval_required %v", ev, tc.coveredBy, tc.wait)
			}
			if !tc.wait {
				return
			}
			g := cellIn(AwaitingApproval, s)
			approved, err := Transition(g, Approve{By: apprv, At: at})
			if err != nil {
				t.Fatal(err)
			}
			if approved.Write.CoverSession != tc.covers {
				t.Fatalf("approving it covers the session: got %v, want %v", approved.Write.CoverSession, tc.covers)
			}
		})
	}
}
