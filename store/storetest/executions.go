package storetest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

func nowPlus(seconds int) time.Time { return time.Now().Add(time.Duration(seconds) * time.Second) }

func testIdempotency(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "idem")
	other := newFixture(t, st, "idem-other")
	mustGrant(t, st, f.ws.ID, 10)
	mustGrant(t, st, other.ws.ID, 10)

	e := f.newExec("print('once')")
	e.IdempotencyKey = "req-1"
	_, err := st.ReplayExecution(ctx, e)
	wantClass(t, "ReplayExecution before the first request", err, errdefs.ErrNotFound)
	first := mustAdmit(t, st, e, admission(2))
	if first.Replayed {
		t.Fatal("first Admit reported Replayed")
	}
	again := mustAdmit(t, st, e, admission(2))
	if !again.Replayed || again.Execution.ID != first.Execution.ID || again.Reservation == nil ||
		again.Reservation.ID != first.Reservation.ID {
		t.Fatalf("retry: got %+v, want a replay of %s with its reservation", again, first.Execution.ID)
	}
	wantCredits(t, st, f.ws.ID, 8, 2)
	wantReplay(t, st, e, first)

	// A finished execution replays with its final state.
	ran := mustApply(t, st, first.Execution, start("runc"))
	end := ending(ran, model.StatusSucceeded, true)
	end.Result = []byte(`{"exit_code":0}`)
	mustApply(t, st, ran, end)
	again = mustAdmit(t, st, e, admission(2))
	if !again.Replayed || again.Execution.Status != model.StatusSucceeded || string(again.Execution.Result) != `{"exit_code":0}` {
		t.Fatalf("retry after the end: got %+v", again.Execution)
	}
	wantCredits(t, st, f.ws.ID, 8, 0)
	if r := wantReplay(t, st, e, first); r.Execution.Status != model.StatusSucceeded || r.Reservation.Status != model.ReservationCommitted {
		t.Fatalf("ReplayExecution after the end: got %s with a %s reservation", r.Execution.Status, r.Reservation.Status)
	}

	changed := f.newExec("print('other code')")
	changed.IdempotencyKey = "req-1"
	_, err = st.Admit(ctx, changed, admission(2))
	wantClass(t, "the same key for a different request", err, errdefs.ErrConflict)
	_, err = st.ReplayExecution(ctx, changed)
	wantClass(t, "ReplayExecution of a different request", err, errdefs.ErrConflict)
	changedReq := e
	changedReq.Request = []byte(`{"runtime":"python","code":"print('once')","timeout_ms":1000}`)
	_, err = st.ReplayExecution(ctx, changedReq)
	wantClass(t, "ReplayExecution of the same code with another request", err, errdefs.ErrConflict)
	noKey := e
	noKey.IdempotencyKey = ""
	_, err = st.ReplayExecution(ctx, noKey)
	wantClass(t, "ReplayExecution without a key", err, errdefs.ErrNotFound)
	_, err = st.ReplayExecution(ctx, store.NewExecution{WorkspaceID: other.ws.ID, IdempotencyKey: "req-1",
		Request: e.Request, InputSHA256: e.InputSHA256})
	wantClass(t, "ReplayExecution of another workspace's key", err, errdefs.ErrNotFound)
	badKey := e
	badKey.IdempotencyKey = "bad\x00key"
	_, err = st.ReplayExecution(ctx, badKey)
	wantClass(t, "ReplayExecution with a NUL in the key", err, errdefs.ErrInvalidArgument)

	// A request awaiting approval replays with its approval.
	ae := f.newExec("print('approve me')")
	ae.IdempotencyKey = "req-approval"
	pending := mustAdmit(t, st, ae, waiting(2, `{"risk":"high"}`, nowPlus(600)))
	if r := wantReplay(t, st, ae, pending); r.Approval == nil || r.Approval.ID != pending.Approval.ID ||
		r.Approval.Status != model.ApprovalPending || r.Execution.Status != model.StatusAwaitingApproval {
		t.Fatalf("ReplayExecution awaiting approval: got %+v", r)
	}
	mustApply(t, st, pending.Execution, decision(pending.Execution, false, f.approver.ID, "no"))
	wantCredits(t, st, f.ws.ID, 8, 0)

	// Keys are scoped to the API key that sent them, and no key means
	// no deduplication.
	oe := other.newExec("print('once')")
	oe.IdempotencyKey = "req-1"
	if adm := mustAdmit(t, st, oe, admission(2)); adm.Replayed {
		t.Fatal("another workspace's idempotency key replayed")
	}
	// The admin key of the workspace reusing the agent's key and body
	// starts a request of its own.
	ae2 := e
	ae2.KeyID = f.adm.ID
	_, err = st.ReplayExecution(ctx, ae2)
	wantClass(t, "ReplayExecution of another key's idempotency key", err, errdefs.ErrNotFound)
	byAdmin := mustAdmit(t, st, ae2, admission(2))
	if byAdmin.Replayed || byAdmin.Execution.KeyID != f.adm.ID || byAdmin.Execution.ID == first.Execution.ID {
		t.Fatalf("another key's idempotency key: got %+v, want a new execution of the admin key", byAdmin)
	}
	wantCredits(t, st, f.ws.ID, 6, 2)
	wantReplay(t, st, ae2, byAdmin)
	plain := f.newExec("print('once')")
	a, b := mustAdmit(t, st, plain, admission(2)), mustAdmit(t, st, plain, admission(2))
	if a.Execution.ID == b.Execution.ID || a.Replayed || b.Replayed {
		t.Fatal("executions without an idempotency key were deduplicated")
	}
	wantCredits(t, st, f.ws.ID, 2, 6)
}

