package capability

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
)

// next returns the next change of ch, failing t after a few seconds.
func next(t *testing.T, ch <-chan Change) Change {
	t.Helper()
	select {
	case c, ok := <-ch:
		if !ok {
			t.Fatal("watch closed; want a change")
		}
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("no change within 5 s")
	}
	return Change{}
}

// TestWatch checks that a workspace's watcher hears of every approval
// requested, decided and expired and of every execution started and
// finished, in order, and that another workspace's watcher hears nothing.
func TestWatch(t *testing.T) {
	ctx := t.Context()
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}
	// The service's clock, moved on to expire an approval. An atomic, as
	// the service's own goroutines read the clock while the test moves it.
	var ahead atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	env := newServiceEnv(t, nil, drv, model.DefaultPolicy(), ServiceOptions{ApprovalTTL: time.Hour, Now: clock})
	k, err := env.st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: env.ws.ID, Role: model.RoleApprover, Hash: model.HashKey("approver")})
	if err != nil {
		t.Fatal(err)
	}
	approver := Principal{KeyID: k.ID, WorkspaceID: env.ws.ID, Role: model.RoleApprover}
	other, err := env.st.CreateWorkspace(ctx, "other", nil)
	if err != nil {
		t.Fatal(err)
	}
	ch, cancel := env.svc.Watch(env.ws.ID)
	defer cancel()
	otherCh, otherCancel := env.svc.Watch(other.ID)
	defer otherCancel()

	want := func(name string, kinds ...Change) {
		t.Helper()
		for _, w := range kinds {
			w.WorkspaceID = env.ws.ID
			if got := next(t, ch); got != w {
				t.Errorf("%s: got %+v, want %+v", name, got, w)
			}
		}
	}
	invoke := func() *Invocation {
		t.Helper()
		inv, err := env.svc.Invoke(ctx, env.agent, InvokeRequest{Runtime: "python", Code: "print(1)"}, InvokeOptions{})
		if err != nil || inv.Approval == nil {
			t.Fatalf("Invoke: got %+v, %v; want a pending approval", inv, err)
		}
		return inv
	}

	approved := invoke()
	a, ex := approved.Approval.ID, approved.Execution.ID
	want("requested", Change{Kind: ApprovalRequested, ApprovalID: a, ExecutionID: ex})
	if _, _, err := env.svc.Decide(ctx, approver, a, true, ""); err != nil {
		t.Fatal(err)
	}
	want("approved and run", Change{Kind: ApprovalDecided, ApprovalID: a, ExecutionID: ex},
		Change{Kind: ExecutionStarted, ApprovalID: a, ExecutionID: ex}, Change{Kind: ExecutionFinished, ApprovalID: a, ExecutionID: ex})

	denied := invoke()
	a, ex = denied.Approval.ID, denied.Execution.ID
	want("requested", Change{Kind: ApprovalRequested, ApprovalID: a, ExecutionID: ex})
	if _, _, err := env.svc.Decide(ctx, approver, a, false, "no"); err != nil {
		t.Fatal(err)
	}
	want("denied", Change{Kind: ApprovalDecided, ApprovalID: a, ExecutionID: ex})

	expiring := invoke()
	a, ex = expiring.Approval.ID, expiring.Execution.ID
	want("requested", Change{Kind: ApprovalRequested, ApprovalID: a, ExecutionID: ex})
	ahead.Store(int64(2 * time.Hour))
	env.svc.approvals.expireApprovals(ctx)
	want("expired", Change{Kind: ApprovalExpired, ApprovalID: a, ExecutionID: ex})
	ahead.Store(0)

	cancelled := invoke()
	a, ex = cancelled.Approval.ID, cancelled.Execution.ID
	want("requested", Change{Kind: ApprovalRequested, ApprovalID: a, ExecutionID: ex})
	if _, err := env.svc.Cancel(ctx, env.agent, ex, ""); err != nil {
		t.Fatal(err)
	}
	want("cancelled", Change{Kind: ExecutionFinished, ApprovalID: a, ExecutionID: ex})

	select {
	case c := <-otherCh:
		t.Errorf("another workspace's watcher: got %+v, want nothing", c)
	default:
	}
}

// TestWatcherThatFallsBehind checks that a watcher whose buffer is full is
// dropped, its channel closed, rather than left to miss changes silently,
// and that the others keep theirs.
func TestWatcherThatFallsBehind(t *testing.T) {
	f := newFeed()
	slow, keen := f.watch("ws"), f.watch("ws")
	for i := range watcherBuffer + 1 {
		f.publish(Change{Kind: ExecutionFinished, WorkspaceID: "ws", ExecutionID: string(rune('a' + i%26))})
		if i < watcherBuffer {
			<-keen
		}
	}
	var got []Change
	for c := range slow {
		got = append(got, c)
	}
	if len(got) != watcherBuffer {
		t.Errorf("slow watcher: got %d changes before its channel closed, want %d", len(got), watcherBuffer)
	}
	select {
	case c, ok := <-keen:
		if !ok {
			t.Fatal("keen watcher: channel closed, want it kept")
		}
		if c.ExecutionID == "" {
			t.Errorf("keen watcher: got %+v", c)
		}
	default:
		t.Error("keen watcher: got no last change")
	}
	f.drop("ws", keen)
	f.drop("ws", keen) // dropping twice is harmless
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.watchers) != 0 {
		t.Errorf("workspaces still watched: got %d, want 0", len(f.watchers))
	}
}
