package capability

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/policy"
)

var (
	t0      = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	agent   = Principal{KeyID: "key_agent", WorkspaceID: "ws_1", Role: model.RoleAgent}
	agent2  = Principal{KeyID: "key_agent2", WorkspaceID: "ws_1", Role: model.RoleAgent}
	apprv   = Principal{KeyID: "key_approver", WorkspaceID: "ws_1", Role: model.RoleApprover}
	admin   = Principal{KeyID: "key_admin", WorkspaceID: "ws_1", Role: model.RoleAdmin}
	outside = Principal{KeyID: "key_other", WorkspaceID: "ws_2", Role: model.RoleAdmin}
)

// grantIn is a one-shot grant of agent's in state, with 2 credits
// reserved and an approval request lapsing 10 minutes after it was made.
func grantIn(state State) Grant {
	g := Grant{ID: "ex_1", Kind: OneShot, WorkspaceID: "ws_1", KeyID: agent.KeyID, State: state, Tool: "code.execute",
		Runtime: "python", CreatedAt: t0, ApprovalID: "apr_1", ApprovalExpires: t0.Add(10 * time.Minute), Run: Run{Reserved: 2}}
	switch state {
	case AwaitingApproval:
		g.Status = model.StatusAwaitingApproval
	case Approved:
		g.Status = model.StatusQueued
	case Running:
		g.Status, g.Run.Driver, g.Run.StartedAt = model.StatusRunning, "runc", t0.Add(2*time.Minute)
	case Settled:
		g.Status, g.Run.Driver, g.Run.StartedAt = model.StatusSucceeded, "runc", t0.Add(2*time.Minute)
	case Requested:
		g = Grant{Kind: OneShot, State: Requested}
	}
	return g
}

// at is a time within the approval request's life, after the start.
var at = t0.Add(5 * time.Minute)

func allowed(approval bool) policy.Decision {
	return policy.Decision{Allowed: true, ApprovalRequired: approval, MaxTimeout: 30 * time.Second}
}

func admitInput() Admit {
	return Admit{By: agent, Asked: audit.Invocation{Capability: "code.execute", Runtime: "python", Network: "deny"},
		Policy: allowed(true), Tool: "code.execute", Price: 2, Card: json.RawMessage(`{"code":"print(1)"}`),
		ExpiresAt: t0.Add(10 * time.Minute), At: t0}
}

// inputs are one valid input of each kind, named.
var inputs = []struct {
	name string
	in   Input
}{
	{"admit", admitInput()},
	{"approve", Approve{By: apprv, Reason: "fine", At: at}},
	{"deny", Deny{By: apprv, Reason: "no", At: at}},
	{"expire", Expire{At: t0.Add(10 * time.Minute)}},
	{"cancel", Cancel{By: agent, Reason: "not needed", At: at}},
	{"start", Start{Driver: "runc", At: at}},
	{"launch failed", LaunchFailed{Err: errors.New("image missing"), At: at}},
	{"finish", Finish{Status: model.StatusSucceeded, Result: json.RawMessage(`{"exit_code":0}`),
		Output: model.Output{ExitCode: new(0), Stdout: []byte("1\n")}, Driver: "runc", At: at}},
	{"interrupt", Interrupt{At: at}},
}

// outcome is what a transition is expected to do: refuse with class, or
// move the grant to state and status with the credit movement and
// approval change given, writing (or not) and auditing events.
type outcome struct {
	class    error
	to       State
	status   model.ExecutionStatus
	credits  model.LedgerKind
	approval model.ApprovalStatus
	write    bool
	events   []string
}

func refused(class error) outcome { return outcome{class: class} }

func settledAs(status model.ExecutionStatus, credits model.LedgerKind, approval model.ApprovalStatus, events ...string) outcome {
	return outcome{to: Settled, status: status, credits: credits, approval: approval, write: true, events: events}
}

