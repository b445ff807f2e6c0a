package storetest

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

func testGrant(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "grant")
	c := must[model.Credits](t, "GrantCredits")(st.GrantCredits(ctx, f.ws.ID, 10, "welcome", nil))
	if c.Available != 10 || c.Reserved != 0 {
		t.Fatalf("GrantCredits: got %+v, want 10 available", c)
	}
	mustGrant(t, st, f.ws.ID, 5)
	wantCredits(t, st, f.ws.ID, 15, 0)
	p := must[store.Page[model.LedgerEntry]](t, "ListLedger")(st.ListLedger(ctx, f.ws.ID, store.PageRequest{}))
	if len(p.Items) != 2 || p.Items[0].Amount != 5 || p.Items[1].Note != "welcome" || p.Items[1].Kind != model.LedgerGrant {
		t.Fatalf("ListLedger: got %+v, want the two grants newest first", p.Items)
	}
	for _, tc := range []struct {
		name   string
		ws     string
		amount int64
		class  error
	}{
		{"zero", f.ws.ID, 0, errdefs.ErrInvalidArgument},
		{"negative", f.ws.ID, -3, errdefs.ErrInvalidArgument},
		{"absurd", f.ws.ID, 1 << 62, errdefs.ErrInvalidArgument},
		{"unknown workspace", "ws_nope", 1, errdefs.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := st.GrantCredits(ctx, tc.ws, tc.amount, "", nil)
			wantClass(t, "GrantCredits", err, tc.class)
		})
	}
	wantCredits(t, st, f.ws.ID, 15, 0)
}

// testReserveCommitRelease moves credits through admissions and ends: a
// reservation taken with the admission, committed or released exactly
// once by the step that ends the execution.
func testReserveCommitRelease(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "ledger")
	mustGrant(t, st, f.ws.ID, 10)

	a := f.admit(t, st, "print(1)", 2)
	if a.Reservation == nil || a.Reservation.Amount != 2 || a.Reservation.Status != model.ReservationOpen ||
		a.Execution.ReservationID != a.Reservation.ID || a.Execution.Credits != 2 {
		t.Fatalf("Admit reservation: got %+v (execution's %q, %d)", a.Reservation, a.Execution.ReservationID, a.Execution.Credits)
	}
	wantCredits(t, st, f.ws.ID, 8, 2)
	run(t, st, a.Execution, "runc", model.StatusSucceeded, true)
	wantCredits(t, st, f.ws.ID, 8, 0)
	tc := must[model.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, a.Execution.ID))
	if tc.CreditsCharged != 2 {
		t.Fatalf("tool call credits after the commit: got %d, want 2", tc.CreditsCharged)
	}

	b := f.admit(t, st, "print(2)", 3)
	wantCredits(t, st, f.ws.ID, 5, 3)
	mustApply(t, st, b.Execution, ending(b.Execution, model.StatusLaunchFailed, false))
	wantCredits(t, st, f.ws.ID, 8, 0)

	// An admission that reserves nothing has no reservation to settle.
	c := f.admit(t, st, "print(3)", 0)
	if c.Reservation != nil || c.Execution.ReservationID != "" || c.Execution.Credits != 0 {
		t.Fatalf("Admit with no credits reserved %+v", c.Reservation)
	}
	mustApply(t, st, c.Execution, ending(c.Execution, model.StatusLaunchFailed, false))
	wantCredits(t, st, f.ws.ID, 8, 0)

	p := must[store.Page[model.LedgerEntry]](t, "ListLedger")(st.ListLedger(ctx, f.ws.ID, store.PageRequest{}))
	var kinds []model.LedgerKind
	for _, e := range p.Items {
		kinds = append(kinds, e.Kind)
	}
	want := []model.LedgerKind{model.LedgerRelease, model.LedgerReserve, model.LedgerCommit, model.LedgerReserve, model.LedgerGrant}
	if fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Fatalf("ledger, newest first: got %v, want %v", kinds, want)
	}
}

func testReserveShortBalance(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "short")
	mustGrant(t, st, f.ws.ID, 3)
	f.admit(t, st, "a", 2)

	e := f.newExec("b")
	e.IdempotencyKey = "retry-me"
	step := waiting(2, `{}`, nowPlus(60), model.NewEvent{Type: "capability.invoke_allowed", Actor: f.agent.ID})
	_, err := st.Admit(ctx, e, step)
	wantClass(t, "Admit on a short balance", err, errdefs.ErrResourceExhausted)
	wantCredits(t, st, f.ws.ID, 1, 2)

	// Nothing of the refused admission remains: no execution, tool call,
	// approval or event, and the idempotency key is still free.
	if p := must[store.Page[model.Execution]](t, "ListExecutions")(st.ListExecutions(ctx, f.ws.ID, store.ExecutionFilter{})); len(p.Items) != 1 {
		t.Fatalf("executions after a refused admission: got %d, want 1", len(p.Items))
	}
	if p := must[store.Page[model.ToolCall]](t, "ListToolCalls")(st.ListToolCalls(ctx, f.ws.ID, store.ToolCallFilter{})); len(p.Items) != 1 {
		t.Fatalf("tool calls after a refused admission: got %d, want 1", len(p.Items))
	}
	if p := must[store.Page[model.Approval]](t, "ListApprovals")(st.ListApprovals(ctx, f.ws.ID, store.ApprovalFilter{})); len(p.Items) != 0 {
		t.Fatalf("approvals after a refused admission: got %d, want 0", len(p.Items))
	}
	if h := must[model.ChainHead](t, "ChainHead")(st.ChainHead(ctx, f.ws.ID)); h.Seq != 0 {
		t.Fatalf("chain head after a refused admission: got seq %d, want 0", h.Seq)
	}
	mustGrant(t, st, f.ws.ID, 1)
	adm := mustAdmit(t, st, e, step)
	if adm.Replayed {
		t.Fatalf("the retry after a refusal was taken for a replay")
	}
	wantCredits(t, st, f.ws.ID, 0, 4)
	_, err = st.Admit(ctx, f.newExec("c"), admission(1))
	wantClass(t, "Admit on an empty balance", err, errdefs.ErrResourceExhausted)
	wantCredits(t, st, f.ws.ID, 0, 4)
}

