package capability

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
)

// key adds a key of role to the environment's workspace.
func (e *serviceEnv) key(t *testing.T, role model.Role, name string) Principal {
	t.Helper()
	k, err := e.st.CreateAPIKey(t.Context(), store.NewAPIKey{WorkspaceID: e.ws.ID, Role: role, Hash: model.HashKey(name)})
	if err != nil {
		t.Fatal(err)
	}
	return Principal{KeyID: k.ID, WorkspaceID: e.ws.ID, Role: role}
}

// wantCredits checks the workspace's balance.
func (e *serviceEnv) wantCredits(t *testing.T, available, reserved int64) {
	t.Helper()
	c, err := e.st.GetCredits(t.Context(), e.ws.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c.Available != available || c.Reserved != reserved {
		t.Errorf("credits: got available %d reserved %d, want %d and %d", c.Available, c.Reserved, available, reserved)
	}
}

// cancelData returns the data of the execution's one execution.cancelled
// event.
func (e *serviceEnv) cancelData(t *testing.T, id string) audit.ExecutionCancelledEvent {
	t.Helper()
	var found []model.Event
	for _, ev := range e.events(t, audit.ExecutionCancelled) {
		if ev.ExecutionID == id {
			found = append(found, ev)
		}
	}
	if len(found) != 1 {
		t.Fatalf("execution.cancelled events of %s: got %d, want 1", id, len(found))
	}
	var d audit.ExecutionCancelledEvent
	if err := json.Unmarshal(found[0].Data, &d); err != nil {
		t.Fatal(err)
	}
	if found[0].Code != audit.ExecutionCancelledCode {
		t.Errorf("event code: got %q, want %q", found[0].Code, audit.ExecutionCancelledCode)
	}
	return d
}

// TestCancelAwaitingApproval cancels an execution waiting for a human: it
// ends cancelled with its credits back and its approval request closed,
// the approvals gauge goes down, the cancel is audited with the
// transition, and a second cancel changes nothing.
func TestCancelAwaitingApproval(t *testing.T) {
	ctx := t.Context()
	obs := &countingObserver{}
	env := newServiceEnv(t, nil, &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}, model.DefaultPolicy(), ServiceOptions{Observer: obs})
	inv, err := env.svc.Invoke(ctx, env.agent, InvokeRequest{Runtime: "python", Code: "print(1)"}, InvokeOptions{})
	if err != nil || inv.Approval == nil {
		t.Fatalf("got %+v, %v; want a pending approval", inv, err)
	}
	env.wantCredits(t, 8, 2)
	ex, err := env.svc.Cancel(ctx, env.agent, inv.Execution.ID, "not needed")
	if err != nil || ex.Status != model.StatusCancelled {
		t.Fatalf("Cancel: got %s, %v; want cancelled", ex.Status, err)
	}
	env.wantCredits(t, 10, 0)
	if a, err := env.st.GetApproval(ctx, env.ws.ID, inv.Approval.ID); err != nil || a.Status != model.ApprovalCancelled {
		t.Errorf("approval: got %s, %v; want cancelled", a.Status, err)
	}
	if d := env.cancelData(t, ex.ID); d != (audit.ExecutionCancelledEvent{From: "awaiting_approval", To: "cancelled", ApprovalID: inv.Approval.ID}) {
		t.Errorf("event data: got %+v", d)
	}
	obs.mu.Lock()
	if obs.pending != 0 {
		t.Errorf("approvals pending gauge: got %d, want 0", obs.pending)
	}
	obs.mu.Unlock()
	n := env.chainLength(t)
	again, err := env.svc.Cancel(ctx, env.agent, inv.Execution.ID, "")
	if err != nil || again.Status != model.StatusCancelled || env.chainLength(t) != n {
		t.Errorf("a second cancel: got %s, %v and %d events, want the execution unchanged and no event (%d)", again.Status, err, env.chainLength(t), n)
	}
}

