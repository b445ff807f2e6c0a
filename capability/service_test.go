package capability

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/broker"
	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/internal/witness"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/store/sqlite"
	"github.com/stockade-sh/stockade/tools"
)

// serviceEnv is a service over a fresh SQLite store and a fake driver, with
// one workspace holding 10 credits and an agent key.
type serviceEnv struct {
	st    testStore
	svc   *Service
	ws    model.Workspace
	agent Principal
}

// newServiceEnv starts the service with o over st (a fresh SQLite store
// when nil) and drv, with an engine built with engOpts. pol is the
// workspace's policy.
func newServiceEnv(t *testing.T, st testStore, drv *sandboxfake.Driver, pol model.Policy, o ServiceOptions, engOpts ...engine.Option) *serviceEnv {
	t.Helper()
	ctx := t.Context()
	if st == nil {
		st = openSQLite(t)
	}
	ws, err := st.CreateWorkspace(ctx, "svc", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.SetPolicy(ctx, ws.ID, pol, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GrantCredits(ctx, ws.ID, 10, "test", nil); err != nil {
		t.Fatal(err)
	}
	k, err := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: model.RoleAgent, Hash: model.HashKey("svc agent")})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(map[string]sandbox.Driver{drv.ID: drv}, drv.ID, sandboxfake.Images{}, sandbox.DefaultLimits(), sandbox.DefaultCeiling(), engOpts...)
	if err != nil {
		t.Fatal(err)
	}
	svc := NewService(eng, st, o)
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close(context.Background()) })
	return &serviceEnv{st: st, svc: svc, ws: ws, agent: Principal{KeyID: k.ID, WorkspaceID: ws.ID, Role: model.RoleAgent}}
}

