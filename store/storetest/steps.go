package storetest

import (
	"testing"
	"time"

	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// The suite's steps are built by hand, in the shapes the capability layer
// gives them, so that the suite proves the journal's contract and nothing
// above it: who may make a step, and what it should charge, is the
// capability layer's business and its tests'.

// admission is the first step of an execution queued to run, reserving
// credits (none when 0).
func admission(credits int64, events ...model.NewEvent) model.Step {
	s := model.Step{To: model.StatusQueued, Audit: events}
	if credits > 0 {
		s.Credits = model.CreditMove{Kind: model.LedgerReserve, Amount: credits}
	}
	return s
}

// waiting is the first step of an execution that waits for approval of
// card, a request lapsing at expires.
func waiting(credits int64, card string, expires time.Time, events ...model.NewEvent) model.Step {
	s := admission(credits, events...)
	s.To = model.StatusAwaitingApproval
	s.Approval = model.ApprovalChange{To: model.ApprovalPending, Card: []byte(card), ExpiresAt: expires}
	return s
}

// start is the step of a queued execution that starts on driver.
func start(driver string, events ...model.NewEvent) model.Step {
	return model.Step{From: model.StatusQueued, To: model.StatusRunning, Driver: driver, Audit: events}
}

// ending is the step that ends ex, as last read, in to: its reservation
// committed when charge is set, released otherwise, and its
// tool_invocations row accordingly.
func ending(ex model.Execution, to model.ExecutionStatus, charge bool, events ...model.NewEvent) model.Step {
	at := store.TruncateTime(time.Now())
	s := model.Step{From: ex.Status, To: to, At: at, Audit: events,
		Invocation: &model.ToolInvocation{Tool: ex.Tool, Runtime: ex.Runtime, Status: to, Driver: ex.Driver}}
	if !ex.StartedAt.IsZero() {
		s.Invocation.Queued, s.Invocation.Ran = ex.StartedAt.Sub(ex.CreatedAt), max(at.Sub(ex.StartedAt), 0)
	} else {
		s.Invocation.Queued = max(at.Sub(ex.CreatedAt), 0)
	}
	if ex.ReservationID != "" {
		s.Credits.Kind = model.LedgerRelease
		if charge {
			s.Credits.Kind, s.Invocation.Credits = model.LedgerCommit, ex.Credits
		}
	}
	return s
}

// decision is the step that decides ex's pending approval request: approved,
// it is queued to run; denied, it ends, uncharged.
func decision(ex model.Execution, approve bool, by, reason string, events ...model.NewEvent) model.Step {
	change := model.ApprovalChange{To: model.ApprovalDenied, DecidedBy: by, Reason: reason}
	if !approve {
		s := ending(ex, model.StatusDenied, false, events...)
		s.Approval = change
		return s
	}
	change.To = model.ApprovalApproved
	return model.Step{From: ex.Status, To: model.StatusQueued, Approval: change, Audit: events}
}

// expiry is the step that ends ex, awaiting approval, when its request
// lapses.
func expiry(ex model.Execution, events ...model.NewEvent) model.Step {
	s := ending(ex, model.StatusApprovalExpired, false, events...)
	s.Approval = model.ApprovalChange{To: model.ApprovalExpired, Reason: "expired without a decision"}
	return s
}

// cancel is the step that ends ex, awaiting approval or queued, cancelled:
// uncharged, its pending request (if any) closed with reason.
func cancel(ex model.Execution, reason string, events ...model.NewEvent) model.Step {
	s := ending(ex, model.StatusCancelled, false, events...)
	s.Result = []byte(`{"error":"cancelled"}`)
	if ex.Status == model.StatusAwaitingApproval {
		s.Approval = model.ApprovalChange{To: model.ApprovalCancelled, Reason: reason}
	}
	return s
}

func mustAdmit(t *testing.T, st store.Store, e store.NewExecution, s model.Step) store.Admission {
	t.Helper()
	adm, err := st.Admit(t.Context(), e, s)
	if err != nil {
		t.Fatalf("Admit: %v", err)
	}
	return adm
}

// mustApply applies step to ex and returns the execution as it leaves it.
func mustApply(t *testing.T, st store.Store, ex model.Execution, s model.Step) model.Execution {
	t.Helper()
	out, err := st.Apply(t.Context(), ex.ID, s)
	if err != nil {
		t.Fatalf("Apply(%s -> %s): %v", s.From, s.To, err)
	}
	return out
}

// run starts ex on driver and ends it in to, charged when charge is set,
// and returns it as it ended.
func run(t *testing.T, st store.Store, ex model.Execution, driver string, to model.ExecutionStatus, charge bool) model.Execution {
	t.Helper()
	ex = mustApply(t, st, ex, start(driver))
	return mustApply(t, st, ex, ending(ex, to, charge))
}
