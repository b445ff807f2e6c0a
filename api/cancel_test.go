package api_test

import (
	"crypto/rand"
	"net/http"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/wire"
)

// TestCancel cancels executions over HTTP: one awaiting approval (cancelled,
// credits released, approval closed), one whose code runs (killed, charged
// as a launched run), an ended one (answered unchanged), and refuses keys
// that neither invoked nor administer the workspace.
func TestCancel(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		t.Run("awaiting approval", func(t *testing.T) {
			e := newEnv(t, b, envConfig{credits: 10})
			v := e.awaitApproval(capability.InvokeRequest{Runtime: "python", Code: "print(1)"})
			e.wantCredits(8, 2)
			got := e.do("POST", "/v1/executions/"+v.ID+"/cancel", e.agent, map[string]string{"reason": "not needed"}).want(t, http.StatusOK).execution(t)
			if string(got.Status) != string(model.StatusCancelled) || got.FinishedAt == nil || got.StartedAt != nil {
				t.Fatalf("cancel answer: got status %q started %v finished %v, want cancelled, never started", got.Status, got.StartedAt, got.FinishedAt)
			}
			e.wantCredits(10, 0)
			if tc := e.toolCall(v.ID); tc.Status != "cancelled" || tc.CreditsCharged != 0 {
				t.Errorf("tool_calls row: got %s with %d credits, want cancelled with 0", tc.Status, tc.CreditsCharged)
			}
			closed := list[wire.Approval](t, e.url, e.approver, "/v1/approvals", "status=cancelled")
			if len(closed) != 1 || closed[0].ID != v.ApprovalID || closed[0].Reason != "not needed" {
				t.Errorf("cancelled approvals: got %+v, want %s", closed, v.ApprovalID)
			}
			if pending := list[wire.Approval](t, e.url, e.approver, "/v1/approvals", "status=pending"); len(pending) != 0 {
				t.Errorf("pending approvals: got %+v, want none", pending)
			}
			if ev := e.events("execution.cancelled", v.ID); len(ev) != 1 || ev[0].Code != "EXE003I" {
				t.Errorf("execution.cancelled events: got %+v, want one with code EXE003I", ev)
			}
			e.do("POST", "/v1/approvals/"+v.ApprovalID+"/approve", e.approver, nil).wantError(t, http.StatusConflict, "conflict")
			// Idempotent: a second cancel answers the execution as it is.
			again := e.do("POST", "/v1/executions/"+v.ID+"/cancel", e.agent, nil).want(t, http.StatusOK).execution(t)
			if string(again.Status) != string(model.StatusCancelled) || len(e.events("execution.cancelled", v.ID)) != 1 {
				t.Errorf("a second cancel: got status %q, want cancelled and no second event", again.Status)
			}
			e.wantCredits(10, 0)
		})

		t.Run("running", func(t *testing.T) {
			e := newEnv(t, b, envConfig{credits: 10, policy: noApproval})
			done := make(chan reply, 1)
			go func() {
				done <- do(t, e.url, "POST", "/v1/executions", e.agent, capability.InvokeRequest{Runtime: "python",
					Code: "import time\nprint('started', flush=True)\ntime.sleep(60)", TimeoutMS: 30000})
			}()
			var id string
			for deadline := time.Now().Add(20 * time.Second); id == ""; time.Sleep(20 * time.Millisecond) {
				if calls := e.toolCalls("status=running"); len(calls) == 1 && calls[0].StartedAt != nil {
					id = calls[0].ExecutionID
				}
				if time.Now().After(deadline) {
					t.Fatal("the execution never ran")
				}
			}
			start := time.Now()
			got := e.do("POST", "/v1/executions/"+id+"/cancel", e.agent, nil).want(t, http.StatusOK).execution(t)
			if string(got.Status) != string(model.StatusKilled) {
				t.Fatalf("cancel answer: got status %q (%s), want killed", got.Status, got.Result)
			}
			if d := time.Since(start); d > 15*time.Second {
				t.Errorf("the cancel took %s; the code sleeps for a minute, the cancel must not wait for it", d)
			}
			res := result(t, got)
			if res.EndedBy != engine.EndedByCancel || res.Signal != 0 {
				t.Errorf("result: got ended_by %q signal %d, want %q and no signal", res.EndedBy, res.Signal, engine.EndedByCancel)
			}
			if r := <-done; r.code != http.StatusOK || string(r.execution(t).Status) != string(model.StatusKilled) {
				t.Errorf("the invoking request: got %d %s, want 200 with the killed execution", r.code, r.body)
			}
			e.wantCredits(8, 0)
			if tc := e.toolCall(id); tc.CreditsCharged != 2 || tc.Status != "killed" {
				t.Errorf("tool_calls row: got %s with %d credits, want killed with 2 (a launched run)", tc.Status, tc.CreditsCharged)
			}
			if ev := e.events("execution.cancelled", id); len(ev) != 1 {
				t.Errorf("execution.cancelled events: got %d, want 1", len(ev))
			}
		})

		t.Run("who", func(t *testing.T) {
			e := newEnv(t, b, envConfig{credits: 10})
			other := "sk_test_agent2_" + rand.Text()
			if _, err := e.st.CreateAPIKey(t.Context(), store.NewAPIKey{WorkspaceID: e.ws.ID, Role: model.RoleAgent, Hash: model.HashKey(other)}); err != nil {
				t.Fatal(err)
			}
			v := e.awaitApproval(capability.InvokeRequest{Runtime: "python", Code: "print(1)"})
			for _, key := range []string{other, e.approver} {
				e.do("POST", "/v1/executions/"+v.ID+"/cancel", key, nil).wantError(t, http.StatusForbidden, "permission_denied", "key that invoked")
			}
			e.do("POST", "/v1/executions/ex_nope/cancel", e.agent, nil).wantError(t, http.StatusNotFound, "not_found")
			e.do("POST", "/v1/executions/"+v.ID+"/cancel", "", nil).wantError(t, http.StatusUnauthorized, "unauthenticated")
			e.wantCredits(8, 2)
			if got := e.do("POST", "/v1/executions/"+v.ID+"/cancel", e.admin, nil).want(t, http.StatusOK).execution(t); string(got.Status) != string(model.StatusCancelled) {
				t.Errorf("an admin's cancel: got %q, want cancelled", got.Status)
			}
			e.wantCredits(10, 0)
			// One that ended otherwise is answered as it ended.
			e2 := e.awaitApproval(capability.InvokeRequest{Runtime: "python", Code: "print(2)"})
			e.deny(t, e2, "no")
			if got := e.do("POST", "/v1/executions/"+e2.ID+"/cancel", e.agent, nil).want(t, http.StatusOK).execution(t); string(got.Status) != string(model.StatusDenied) {
				t.Errorf("cancelling a denied execution: got %q, want it still denied", got.Status)
			}
		})
	})
}