// events returns the workspace's audit events of type typ, oldest first.
func (e *serviceEnv) events(t *testing.T, typ string) []model.Event {
	t.Helper()
	var out []model.Event
	if err := eachEvent(t.Context(), e.st, e.ws.ID, []string{typ}, func(ev model.Event) bool {
		out = append([]model.Event{ev}, out...)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// chainLength is the number of events in the workspace's audit chain.
func (e *serviceEnv) chainLength(t *testing.T) int64 {
	t.Helper()
	h, err := e.st.ChainHead(t.Context(), e.ws.ID)
	if err != nil {
		t.Fatal(err)
	}
	return h.Seq
}

// openSQLite opens a fresh SQLite store, closed when the test ends (after
// the clean-ups registered later, such as a service's Close).
func openSQLite(t testing.TB) testStore {
	t.Helper()
	db, err := sqlite.Open(t.Context(), sqlite.Config{Path: filepath.Join(t.TempDir(), "db.sqlite")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func noApprovalPolicy() model.Policy {
	p := model.DefaultPolicy()
	p.Approval = model.ApprovalNone
	return p
}

// TestIdempotentRetryIsNotDecidedAgain checks that a retry of an admitted
// request (same Idempotency-Key, same body) gets the first execution back
// before anything is decided again: it is not refused because the server is
// full or the policy changed since, and it writes no second decision event.
// The same key with another body stays a conflict.
func TestIdempotentRetryIsNotDecidedAgain(t *testing.T) {
	ctx := t.Context()
	hold := make(chan struct{})
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor, Hold: hold}
	// One slot and no queue: the first execution, held running, fills the
	// server.
	env := newServiceEnv(t, nil, drv, noApprovalPolicy(), ServiceOptions{MaxConcurrent: 1, MaxQueue: -1})
	defer func() {
		select {
		case <-hold:
		default:
			close(hold)
		}
	}()
	req := InvokeRequest{Runtime: "python", Code: "print(1)"}
	idem := InvokeOptions{IdempotencyKey: "retry-1"}
	first, err := env.svc.Invoke(ctx, env.agent, req, idem)
	if err != nil {
		t.Fatalf("first invocation: %v", err)
	}
	if first.Replayed {
		t.Fatal("first invocation: got Replayed")
	}
	_, err = env.svc.Invoke(ctx, env.agent, InvokeRequest{Runtime: "python", Code: "print(2)"}, InvokeOptions{})
	if !errdefs.IsResourceExhausted(err) {
		t.Fatalf("a new request while the server is full: got %v, want resource exhausted (429)", err)
	}

	replayed := func(t *testing.T, what string) *Invocation {
		t.Helper()
		before := env.chainLength(t)
		inv, err := env.svc.Invoke(ctx, env.agent, req, idem)
		if err != nil {
			t.Fatalf("%s: got %v, want the first execution", what, err)
		}
		if !inv.Replayed || inv.Execution.ID != first.Execution.ID {
			t.Fatalf("%s: got execution %s replayed %v, want %s replayed", what, inv.Execution.ID, inv.Replayed, first.Execution.ID)
		}
		if after := env.chainLength(t); after != before {
			t.Errorf("%s: the audit chain grew from %d to %d events, want no new event", what, before, after)
		}
		return inv
	}
	t.Run("retry while the server is full", func(t *testing.T) {
		replayed(t, "retry at capacity")
	})
	t.Run("same key, different body", func(t *testing.T) {
		before := env.chainLength(t)
		for _, diff := range []InvokeRequest{
			{Runtime: "python", Code: "print(3)"},
			{Runtime: "python", Code: "print(1)", TimeoutMS: 1000},
		} {
			if _, err := env.svc.Invoke(ctx, env.agent, diff, idem); !errdefs.IsConflict(err) {
				t.Errorf("reusing the key for %+v: got %v, want a conflict (409)", diff, err)
			}
		}
		if after := env.chainLength(t); after != before {
			t.Errorf("conflicts: the audit chain grew from %d to %d events, want no new event", before, after)
		}
	})

	close(hold)
	if ex, err := env.svc.Wait(ctx, env.agent, first.Execution.ID, 10*time.Second); err != nil || ex.Status != model.StatusSucceeded {
		t.Fatalf("first execution: got %s, %v; want succeeded", ex.Status, err)
	}
	t.Run("retry after the policy changed", func(t *testing.T) {
		// The request names no timeout: the policy gave it one, which is
		// not part of what a retry must match.
		pol := noApprovalPolicy()
		pol.MaxTimeout = 10 * time.Second
		if _, err := env.st.SetPolicy(ctx, env.ws.ID, pol, nil); err != nil {
			t.Fatal(err)
		}
		replayed(t, "retry after the policy's maximum timeout was lowered")
		pol.CodeExecution = false
		if _, err := env.st.SetPolicy(ctx, env.ws.ID, pol, nil); err != nil {
			t.Fatal(err)
		}
		if inv := replayed(t, "retry after code execution was disabled"); inv.Execution.Status != model.StatusSucceeded {
			t.Errorf("replayed execution: got %s, want succeeded", inv.Execution.Status)
		}
	})
	if got := env.events(t, audit.InvokeAllowed); len(got) != 1 || got[0].ExecutionID != first.Execution.ID {
		t.Errorf("invoke_allowed events: got %d, want 1 for %s", len(got), first.Execution.ID)
	}
	if got := env.events(t, audit.InvokeDenied); len(got) != 1 {
		t.Errorf("invoke_denied events: got %d, want 1 (the request without a key)", len(got))
	}
	if c, err := env.st.GetCredits(ctx, env.ws.ID); err != nil || c.Available != 8 || c.Reserved != 0 {
		t.Errorf("credits: got %+v, %v; want 8 available, none reserved (one charge)", c, err)
	}
}

// TestIdempotencyKeyIsTheAPIKeys checks that an idempotency key is the
// API key's own: another key of the workspace that sends the agent's key
// and body is not answered with the agent's execution. An approver's is
// refused for its role, as any request of it is (a denial recorded); an
// admin's is a request of its own, and its retry replays that one.
func TestIdempotencyKeyIsTheAPIKeys(t *testing.T) {
	ctx := t.Context()
	st := &countingReplays{testStore: openSQLite(t)}
	env := newServiceEnv(t, st, &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}, noApprovalPolicy(), ServiceOptions{})
	req := InvokeRequest{Runtime: "python", Code: "print(1)"}
	idem := InvokeOptions{IdempotencyKey: "retry-1"}
	first, err := env.svc.Invoke(ctx, env.agent, req, idem)
	if err != nil {
		t.Fatalf("the agent's invocation: %v", err)
	}
	principal := func(role model.Role) Principal {
		k, err := env.st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: env.ws.ID, Role: role, Hash: model.HashKey("svc " + string(role))})
		if err != nil {
			t.Fatal(err)
		}
		return Principal{KeyID: k.ID, WorkspaceID: env.ws.ID, Role: role}
	}

	t.Run("approver", func(t *testing.T) {
		before := len(env.events(t, audit.InvokeDenied))
		lookups := st.replays.Load()
		inv, err := env.svc.Invoke(ctx, principal(model.RoleApprover), req, idem)
		if !errdefs.IsPermissionDenied(err) || inv != nil {
			t.Fatalf("got %+v, %v; want permission denied, not the agent's execution", inv, err)
		}
		// The role is checked before any replay is looked up.
		if got := st.replays.Load() - lookups; got != 0 {
			t.Errorf("replays looked up for the approver: got %d, want 0", got)
		}
		if got := len(env.events(t, audit.InvokeDenied)); got != before+1 {
			t.Errorf("invoke_denied events: got %d, want %d (the approver's refusal recorded)", got, before+1)
		}
	})
	t.Run("admin", func(t *testing.T) {
		admin := principal(model.RoleAdmin)
		inv, err := env.svc.Invoke(ctx, admin, req, idem)
		if err != nil || inv.Replayed || inv.Execution.ID == first.Execution.ID || inv.Execution.KeyID != admin.KeyID {
			t.Fatalf("got %+v, %v; want a new execution of the admin key", inv, err)
		}
		again, err := env.svc.Invoke(ctx, admin, req, idem)
		if err != nil || !again.Replayed || again.Execution.ID != inv.Execution.ID {
			t.Fatalf("the admin's retry: got %+v, %v; want its own execution %s replayed", again, err, inv.Execution.ID)
		}
	})
}

// countingReplays is a store that counts the replays looked up.
type countingReplays struct {
	testStore
	replays atomic.Int32
}

func (s *countingReplays) ReplayExecution(ctx context.Context, e store.NewExecution) (store.Admission, error) {
	s.replays.Add(1)
	return s.testStore.ReplayExecution(ctx, e)
}

// failingAppends is a store whose AppendEvent fails, as a store that is
// down or busy: while fail is set, and the next n times. failures counts
// the calls that failed. The daemon dying after a transaction committed
// and before a separate audit write looks the same to the audit trail.
type failingAppends struct {
	testStore
	fail     atomic.Bool
	n        atomic.Int32
	failures atomic.Int32
}

func (s *failingAppends) AppendEvent(ctx context.Context, e model.NewEvent) (model.Event, error) {
	if s.fail.Load() || s.n.Add(-1) >= 0 {
		s.failures.Add(1)
		return model.Event{}, fmt.Errorf("the store is unreachable: %w", errdefs.ErrUnavailable)
	}
	return s.testStore.AppendEvent(ctx, e)
}

// flakyEnds fails the first n steps that end an execution, as a busy
// store.
type flakyEnds struct {
	testStore
	n atomic.Int32
}

func (s *flakyEnds) Apply(ctx context.Context, id string, st model.Step) (model.Execution, error) {
	if st.To.Terminal() && s.n.Add(-1) >= 0 {
		return model.Execution{}, fmt.Errorf("database is locked: %w", errdefs.ErrUnavailable)
	}
	return s.testStore.Apply(ctx, id, st)
}

// TestFinishRetries checks that a transient store error while recording an
// outcome does not leave the execution running with its credits reserved.
func TestFinishRetries(t *testing.T) {
	ctx := t.Context()
	st := &flakyEnds{testStore: openSQLite(t)}
	st.n.Store(2)
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}
	env := newServiceEnv(t, st, drv, noApprovalPolicy(), ServiceOptions{})
	inv, err := env.svc.Invoke(ctx, env.agent, InvokeRequest{Runtime: "python", Code: "print(1)"}, InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ex, err := env.svc.Wait(ctx, env.agent, inv.Execution.ID, 20*time.Second); err != nil || ex.Status != model.StatusSucceeded {
		t.Fatalf("execution: got %s, %v; want succeeded after two failed attempts to record it", ex.Status, err)
	}
}

// countingObserver records the observer calls of approvals and witnesses.
type countingObserver struct {
	mu          sync.Mutex
	pending     int
	expired     int
	unwitnessed int
}

func (o *countingObserver) WitnessRefused() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.unwitnessed++
}

func (o *countingObserver) Invocation(status model.ExecutionStatus, _ string, _ time.Duration, _ int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if status == model.StatusApprovalExpired {
		o.expired++
	}
}

func (o *countingObserver) ApprovalsPending(delta int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.pending += delta
}

// TestApprovalExpiryIsAuditedWithIt checks that an approval's expiry and
// its approval.expired event are one unit: the event exists, exactly once,
// even when no separate audit write could be made after the expiry.
func TestApprovalExpiryIsAuditedWithIt(t *testing.T) {
	ctx := t.Context()
	st := &failingAppends{testStore: openSQLite(t)}
	obs := &countingObserver{}
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}
	env := newServiceEnv(t, st, drv, model.DefaultPolicy(), ServiceOptions{ApprovalTTL: time.Millisecond, Observer: obs})
	inv, err := env.svc.Invoke(ctx, env.agent, InvokeRequest{Runtime: "python", Code: "print(1)"}, InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if inv.Approval == nil {
		t.Fatal("got no approval request under the default policy")
	}
	st.fail.Store(true)
	// The expiry loop runs every second.
	ex, err := env.svc.Wait(ctx, env.agent, inv.Execution.ID, 10*time.Second)
	if err != nil || ex.Status != model.StatusApprovalExpired {
		t.Fatalf("execution: got %s, %v; want approval_expired", ex.Status, err)
	}
	got := env.events(t, audit.ApprovalExpired)
	if len(got) != 1 {
		t.Fatalf("approval.expired events: got %d, want 1", len(got))
	}
	ev := got[0]
	var data struct {
		ApprovalID string `json:"approval_id"`
	}
	if err := json.Unmarshal(ev.Data, &data); err != nil {
		t.Fatalf("event data %s: %v", ev.Data, err)
	}
	if ev.Code != audit.ApprovalExpiredCode || ev.Actor != "system" || ev.ExecutionID != inv.Execution.ID ||
		ev.WorkspaceID != env.ws.ID || ev.Reason == "" || data.ApprovalID != inv.Approval.ID {
		t.Errorf("approval.expired event: got %+v, want code %s, actor system, execution %s, approval %s",
			ev, audit.ApprovalExpiredCode, inv.Execution.ID, inv.Approval.ID)
	}
	if ok, broken, err := env.st.VerifyChain(ctx, env.ws.ID); err != nil || !ok {
		t.Errorf("VerifyChain: got ok %v, broken %+v, err %v", ok, broken, err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.pending != 0 || obs.expired != 1 {
		t.Errorf("observer: got %d pending and %d expired, want 0 and 1", obs.pending, obs.expired)
	}
}

// TestChainFingerprintsTheRun checks what the audit chain holds of a run:
// the decision fingerprints the code and stdin that were asked to run, and
// execution.finished, written with the outcome, how it ended, what it was
// charged and a fingerprint of the stored result.
func TestChainFingerprintsTheRun(t *testing.T) {
	ctx := t.Context()
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}
	env := newServiceEnv(t, nil, drv, noApprovalPolicy(), ServiceOptions{CreditsPerInvocation: new(int64(3))})
	req := InvokeRequest{Runtime: "python", Code: "print(1)", Stdin: "some input"}
	inv, err := env.svc.Invoke(ctx, env.agent, req, InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := env.svc.Wait(ctx, env.agent, inv.Execution.ID, 10*time.Second)
	if err != nil || ex.Status != model.StatusSucceeded {
		t.Fatalf("execution: got %s, %v; want succeeded", ex.Status, err)
	}
	allowed := env.events(t, audit.InvokeAllowed)
	var decided struct {
		Request struct {
			Input string `json:"input_sha256"`
			Stdin string `json:"stdin_sha256"`
		} `json:"request"`
	}
	if len(allowed) != 1 || json.Unmarshal(allowed[0].Data, &decided) != nil ||
		decided.Request.Input != InputHash("python", "print(1)") || decided.Request.Stdin != sha256Hex([]byte("some input")) {
		t.Errorf("invoke_allowed: got %+v, want the input's and stdin's hashes", allowed)
	}
	finished := env.events(t, audit.ExecutionFinished)
	var data struct {
		Status   string `json:"status"`
		ExitCode *int   `json:"exit_code"`
		Credits  int64  `json:"credits"`
		Result   string `json:"result_sha256"`
	}
	if len(finished) != 1 || json.Unmarshal(finished[0].Data, &data) != nil {
		t.Fatalf("execution.finished: got %+v, want one event", finished)
	}
	ev := finished[0]
	if ev.ExecutionID != ex.ID || ev.Code != audit.ExecutionFinishedCode || data.Status != string(model.StatusSucceeded) ||
		data.ExitCode == nil || *data.ExitCode != 0 || data.Credits != 3 || data.Result != sha256Hex(ex.Result) {
		t.Errorf("execution.finished: got %+v with %+v; want succeeded, exit 0, 3 credits, the stored result's hash %s", ev, data, sha256Hex(ex.Result))
	}
	if ok, broken, err := env.st.VerifyChain(ctx, env.ws.ID); err != nil || !ok {
		t.Errorf("VerifyChain: got ok %v, broken %+v, err %v", ok, broken, err)
	}
}

// TestApprovalCardShowsStdin checks that an approver sees what the program
// will read, not only its code.
func TestApprovalCardShowsStdin(t *testing.T) {
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}
	env := newServiceEnv(t, nil, drv, model.DefaultPolicy(), ServiceOptions{})
	inv, err := env.svc.Invoke(t.Context(), env.agent, InvokeRequest{Runtime: "python", Code: "exec(input())", Stdin: "print('hidden')"}, InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var card ApprovalCard
	if inv.Approval == nil || json.Unmarshal(inv.Approval.Card, &card) != nil || card.Stdin != "print('hidden')" {
		t.Fatalf("approval: got %+v, want a card showing stdin", inv.Approval)
	}
}

// TestApprovalUnderTheCurrentPolicy checks that a request the workspace's
// policy stopped allowing while it waited cannot be approved, and can
// still be denied.
func TestApprovalUnderTheCurrentPolicy(t *testing.T) {
	ctx := t.Context()
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}
	env := newServiceEnv(t, nil, drv, model.DefaultPolicy(), ServiceOptions{})
	k, err := env.st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: env.ws.ID, Role: model.RoleApprover, Hash: model.HashKey("approver")})
	if err != nil {
		t.Fatal(err)
	}
	approver := Principal{KeyID: k.ID, WorkspaceID: env.ws.ID, Role: model.RoleApprover}
	inv, err := env.svc.Invoke(ctx, env.agent, InvokeRequest{Runtime: "python", Code: "print(1)"}, InvokeOptions{})
	if err != nil || inv.Approval == nil {
		t.Fatalf("got %+v, %v; want a pending approval", inv, err)
	}
	pol := model.DefaultPolicy()
	pol.CodeExecution = false
	if _, err := env.st.SetPolicy(ctx, env.ws.ID, pol, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := env.svc.Decide(ctx, approver, inv.Approval.ID, true, "ok"); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "disabled") {
		t.Errorf("approving after code execution was disabled: got %v, want a conflict naming the policy", err)
	}
	if _, ex, err := env.svc.Decide(ctx, approver, inv.Approval.ID, false, "policy changed"); err != nil || ex.Status != model.StatusDenied {
		t.Errorf("denying it: got %s, %v", ex.Status, err)
	}
}

