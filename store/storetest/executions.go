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
	"github.com/stockade-sh/stockade/store"
)

func nowPlus(seconds int) time.Time { return time.Now().Add(time.Duration(seconds) * time.Second) }

func testIdempotency(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "idem")
	other := newFixture(t, st, "idem-other")
	mustGrant(t, st, f.ws.ID, 10)
	mustGrant(t, st, other.ws.ID, 10)

	e := f.newExec("print('once')", 2)
	e.IdempotencyKey = "req-1"
	_, err := st.ReplayExecution(ctx, e)
	wantClass(t, "ReplayExecution before the first request", err, errdefs.ErrNotFound)
	first := mustCreate(t, st, e)
	if first.Replayed {
		t.Fatal("first CreateExecution reported Replayed")
	}
	again := mustCreate(t, st, e)
	if !again.Replayed || again.Execution.ID != first.Execution.ID || again.Reservation == nil ||
		again.Reservation.ID != first.Reservation.ID {
		t.Fatalf("retry: got %+v, want a replay of %s with its reservation", again, first.Execution.ID)
	}
	wantCredits(t, st, f.ws.ID, 8, 2)
	wantReplay(t, st, e, first)

	// A finished execution replays with its final state.
	must[store.Execution](t, "StartExecution")(st.StartExecution(ctx, first.Execution.ID, "runc"))
	must[store.Execution](t, "FinishExecution")(st.FinishExecution(ctx, store.Outcome{ExecutionID: first.Execution.ID,
		Status: store.StatusSucceeded, Result: []byte(`{"exit_code":0}`)}))
	again = mustCreate(t, st, e)
	if !again.Replayed || again.Execution.Status != store.StatusSucceeded || string(again.Execution.Result) != `{"exit_code":0}` {
		t.Fatalf("retry after the end: got %+v", again.Execution)
	}
	wantCredits(t, st, f.ws.ID, 8, 0)
	if r := wantReplay(t, st, e, first); r.Execution.Status != store.StatusSucceeded || r.Reservation.Status != store.ReservationCommitted {
		t.Fatalf("ReplayExecution after the end: got %s with a %s reservation", r.Execution.Status, r.Reservation.Status)
	}

	changed := f.newExec("print('other code')", 2)
	changed.IdempotencyKey = "req-1"
	_, err = st.CreateExecution(ctx, changed)
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
	ae := f.newExec("print('approve me')", 2)
	ae.IdempotencyKey = "req-approval"
	ae.Approval = &store.NewApproval{Card: []byte(`{"risk":"high"}`), ExpiresAt: nowPlus(600)}
	waiting := mustCreate(t, st, ae)
	if r := wantReplay(t, st, ae, waiting); r.Approval == nil || r.Approval.ID != waiting.Approval.ID ||
		r.Approval.Status != store.ApprovalPending || r.Execution.Status != store.StatusAwaitingApproval {
		t.Fatalf("ReplayExecution awaiting approval: got %+v", r)
	}
	if _, _, err := st.DecideApproval(ctx, store.Decision{WorkspaceID: f.ws.ID, ApprovalID: waiting.Approval.ID,
		DecidedBy: f.approver.ID, Reason: "no"}); err != nil {
		t.Fatalf("DecideApproval: %v", err)
	}
	wantCredits(t, st, f.ws.ID, 8, 0)

	// Keys are scoped to the workspace, and no key means no deduplication.
	oe := other.newExec("print('once')", 2)
	oe.IdempotencyKey = "req-1"
	if adm := mustCreate(t, st, oe); adm.Replayed {
		t.Fatal("another workspace's idempotency key replayed")
	}
	plain := f.newExec("print('once')", 2)
	a, b := mustCreate(t, st, plain), mustCreate(t, st, plain)
	if a.Execution.ID == b.Execution.ID || a.Replayed || b.Replayed {
		t.Fatal("executions without an idempotency key were deduplicated")
	}
	wantCredits(t, st, f.ws.ID, 4, 4)
}