// wantReplay checks that ReplayExecution answers e with the execution of
// first, Replayed, its reservation and approval, and writes nothing.
func wantReplay(t *testing.T, st store.Store, e store.NewExecution, first store.Admission) store.Admission {
	t.Helper()
	ctx := t.Context()
	head := must[model.ChainHead](t, "ChainHead")(st.ChainHead(ctx, e.WorkspaceID))
	credits := must[model.Credits](t, "GetCredits")(st.GetCredits(ctx, e.WorkspaceID))
	r, err := st.ReplayExecution(ctx, e)
	if err != nil {
		t.Fatalf("ReplayExecution: %v", err)
	}
	if !r.Replayed || r.Execution.ID != first.Execution.ID || r.Execution.IdempotencyKey != e.IdempotencyKey ||
		(r.Reservation == nil) != (first.Reservation == nil) || (r.Approval == nil) != (first.Approval == nil) {
		t.Fatalf("ReplayExecution: got %+v, want a replay of %+v", r, first)
	}
	if r.Reservation != nil && r.Reservation.ID != first.Reservation.ID {
		t.Fatalf("ReplayExecution: got reservation %s, want %s", r.Reservation.ID, first.Reservation.ID)
	}
	if h := must[model.ChainHead](t, "ChainHead")(st.ChainHead(ctx, e.WorkspaceID)); h != head {
		t.Fatalf("ReplayExecution moved the chain head from %+v to %+v", head, h)
	}
	if c := must[model.Credits](t, "GetCredits")(st.GetCredits(ctx, e.WorkspaceID)); c != credits {
		t.Fatalf("ReplayExecution changed the credits from %+v to %+v", credits, c)
	}
	return r
}

