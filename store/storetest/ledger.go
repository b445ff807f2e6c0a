package storetest

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/store"
)

func testGrant(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "grant")
	c := must[store.Credits](t, "GrantCredits")(st.GrantCredits(ctx, f.ws.ID, 10, "welcome", nil))
	if c.Available != 10 || c.Reserved != 0 {
		t.Fatalf("GrantCredits: got %+v, want 10 available", c)
	}
	mustGrant(t, st, f.ws.ID, 5)
	wantCredits(t, st, f.ws.ID, 15, 0)
	p := must[store.Page[store.LedgerEntry]](t, "ListLedger")(st.ListLedger(ctx, f.ws.ID, store.PageRequest{}))
	if len(p.Items) != 2 || p.Items[0].Amount != 5 || p.Items[1].Note != "welcome" || p.Items[1].Kind != store.LedgerGrant {
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

func testReserveCommitRelease(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "ledger")
	other := newFixture(t, st, "other")
	mustGrant(t, st, f.ws.ID, 10)

	a := mustCreate(t, st, f.newExec("print(1)", 2))
	if a.Reservation == nil || a.Reservation.Amount != 2 || a.Reservation.Status != store.ReservationOpen ||
		a.Execution.ReservationID != a.Reservation.ID {
		t.Fatalf("CreateExecution reservation: got %+v (execution's %q)", a.Reservation, a.Execution.ReservationID)
	}
	wantCredits(t, st, f.ws.ID, 8, 2)

	r := must[store.Reservation](t, "Commit")(st.Commit(ctx, a.Reservation.ID))
	if r.Status != store.ReservationCommitted || r.SettledAt.IsZero() {
		t.Fatalf("Commit: got %+v", r)
	}
	wantCredits(t, st, f.ws.ID, 8, 0)
	tc := must[store.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, a.Execution.ID))
	if tc.CreditsCharged != 2 {
		t.Fatalf("tool call credits after Commit: got %d, want 2", tc.CreditsCharged)
	}

	b := mustCreate(t, st, f.newExec("print(2)", 3))
	wantCredits(t, st, f.ws.ID, 5, 3)
	r = must[store.Reservation](t, "Release")(st.Release(ctx, b.Reservation.ID))
	if r.Status != store.ReservationReleased {
		t.Fatalf("Release: got %+v", r)
	}
	wantCredits(t, st, f.ws.ID, 8, 0)

	// A reservation taken separately from the admission.
	c := mustCreate(t, st, f.newExec("print(3)", 0))
	if c.Reservation != nil || c.Execution.ReservationID != "" {
		t.Fatalf("CreateExecution with no credits reserved %+v", c.Reservation)
	}
	rc := must[store.Reservation](t, "Reserve")(st.Reserve(ctx, f.ws.ID, c.Execution.ID, 4))
	wantCredits(t, st, f.ws.ID, 4, 4)
	got := must[store.Execution](t, "GetExecution")(st.GetExecution(ctx, f.ws.ID, c.Execution.ID))
	if got.ReservationID != rc.ID {
		t.Fatalf("execution's reservation: got %q, want %q", got.ReservationID, rc.ID)
	}

	for _, tc := range []struct {
		name  string
		err   error
		class error
	}{
		{"double commit", second(st.Commit(ctx, a.Reservation.ID)), errdefs.ErrConflict},
		{"release after commit", second(st.Release(ctx, a.Reservation.ID)), errdefs.ErrConflict},
		{"double release", second(st.Release(ctx, b.Reservation.ID)), errdefs.ErrConflict},
		{"commit after release", second(st.Commit(ctx, b.Reservation.ID)), errdefs.ErrConflict},
		{"commit unknown", second(st.Commit(ctx, "res_nope")), errdefs.ErrNotFound},
		{"release unknown", second(st.Release(ctx, "res_nope")), errdefs.ErrNotFound},
		{"second reservation", second(st.Reserve(ctx, f.ws.ID, c.Execution.ID, 1)), errdefs.ErrConflict},
		{"reserve unknown execution", second(st.Reserve(ctx, f.ws.ID, "ex_nope", 1)), errdefs.ErrNotFound},
		{"reserve another workspace's execution", second(st.Reserve(ctx, other.ws.ID, c.Execution.ID, 1)), errdefs.ErrNotFound},
		{"reserve zero", second(st.Reserve(ctx, f.ws.ID, c.Execution.ID, 0)), errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) { wantClass(t, tc.name, tc.err, tc.class) })
	}
	wantCredits(t, st, f.ws.ID, 4, 4)

	// A finished execution takes no new reservation.
	d := mustCreate(t, st, f.newExec("print(4)", 0))
	must[store.Execution](t, "FinishExecution")(st.FinishExecution(ctx, store.Outcome{ExecutionID: d.Execution.ID, Status: store.StatusLaunchFailed}))
	_, err := st.Reserve(ctx, f.ws.ID, d.Execution.ID, 1)
	wantClass(t, "Reserve on a finished execution", err, errdefs.ErrConflict)
}