// TestCloseWritesLateAuditEvents checks that the events of a run that
// Close cuts short, reported while its sandbox is being destroyed (as the
// decisions of requests still in flight are), reach the audit trail.
func TestCloseWritesLateAuditEvents(t *testing.T) {
	hold, destroy := make(chan struct{}), make(chan struct{})
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor, Hold: hold, HoldDestroy: destroy}
	env := newServiceEnv(t, nil, drv, noApprovalPolicy(), ServiceOptions{})
	defer close(hold)
	inv, err := env.svc.Invoke(t.Context(), env.agent, InvokeRequest{Runtime: "python", Code: "print(1)"}, InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	env.waitRunning(t, inv.Execution.ID)
	closed := make(chan struct{})
	go func() {
		env.svc.Close(t.Context())
		close(closed)
	}()
	// Close has cancelled the run; its sandbox is being destroyed.
	<-env.svc.ctx.Done()
	labels := map[string]string{engine.LabelExecution: inv.Execution.ID}
	const n = 50
	for i := range n {
		env.svc.egress.brokerCall(engine.BrokerEvent{Event: broker.Event{Operation: "op", Allowed: true, Status: 200, ParamsSHA256: fmt.Sprint(i)}, Labels: labels})
	}
	close(destroy)
	<-closed
	if got := len(env.events(t, audit.BrokerCall)); got != n {
		t.Fatalf("%d broker.call events after Close, want %d", got, n)
	}
}