func testConcurrentIdempotency(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "idem-race")
	mustGrant(t, st, f.ws.ID, 100)
	e := f.newExec("print('race')")
	e.IdempotencyKey = "race"
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		fresh  int
		execID = map[string]bool{}
		errs   []error
	)
	for range 10 {
		wg.Go(func() {
			adm, err := st.Admit(ctx, e, admission(2, model.NewEvent{Type: "capability.invoke_allowed"}))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			execID[adm.Execution.ID] = true
			if !adm.Replayed {
				fresh++
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if fresh != 1 || len(execID) != 1 {
		t.Fatalf("10 concurrent retries: got %d fresh admissions and %d execution ids, want 1 and 1", fresh, len(execID))
	}
	wantCredits(t, st, f.ws.ID, 98, 2)
	if h := must[model.ChainHead](t, "ChainHead")(st.ChainHead(ctx, f.ws.ID)); h.Seq != 1 {
		t.Fatalf("events after 10 retries: got %d, want 1", h.Seq)
	}
}

func testExecutionLifecycle(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "life")
	other := newFixture(t, st, "life-other")
	mustGrant(t, st, f.ws.ID, 10)

	e := f.newExec("print('hi')")
	e.ID = "ex_chosen_by_caller"
	created := store.TruncateTime(time.Now().Add(-time.Minute))
	first := admission(2)
	first.At = created
	adm := mustAdmit(t, st, e, first)
	ex := adm.Execution
	if ex.ID != e.ID || ex.Status != model.StatusQueued || !ex.CreatedAt.Equal(created) || !ex.StartedAt.IsZero() ||
		ex.KeyID != f.agent.ID || ex.Tool != "code.execute" || !bytes.Equal(ex.Request, e.Request) || ex.Credits != 2 {
		t.Fatalf("admitted execution: got %+v", ex)
	}
	got := must[model.Execution](t, "GetExecution")(st.GetExecution(ctx, f.ws.ID, ex.ID))
	if got.ID != ex.ID || got.Status != ex.Status || !got.CreatedAt.Equal(ex.CreatedAt) || got.InputSHA256 != e.InputSHA256 ||
		got.ReservationID != adm.Reservation.ID || !bytes.Equal(got.Request, e.Request) || got.Credits != 2 {
		t.Fatalf("GetExecution: got %+v, want %+v", got, ex)
	}
	_, err := st.GetExecution(ctx, other.ws.ID, ex.ID)
	wantClass(t, "GetExecution from another workspace", err, errdefs.ErrNotFound)
	_, err = st.GetToolCall(ctx, other.ws.ID, ex.ID)
	wantClass(t, "GetToolCall from another workspace", err, errdefs.ErrNotFound)
	_, err = st.Admit(ctx, e, admission(2))
	wantClass(t, "Admit with a taken id", err, errdefs.ErrConflict)

	tc := must[model.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, ex.ID))
	if tc.Status != model.StatusQueued || tc.InputSHA256 != e.InputSHA256 || tc.ExitCode != nil || tc.CreditsCharged != 0 {
		t.Fatalf("tool call of a queued execution: got %+v", tc)
	}

	started := store.TruncateTime(time.Now())
	begin := start("gvisor")
	begin.At = started
	running := mustApply(t, st, ex, begin)
	if running.Status != model.StatusRunning || !running.StartedAt.Equal(started) || running.Driver != "gvisor" {
		t.Fatalf("start: got %+v", running)
	}
	_, err = st.Apply(ctx, ex.ID, start("gvisor"))
	wantClass(t, "starting twice", err, errdefs.ErrConflict)
	wantCredits(t, st, f.ws.ID, 8, 2) // still reserved while running

	stdout := bytes.Repeat([]byte("o"), model.PreviewLimit+100)
	stderr := []byte("warn\x00\xff binary is fine")
	end := ending(running, model.StatusSucceeded, true)
	end.Result, end.Output = []byte(`{"exit_code": 0}`), model.Output{ExitCode: ptr(0), Stdout: stdout, Stderr: stderr, StderrTruncated: true}
	fin := mustApply(t, st, running, end)
	if fin.Status != model.StatusSucceeded || !fin.FinishedAt.Equal(end.At) || string(fin.Result) != `{"exit_code": 0}` || fin.Driver != "gvisor" {
		t.Fatalf("end: got %+v", fin)
	}
	wantCredits(t, st, f.ws.ID, 8, 0)
	tc = must[model.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, ex.ID))
	switch {
	case tc.Status != model.StatusSucceeded, tc.ExitCode == nil || *tc.ExitCode != 0, tc.CreditsCharged != 2, tc.Driver != "gvisor":
		t.Fatalf("completed tool call: got status %s exit %v credits %d driver %q", tc.Status, tc.ExitCode, tc.CreditsCharged, tc.Driver)
	case !bytes.Equal(tc.StdoutPreview, stdout[:model.PreviewLimit]) || !tc.StdoutTruncated:
		t.Fatalf("stdout preview: got %d bytes (truncated %v), want %d, truncated", len(tc.StdoutPreview), tc.StdoutTruncated, model.PreviewLimit)
	case !bytes.Equal(tc.StderrPreview, stderr) || !tc.StderrTruncated:
		t.Fatalf("stderr preview: got %q (truncated %v), want %q, truncated", tc.StderrPreview, tc.StderrTruncated, stderr)
	case !tc.StartedAt.Equal(started) || !tc.FinishedAt.Equal(end.At):
		t.Fatalf("tool call timings: created %v started %v finished %v, want started %v finished %v", tc.CreatedAt, tc.StartedAt, tc.FinishedAt, started, end.At)
	}
	inv := must[store.Page[model.ToolInvocation]](t, "ListToolInvocations")(st.ListToolInvocations(ctx, f.ws.ID, store.ToolCallFilter{}))
	if len(inv.Items) != 1 || inv.Items[0].ExecutionID != ex.ID || inv.Items[0].Credits != 2 || inv.Items[0].Status != model.StatusSucceeded ||
		inv.Items[0].Driver != "gvisor" || inv.Items[0].Queued != end.Invocation.Queued || inv.Items[0].Ran != end.Invocation.Ran ||
		!inv.Items[0].CreatedAt.Equal(end.At) {
		t.Fatalf("tool invocations: got %+v, want the step's %+v", inv.Items, end.Invocation)
	}

	_, err = st.Apply(ctx, ex.ID, ending(running, model.StatusFailed, false))
	wantClass(t, "ending twice", err, errdefs.ErrConflict)
	_, err = st.Apply(ctx, "ex_nope", ending(running, model.StatusFailed, false))
	wantClass(t, "ending an unknown execution", err, errdefs.ErrNotFound)
	_, err = st.Apply(ctx, "ex_nope", start("runc"))
	wantClass(t, "starting an unknown execution", err, errdefs.ErrNotFound)
	wantCredits(t, st, f.ws.ID, 8, 0)

	// Every ending that commits charges the reservation, whatever its
	// status: what is charged is the capability layer's decision.
	for _, status := range []model.ExecutionStatus{model.StatusFailed, model.StatusTimedOut, model.StatusOOMKilled, model.StatusKilled} {
		t.Run(string(status), func(t *testing.T) {
			before := must[model.Credits](t, "GetCredits")(st.GetCredits(ctx, f.ws.ID))
			a := f.admit(t, st, "loop "+string(status), 1)
			run(t, st, a.Execution, "runc", status, true)
			wantCredits(t, st, f.ws.ID, before.Available-1, 0)
		})
	}
}