// TestTransitions tables every input in every state of a one-shot grant,
// the refused pairs with their error class, and of a session's cell.
func TestTransitions(t *testing.T) {
	fp, conflict := refused(errdefs.ErrFailedPrecondition), refused(errdefs.ErrConflict)
	want := map[State]map[string]outcome{
		Requested: {
			"admit": {to: AwaitingApproval, status: model.StatusAwaitingApproval, credits: model.LedgerReserve, approval: model.ApprovalPending,
				write: true, events: []string{audit.InvokeAllowed, audit.ApprovalRequested}},
			"approve": fp, "deny": fp, "expire": fp, "cancel": fp, "start": fp, "launch failed": fp, "finish": fp, "interrupt": fp,
		},
		AwaitingApproval: {
			"admit":   fp,
			"approve": {to: Approved, status: model.StatusQueued, approval: model.ApprovalApproved, write: true, events: []string{audit.ApprovalApproved}},
			"deny":    settledAs(model.StatusDenied, model.LedgerRelease, model.ApprovalDenied, audit.ApprovalDenied),
			"expire":  settledAs(model.StatusApprovalExpired, model.LedgerRelease, model.ApprovalExpired, audit.ApprovalExpired),
			"cancel":  settledAs(model.StatusCancelled, model.LedgerRelease, model.ApprovalCancelled, audit.ExecutionCancelled),
			"start":   conflict, "launch failed": conflict, "finish": conflict,
			"interrupt": fp, // its approval request stays valid across a restart
		},
		Approved: {
			"admit": fp, "approve": conflict, "deny": conflict, "expire": conflict,
			"cancel":        settledAs(model.StatusCancelled, model.LedgerRelease, "", audit.ExecutionCancelled),
			"start":         {to: Running, status: model.StatusRunning, write: true},
			"launch failed": settledAs(model.StatusLaunchFailed, model.LedgerRelease, "", audit.ExecutionFinished),
			"finish":        conflict, // a run that never started cannot have succeeded
			"interrupt":     settledAs(model.StatusFailed, model.LedgerRelease, "", audit.ExecutionRecovered),
		},
		Running: {
			"admit": fp, "approve": conflict, "deny": conflict, "expire": conflict,
			"cancel":        {to: Running, status: model.StatusRunning}, // its run is stopped, and its end records the cancel
			"start":         conflict,
			"launch failed": settledAs(model.StatusLaunchFailed, model.LedgerRelease, "", audit.ExecutionFinished),
			"finish":        settledAs(model.StatusSucceeded, model.LedgerCommit, "", audit.ExecutionFinished),
			"interrupt":     settledAs(model.StatusFailed, model.LedgerRelease, "", audit.ExecutionRecovered),
		},
		Settled: {
			"admit": fp, "approve": conflict, "deny": conflict, "expire": conflict,
			"cancel": {to: Settled, status: model.StatusSucceeded}, // unchanged: a retried cancel is harmless
			"start":  conflict, "launch failed": conflict, "finish": conflict, "interrupt": conflict,
		},
	}
	for _, state := range []State{Requested, AwaitingApproval, Approved, Running, Settled} {
		for _, in := range inputs {
			w, ok := want[state][in.name]
			if !ok {
				t.Fatalf("the table has no row for %s in %s", in.name, state)
			}
			t.Run(string(state)+"/"+in.name, func(t *testing.T) {
				check(t, grantIn(state), in.in, w)
			})
		}
	}
	// A cell of an active session moves as a one-shot grant does (its
	// session's own inputs are tabled in TestSessionTransitions).
	for _, state := range []State{Requested, AwaitingApproval, Approved, Running, Settled} {
		for _, in := range inputs {
			t.Run("cell/"+string(state)+"/"+in.name, func(t *testing.T) {
				check(t, cellIn(state, activeSession(model.ApprovalRequired)), in.in, want[state][in.name])
			})
		}
	}
}

// TestMalformedTransitions checks that a transition without an input, or
// of a grant of no known kind, is refused as invalid, whatever the state.
func TestMalformedTransitions(t *testing.T) {
	for _, state := range []State{Requested, AwaitingApproval, Approved, Running, Settled} {
		t.Run(string(state), func(t *testing.T) {
			for _, kind := range []Kind{OneShot, Session, "", "pool"} {
				g := grantIn(state)
				g.Kind = kind
				if _, err := Transition(g, nil); !errdefs.IsInvalidArgument(err) {
					t.Errorf("kind %q, no input: got %v, want invalid argument", kind, err)
				}
			}
			for _, kind := range []Kind{"", "pool"} {
				g := grantIn(state)
				g.Kind = kind
				if _, err := Transition(g, Start{Driver: "runc", At: at}); !errdefs.IsInvalidArgument(err) {
					t.Errorf("kind %q: got %v, want invalid argument", kind, err)
				}
			}
		})
	}
}

