package storetest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// stressStall is how long the mixed workload may go without finishing a
// single operation before the suite calls it a deadlock. Operations take
// milliseconds, even under the race detector.
const stressStall = 30 * time.Second

// watch runs fn and fails the test with every goroutine's stack when done
// has not grown for stall: a store that deadlocks shows where, instead of
// hanging until the test binary's timeout.
func watch(t *testing.T, stall time.Duration, what string, done *atomic.Int64, fn func()) {
	t.Helper()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		fn()
	}()
	tick := time.NewTicker(stall / 10)
	defer tick.Stop()
	last, since := done.Load(), time.Now()
	for {
		select {
		case <-finished:
			return
		case <-tick.C:
		}
		if n := done.Load(); n != last {
			last, since = n, time.Now()
			continue
		}
		if time.Since(since) < stall {
			continue
		}
		var buf bytes.Buffer
		pprof.Lookup("goroutine").WriteTo(&buf, 2)
		// Straight to stderr as well: the test's own log is only printed
		// when it ends, and the cleanup of a deadlocked store may not end.
		fmt.Fprintf(os.Stderr, "%s: no operation finished in %v after %d; goroutines:\n%s\n", what, stall, last, buf.Bytes())
		t.Fatalf("%s: no operation finished in %v after %d (deadlock?); goroutine dump on stderr", what, stall, last)
	}
}