func testLaunchFailed(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "launch")
	mustGrant(t, st, f.ws.ID, 4)
	for _, tc := range []struct {
		name    string
		started bool
		status  model.ExecutionStatus
	}{
		{"launch failed before start", false, model.StatusLaunchFailed},
		{"launch failed after start", true, model.StatusLaunchFailed},
		{"failed before start", false, model.StatusFailed},
		{"killed before start", false, model.StatusKilled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ex := f.admit(t, st, tc.name, 2).Execution
			if tc.started {
				ex = mustApply(t, st, ex, start("runc"))
			}
			end := ending(ex, tc.status, false)
			end.Result = []byte(`{"error":"image missing"}`)
			mustApply(t, st, ex, end)
			wantCredits(t, st, f.ws.ID, 4, 0)
			tcall := must[model.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, ex.ID))
			if tcall.CreditsCharged != 0 || tcall.Status != tc.status {
				t.Fatalf("tool call: got status %s credits %d, want %s and 0", tcall.Status, tcall.CreditsCharged, tc.status)
			}
			r := must[store.Page[model.LedgerEntry]](t, "ListLedger")(st.ListLedger(ctx, f.ws.ID, store.PageRequest{Limit: 1}))
			if r.Items[0].Kind != model.LedgerRelease || r.Items[0].ExecutionID != ex.ID {
				t.Fatalf("last ledger entry: got %+v, want the release", r.Items[0])
			}
		})
	}
}

// testCompareAndSet applies steps whose from-status the execution has left:
// each is ErrConflict and changes nothing, neither the execution nor its
// tool_calls row, reservation, approval request or chain.
func testCompareAndSet(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "cas")
	mustGrant(t, st, f.ws.ID, 10)
	queued := f.admit(t, st, "queued", 2).Execution
	pending := mustAdmit(t, st, f.newExec("pending"), waiting(2, `{}`, nowPlus(600))).Execution
	ended := f.admit(t, st, "ended", 2).Execution
	ended = run(t, st, ended, "runc", model.StatusSucceeded, true)
	approved := mustAdmit(t, st, f.newExec("approved"), waiting(2, `{}`, nowPlus(600))).Execution
	approved = mustApply(t, st, approved, decision(approved, true, f.approver.ID, "fine"))
	for _, tc := range []struct {
		name string
		ex   model.Execution
		step model.Step
	}{
		{"starting one awaiting approval", pending, model.Step{From: model.StatusQueued, To: model.StatusRunning, Driver: "runc"}},
		{"ending one awaiting approval as if running", pending, ending(model.Execution{Status: model.StatusRunning, ReservationID: pending.ReservationID,
			Credits: 2, Tool: pending.Tool, Runtime: pending.Runtime}, model.StatusKilled, true)},
		{"deciding an approved one again", approved, decision(model.Execution{Status: model.StatusAwaitingApproval}, false, f.approver.ID, "")},
		{"ending a queued one as if running", queued, ending(model.Execution{Status: model.StatusRunning, ReservationID: queued.ReservationID,
			Credits: 2, Tool: queued.Tool, Runtime: queued.Runtime}, model.StatusSucceeded, true)},
		{"starting an ended one", ended, start("runc")},
		{"cancelling an ended one", ended, cancel(model.Execution{Status: model.StatusQueued, ReservationID: ended.ReservationID}, "late")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			head := must[model.ChainHead](t, "ChainHead")(st.ChainHead(ctx, f.ws.ID))
			credits := must[model.Credits](t, "GetCredits")(st.GetCredits(ctx, f.ws.ID))
			before := must[model.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, tc.ex.ID))
			tc.step.Audit = []model.NewEvent{{Type: "test.refused"}}
			_, err := st.Apply(ctx, tc.ex.ID, tc.step)
			wantClass(t, "Apply", err, errdefs.ErrConflict)
			if ex := must[model.Execution](t, "GetExecution")(st.GetExecution(ctx, f.ws.ID, tc.ex.ID)); ex.Status != tc.ex.Status {
				t.Errorf("execution after a refused step: got %s, want %s", ex.Status, tc.ex.Status)
			}
			if after := must[model.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, tc.ex.ID)); after.Status != before.Status ||
				after.CreditsCharged != before.CreditsCharged || !after.FinishedAt.Equal(before.FinishedAt) {
				t.Errorf("tool call after a refused step: got %+v, want %+v", after, before)
			}
			if h := must[model.ChainHead](t, "ChainHead")(st.ChainHead(ctx, f.ws.ID)); h != head {
				t.Errorf("a refused step moved the chain from %+v to %+v", head, h)
			}
			if c := must[model.Credits](t, "GetCredits")(st.GetCredits(ctx, f.ws.ID)); c != credits {
				t.Errorf("a refused step changed the credits from %+v to %+v", credits, c)
			}
		})
	}
	if a := must[model.Approval](t, "GetApproval")(st.GetApproval(ctx, f.ws.ID, pending.ApprovalID)); a.Status != model.ApprovalPending {
		t.Errorf("approval after refused steps: got %s, want pending", a.Status)
	}
	if p := must[store.Page[model.ToolInvocation]](t, "ListToolInvocations")(st.ListToolInvocations(ctx, f.ws.ID, store.ToolCallFilter{})); len(p.Items) != 1 {
		t.Errorf("tool_invocations rows after refused steps: got %d, want the one ended", len(p.Items))
	}
}