// waitStarted waits until execution id's start is recorded: its code runs.
func (e *serviceEnv) waitStarted(t *testing.T, id string) {
	t.Helper()
	e.waitRunning(t, id)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ex, _ := e.st.GetExecution(t.Context(), e.ws.ID, id); !ex.StartedAt.IsZero() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the execution never started")
		}
	}
}

// waitRunning waits until execution id runs, which is when the service
// maps it to its workspace.
func (e *serviceEnv) waitRunning(t *testing.T, id string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		e.svc.egress.runsMu.Lock()
		r := e.svc.egress.runs[id]
		e.svc.egress.runsMu.Unlock()
		if r != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the execution never started")
		}
	}
}

// TestAuditQueueDropsNothing floods the queue of the proxy's and the
// broker's audit events far past its capacity, faster than the store
// writes: every event must reach the audit trail, since a sandbox could
// otherwise flood refusals to hide a broker call.
func TestAuditQueueDropsNothing(t *testing.T) {
	hold := make(chan struct{})
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor, Hold: hold}
	env := newServiceEnv(t, nil, drv, noApprovalPolicy(), ServiceOptions{})
	defer close(hold)
	inv, err := env.svc.Invoke(t.Context(), env.agent, InvokeRequest{Runtime: "python", Code: "print(1)"}, InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{engine.LabelExecution: inv.Execution.ID}
	env.waitRunning(t, inv.Execution.ID)
	const n = 3 * 1024
	for i := range n {
		env.svc.egress.brokerCall(engine.BrokerEvent{Event: broker.Event{Operation: "op", Allowed: true, Status: 200, ParamsSHA256: fmt.Sprint(i)}, Labels: labels})
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		got := len(env.events(t, audit.BrokerCall))
		if got == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d broker.call events, want %d", got, n)
		}
	}
}