// wantReplay checks that ReplayExecution answers e with the execution of
// first, Replayed, its reservation and approval, and writes nothing.
func wantReplay(t *testing.T, st store.Store, e store.NewExecution, first store.Admission) store.Admission {
	t.Helper()
	ctx := t.Context()
	head := must[store.ChainHead](t, "ChainHead")(st.ChainHead(ctx, e.WorkspaceID))
	credits := must[store.Credits](t, "GetCredits")(st.GetCredits(ctx, e.WorkspaceID))
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
	if h := must[store.ChainHead](t, "ChainHead")(st.ChainHead(ctx, e.WorkspaceID)); h != head {
		t.Fatalf("ReplayExecution moved the chain head from %+v to %+v", head, h)
	}
	if c := must[store.Credits](t, "GetCredits")(st.GetCredits(ctx, e.WorkspaceID)); c != credits {
		t.Fatalf("ReplayExecution changed the credits from %+v to %+v", credits, c)
	}
	return r
}

func testConcurrentIdempotency(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "idem-race")
	mustGrant(t, st, f.ws.ID, 100)
	e := f.newExec("print('race')", 2)
	e.IdempotencyKey = "race"
	e.Audit = []store.NewEvent{{Type: "capability.invoke_allowed"}}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		fresh  int
		execID = map[string]bool{}
		errs   []error
	)
	for range 10 {
		wg.Go(func() {
			adm, err := st.CreateExecution(ctx, e)
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
	if h := must[store.ChainHead](t, "ChainHead")(st.ChainHead(ctx, f.ws.ID)); h.Seq != 1 {
		t.Fatalf("events after 10 retries: got %d, want 1", h.Seq)
	}
}

func testExecutionLifecycle(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "life")
	other := newFixture(t, st, "life-other")
	mustGrant(t, st, f.ws.ID, 10)

	e := f.newExec("print('hi')", 2)
	e.ID = "ex_chosen_by_caller"
	adm := mustCreate(t, st, e)
	ex := adm.Execution
	if ex.ID != e.ID || ex.Status != store.StatusQueued || ex.CreatedAt.IsZero() || !ex.StartedAt.IsZero() ||
		ex.KeyID != f.agent.ID || ex.Tool != "code.execute" || !bytes.Equal(ex.Request, e.Request) {
		t.Fatalf("admitted execution: got %+v", ex)
	}
	got := must[store.Execution](t, "GetExecution")(st.GetExecution(ctx, f.ws.ID, ex.ID))
	if got.ID != ex.ID || got.Status != ex.Status || !got.CreatedAt.Equal(ex.CreatedAt) || got.InputSHA256 != e.InputSHA256 ||
		got.ReservationID != adm.Reservation.ID || !bytes.Equal(got.Request, e.Request) {
		t.Fatalf("GetExecution: got %+v, want %+v", got, ex)
	}
	_, err := st.GetExecution(ctx, other.ws.ID, ex.ID)
	wantClass(t, "GetExecution from another workspace", err, errdefs.ErrNotFound)
	_, err = st.GetToolCall(ctx, other.ws.ID, ex.ID)
	wantClass(t, "GetToolCall from another workspace", err, errdefs.ErrNotFound)
	_, err = st.CreateExecution(ctx, e)
	wantClass(t, "CreateExecution with a taken id", err, errdefs.ErrConflict)

	tc := must[store.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, ex.ID))
	if tc.Status != store.StatusQueued || tc.InputSHA256 != e.InputSHA256 || tc.ExitCode != nil || tc.CreditsCharged != 0 {
		t.Fatalf("tool call of a queued execution: got %+v", tc)
	}

	run := must[store.Execution](t, "StartExecution")(st.StartExecution(ctx, ex.ID, "gvisor"))
	if run.Status != store.StatusRunning || run.StartedAt.IsZero() || run.Driver != "gvisor" {
		t.Fatalf("StartExecution: got %+v", run)
	}
	_, err = st.StartExecution(ctx, ex.ID, "gvisor")
	wantClass(t, "StartExecution twice", err, errdefs.ErrConflict)
	wantCredits(t, st, f.ws.ID, 8, 2) // still reserved while running

	stdout := bytes.Repeat([]byte("o"), store.PreviewLimit+100)
	stderr := []byte("warn\x00\xff binary is fine")
	fin := must[store.Execution](t, "FinishExecution")(st.FinishExecution(ctx, store.Outcome{
		ExecutionID: ex.ID, Status: store.StatusSucceeded, Result: []byte(`{"exit_code": 0}`),
		ExitCode: ptr(0), Stdout: stdout, Stderr: stderr, StderrTruncated: true,
	}))
	if fin.Status != store.StatusSucceeded || fin.FinishedAt.IsZero() || string(fin.Result) != `{"exit_code": 0}` {
		t.Fatalf("FinishExecution: got %+v", fin)
	}
	wantCredits(t, st, f.ws.ID, 8, 0)
	tc = must[store.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, ex.ID))
	switch {
	case tc.Status != store.StatusSucceeded, tc.ExitCode == nil || *tc.ExitCode != 0, tc.CreditsCharged != 2, tc.Driver != "gvisor":
		t.Fatalf("completed tool call: got status %s exit %v credits %d driver %q", tc.Status, tc.ExitCode, tc.CreditsCharged, tc.Driver)
	case !bytes.Equal(tc.StdoutPreview, stdout[:store.PreviewLimit]) || !tc.StdoutTruncated:
		t.Fatalf("stdout preview: got %d bytes (truncated %v), want %d, truncated", len(tc.StdoutPreview), tc.StdoutTruncated, store.PreviewLimit)
	case !bytes.Equal(tc.StderrPreview, stderr) || !tc.StderrTruncated:
		t.Fatalf("stderr preview: got %q (truncated %v), want %q, truncated", tc.StderrPreview, tc.StderrTruncated, stderr)
	case tc.StartedAt.IsZero() || tc.FinishedAt.IsZero() || tc.FinishedAt.Before(tc.StartedAt):
		t.Fatalf("tool call timings: created %v started %v finished %v", tc.CreatedAt, tc.StartedAt, tc.FinishedAt)
	}
	inv := must[store.Page[store.ToolInvocation]](t, "ListToolInvocations")(st.ListToolInvocations(ctx, f.ws.ID, store.ToolCallFilter{}))
	if len(inv.Items) != 1 || inv.Items[0].ExecutionID != ex.ID || inv.Items[0].Credits != 2 ||
		inv.Items[0].Status != store.StatusSucceeded || inv.Items[0].Driver != "gvisor" || inv.Items[0].Ran < 0 {
		t.Fatalf("tool invocations: got %+v", inv.Items)
	}

	_, err = st.FinishExecution(ctx, store.Outcome{ExecutionID: ex.ID, Status: store.StatusFailed})
	wantClass(t, "FinishExecution twice", err, errdefs.ErrConflict)
	_, err = st.StartExecution(ctx, ex.ID, "runc")
	wantClass(t, "StartExecution after the end", err, errdefs.ErrConflict)
	_, err = st.FinishExecution(ctx, store.Outcome{ExecutionID: "ex_nope", Status: store.StatusFailed})
	wantClass(t, "FinishExecution of an unknown execution", err, errdefs.ErrNotFound)
	_, err = st.StartExecution(ctx, "ex_nope", "runc")
	wantClass(t, "StartExecution of an unknown execution", err, errdefs.ErrNotFound)
	wantCredits(t, st, f.ws.ID, 8, 0)

	// Every charged status of a started execution is charged; the engine
	// reports the exit, the store charges the run.
	for _, status := range []store.ExecutionStatus{store.StatusFailed, store.StatusTimedOut, store.StatusOOMKilled, store.StatusKilled} {
		t.Run(string(status), func(t *testing.T) {
			before := must[store.Credits](t, "GetCredits")(st.GetCredits(ctx, f.ws.ID))
			a := mustCreate(t, st, f.newExec("loop "+string(status), 1))
			must[store.Execution](t, "StartExecution")(st.StartExecution(ctx, a.Execution.ID, "runc"))
			must[store.Execution](t, "FinishExecution")(st.FinishExecution(ctx, store.Outcome{ExecutionID: a.Execution.ID,
				Status: status, ExitCode: ptr(137)}))
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
		status  store.ExecutionStatus
	}{
		{"launch failed before start", false, store.StatusLaunchFailed},
		{"launch failed after start", true, store.StatusLaunchFailed},
		{"failed before start", false, store.StatusFailed},
		{"killed before start", false, store.StatusKilled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := mustCreate(t, st, f.newExec(tc.name, 2))
			if tc.started {
				must[store.Execution](t, "StartExecution")(st.StartExecution(ctx, a.Execution.ID, "runc"))
			}
			must[store.Execution](t, "FinishExecution")(st.FinishExecution(ctx, store.Outcome{ExecutionID: a.Execution.ID,
				Status: tc.status, Result: []byte(`{"error":"image missing"}`)}))
			wantCredits(t, st, f.ws.ID, 4, 0)
			tcall := must[store.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, a.Execution.ID))
			if tcall.CreditsCharged != 0 || tcall.Status != tc.status {
				t.Fatalf("tool call: got status %s credits %d, want %s and 0", tcall.Status, tcall.CreditsCharged, tc.status)
			}
			r := must[store.Page[store.LedgerEntry]](t, "ListLedger")(st.ListLedger(ctx, f.ws.ID, store.PageRequest{Limit: 1}))
			if r.Items[0].Kind != store.LedgerRelease || r.Items[0].ExecutionID != a.Execution.ID {
				t.Fatalf("last ledger entry: got %+v, want the release", r.Items[0])
			}
		})
	}
}