func testAdmissionValidation(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "valid")
	other := newFixture(t, st, "valid-other")
	mustGrant(t, st, f.ws.ID, 10)
	for _, tc := range []struct {
		name string
		mod  func(e *store.NewExecution, s *model.Step)
	}{
		{"no workspace", func(e *store.NewExecution, _ *model.Step) { e.WorkspaceID = "" }},
		{"no runtime", func(e *store.NewExecution, _ *model.Step) { e.Runtime = "" }},
		{"no request", func(e *store.NewExecution, _ *model.Step) { e.Request = nil }},
		{"bad request JSON", func(e *store.NewExecution, _ *model.Step) { e.Request = []byte(`{"a":`) }},
		{"bad input hash", func(e *store.NewExecution, _ *model.Step) { e.InputSHA256 = "ABC" }},
		{"another workspace's key", func(e *store.NewExecution, _ *model.Step) { e.KeyID = other.agent.ID }},
		{"unknown key", func(e *store.NewExecution, _ *model.Step) { e.KeyID = "key_nope" }},
		{"negative credits", func(_ *store.NewExecution, s *model.Step) { s.Credits.Amount = -1 }},
		{"an amount without a movement", func(_ *store.NewExecution, s *model.Step) { s.Credits = model.CreditMove{Amount: 2} }},
		{"a commit", func(_ *store.NewExecution, s *model.Step) { s.Credits.Kind = model.LedgerCommit }},
		{"running at once", func(_ *store.NewExecution, s *model.Step) { s.To, s.Driver = model.StatusRunning, "runc" }},
		{"ended at once", func(_ *store.NewExecution, s *model.Step) {
			s.To, s.Invocation = model.StatusLaunchFailed, &model.ToolInvocation{Status: model.StatusLaunchFailed}
		}},
		{"awaiting approval without a request", func(_ *store.NewExecution, s *model.Step) { s.To = model.StatusAwaitingApproval }},
		{"a request to a queued execution", func(_ *store.NewExecution, s *model.Step) {
			s.Approval = model.ApprovalChange{To: model.ApprovalPending, Card: []byte(`{}`), ExpiresAt: nowPlus(60)}
		}},
		{"approval without expiry", func(_ *store.NewExecution, s *model.Step) {
			*s = waiting(0, `{}`, time.Time{})
		}},
		{"approval without card", func(_ *store.NewExecution, s *model.Step) { *s = waiting(0, ``, nowPlus(60)) }},
		{"a driver", func(_ *store.NewExecution, s *model.Step) { s.Driver = "runc" }},
		{"a result", func(_ *store.NewExecution, s *model.Step) { s.Result = []byte(`{}`) }},
		{"event without type", func(_ *store.NewExecution, s *model.Step) { s.Audit = []model.NewEvent{{Actor: "x"}} }},
		{"event with bad data", func(_ *store.NewExecution, s *model.Step) { s.Audit = []model.NewEvent{{Type: "x", Data: []byte("{")}} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, s := f.newExec("x"), admission(2)
			tc.mod(&e, &s)
			_, err := st.Admit(ctx, e, s)
			wantClass(t, "Admit", err, errdefs.ErrInvalidArgument)
		})
	}
	if p := must[store.Page[model.Execution]](t, "ListExecutions")(st.ListExecutions(ctx, f.ws.ID, store.ExecutionFilter{})); len(p.Items) != 0 {
		t.Fatalf("executions after refused admissions: got %d, want none", len(p.Items))
	}
	wantCredits(t, st, f.ws.ID, 10, 0)
}