func testReserveShortBalance(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "short")
	mustGrant(t, st, f.ws.ID, 3)
	mustCreate(t, st, f.newExec("a", 2))

	e := f.newExec("b", 2)
	e.IdempotencyKey = "retry-me"
	e.Approval = &store.NewApproval{Card: []byte(`{}`), ExpiresAt: nowPlus(60)}
	e.Audit = []store.NewEvent{{Type: "capability.invoke_allowed", Actor: f.agent.ID}}
	_, err := st.CreateExecution(ctx, e)
	wantClass(t, "CreateExecution on a short balance", err, errdefs.ErrResourceExhausted)
	wantCredits(t, st, f.ws.ID, 1, 2)

	// Nothing of the refused admission remains: no execution, tool call,
	// approval or event, and the idempotency key is still free.
	if p := must[store.Page[store.Execution]](t, "ListExecutions")(st.ListExecutions(ctx, f.ws.ID, store.ExecutionFilter{})); len(p.Items) != 1 {
		t.Fatalf("executions after a refused admission: got %d, want 1", len(p.Items))
	}
	if p := must[store.Page[store.ToolCall]](t, "ListToolCalls")(st.ListToolCalls(ctx, f.ws.ID, store.ToolCallFilter{})); len(p.Items) != 1 {
		t.Fatalf("tool calls after a refused admission: got %d, want 1", len(p.Items))
	}
	if p := must[store.Page[store.Approval]](t, "ListApprovals")(st.ListApprovals(ctx, f.ws.ID, store.ApprovalFilter{})); len(p.Items) != 0 {
		t.Fatalf("approvals after a refused admission: got %d, want 0", len(p.Items))
	}
	if h := must[store.ChainHead](t, "ChainHead")(st.ChainHead(ctx, f.ws.ID)); h.Seq != 0 {
		t.Fatalf("chain head after a refused admission: got seq %d, want 0", h.Seq)
	}
	mustGrant(t, st, f.ws.ID, 1)
	adm := mustCreate(t, st, e)
	if adm.Replayed {
		t.Fatalf("the retry after a refusal was taken for a replay")
	}
	wantCredits(t, st, f.ws.ID, 0, 4)

	// The standalone Reserve is refused likewise.
	c := mustCreate(t, st, f.newExec("c", 0))
	_, err = st.Reserve(ctx, f.ws.ID, c.Execution.ID, 1)
	wantClass(t, "Reserve on an empty balance", err, errdefs.ErrResourceExhausted)
	wantCredits(t, st, f.ws.ID, 0, 4)
}

// testConcurrentReservations runs 50 goroutines that each reserve and then
// commit or release, and checks that the balance comes out exact.
func testConcurrentReservations(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "concurrent")
	const (
		workers = 50
		cost    = 2
		granted = 70 // less than workers*cost: some reservations must fail
	)
	mustGrant(t, st, f.ws.ID, granted)
	execs := make([]string, workers)
	for i := range execs {
		execs[i] = mustCreate(t, st, f.newExec(fmt.Sprint("job ", i), 0)).Execution.ID
	}
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
				r, err := st.Reserve(ctx, f.ws.ID, execs[i], cost)
				if err != nil {
					return err
				}
				if commit {
					_, err = st.Commit(ctx, r.ID)
				} else {
					_, err = st.Release(ctx, r.ID)
				}
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

// testConcurrentAdmissions runs 50 concurrent CreateExecution calls against a
// balance that covers 30 of them.
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
			e := f.newExec(fmt.Sprint("job ", i), cost)
			e.Audit = []store.NewEvent{{Type: "capability.invoke_allowed", Actor: f.agent.ID}}
			_, err := st.CreateExecution(ctx, e)
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
	calls := allPages(t, 7, func(c store.ToolCall) string { return c.ID }, func(p store.PageRequest) (store.Page[store.ToolCall], error) {
		return st.ListToolCalls(ctx, f.ws.ID, store.ToolCallFilter{PageRequest: p})
	})
	if len(calls) != admitted {
		t.Fatalf("tool calls: got %d, want %d", len(calls), admitted)
	}
	if h := must[store.ChainHead](t, "ChainHead")(st.ChainHead(ctx, f.ws.ID)); h.Seq != int64(admitted) {
		t.Fatalf("events: got %d, want one per admission (%d)", h.Seq, admitted)
	}
	if ok, broken, err := st.VerifyChain(ctx, f.ws.ID); err != nil || !ok {
		t.Fatalf("VerifyChain after concurrent admissions: ok %v, broken %+v, err %v", ok, broken, err)
	}
}

func testConcurrentDoubleCommit(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "double")
	mustGrant(t, st, f.ws.ID, 5)
	adm := mustCreate(t, st, f.newExec("x", 5))
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		ok, confl int
		errs      []error
	)
	for i := range 10 {
		wg.Go(func() {
			var err error
			if i%2 == 0 {
				_, err = st.Commit(ctx, adm.Reservation.ID)
			} else {
				_, err = st.Release(ctx, adm.Reservation.ID)
			}
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
		t.Fatalf("10 concurrent settlements: got %d successes and %d conflicts, want 1 and 9", ok, confl)
	}
	c := must[store.Credits](t, "GetCredits")(st.GetCredits(ctx, f.ws.ID))
	if c.Reserved != 0 || (c.Available != 0 && c.Available != 5) {
		t.Fatalf("credits after one settlement: got %+v", c)
	}
	CheckLedger(t, st, f.ws.ID)
}