// check runs the transition of g by in and compares it with w.
func check(t *testing.T, g Grant, in Input, w outcome) Step {
	t.Helper()
	s, err := Transition(g, in)
	if w.class != nil {
		if !errors.Is(err, w.class) {
			t.Fatalf("got step %+v, error %v; want an error of class %q", s, err, w.class)
		}
		return s
	}
	if err != nil {
		t.Fatalf("got error %v, want a step to %s", err, w.to)
	}
	if s.From != g.State || s.To != w.to || s.Status != w.status {
		t.Errorf("step: got %s -> %s (%s), want %s -> %s (%s)", s.From, s.To, s.Status, g.State, w.to, w.status)
	}
	if (s.Write != nil) != w.write {
		t.Fatalf("write: got %+v, want one: %v", s.Write, w.write)
	}
	var types []string
	for _, e := range s.Events {
		types = append(types, e.Type())
	}
	if !slices.Equal(types, w.events) {
		t.Errorf("events: got %v, want %v", types, w.events)
	}
	if s.Write == nil {
		return s
	}
	wr := s.Write
	switch {
	case wr.To != w.status:
		t.Errorf("write to: got %s, want %s", wr.To, w.status)
	case g.State != Requested && wr.From != g.Status:
		t.Errorf("write from: got %s, want %s (the compare-and-set)", wr.From, g.Status)
	case wr.Credits.Kind != w.credits:
		t.Errorf("credits: got %q, want %q", wr.Credits.Kind, w.credits)
	case wr.Approval.To != w.approval:
		t.Errorf("approval change: got %q, want %q", wr.Approval.To, w.approval)
	case (wr.Invocation != nil) != wr.To.Terminal():
		t.Errorf("tool_invocations row: got %+v for a step to %s", wr.Invocation, wr.To)
	case len(wr.Audit) != len(s.Events):
		t.Errorf("encoded events: got %d, want %d", len(wr.Audit), len(s.Events))
	}
	for i, e := range wr.Audit {
		if e.Type != s.Events[i].Type() || e.Code != s.Events[i].Code() {
			t.Errorf("encoded event %d: got %s/%s, want %s/%s", i, e.Type, e.Code, s.Events[i].Type(), s.Events[i].Code())
		}
	}
	return s
}

// TestWhoMayDecide tables the keys that may approve or deny a request:
// approver and admin keys of its workspace, never the key that asked for
// it, and never once the request has lapsed or gone stale.
func TestWhoMayDecide(t *testing.T) {
	invokerAdmin := Principal{KeyID: agent.KeyID, WorkspaceID: "ws_1", Role: model.RoleAdmin}
	for _, tc := range []struct {
		name  string
		in    Input
		class error
	}{
		{"an approver approves", Approve{By: apprv, At: at}, nil},
		{"an admin approves", Approve{By: admin, At: at}, nil},
		{"an approver denies", Deny{By: apprv, At: at}, nil},
		{"an agent approves", Approve{By: agent2, At: at}, errdefs.ErrPermissionDenied},
		{"an agent denies", Deny{By: agent2, At: at}, errdefs.ErrPermissionDenied},
		{"another workspace's admin", Approve{By: outside, At: at}, errdefs.ErrPermissionDenied},
		{"the key that asked, an admin", Approve{By: invokerAdmin, At: at}, errdefs.ErrPermissionDenied},
		{"the key that asked denies", Deny{By: invokerAdmin, At: at}, errdefs.ErrPermissionDenied},
		{"at the expiry", Approve{By: apprv, At: t0.Add(10 * time.Minute)}, errdefs.ErrConflict},
		{"after the expiry", Deny{By: apprv, At: t0.Add(time.Hour)}, errdefs.ErrConflict},
		{"a stale request", Approve{By: apprv, Stale: "the tool changed", At: at}, errdefs.ErrConflict},
		{"a stale request denied", Deny{By: apprv, At: at}, nil},
		{"without a time", Approve{By: apprv}, errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Transition(grantIn(AwaitingApproval), tc.in)
			if tc.class == nil {
				if err != nil {
					t.Fatalf("got %v, want the decision", err)
				}
				if s.Write.Approval.DecidedBy == "" || s.Events[0].Metadata().Actor != s.Write.Approval.DecidedBy {
					t.Errorf("decision: got decider %q and event actor %q, want the deciding key", s.Write.Approval.DecidedBy, s.Events[0].Metadata().Actor)
				}
				return
			}
			if !errors.Is(err, tc.class) {
				t.Fatalf("got %v, want an error of class %q", err, tc.class)
			}
		})
	}
	// A request without its expiry read cannot be decided nor expired.
	g := grantIn(AwaitingApproval)
	g.ApprovalExpires = time.Time{}
	for _, in := range []Input{Approve{By: apprv, At: at}, Expire{At: at}} {
		if _, err := Transition(g, in); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%T of a grant without its expiry: got %v, want invalid argument", in, err)
		}
	}
	if _, err := Transition(grantIn(AwaitingApproval), Expire{At: at}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("expiring before the expiry: got %v, want failed precondition", err)
	}
}