// testStepValidation refuses steps that would leave the records
// inconsistent; each writes nothing.
func testStepValidation(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "steps")
	mustGrant(t, st, f.ws.ID, 10)
	queued := f.admit(t, st, "queued", 2).Execution
	free := f.admit(t, st, "free", 0).Execution
	pending := mustAdmit(t, st, f.newExec("pending"), waiting(2, `{}`, nowPlus(600))).Execution
	running := mustApply(t, st, f.admit(t, st, "running", 2).Execution, start("runc"))
	for _, tc := range []struct {
		name string
		ex   model.Execution
		mod  func(s *model.Step)
		base model.Step
	}{
		{"a start without a driver", queued, func(s *model.Step) { s.Driver = "" }, start("runc")},
		{"a step to itself", queued, func(s *model.Step) { s.To = model.StatusQueued }, start("runc")},
		{"a step from an end", queued, func(s *model.Step) { s.From = model.StatusSucceeded }, start("runc")},
		{"an unknown status", queued, func(s *model.Step) { s.To = "exploded" }, start("runc")},
		{"a start that settles", queued, func(s *model.Step) { s.Credits.Kind = model.LedgerCommit }, start("runc")},
		{"a start with a result", queued, func(s *model.Step) { s.Result = []byte(`{}`) }, start("runc")},
		{"a reservation", queued, func(s *model.Step) { s.Credits = model.CreditMove{Kind: model.LedgerReserve, Amount: 1} }, start("runc")},
		{"an end without its row", running, func(s *model.Step) { s.Invocation = nil }, ending(running, model.StatusSucceeded, true)},
		{"a row of another status", running, func(s *model.Step) { s.Invocation.Status = model.StatusFailed }, ending(running, model.StatusSucceeded, true)},
		{"a row that misstates the charge", running, func(s *model.Step) { s.Invocation.Credits = 0 }, ending(running, model.StatusSucceeded, true)},
		{"a row that charges a release", running, func(s *model.Step) { s.Invocation.Credits = 2 }, ending(running, model.StatusFailed, false)},
		{"a negative duration", running, func(s *model.Step) { s.Invocation.Ran = -time.Second }, ending(running, model.StatusFailed, false)},
		{"an end with its reservation open", running, func(s *model.Step) { s.Credits = model.CreditMove{} }, ending(running, model.StatusFailed, false)},
		{"a commit without a reservation", free, func(s *model.Step) { s.Credits.Kind = model.LedgerCommit }, ending(free, model.StatusLaunchFailed, false)},
		{"a row on a live status", queued, func(s *model.Step) { s.Invocation = &model.ToolInvocation{Status: model.StatusRunning} }, start("runc")},
		{"a decision without its decider", pending, func(s *model.Step) { s.Approval.DecidedBy = "" }, decision(pending, true, f.approver.ID, "")},
		{"an expiry with a decider", pending, func(s *model.Step) { s.Approval.DecidedBy = f.approver.ID }, expiry(pending)},
		{"a request created late", pending, func(s *model.Step) { s.Approval.To = model.ApprovalPending }, decision(pending, true, f.approver.ID, "")},
		{"closing a request that is not there", queued, func(*model.Step) {}, decision(model.Execution{ID: queued.ID, Status: model.StatusQueued,
			ReservationID: queued.ReservationID, Credits: 2}, false, f.approver.ID, "")},
		{"an invalid event", running, func(s *model.Step) { s.Audit = []model.NewEvent{{Type: ""}} }, ending(running, model.StatusFailed, false)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.base
			tc.mod(&s)
			_, err := st.Apply(ctx, tc.ex.ID, s)
			wantClass(t, "Apply", err, errdefs.ErrInvalidArgument)
			if ex := must[model.Execution](t, "GetExecution")(st.GetExecution(ctx, f.ws.ID, tc.ex.ID)); ex.Status != tc.ex.Status {
				t.Errorf("execution after a refused step: got %s, want %s", ex.Status, tc.ex.Status)
			}
		})
	}
	wantCredits(t, st, f.ws.ID, 4, 6)
	if h := must[model.ChainHead](t, "ChainHead")(st.ChainHead(ctx, f.ws.ID)); h.Seq != 0 {
		t.Errorf("events after refused steps: got %d, want none", h.Seq)
	}
}