// unreachableKeys is a store whose key lookups fail as PostgreSQL's do when
// it is down: the error names the server, the user and the database.
type unreachableKeys struct{ testStore }

func (unreachableKeys) LookupAPIKey(context.Context, model.KeyHash) (model.APIKey, error) {
	return model.APIKey{}, fmt.Errorf("failed to connect to `user=stockade database=prod`: host=db.internal:5432: %w", errdefs.ErrUnavailable)
}

// TestAuthenticateHidesTheDatabase checks that a key that cannot be
// checked is "unavailable", and that the database's words are no message
// a client may read (errdefs.PublicMessage): the API answers the class's
// sentence and logs the cause. Anyone may send a key.
func TestAuthenticateHidesTheDatabase(t *testing.T) {
	env := newServiceEnv(t, unreachableKeys{openSQLite(t)}, &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}, noApprovalPolicy(), ServiceOptions{})
	_, err := env.svc.Authenticate(t.Context(), "any-key")
	if !errdefs.IsUnavailable(err) {
		t.Fatalf("got %v, want unavailable", err)
	}
	if msg, ok := errdefs.PublicMessage(err); ok {
		t.Errorf("the error %q has a public message %q", err, msg)
	}
	if !strings.Contains(err.Error(), "db.internal") {
		t.Errorf("the error %q lost its cause, which the API logs", err)
	}
}

// TestDriverUnavailable checks that a request whose driver cannot run
// sandboxes is refused as unavailable (503) at once, recorded as the
// refusal and reserving nothing, rather than admitted to fail its launch.
func TestDriverUnavailable(t *testing.T) {
	ctx := t.Context()
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor, Down: fmt.Errorf("runsc not found at /usr/local/bin/runsc: %w", errdefs.ErrUnavailable)}
	env := newServiceEnv(t, nil, drv, noApprovalPolicy(), ServiceOptions{})
	before := env.chainLength(t)
	_, err := env.svc.Invoke(ctx, env.agent, InvokeRequest{Runtime: "python", Code: "print(1)"}, InvokeOptions{})
	if !errdefs.IsUnavailable(err) || strings.Contains(err.Error(), "/usr/local/bin") {
		t.Fatalf("got %v, want unavailable, without the driver's details", err)
	}
	if after := env.chainLength(t); after != before+1 {
		t.Errorf("the audit chain grew from %d to %d events, want the refusal alone", before, after)
	}
	if got := env.events(t, audit.InvokeDenied); len(got) != 1 || !strings.Contains(string(got[0].Data), `"decision":"driver_unavailable"`) {
		t.Errorf("invoke_denied events: got %+v, want one with decision driver_unavailable", got)
	}
	page, err := env.st.ListExecutions(ctx, env.ws.ID, store.ExecutionFilter{})
	if err != nil || len(page.Items) != 0 {
		t.Errorf("executions: got %d (%v), want none", len(page.Items), err)
	}
	if c, err := env.st.GetCredits(ctx, env.ws.ID); err != nil || c.Reserved != 0 {
		t.Errorf("credits: got %+v, %v; want nothing reserved", c, err)
	}
}