// TestWhoMayCancel tables the keys that may cancel: the key that asked,
// or an admin key of its workspace; and the daemon itself (the zero
// Principal: the waiting cell of a session that ended).
func TestWhoMayCancel(t *testing.T) {
	for _, tc := range []struct {
		name string
		by   Principal
		ok   bool
	}{
		{"the key that asked", agent, true},
		{"an admin", admin, true},
		{"another agent", agent2, false},
		{"an approver", apprv, false},
		{"another workspace's admin", outside, false},
		{"the daemon", Principal{}, true},
	} {
		for _, state := range []State{AwaitingApproval, Approved, Running, Settled} {
			t.Run(tc.name+"/"+string(state), func(t *testing.T) {
				s, err := Transition(grantIn(state), Cancel{By: tc.by, At: at})
				if !tc.ok {
					if !errdefs.IsPermissionDenied(err) {
						t.Fatalf("got %v, want permission denied", err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if live := state != Settled; (s.Next.Stop != nil) != live || (live && s.Next.Stop.By != tc.by.KeyID) {
					t.Errorf("stop: got %+v, want the run stopped by %s: %v", s.Next.Stop, tc.by.KeyID, live)
				}
			})
		}
	}
}

// TestCharging tables what each end charges: a run that started and ended
// in a charged status commits its reservation; every other end releases
// it; a free grant moves nothing.
func TestCharging(t *testing.T) {
	c := &Cancellation{By: agent.KeyID}
	for _, tc := range []struct {
		name    string
		state   State
		in      Input
		free    bool
		credits model.LedgerKind
		charged int64
	}{
		{"succeeded", Running, Finish{Status: model.StatusSucceeded, At: at}, false, model.LedgerCommit, 2},
		{"failed", Running, Finish{Status: model.StatusFailed, At: at}, false, model.LedgerCommit, 2},
		{"timed out", Running, Finish{Status: model.StatusTimedOut, At: at}, false, model.LedgerCommit, 2},
		{"oom killed", Running, Finish{Status: model.StatusOOMKilled, At: at}, false, model.LedgerCommit, 2},
		{"killed by a cancel", Running, Finish{Status: model.StatusKilled, Cancel: c, At: at}, false, model.LedgerCommit, 2},
		{"killed by a shutdown", Running, Finish{Status: model.StatusKilled, At: at}, false, model.LedgerCommit, 2},
		{"cancelled after its start, before its code", Running, Finish{Status: model.StatusCancelled, Cancel: c, At: at}, false, model.LedgerRelease, 0},
		{"cancelled before its start", Approved, Finish{Status: model.StatusCancelled, Cancel: c, At: at}, false, model.LedgerRelease, 0},
		{"launch failed after its start", Running, LaunchFailed{At: at}, false, model.LedgerRelease, 0},
		{"launch failed before its start", Approved, LaunchFailed{At: at}, false, model.LedgerRelease, 0},
		{"interrupted while running", Running, Interrupt{At: at}, false, model.LedgerRelease, 0},
		{"interrupted while queued", Approved, Interrupt{At: at}, false, model.LedgerRelease, 0},
		{"cancelled while queued", Approved, Cancel{By: agent, At: at}, false, model.LedgerRelease, 0},
		{"denied", AwaitingApproval, Deny{By: apprv, At: at}, false, model.LedgerRelease, 0},
		{"expired", AwaitingApproval, Expire{At: t0.Add(time.Hour)}, false, model.LedgerRelease, 0},
		{"free, succeeded", Running, Finish{Status: model.StatusSucceeded, At: at}, true, "", 0},
		{"free, denied", AwaitingApproval, Deny{By: apprv, At: at}, true, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := grantIn(tc.state)
			if tc.free {
				g.Run.Reserved = 0
			}
			s, err := Transition(g, tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if s.Write.Credits.Kind != tc.credits || s.Write.Invocation.Credits != tc.charged {
				t.Errorf("got %q charging %d, want %q charging %d", s.Write.Credits.Kind, s.Write.Invocation.Credits, tc.credits, tc.charged)
			}
			for _, e := range s.Events {
				var credits int64
				switch e := e.(type) {
				case audit.ExecutionFinishedEvent:
					credits = e.Credits
				case audit.ExecutionCancelledEvent:
					credits = e.Credits
				default:
					continue
				}
				if credits != tc.charged {
					t.Errorf("%s event says %d credits, want %d", e.Type(), credits, tc.charged)
				}
			}
		})
	}
	if _, err := Transition(grantIn(Running), Finish{Status: model.StatusCancelled, At: at}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("cancelled without a cancel: got %v, want invalid argument", err)
	}
	for _, status := range []model.ExecutionStatus{model.StatusQueued, model.StatusDenied, model.StatusLaunchFailed, "exploded"} {
		if _, err := Transition(grantIn(Running), Finish{Status: status, At: at}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("a run finishing %q: got %v, want invalid argument", status, err)
		}
	}
}

// TestAdmission tables the admission's rules in their order: each check
// denies with its code (an event of no grant), and an allowed request
// waits for approval when the policy or a network request asks for one.
func TestAdmission(t *testing.T) {
	late := &Refusal{"server_at_capacity", "the server is at capacity", errdefs.ErrResourceExhausted}
	for _, tc := range []struct {
		name  string
		mod   func(*Admit)
		code  string // denied with this code, or admitted
		class error
		to    State
	}{
		{"allowed, approval required", func(*Admit) {}, "", nil, AwaitingApproval},
		{"allowed, no approval", func(a *Admit) { a.Policy = allowed(false) }, "", nil, Approved},
		{"network goes to a human", func(a *Admit) {
			a.Policy, a.Network, a.ToolEgress, a.EgressAvailable = allowed(false), true, true, true
		},
			"", nil, AwaitingApproval},
		{"the tool's record refuses first", func(a *Admit) {
			a.ToolRefusal, a.By.Role, a.Policy = "tool refuses node", model.RoleApprover, policy.Decision{Code: "x"}
		}, "tool_runtime_not_allowed", errdefs.ErrPermissionDenied, ""},
		{"an approver key", func(a *Admit) { a.By.Role, a.Policy = model.RoleApprover, policy.Decision{Code: "x"} },
			"role_cannot_invoke", errdefs.ErrPermissionDenied, ""},
		{"the policy", func(a *Admit) {
			a.Policy, a.ReviewPending = policy.Decision{Code: policy.DenyRuntimeNotAllowed, Reason: "runtime not allowed"}, "review"
		}, policy.DenyRuntimeNotAllowed, errdefs.ErrPermissionDenied, ""},
		{"a pending review", func(a *Admit) { a.ReviewPending, a.Network = "tool changed", true }, "tool_review_required", errdefs.ErrPermissionDenied, ""},
		{"network without an allowlist", func(a *Admit) { a.Network, a.EgressAvailable = true, true },
			policy.DenyNetworkNotPermitted, errdefs.ErrPermissionDenied, ""},
		{"network without egress", func(a *Admit) { a.Network, a.ToolEgress = true, true },
			policy.DenyNetworkNotPermitted, errdefs.ErrPermissionDenied, ""},
		{"a late refusal", func(a *Admit) { a.Policy, a.Refusal = allowed(false), late }, late.Code, errdefs.ErrResourceExhausted, ""},
		{"no card for approval", func(a *Admit) { a.Card = nil }, "", errdefs.ErrInvalidArgument, ""},
		{"a negative price", func(a *Admit) { a.Price = -1 }, "", errdefs.ErrInvalidArgument, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := admitInput()
			tc.mod(&in)
			s, err := Transition(grantIn(Requested), in)
			switch {
			case tc.code == "" && tc.class != nil:
				if !errors.Is(err, tc.class) {
					t.Fatalf("got %v, want an error of class %q", err, tc.class)
				}
			case err != nil:
				t.Fatal(err)
			case tc.code != "":
				ev, ok := s.Events[0].(audit.InvokeDeniedEvent)
				if s.Write != nil || len(s.Events) != 1 || !ok || ev.Decision != tc.code || ev.WorkspaceID != agent.WorkspaceID ||
					ev.Actor != agent.KeyID || !errors.Is(s.Refusal, tc.class) {
					t.Fatalf("got step %+v, want a denial %s of class %q audited alone", s, tc.code, tc.class)
				}
			default:
				if s.To != tc.to || s.Refusal != nil || s.Next.Dispatch != (tc.to == Approved) {
					t.Fatalf("got step to %s (dispatch %v, refusal %v), want %s", s.To, s.Next.Dispatch, s.Refusal, tc.to)
				}
				allowed, ok := s.Events[0].(audit.InvokeAllowedEvent)
				if !ok || allowed.ApprovalRequired != (tc.to == AwaitingApproval) {
					t.Errorf("first event: got %+v, want invoke_allowed saying whether approval is required", s.Events[0])
				}
			}
		})
	}
	free := admitInput()
	free.Price = 0
	if s, err := Transition(grantIn(Requested), free); err != nil || s.Write.Credits.Kind != "" {
		t.Errorf("a free admission: got %+v, %v; want no reservation", s.Write, err)
	}
}

// TestSettledRows checks the tool_invocations row a step settles with: its
// times, driver and status.
func TestSettledRows(t *testing.T) {
	for _, tc := range []struct {
		name        string
		state       State
		in          Input
		driver      string
		queued, ran time.Duration
	}{
		{"ran", Running, Finish{Status: model.StatusSucceeded, Driver: "gvisor", At: at}, "gvisor", 2 * time.Minute, 3 * time.Minute},
		{"ran, the start's driver", Running, Finish{Status: model.StatusSucceeded, At: at}, "runc", 2 * time.Minute, 3 * time.Minute},
		{"never started", AwaitingApproval, Deny{By: apprv, At: at}, "", 5 * time.Minute, 0},
		{"a clock that went back", Approved, LaunchFailed{At: t0.Add(-time.Second)}, "", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Transition(grantIn(tc.state), tc.in)
			if err != nil {
				t.Fatal(err)
			}
			inv := s.Write.Invocation
			if inv.Driver != tc.driver || inv.Queued != tc.queued || inv.Ran != tc.ran || inv.Status != s.Write.To ||
				inv.Tool != "code.execute" || inv.Runtime != "python" {
				t.Errorf("row: got %+v, want driver %q, queued %v, ran %v", inv, tc.driver, tc.queued, tc.ran)
			}
		})
	}
}

// TestAudited checks the events' metadata and data where the chain's
// readers depend on them: the actors, the ids they name, the credits, and
// the result's fingerprint.
func TestAudited(t *testing.T) {
	c := &Cancellation{By: admin.KeyID, Reason: "stop"}
	// The daemon's own cancels: a session's end, a shutdown for good.
	ended := &Cancellation{Reason: "its session ses_1 ended (closed)", EndedBy: engine.EndedBySessionEnd}
	shutdown := &Cancellation{Reason: "its session ses_1 ended (interrupted)", EndedBy: engine.EndedByShutdown}
	result := json.RawMessage(`{"stdout":"1\n"}`)
	for _, tc := range []struct {
		name  string
		state State
		in    Input
		want  []audit.Event
	}{
		{"approve", AwaitingApproval, Approve{By: apprv, Reason: "fine", At: at},
			[]audit.Event{audit.ApprovalApprovedEvent{Meta: audit.Meta{Actor: apprv.KeyID, Reason: "fine"}, ApprovalID: "apr_1"}}},
		{"expire", AwaitingApproval, Expire{At: t0.Add(time.Hour)},
			[]audit.Event{audit.ApprovalExpiredEvent{Meta: audit.Meta{Actor: "system", Reason: "no decision before the approval expired"}, ApprovalID: "apr_1"}}},
		{"cancel awaiting", AwaitingApproval, Cancel{By: admin, Reason: "stop", At: at},
			[]audit.Event{audit.ExecutionCancelledEvent{Meta: audit.Meta{Actor: admin.KeyID, Reason: c.Error()},
				From: model.StatusAwaitingApproval, To: model.StatusCancelled, ApprovalID: "apr_1"}}},
		{"cancel queued", Approved, Cancel{By: admin, Reason: "stop", At: at},
			[]audit.Event{audit.ExecutionCancelledEvent{Meta: audit.Meta{Actor: admin.KeyID, Reason: c.Error()},
				From: model.StatusQueued, To: model.StatusCancelled}}},
		{"killed by a cancel", Running, Finish{Status: model.StatusKilled, Result: result, Driver: "runc", Cancel: c, At: at},
			[]audit.Event{
				audit.ExecutionCancelledEvent{Meta: audit.Meta{Actor: admin.KeyID, Reason: c.Error()}, From: model.StatusRunning, To: model.StatusKilled, Credits: 2},
				finishedEvent(model.StatusKilled, "runc", result, nil, 2),
			}},
		// A session's end or a shutdown is no one's cancel: the finished
		// event alone, the result saying ended_by.
		{"killed by its session's end", Running, Finish{Status: model.StatusKilled, Result: result, Driver: "runc", Cancel: ended, At: at},
			[]audit.Event{finishedEvent(model.StatusKilled, "runc", result, nil, 2)}},
		{"killed by a shutdown for good", Running, Finish{Status: model.StatusKilled, Result: result, Driver: "runc", Cancel: shutdown, At: at},
			[]audit.Event{finishedEvent(model.StatusKilled, "runc", result, nil, 2)}},
		// A waiting cell of an ended session is cancelled by the system.
		{"cancel queued by the system", Approved, Cancel{Reason: "its session ses_1 ended (ttl)", At: at},
			[]audit.Event{audit.ExecutionCancelledEvent{Meta: audit.Meta{Actor: "system", Reason: "cancelled by the daemon: its session ses_1 ended (ttl)"},
				From: model.StatusQueued, To: model.StatusCancelled}}},
		{"cancelled before its start by its session's end", Approved, Finish{Status: model.StatusCancelled, Cancel: ended, At: at},
			[]audit.Event{audit.ExecutionCancelledEvent{Meta: audit.Meta{Actor: "system", Reason: ended.Error()},
				From: model.StatusQueued, To: model.StatusCancelled}}},
		{"interrupt", Running, Interrupt{At: at},
			[]audit.Event{audit.ExecutionRecoveredEvent{Meta: audit.Meta{Actor: "system",
				Reason: "execution interrupted by a daemon stop; marked failed, credits released"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Transition(grantIn(tc.state), tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprintf("%+v", s.Events) != fmt.Sprintf("%+v", tc.want) {
				t.Errorf("events:\ngot  %+v\nwant %+v", s.Events, tc.want)
			}
		})
	}
	s, err := Transition(grantIn(Running), Finish{Status: model.StatusSucceeded, Result: result, At: at})
	if err != nil {
		t.Fatal(err)
	}
	if ev := s.Events[0].(audit.ExecutionFinishedEvent); ev.ResultSHA256 != sha256Hex(result) {
		t.Errorf("finished event: got result fingerprint %s, want the result's", ev.ResultSHA256)
	}
}

// TestStatesOfStatuses checks that every stored status has its state.
func TestStatesOfStatuses(t *testing.T) {
	for _, s := range model.ExecutionStatuses {
		st := StateOf(s)
		if st == Requested || (st == Settled) != s.Terminal() {
			t.Errorf("StateOf(%s) = %s", s, st)
		}
	}
	if StateOf("bogus") != Requested {
		t.Errorf("StateOf(bogus) = %s, want requested (unknown)", StateOf("bogus"))
	}
}

// BenchmarkOneShotTransitions measures the pure part of a one-shot call's
// capability layer: the three transitions of a grant admitted without
// approval (admit, start, finish), their steps and encoded audit events.
// The store's transactions, which apply them, are bench/capability's.
func BenchmarkOneShotTransitions(b *testing.B) {
	admit := admitInput()
	admit.Policy = allowed(false)
	finish := Finish{Status: model.StatusSucceeded, Result: json.RawMessage(`{"exit_code":0,"stdout":"hi\n"}`),
		Output: model.Output{ExitCode: new(0), Stdout: []byte("hi\n")}, Driver: "runc", At: at}
	for b.Loop() {
		s, err := Transition(grantIn(Requested), admit)
		if err != nil || s.To != Approved {
			b.Fatalf("admit: got %+v, %v", s, err)
		}
		if s, err = Transition(grantIn(Approved), Start{Driver: "runc", At: at}); err != nil {
			b.Fatal(err)
		}
		if s, err = Transition(grantIn(Running), finish); err != nil || len(s.Write.Audit) != 1 {
			b.Fatalf("finish: got %+v, %v", s, err)
		}
	}
}