// TestCancelQueued cancels an execution waiting for a sandbox slot: it
// ends cancelled, uncharged, and never runs once the slot is free.
func TestCancelQueued(t *testing.T) {
	ctx := t.Context()
	hold := make(chan struct{})
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor, Hold: hold}
	env := newServiceEnv(t, nil, drv, noApprovalPolicy(), ServiceOptions{MaxConcurrent: 1})
	first, err := env.svc.Invoke(ctx, env.agent, InvokeRequest{Runtime: "python", Code: "first"}, InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	env.waitRunning(t, first.Execution.ID)
	queued, err := env.svc.Invoke(ctx, env.agent, InvokeRequest{Runtime: "python", Code: "second"}, InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	env.wantCredits(t, 6, 4)
	ex, err := env.svc.Cancel(ctx, env.agent, queued.Execution.ID, "")
	if err != nil || ex.Status != model.StatusCancelled {
		t.Fatalf("Cancel: got %s, %v; want cancelled", ex.Status, err)
	}
	env.wantCredits(t, 8, 2)
	close(hold)
	if got, err := env.svc.Wait(ctx, env.agent, first.Execution.ID, 10*time.Second); err != nil || got.Status != model.StatusSucceeded {
		t.Fatalf("first execution: got %s, %v", got.Status, err)
	}
	env.svc.Close(t.Context()) // every run has ended
	if n := len(drv.Specs()); n != 1 {
		t.Errorf("sandboxes created: got %d, want 1 (none for the cancelled execution)", n)
	}
	if got, _ := env.st.GetExecution(ctx, env.ws.ID, queued.Execution.ID); got.Status != model.StatusCancelled {
		t.Errorf("cancelled execution afterwards: got %s", got.Status)
	}
	if d := env.cancelData(t, queued.Execution.ID); d != (audit.ExecutionCancelledEvent{From: "queued", To: "cancelled"}) {
		t.Errorf("event data: got %+v", d)
	}
	env.wantCredits(t, 8, 0)
}

// TestCancelRunning cancels an execution whose code runs: its sandbox is
// destroyed and it ends killed, charged as the launched run it was, with
// the output it had made, ended_by cancel and no invented signal.
func TestCancelRunning(t *testing.T) {
	ctx := t.Context()
	hold := make(chan struct{})
	defer close(hold)
	env := newServiceEnv(t, nil, &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor, Hold: hold, Echo: true}, noApprovalPolicy(), ServiceOptions{})
	inv, err := env.svc.Invoke(ctx, env.agent, InvokeRequest{Runtime: "python", Code: "partial output"}, InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	env.waitStarted(t, inv.Execution.ID)
	ex, err := env.svc.Cancel(ctx, env.agent, inv.Execution.ID, "taking too long")
	if err != nil || ex.Status != model.StatusKilled {
		t.Fatalf("Cancel: got %s, %v; want killed", ex.Status, err)
	}
	var res struct {
		engine.Result
		Error string `json:"error"`
	}
	if err := json.Unmarshal(ex.Result, &res); err != nil {
		t.Fatal(err)
	}
	if res.EndedBy != engine.EndedByCancel || res.Signal != 0 || res.Stdout != "partial output" || res.Error == "" {
		t.Errorf("result: got %s, want ended_by cancel, no signal and the output so far", ex.Result)
	}
	env.wantCredits(t, 8, 0)
	if d := env.cancelData(t, ex.ID); d != (audit.ExecutionCancelledEvent{From: "running", To: "killed", Credits: 2}) {
		t.Errorf("event data: got %+v", d)
	}
	if got := len(env.events(t, audit.ExecutionFinished)); got != 1 {
		t.Errorf("execution.finished events: got %d, want 1", got)
	}
}

// TestCancelWho checks who may cancel an execution: the key that invoked
// it or an admin key of the workspace, no one else.
func TestCancelWho(t *testing.T) {
	ctx := t.Context()
	env := newServiceEnv(t, nil, &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}, model.DefaultPolicy(), ServiceOptions{})
	inv, err := env.svc.Invoke(ctx, env.agent, InvokeRequest{Runtime: "python", Code: "print(1)"}, InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []Principal{env.key(t, model.RoleAgent, "another agent"), env.key(t, model.RoleApprover, "approver")} {
		if _, err := env.svc.Cancel(ctx, p, inv.Execution.ID, ""); !errdefs.IsPermissionDenied(err) {
			t.Errorf("Cancel by a %s key that did not invoke: got %v, want permission denied", p.Role, err)
		}
	}
	if _, err := env.svc.Cancel(ctx, env.agent, "ex_nope", ""); !errdefs.IsNotFound(err) {
		t.Errorf("Cancel of an unknown execution: got %v, want not found", err)
	}
	env.wantCredits(t, 8, 2)
	if ex, err := env.svc.Cancel(ctx, env.key(t, model.RoleAdmin, "admin"), inv.Execution.ID, ""); err != nil || ex.Status != model.StatusCancelled {
		t.Errorf("Cancel by an admin key: got %s, %v; want cancelled", ex.Status, err)
	}
	env.wantCredits(t, 10, 0)
}