// TestOutputChunksKeepCharacters splits characters between chunks, on both
// streams interleaved: what is published is valid UTF-8 and, joined, the
// output; bytes that never complete a character are passed on at the end.
func TestOutputChunksKeepCharacters(t *testing.T) {
	got := map[sandbox.Stream]string{}
	o := outputChunks{publish: func(st sandbox.Stream, p []byte) {
		if !utf8.Valid(p) && st == sandbox.Stdout {
			t.Errorf("published %q, not valid UTF-8", p)
		}
		got[st] += string(p)
	}}
	text := "é€𝄞 ok"
	for i := range len(text) {
		o.add(sandbox.Stdout, []byte{text[i]})
		o.add(sandbox.Stderr, []byte{"x\xe2\x82"[i%3]})
	}
	o.flush()
	if got[sandbox.Stdout] != text {
		t.Errorf("stdout: got %q, want %q", got[sandbox.Stdout], text)
	}
	if !strings.HasPrefix(got[sandbox.Stderr], "x\xe2\x82x") {
		t.Errorf("stderr: got %q, want its bytes as they came", got[sandbox.Stderr])
	}
}

// TestBrokerEventRetries checks that the event of a broker call (a use of
// the operator's credential) survives a store busy for a moment.
func TestBrokerEventRetries(t *testing.T) {
	st := &failingAppends{testStore: openSQLite(t)}
	env := newServiceEnv(t, st, &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}, noApprovalPolicy(), ServiceOptions{})
	st.n.Store(2)
	const exec = "ex_busy"
	env.svc.egress.startRun(exec, env.ws.ID, "")
	env.svc.egress.brokerCall(engine.BrokerEvent{Event: broker.Event{Sandbox: "sbx-1", Tool: "t", Operation: "issues.create", Allowed: true, Status: 201},
		Labels: map[string]string{engine.LabelExecution: exec}})
	env.svc.egress.endRun(exec)
	env.svc.Close(t.Context())
	if got := env.events(t, audit.BrokerCall); len(got) != 1 || got[0].ExecutionID != exec {
		t.Fatalf("broker.call events: got %+v, want one for %s after two failed attempts", got, exec)
	}
}