// testConcurrentReservations runs 50 goroutines that each admit with a
// reservation and then end, committing or releasing it, and checks that the
// balance comes out exact.
func testConcurrentReservations(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "concurrent")
	const (
		workers = 50
		cost    = 2
		granted = 70 // less than workers*cost: some reservations must fail
	)
	mustGrant(t, st, f.ws.ID, granted)
	var (
		wg                          sync.WaitGroup
		mu                          sync.Mutex
		committed, released, denied int
		errs                        []error
	)
	for i := range workers {
		wg.Go(func() {
			commit := i%2 == 0
			err := func() error {
				adm, err := st.Admit(ctx, f.newExec(fmt.Sprint("job ", i)), admission(cost))
				if err != nil {
					return err
				}
				to := model.StatusSucceeded
				if !commit {
					to = model.StatusLaunchFailed
				}
				_, err = st.Apply(ctx, adm.Execution.ID, ending(adm.Execution, to, commit))
				return err
			}()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errdefs.IsResourceExhausted(err):
				denied++
			case err != nil:
				errs = append(errs, fmt.Errorf("worker %d: %w", i, err))
			case commit:
				committed++
			default:
				released++
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	if committed+released+denied != workers || committed == 0 {
		t.Fatalf("got %d committed, %d released, %d refused; want %d in all, some committed", committed, released, denied, workers)
	}
	wantCredits(t, st, f.ws.ID, granted-cost*int64(committed), 0)
}

// testConcurrentAdmissions runs 50 concurrent admissions against a balance
// that covers 30 of them.
func testConcurrentAdmissions(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "admissions")
	const workers, cost, granted = 50, 2, 60
	mustGrant(t, st, f.ws.ID, granted)
	var (
		wg              sync.WaitGroup
		mu              sync.Mutex
		admitted, short int
		errs            []error
	)
	for i := range workers {
		wg.Go(func() {
			_, err := st.Admit(ctx, f.newExec(fmt.Sprint("job ", i)),
				admission(cost, model.NewEvent{Type: "capability.invoke_allowed", Actor: f.agent.ID}))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				admitted++
			case errdefs.IsResourceExhausted(err):
				short++
			default:
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if admitted != granted/cost || short != workers-granted/cost {
		t.Fatalf("got %d admitted and %d refused, want %d and %d", admitted, short, granted/cost, workers-granted/cost)
	}
	wantCredits(t, st, f.ws.ID, 0, granted)
	calls := allPages(t, 7, func(c model.ToolCall) string { return c.ID }, func(p store.PageRequest) (store.Page[model.ToolCall], error) {
		return st.ListToolCalls(ctx, f.ws.ID, store.ToolCallFilter{PageRequest: p})
	})
	if len(calls) != admitted {
		t.Fatalf("tool calls: got %d, want %d", len(calls), admitted)
	}
	if h := must[model.ChainHead](t, "ChainHead")(st.ChainHead(ctx, f.ws.ID)); h.Seq != int64(admitted) {
		t.Fatalf("events: got %d, want one per admission (%d)", h.Seq, admitted)
	}
	if ok, broken, err := st.VerifyChain(ctx, f.ws.ID); err != nil || !ok {
		t.Fatalf("VerifyChain after concurrent admissions: ok %v, broken %+v, err %v", ok, broken, err)
	}
}

// testConcurrentSteps applies ten steps from the same status to one
// execution at once, half of them committing its reservation and half
// releasing it: the compare-and-set lets exactly one apply, the others are
// ErrConflict, and the reservation is settled once.
func testConcurrentSteps(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "double")
	mustGrant(t, st, f.ws.ID, 5)
	ex := mustApply(t, st, f.admit(t, st, "x", 5).Execution, start("runc"))
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		ok, confl int
		errs      []error
	)
	for i := range 10 {
		wg.Go(func() {
			s := ending(ex, model.StatusSucceeded, true, model.NewEvent{Type: "execution.finished"})
			if i%2 == 1 {
				s = ending(ex, model.StatusLaunchFailed, false, model.NewEvent{Type: "execution.finished"})
			}
			_, err := st.Apply(ctx, ex.ID, s)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errdefs.IsConflict(err):
				confl++
			default:
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if ok != 1 || confl != 9 {
		t.Fatalf("10 concurrent steps: got %d applied and %d conflicts, want 1 and 9", ok, confl)
	}
	c := must[model.Credits](t, "GetCredits")(st.GetCredits(ctx, f.ws.ID))
	if c.Reserved != 0 || (c.Available != 0 && c.Available != 5) {
		t.Fatalf("credits after one settlement: got %+v", c)
	}
	CheckLedger(t, st, f.ws.ID)
	if h := must[model.ChainHead](t, "ChainHead")(st.ChainHead(ctx, f.ws.ID)); h.Seq != 1 {
		t.Fatalf("events after 10 concurrent steps: got %d, want the one that applied", h.Seq)
	}
	if p := must[store.Page[model.ToolInvocation]](t, "ListToolInvocations")(st.ListToolInvocations(ctx, f.ws.ID, store.ToolCallFilter{})); len(p.Items) != 1 {
		t.Fatalf("tool_invocations rows after 10 concurrent steps: got %d, want 1", len(p.Items))
	}
}