func testExecutionValidation(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "valid")
	other := newFixture(t, st, "valid-other")
	for _, tc := range []struct {
		name   string
		mod    func(e *store.NewExecution)
		class  error
		finish *store.Outcome
	}{
		{name: "no workspace", mod: func(e *store.NewExecution) { e.WorkspaceID = "" }, class: errdefs.ErrInvalidArgument},
		{name: "no runtime", mod: func(e *store.NewExecution) { e.Runtime = "" }, class: errdefs.ErrInvalidArgument},
		{name: "no request", mod: func(e *store.NewExecution) { e.Request = nil }, class: errdefs.ErrInvalidArgument},
		{name: "bad request JSON", mod: func(e *store.NewExecution) { e.Request = []byte(`{"a":`) }, class: errdefs.ErrInvalidArgument},
		{name: "bad input hash", mod: func(e *store.NewExecution) { e.InputSHA256 = "ABC" }, class: errdefs.ErrInvalidArgument},
		{name: "negative credits", mod: func(e *store.NewExecution) { e.Credits = -1 }, class: errdefs.ErrInvalidArgument},
		{name: "another workspace's key", mod: func(e *store.NewExecution) { e.KeyID = other.agent.ID }, class: errdefs.ErrInvalidArgument},
		{name: "unknown key", mod: func(e *store.NewExecution) { e.KeyID = "key_nope" }, class: errdefs.ErrInvalidArgument},
		{name: "approval without expiry", mod: func(e *store.NewExecution) { e.Approval = &store.NewApproval{Card: []byte(`{}`)} },
			class: errdefs.ErrInvalidArgument},
		{name: "event without type", mod: func(e *store.NewExecution) { e.Audit = []store.NewEvent{{Actor: "x"}} },
			class: errdefs.ErrInvalidArgument},
		{name: "event with bad data", mod: func(e *store.NewExecution) { e.Audit = []store.NewEvent{{Type: "x", Data: []byte("{")}} },
			class: errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := f.newExec("x", 0)
			tc.mod(&e)
			_, err := st.CreateExecution(ctx, e)
			wantClass(t, "CreateExecution", err, tc.class)
		})
	}
	a := mustCreate(t, st, f.newExec("x", 0))
	for _, tc := range []struct {
		name string
		o    store.Outcome
	}{
		{"live status", store.Outcome{ExecutionID: a.Execution.ID, Status: store.StatusRunning}},
		{"unknown status", store.Outcome{ExecutionID: a.Execution.ID, Status: "exploded"}},
		{"bad result JSON", store.Outcome{ExecutionID: a.Execution.ID, Status: store.StatusFailed, Result: []byte("nope")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := st.FinishExecution(ctx, tc.o)
			wantClass(t, "FinishExecution", err, errdefs.ErrInvalidArgument)
		})
	}
}