// TestServiceWitnessesChains checks that the daemon leaves the heads of the
// audit chains in its witness directory when it closes.
func TestServiceWitnessesChains(t *testing.T) {
	ctx := t.Context()
	dir := witness.Dir(t.TempDir())
	env := newServiceEnv(t, nil, &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}, noApprovalPolicy(), ServiceOptions{Witness: dir})
	inv, err := env.svc.Invoke(ctx, env.agent, InvokeRequest{Runtime: "python", Code: "print(1)"}, InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.svc.Wait(ctx, env.agent, inv.Execution.ID, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	env.svc.Close(t.Context())
	head, err := env.st.ChainHead(ctx, env.ws.ID)
	if err != nil {
		t.Fatal(err)
	}
	got, ok, err := dir.Read(env.ws.ID)
	if err != nil || !ok || got != head {
		t.Fatalf("witnessed head: got %+v (found %v, %v), want %+v", got, ok, err, head)
	}
	if ok, broken, err := env.st.VerifyChain(ctx, env.ws.ID, got); err != nil || !ok {
		t.Fatalf("VerifyChain against the witness: ok %v, broken %+v, err %v", ok, broken, err)
	}
}

// TestServiceRefusesToWitnessARewrittenChain rewrites a witnessed chain
// consistently from its second event on and pads it past the witnessed
// head: the service's witness tick keeps the old head, logs the refusal
// and counts it, at every tick while the chain stays so.
func TestServiceRefusesToWitnessARewrittenChain(t *testing.T) {
	ctx := t.Context()
	dir := witness.Dir(t.TempDir())
	obs := &countingObserver{}
	var logs testenv.Buffer
	env := newServiceEnv(t, nil, &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}, noApprovalPolicy(),
		ServiceOptions{Witness: dir, Observer: obs, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	for i := range 3 {
		if _, err := env.st.AppendEvent(ctx, model.NewEvent{WorkspaceID: env.ws.ID, Type: "test.event", Reason: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	env.svc.daemon.witnessChains(ctx)
	witnessed, ok, err := dir.Read(env.ws.ID)
	if err != nil || !ok || witnessed.Seq < 2 {
		t.Fatalf("witnessed head: got %+v (found %v, %v), want one past seq 1", witnessed, ok, err)
	}
	tp := env.st.(interface {
		UnsafeExec(ctx context.Context, query string, args ...any) error
	})
	for _, q := range []string{
		fmt.Sprintf("DELETE FROM audit_events WHERE workspace_id = '%s' AND seq >= 2", env.ws.ID),
		fmt.Sprintf("UPDATE audit_chain_heads SET seq = 1, hash = (SELECT hash FROM audit_events WHERE workspace_id = '%[1]s' AND seq = 1) WHERE workspace_id = '%[1]s'", env.ws.ID),
	} {
		if err := tp.UnsafeExec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for i := range int(witnessed.Seq) + 2 {
		if _, err := env.st.AppendEvent(ctx, model.NewEvent{WorkspaceID: env.ws.ID, Type: "forged", Reason: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	for tick := 1; tick <= 2; tick++ {
		env.svc.daemon.witnessChains(ctx)
		if got, _, _ := dir.Read(env.ws.ID); got != witnessed {
			t.Fatalf("tick %d: witnessed head %+v, want the old %+v kept", tick, got, witnessed)
		}
		obs.mu.Lock()
		n := obs.unwitnessed
		obs.mu.Unlock()
		if n != tick {
			t.Errorf("tick %d: WitnessRefused called %d times, want %d", tick, n, tick)
		}
	}
	if got := strings.Count(logs.String(), "level=ERROR msg=\"audit chain not witnessed"); got != 2 {
		t.Errorf("got %d error lines about the chain, want 2; log:\n%s", got, logs.String())
	}
}

// TestCloseDuringARun closes the service while code runs: the execution
// ends killed, charged as a launched run, with the output it had made, not
// as a launch that failed.
func TestCloseDuringARun(t *testing.T) {
	ctx := t.Context()
	hold := make(chan struct{})
	defer close(hold)
	env := newServiceEnv(t, nil, &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor, Hold: hold, Echo: true}, noApprovalPolicy(), ServiceOptions{})
	inv, err := env.svc.Invoke(ctx, env.agent, InvokeRequest{Runtime: "python", Code: "partial output"}, InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	env.waitStarted(t, inv.Execution.ID)
	env.svc.Close(t.Context())
	ex, err := env.st.GetExecution(ctx, env.ws.ID, inv.Execution.ID)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		engine.Result
		Error string `json:"error"`
	}
	if err := json.Unmarshal(ex.Result, &res); err != nil {
		t.Fatal(err)
	}
	if ex.Status != model.StatusKilled || res.Stdout != "partial output" || !strings.Contains(res.Error, "daemon stopped") {
		t.Errorf("execution: got %s with result %s, want killed with the output so far", ex.Status, ex.Result)
	}
	// Nobody saw a signal: the sandbox was destroyed under the program.
	if res.Signal != 0 || res.EndedBy != engine.EndedByShutdown {
		t.Errorf("result: got signal %d ended_by %q, want no signal and ended_by %q", res.Signal, res.EndedBy, engine.EndedByShutdown)
	}
	if c, err := env.st.GetCredits(ctx, env.ws.ID); err != nil || c.Available != 8 || c.Reserved != 0 {
		t.Errorf("credits: got %+v, %v; want 8 available, none reserved (the launched run charged)", c, err)
	}
}

// TestConflictBeforeTheStart checks that a runner's conflict before the
// code started (a driver whose engine reports a name conflict) ends the
// execution as a failed launch, its credits released, rather than being
// taken for a refused start and left queued with its credits reserved.
func TestConflictBeforeTheStart(t *testing.T) {
	ctx := t.Context()
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor, CreateErr: fmt.Errorf("container name in use: %w", errdefs.ErrConflict)}
	env := newServiceEnv(t, nil, drv, noApprovalPolicy(), ServiceOptions{})
	inv, err := env.svc.Invoke(ctx, env.agent, InvokeRequest{Runtime: "python", Code: "print(1)"}, InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := env.svc.Wait(ctx, env.agent, inv.Execution.ID, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ex.Status != model.StatusLaunchFailed {
		t.Errorf("execution: got %s, want %s", ex.Status, model.StatusLaunchFailed)
	}
	if c, err := env.st.GetCredits(ctx, env.ws.ID); err != nil || c.Available != 10 || c.Reserved != 0 {
		t.Errorf("credits: got %+v, %v; want 10 available, none reserved", c, err)
	}
}

// TestAuditWriterWithTheStoreDown checks that while the store is down only
// the first event is tried again: the queue every sandbox shares keeps
// moving, and Close does not wait out every event's retries.
func TestAuditWriterWithTheStoreDown(t *testing.T) {
	saved := storeRetries
	storeRetries = []time.Duration{time.Millisecond, time.Millisecond, time.Millisecond, time.Millisecond}
	defer func() { storeRetries = saved }()
	st := &failingAppends{testStore: openSQLite(t)}
	env := newServiceEnv(t, st, &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}, noApprovalPolicy(), ServiceOptions{})
	st.fail.Store(true)
	const exec = "ex_down"
	env.svc.egress.startRun(exec, env.ws.ID, "")
	for range 3 {
		env.svc.egress.egressDecision(engine.EgressDecision{Decision: egress.Decision{Reason: egress.ReasonNameNotAllowed, Sandbox: "sbx-1", Name: "evil.test", Port: 443},
			Labels: map[string]string{engine.LabelExecution: exec}})
	}
	env.svc.egress.endRun(exec)
	env.svc.Close(t.Context())
	if got, want := st.failures.Load(), int32(len(storeRetries)+1+2); got != want {
		t.Errorf("AppendEvent attempts: got %d, want %d (every retry for the first event, one for each after)", got, want)
	}
}

// lostCommit is a store whose Admit commits and then fails as a
// connection cut after COMMIT does: the answer is lost, not the commit.
type lostCommit struct{ testStore }

func (s lostCommit) Admit(ctx context.Context, e store.NewExecution, st model.Step) (store.Admission, error) {
	if _, err := s.testStore.Admit(ctx, e, st); err != nil {
		return store.Admission{}, err
	}
	return store.Admission{}, fmt.Errorf("connection reset by peer: %w", errdefs.ErrUnavailable)
}

// TestAdmissionWhoseAnswerWasLost checks that an execution admitted by a
// commit whose answer was lost runs, charged once, instead of staying
// queued with its credits reserved until the next start.
func TestAdmissionWhoseAnswerWasLost(t *testing.T) {
	ctx := t.Context()
	env := newServiceEnv(t, lostCommit{openSQLite(t)}, &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}, noApprovalPolicy(), ServiceOptions{})
	inv, err := env.svc.Invoke(ctx, env.agent, InvokeRequest{Runtime: "python", Code: "print(1)"}, InvokeOptions{ExecutionID: NewExecutionID()})
	if err != nil {
		t.Fatalf("Invoke: %v, want the admitted execution", err)
	}
	if ex, err := env.svc.Wait(ctx, env.agent, inv.Execution.ID, 10*time.Second); err != nil || ex.Status != model.StatusSucceeded {
		t.Fatalf("execution: got %s, %v; want succeeded", ex.Status, err)
	}
	if c, err := env.st.GetCredits(ctx, env.ws.ID); err != nil || c.Available != 8 || c.Reserved != 0 {
		t.Errorf("credits: got %+v, %v; want 8 available, none reserved", c, err)
	}
}

// TestNetworkWords checks the request's network words, "allow" and "deny",
// and the older "allowed" and "denied" read as the same words: a request
// for network under a policy that denies it is refused, one without is
// admitted and its approval card shows "deny".
func TestNetworkWords(t *testing.T) {
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}
	env := newServiceEnv(t, nil, drv, model.DefaultPolicy(), ServiceOptions{}) // approval required, network denied
	for _, tt := range []struct {
		network string
		allow   bool
	}{{"allow", true}, {"allowed", true}, {"deny", false}, {"denied", false}, {"", false}} {
		t.Run(cmp.Or(tt.network, "empty"), func(t *testing.T) {
			inv, err := env.svc.Invoke(t.Context(), env.agent, InvokeRequest{Runtime: "python", Code: "print(1)", Network: tt.network}, InvokeOptions{})
			if tt.allow {
				if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "network access is not permitted") {
					t.Errorf("got %+v, %v; want network refused by the policy", inv, err)
				}
				return
			}
			var card ApprovalCard
			if err != nil || inv.Approval == nil || json.Unmarshal(inv.Approval.Card, &card) != nil || card.Network != "deny" {
				t.Errorf("got %+v, %v; want a pending approval whose card shows network deny", inv, err)
			}
		})
	}
	if _, err := env.svc.Invoke(t.Context(), env.agent, InvokeRequest{Runtime: "python", Code: "print(1)", Network: "maybe"}, InvokeOptions{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("network maybe: got %v, want an ErrInvalidArgument", err)
	}
}

// TestApprovalCardReadsTheOldNetworkField checks that a card stored before
// the card said "network" still reads what was asked.
func TestApprovalCardReadsTheOldNetworkField(t *testing.T) {
	for raw, want := range map[string]string{
		`{"runtime":"python","network_requested":true}`:  "allow",
		`{"runtime":"python","network_requested":false}`: "deny",
		`{"runtime":"python","network":"allow"}`:         "allow",
	} {
		var c ApprovalCard
		if err := json.Unmarshal([]byte(raw), &c); err != nil || c.Network != want || c.Runtime != "python" {
			t.Errorf("%s: got %+v, %v; want network %s", raw, c, err, want)
		}
	}
}

// boundedTool is a tool whose record limits its sandboxes to 10 s and
// 256 MiB.
func boundedTool(t *testing.T) engine.Option {
	t.Helper()
	opts := tools.Options{Drivers: DriverCapabilities()}
	set, err := tools.Load(writeTools(t, `
tools:
  - name: report
    input_trust: trusted
    tier: gvisor
    limits: {timeout: 10s, memory: 256MiB}
`), opts)
	if err != nil {
		t.Fatal(err)
	}
	return engine.WithTools(set, opts)
}

// TestInvokeAboveRecordLimits checks the same through the capability
// layer: a timeout_ms above the tool's limit is the caller's mistake
// (400), refused before anything is admitted, and an invocation naming no
// timeout runs with the record's, not the server's default.
func TestInvokeAboveRecordLimits(t *testing.T) {
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}
	env := newServiceEnv(t, nil, drv, noApprovalPolicy(), ServiceOptions{}, boundedTool(t))
	_, err := env.svc.Invoke(t.Context(), env.agent, InvokeRequest{Runtime: "python", Code: "print(1)", Tool: "report", TimeoutMS: 20000}, InvokeOptions{})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `tool "report"`) || !strings.Contains(err.Error(), "10s") {
		t.Fatalf("timeout_ms 20000: got %v, want an invalid argument naming the tool and its 10s", err)
	}
	if n := env.chainLength(t); n != 0 {
		t.Errorf("audit events after the refusal: got %d, want none (nothing was decided)", n)
	}
	inv, err := env.svc.Invoke(t.Context(), env.agent, InvokeRequest{Runtime: "python", Code: "print(1)", Tool: "report"}, InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ex, err := env.svc.Wait(t.Context(), env.agent, inv.Execution.ID, 10*time.Second); err != nil || !ex.Status.Terminal() {
		t.Fatalf("Wait: got %+v, %v", ex, err)
	}
	if got := drv.Specs()[len(drv.Specs())-1].Limits.Timeout; got != 10*time.Second {
		t.Errorf("wall clock of an invocation naming none: got %s, want the record's 10s", got)
	}
}

// testStore is the store the tests run on: all of it, as a daemon's.
type testStore = store.Store