func testListings(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "lists")
	other := newFixture(t, st, "lists-other")
	other.admit(t, st, "not mine", 0)
	statuses := []model.ExecutionStatus{model.StatusSucceeded, model.StatusFailed, model.StatusLaunchFailed}
	var made []model.Execution
	for i := range 11 {
		a := f.admit(t, st, fmt.Sprint("job ", i), 0)
		if i%4 != 3 { // every fourth stays queued
			run(t, st, a.Execution, "runc", statuses[i%3], false)
		}
		made = append(made, must[model.Execution](t, "GetExecution")(st.GetExecution(ctx, f.ws.ID, a.Execution.ID)))
	}
	// Newest first: reverse creation order, ties broken by id descending.
	want := slices.Clone(made)
	slices.SortStableFunc(want, func(a, b model.Execution) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	exID := func(e model.Execution) string { return e.ID }
	gotEx := allPages(t, 3, exID, func(p store.PageRequest) (store.Page[model.Execution], error) {
		return st.ListExecutions(ctx, f.ws.ID, store.ExecutionFilter{PageRequest: p})
	})
	if ids(gotEx, exID) != ids(want, exID) {
		t.Fatalf("ListExecutions: got %v, want %v", ids(gotEx, exID), ids(want, exID))
	}

	tcID := func(c model.ToolCall) string { return c.ExecutionID }
	since, until := made[2].CreatedAt, made[8].CreatedAt
	for _, tc := range []struct {
		name   string
		filter store.ToolCallFilter
		keep   func(e model.Execution) bool
	}{
		{"all", store.ToolCallFilter{}, func(model.Execution) bool { return true }},
		{"by status", store.ToolCallFilter{Statuses: []model.ExecutionStatus{model.StatusFailed, model.StatusQueued}},
			func(e model.Execution) bool { return e.Status == model.StatusFailed || e.Status == model.StatusQueued }},
		{"since", store.ToolCallFilter{Since: since}, func(e model.Execution) bool { return !e.CreatedAt.Before(since) }},
		{"until", store.ToolCallFilter{Until: until}, func(e model.Execution) bool { return e.CreatedAt.Before(until) }},
		{"range and status", store.ToolCallFilter{Since: since, Until: until, Statuses: []model.ExecutionStatus{model.StatusSucceeded}},
			func(e model.Execution) bool {
				return !e.CreatedAt.Before(since) && e.CreatedAt.Before(until) && e.Status == model.StatusSucceeded
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var wantIDs []model.Execution
			for _, e := range want {
				if tc.keep(e) {
					wantIDs = append(wantIDs, e)
				}
			}
			got := allPages(t, 2, tcID, func(p store.PageRequest) (store.Page[model.ToolCall], error) {
				flt := tc.filter
				flt.PageRequest = p
				return st.ListToolCalls(ctx, f.ws.ID, flt)
			})
			if ids(got, tcID) != ids(wantIDs, exID) {
				t.Fatalf("ListToolCalls: got %v, want %v", ids(got, tcID), ids(wantIDs, exID))
			}
			gotEx := allPages(t, 4, exID, func(p store.PageRequest) (store.Page[model.Execution], error) {
				return st.ListExecutions(ctx, f.ws.ID, store.ExecutionFilter{PageRequest: p, Statuses: tc.filter.Statuses,
					Since: tc.filter.Since, Until: tc.filter.Until})
			})
			if ids(gotEx, exID) != ids(wantIDs, exID) {
				t.Fatalf("ListExecutions: got %v, want %v", ids(gotEx, exID), ids(wantIDs, exID))
			}
		})
	}

	ended := 0
	for _, e := range made {
		if e.Status.Terminal() {
			ended++
		}
	}
	inv := allPages(t, 5, func(i model.ToolInvocation) string { return i.ID }, func(p store.PageRequest) (store.Page[model.ToolInvocation], error) {
		return st.ListToolInvocations(ctx, f.ws.ID, store.ToolCallFilter{PageRequest: p})
	})
	if len(inv) != ended {
		t.Fatalf("tool invocations: got %d, want one per ended execution (%d)", len(inv), ended)
	}
	failed := must[store.Page[model.ToolInvocation]](t, "ListToolInvocations")(st.ListToolInvocations(ctx, f.ws.ID,
		store.ToolCallFilter{Statuses: []model.ExecutionStatus{model.StatusFailed}}))
	for _, i := range failed.Items {
		if i.Status != model.StatusFailed {
			t.Fatalf("ListToolInvocations by status returned %s", i.Status)
		}
	}

	_, err := st.ListToolCalls(ctx, f.ws.ID, store.ToolCallFilter{PageRequest: store.PageRequest{Cursor: "%%%"}})
	wantClass(t, "ListToolCalls with a bad cursor", err, errdefs.ErrInvalidArgument)
	p := must[store.Page[model.ToolCall]](t, "ListToolCalls")(st.ListToolCalls(ctx, f.ws.ID, store.ToolCallFilter{PageRequest: store.PageRequest{Limit: 100000}}))
	if len(p.Items) != len(made) || p.Next != "" {
		t.Fatalf("an over-large limit: got %d items and next %q", len(p.Items), p.Next)
	}
}