func testListings(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "lists")
	other := newFixture(t, st, "lists-other")
	mustCreate(t, st, other.newExec("not mine", 0))
	statuses := []store.ExecutionStatus{store.StatusSucceeded, store.StatusFailed, store.StatusLaunchFailed}
	var made []store.Execution
	for i := range 11 {
		a := mustCreate(t, st, f.newExec(fmt.Sprint("job ", i), 0))
		if i%4 != 3 { // every fourth stays queued
			if _, err := st.StartExecution(ctx, a.Execution.ID, "runc"); err != nil {
				t.Fatal(err)
			}
			if _, err := st.FinishExecution(ctx, store.Outcome{ExecutionID: a.Execution.ID, Status: statuses[i%3]}); err != nil {
				t.Fatal(err)
			}
		}
		made = append(made, must[store.Execution](t, "GetExecution")(st.GetExecution(ctx, f.ws.ID, a.Execution.ID)))
	}
	// Newest first: reverse creation order, ties broken by id descending.
	want := slices.Clone(made)
	slices.SortStableFunc(want, func(a, b store.Execution) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	exID := func(e store.Execution) string { return e.ID }
	gotEx := allPages(t, 3, exID, func(p store.PageRequest) (store.Page[store.Execution], error) {
		return st.ListExecutions(ctx, f.ws.ID, store.ExecutionFilter{PageRequest: p})
	})
	if ids(gotEx, exID) != ids(want, exID) {
		t.Fatalf("ListExecutions: got %v, want %v", ids(gotEx, exID), ids(want, exID))
	}

	tcID := func(c store.ToolCall) string { return c.ExecutionID }
	since, until := made[2].CreatedAt, made[8].CreatedAt
	for _, tc := range []struct {
		name   string
		filter store.ToolCallFilter
		keep   func(e store.Execution) bool
	}{
		{"all", store.ToolCallFilter{}, func(store.Execution) bool { return true }},
		{"by status", store.ToolCallFilter{Statuses: []store.ExecutionStatus{store.StatusFailed, store.StatusQueued}},
			func(e store.Execution) bool { return e.Status == store.StatusFailed || e.Status == store.StatusQueued }},
		{"since", store.ToolCallFilter{Since: since}, func(e store.Execution) bool { return !e.CreatedAt.Before(since) }},
		{"until", store.ToolCallFilter{Until: until}, func(e store.Execution) bool { return e.CreatedAt.Before(until) }},
		{"range and status", store.ToolCallFilter{Since: since, Until: until, Statuses: []store.ExecutionStatus{store.StatusSucceeded}},
			func(e store.Execution) bool {
				return !e.CreatedAt.Before(since) && e.CreatedAt.Before(until) && e.Status == store.StatusSucceeded
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var wantIDs []store.Execution
			for _, e := range want {
				if tc.keep(e) {
					wantIDs = append(wantIDs, e)
				}
			}
			got := allPages(t, 2, tcID, func(p store.PageRequest) (store.Page[store.ToolCall], error) {
				flt := tc.filter
				flt.PageRequest = p
				return st.ListToolCalls(ctx, f.ws.ID, flt)
			})
			if ids(got, tcID) != ids(wantIDs, exID) {
				t.Fatalf("ListToolCalls: got %v, want %v", ids(got, tcID), ids(wantIDs, exID))
			}
			gotEx := allPages(t, 4, exID, func(p store.PageRequest) (store.Page[store.Execution], error) {
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
	inv := allPages(t, 5, func(i store.ToolInvocation) string { return i.ID }, func(p store.PageRequest) (store.Page[store.ToolInvocation], error) {
		return st.ListToolInvocations(ctx, f.ws.ID, store.ToolCallFilter{PageRequest: p})
	})
	if len(inv) != ended {
		t.Fatalf("tool invocations: got %d, want one per ended execution (%d)", len(inv), ended)
	}
	failed := must[store.Page[store.ToolInvocation]](t, "ListToolInvocations")(st.ListToolInvocations(ctx, f.ws.ID,
		store.ToolCallFilter{Statuses: []store.ExecutionStatus{store.StatusFailed}}))
	for _, i := range failed.Items {
		if i.Status != store.StatusFailed {
			t.Fatalf("ListToolInvocations by status returned %s", i.Status)
		}
	}

	_, err := st.ListToolCalls(ctx, f.ws.ID, store.ToolCallFilter{PageRequest: store.PageRequest{Cursor: "%%%"}})
	wantClass(t, "ListToolCalls with a bad cursor", err, errdefs.ErrInvalidArgument)
	p := must[store.Page[store.ToolCall]](t, "ListToolCalls")(st.ListToolCalls(ctx, f.ws.ID, store.ToolCallFilter{PageRequest: store.PageRequest{Limit: 100000}}))
	if len(p.Items) != len(made) || p.Next != "" {
		t.Fatalf("an over-large limit: got %d items and next %q", len(p.Items), p.Next)
	}
}

func testRecoverInterrupted(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "recover")
	mustGrant(t, st, f.ws.ID, 20)
	queued := mustCreate(t, st, f.newExec("queued", 2))
	running := mustCreate(t, st, f.newExec("running", 2))
	must[store.Execution](t, "StartExecution")(st.StartExecution(ctx, running.Execution.ID, "runc"))
	waiting := f.newExec("waiting", 2)
	waiting.Approval = &store.NewApproval{Card: []byte(`{}`), ExpiresAt: nowPlus(600)}
	awaiting := mustCreate(t, st, waiting)
	done := mustCreate(t, st, f.newExec("done", 2))
	must[store.Execution](t, "StartExecution")(st.StartExecution(ctx, done.Execution.ID, "runc"))
	must[store.Execution](t, "FinishExecution")(st.FinishExecution(ctx, store.Outcome{ExecutionID: done.Execution.ID, Status: store.StatusSucceeded}))
	wantCredits(t, st, f.ws.ID, 12, 6)

	result := json.RawMessage(`{"error":"interrupted by a daemon restart"}`)
	// An event the store refuses rolls the recovery back with it: the two
	// are one transaction.
	_, err := st.RecoverInterrupted(ctx, result, func(store.Execution) []store.NewEvent { return []store.NewEvent{{Type: ""}} })
	wantClass(t, "RecoverInterrupted with an invalid event", err, errdefs.ErrInvalidArgument)
	wantCredits(t, st, f.ws.ID, 12, 6)
	got := must[[]store.Execution](t, "RecoverInterrupted")(st.RecoverInterrupted(ctx, result, func(store.Execution) []store.NewEvent {
		return []store.NewEvent{{Type: "execution.recovered", Code: "EXE002W", Actor: "system"}}
	}))
	gotIDs := []string{}
	for _, e := range got {
		gotIDs = append(gotIDs, e.ID)
		if e.Status != store.StatusFailed || string(e.Result) != string(result) || e.FinishedAt.IsZero() {
			t.Fatalf("recovered execution: got %+v", e)
		}
	}
	slices.Sort(gotIDs)
	wantIDs := []string{queued.Execution.ID, running.Execution.ID}
	slices.Sort(wantIDs)
	if !slices.Equal(gotIDs, wantIDs) {
		t.Fatalf("RecoverInterrupted: got %v, want %v", gotIDs, wantIDs)
	}
	// Nothing is charged for an execution that produced no result; the one
	// awaiting approval keeps its reservation.
	wantCredits(t, st, f.ws.ID, 16, 2)
	for _, id := range wantIDs {
		tc := must[store.ToolCall](t, "GetToolCall")(st.GetToolCall(ctx, f.ws.ID, id))
		if tc.Status != store.StatusFailed || tc.CreditsCharged != 0 {
			t.Fatalf("tool call of a recovered execution: got status %s credits %d", tc.Status, tc.CreditsCharged)
		}
	}
	if e := must[store.Execution](t, "GetExecution")(st.GetExecution(ctx, f.ws.ID, awaiting.Execution.ID)); e.Status != store.StatusAwaitingApproval {
		t.Fatalf("an execution awaiting approval was recovered: %s", e.Status)
	}
	for _, id := range wantIDs {
		p := must[store.Page[store.Event]](t, "ListEvents")(st.ListEvents(ctx, f.ws.ID, store.EventFilter{ExecutionID: id, Types: []string{"execution.recovered"}}))
		if len(p.Items) != 1 {
			t.Fatalf("execution.recovered events of %s: got %d, want 1", id, len(p.Items))
		}
	}
	if again := must[[]store.Execution](t, "RecoverInterrupted")(st.RecoverInterrupted(ctx, nil, nil)); len(again) != 0 {
		t.Fatalf("second RecoverInterrupted: got %d executions, want none", len(again))
	}
}