// testConcurrentMixed runs every kind of transaction at once on one
// workspace: admissions with and without approval, starts and ends,
// decisions racing with expiry, cancels, audit appends, and
// the reads the service interleaves with them (lists, snapshots). It fails on
// a deadlock (with a goroutine dump), on any error other than the conflicts
// the races make legitimate, and on a ledger, chain or state left
// inconsistent.
func testConcurrentMixed(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "mixed")
	const (
		workers = 8
		granted = 1 << 30
	)
	ops := 2000
	if raceEnabled {
		ops = 300 // SQLite, transpiled C, runs tens of times slower
	}
	mustGrant(t, st, f.ws.ID, granted)

	var (
		mu      sync.Mutex
		pending []model.Execution // awaiting approval, not yet decided by a worker
		errs    []error
	)
	fail := func(op string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if len(errs) < 20 {
			errs = append(errs, fmt.Errorf("%s: %w", op, err))
		}
	}
	audit := func(typ string) model.NewEvent { return model.NewEvent{Type: typ, Actor: f.agent.ID} }
	finish := func(ex model.Execution, status model.ExecutionStatus, charge bool) {
		end := ending(ex, status, charge, audit("execution.finished"))
		end.Output = model.Output{ExitCode: ptr(0), Stdout: []byte("ok\n")}
		if _, err := st.Apply(ctx, ex.ID, end); err != nil {
			fail("ending", err)
		}
	}
	run := func(ex model.Execution) {
		ex, err := st.Apply(ctx, ex.ID, start("runc"))
		if err != nil {
			fail("starting", err)
			return
		}
		finish(ex, model.StatusSucceeded, true)
	}
	step := func(rng *rand.Rand, i int) {
		switch rng.IntN(12) {
		case 0, 1: // an approval request, expiring soon or not
			expires := time.Now().Add(time.Duration(rng.IntN(5)) * time.Millisecond)
			if rng.IntN(2) == 0 {
				expires = nowPlus(600)
			}
			adm, err := st.Admit(ctx, f.newExec(fmt.Sprint("approve ", i)), waiting(2, `{"risk":"high"}`, expires, audit("approval.requested")))
			if err != nil {
				fail("admitting with approval", err)
				return
			}
			mu.Lock()
			pending = append(pending, adm.Execution)
			mu.Unlock()
		case 2: // a decision, possibly racing with expiry
			mu.Lock()
			var ex model.Execution
			if n := len(pending); n > 0 {
				ex, pending = pending[n-1], pending[:n-1]
			}
			mu.Unlock()
			if ex.ID == "" {
				return
			}
			approve := rng.IntN(2) == 0
			ex, err := st.Apply(ctx, ex.ID, decision(ex, approve, f.approver.ID, "stress", audit("approval.decided")))
			switch {
			case errdefs.IsConflict(err): // expired first
			case err != nil:
				fail("deciding", err)
			case approve:
				run(ex)
			}
		case 3:
			due, err := st.ListDueApprovals(ctx, time.Now())
			if err != nil {
				fail("ListDueApprovals", err)
				return
			}
			for _, a := range due {
				ex, err := st.GetExecution(ctx, a.WorkspaceID, a.ExecutionID)
				if err != nil {
					fail("GetExecution", err)
					return
				}
				if ex.Status != model.StatusAwaitingApproval {
					continue // decided or expired since it was listed
				}
				if _, err := st.Apply(ctx, ex.ID, expiry(ex, expiredEvents(a)...)); err != nil && !errdefs.IsConflict(err) {
					fail("expiring", err)
				}
			}
		case 4, 5: // an admission that runs
			adm, err := st.Admit(ctx, f.newExec(fmt.Sprint("run ", i)), admission(2, audit("capability.invoke_allowed")))
			if err != nil {
				fail("admitting", err)
				return
			}
			if rng.IntN(4) == 0 {
				finish(adm.Execution, model.StatusLaunchFailed, false)
				return
			}
			run(adm.Execution)
		case 6: // an admission that is cancelled before it runs
			adm, err := st.Admit(ctx, f.newExec(fmt.Sprint("cancel ", i)), admission(3))
			if err != nil {
				fail("admitting", err)
				return
			}
			if _, err := st.Apply(ctx, adm.Execution.ID, cancel(adm.Execution, "stress", audit("execution.cancelled"))); err != nil {
				fail("cancelling", err)
			}
		case 7:
			if _, err := st.AppendEvent(ctx, model.NewEvent{WorkspaceID: f.ws.ID, Type: "stress.note", Actor: f.adm.ID}); err != nil {
				fail("AppendEvent", err)
			}
		case 8:
			if _, err := st.ListEvents(ctx, f.ws.ID, store.EventFilter{PageRequest: store.PageRequest{Limit: 50}}); err != nil {
				fail("ListEvents", err)
			}
			if _, err := st.ListApprovals(ctx, f.ws.ID, store.ApprovalFilter{Statuses: []model.ApprovalStatus{model.ApprovalPending}}); err != nil {
				fail("ListApprovals", err)
			}
		case 9:
			if _, err := st.GetCredits(ctx, f.ws.ID); err != nil {
				fail("GetCredits", err)
			}
			if _, err := st.ListExecutions(ctx, f.ws.ID, store.ExecutionFilter{PageRequest: store.PageRequest{Limit: 20}}); err != nil {
				fail("ListExecutions", err)
			}
		case 10:
			if _, err := st.GetPolicy(ctx, f.ws.ID); err != nil {
				fail("GetPolicy", err)
			}
			if _, err := st.LookupAPIKey(ctx, model.HashKey("mixed/agent")); err != nil {
				fail("LookupAPIKey", err)
			}
		case 11:
			if rng.IntN(4) == 0 {
				if ok, broken, err := st.VerifyChain(ctx, f.ws.ID); err != nil || !ok {
					fail("VerifyChain", fmt.Errorf("ok %v, broken %+v, err %w", ok, broken, err))
				}
			}
		}
	}

	var done atomic.Int64
	watch(t, stressStall, fmt.Sprintf("%d mixed store operations on %d goroutines", ops, workers), &done, func() {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 1))
				for i := w; i < ops; i += workers {
					step(rng, i)
					done.Add(1)
				}
			})
		}
		wg.Wait()
	})
	for _, err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}

	// Everything left waiting expires; then nothing may be live, nothing
	// reserved, and the ledger and the chain must add up.
	expireDue(t, st, time.Now().Add(time.Hour))
	live := allPages(t, store.MaxPageLimit, func(e model.Execution) string { return e.ID }, func(p store.PageRequest) (store.Page[model.Execution], error) {
		return st.ListExecutions(ctx, f.ws.ID, store.ExecutionFilter{PageRequest: p,
			Statuses: []model.ExecutionStatus{model.StatusQueued, model.StatusRunning, model.StatusAwaitingApproval}})
	})
	if len(live) > 0 {
		t.Fatalf("%d executions still live after every worker finished, e.g. %+v", len(live), live[0])
	}
	left := must[store.Page[model.Approval]](t, "ListApprovals")(st.ListApprovals(ctx, f.ws.ID,
		store.ApprovalFilter{Statuses: []model.ApprovalStatus{model.ApprovalPending}}))
	if len(left.Items) > 0 {
		t.Fatalf("%d approvals still pending after expiring them all", len(left.Items))
	}
	if c := must[model.Credits](t, "GetCredits")(st.GetCredits(ctx, f.ws.ID)); c.Reserved != 0 || c.Available > granted {
		t.Fatalf("credits after every execution ended: %+v, want nothing reserved", c)
	}
	CheckLedger(t, st, f.ws.ID)
	if ok, broken, err := st.VerifyChain(ctx, f.ws.ID); err != nil || !ok {
		t.Fatalf("VerifyChain after the mixed workload: ok %v, broken %+v, err %v", ok, broken, err)
	}
}