// testLiveExecutions lists what a daemon that starts finds live, and ends
// it as recovery does, one step each: an event the store refuses rolls the
// step back with it, and a second pass finds nothing.
func testLiveExecutions(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "recover")
	other := newFixture(t, st, "recover-other")
	mustGrant(t, st, f.ws.ID, 20)
	queued := f.admit(t, st, "queued", 2)
	running := f.admit(t, st, "running", 2)
	mustApply(t, st, running.Execution, start("runc"))
	awaiting := mustAdmit(t, st, f.newExec("waiting"), waiting(2, `{}`, nowPlus(600)))
	done := f.admit(t, st, "done", 2)
	run(t, st, done.Execution, "runc", model.StatusSucceeded, true)
	elsewhere := other.admit(t, st, "elsewhere", 0)
	wantCredits(t, st, f.ws.ID, 12, 6)

	live := must[[]model.Execution](t, "ListLiveExecutions")(st.ListLiveExecutions(ctx))
	wantIDs := []string{queued.Execution.ID, running.Execution.ID, elsewhere.Execution.ID}
	if got := ids(live, func(e model.Execution) string { return e.ID }); got != fmt.Sprint(wantIDs) {
		t.Fatalf("ListLiveExecutions: got %v, want %v, oldest first", got, wantIDs)
	}
	result := json.RawMessage(`{"error":"interrupted by a daemon restart"}`)
	recovery := func(ex model.Execution, events ...model.NewEvent) model.Step {
		s := ending(ex, model.StatusFailed, false, events...)
		s.Result = result
		return s
	}
	_, err := st.Apply(ctx, live[0].ID, recovery(live[0], model.NewEvent{Type: ""}))
	wantClass(t, "a recovery with an invalid event", err, errdefs.ErrInvalidArgument)
	wantCredits(t, st, f.ws.ID, 12, 6)
	for _, ex := range live {
		got := mustApply(t, st, ex, recovery(ex, model.NewEvent{Type: "execution.recovered", Code: "EXE002W", Actor: "system"}))
		if got.Status != model.StatusFailed || string(got.Result) != string(result) || got.FinishedAt.IsZero() {
			t.Fatalf("recovered execution: got %+v", got)
		}
	}
	// Nothing is charged for an execution that produced no result; the one
	// awaiting approval keeps its reservation.
	wantCredits(t, st, f.ws.ID, 16, 2)
	for _, id := range wantIDs[:2] {
		tc := must[model.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, id))
		if tc.Status != model.StatusFailed || tc.CreditsCharged != 0 {
			t.Fatalf("tool call of a recovered execution: got status %s credits %d", tc.Status, tc.CreditsCharged)
		}
		p := must[store.Page[model.Event]](t, "ListEvents")(st.ListEvents(ctx, f.ws.ID, store.EventFilter{ExecutionID: id, Types: []string{"execution.recovered"}}))
		if len(p.Items) != 1 {
			t.Fatalf("execution.recovered events of %s: got %d, want 1", id, len(p.Items))
		}
	}
	if e := must[model.Execution](t, "GetExecution")(st.GetExecution(ctx, f.ws.ID, awaiting.Execution.ID)); e.Status != model.StatusAwaitingApproval {
		t.Fatalf("an execution awaiting approval was recovered: %s", e.Status)
	}
	if again := must[[]model.Execution](t, "ListLiveExecutions")(st.ListLiveExecutions(ctx)); len(again) != 0 {
		t.Fatalf("ListLiveExecutions after the recovery: got %d executions, want none", len(again))
	}
}
