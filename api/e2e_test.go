package api_test

// End-to-end tests of the capability layer: real HTTP (httptest) over the
// real service, the real runc driver and both stores (SQLite in a temporary
// file, PostgreSQL in a schema of its own per test). Each test runs once per
// store as the subtests sqlite and postgres. The PostgreSQL half needs
// STOCKADE_TEST_POSTGRES (export STOCKADE_TEST_POSTGRES=$(scripts/pgtest.sh)).

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/store/storetest"
	"github.com/stockade-sh/stockade/wire"
)

func TestAllowedRunChargesTwoCredits(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		e := newEnv(t, b, envConfig{policy: noApproval, credits: 10})
		code := `print("hello from the sandbox")`
		v := e.invoke(capability.InvokeRequest{Runtime: "python", Code: code}).want(t, http.StatusOK).execution(t)
		if string(v.Status) != string(model.StatusSucceeded) || v.Driver != "runc" || v.StartedAt == nil || v.FinishedAt == nil {
			t.Fatalf("execution: got status %q driver %q started %v finished %v, want succeeded on runc", v.Status, v.Driver, v.StartedAt, v.FinishedAt)
		}
		res := result(t, v)
		if res.Stdout != "hello from the sandbox\n" || res.ExitCode != 0 || res.Runtime != "python" {
			t.Errorf("result: got stdout %q exit %d runtime %q", res.Stdout, res.ExitCode, res.Runtime)
		}
		e.wantCredits(8, 0)

		calls := e.toolCalls("")
		if len(calls) != 1 {
			t.Fatalf("tool_calls rows: got %d, want 1", len(calls))
		}
		tc := calls[0]
		if tc.ExecutionID != v.ID || tc.CreditsCharged != 2 || string(tc.Status) != string(model.StatusSucceeded) ||
			tc.ExitCode == nil || *tc.ExitCode != 0 || tc.StdoutPreview != "hello from the sandbox\n" ||
			tc.InputSHA256 != capability.InputHash("python", code) || tc.Driver != "runc" || tc.Tool != "code.execute" {
			t.Errorf("tool_calls row: got %+v", tc)
		}
		inv, err := e.st.ListToolInvocations(t.Context(), e.ws.ID, store.ToolCallFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(inv.Items) != 1 || inv.Items[0].ExecutionID != v.ID || inv.Items[0].Credits != 2 || inv.Items[0].Ran <= 0 {
			t.Errorf("tool_invocations rows: got %+v, want one for %s with 2 credits", inv.Items, v.ID)
		}

		allowed := e.events("capability.invoke_allowed", "")
		if len(allowed) != 1 || allowed[0].ExecutionID != v.ID || allowed[0].Code != "CAP001I" || allowed[0].Actor == "" {
			t.Errorf("invoke_allowed events: got %+v, want one for %s", allowed, v.ID)
		}
		if denied := e.events("capability.invoke_denied", ""); len(denied) != 0 {
			t.Errorf("invoke_denied events: got %+v, want none", denied)
		}
		if got := e.do("GET", "/v1/executions/"+v.ID, e.agent, nil).want(t, http.StatusOK).execution(t); got.Status != v.Status {
			t.Errorf("GET execution: got status %q, want %q", got.Status, v.Status)
		}
	})
}

func TestDenials(t *testing.T) {
	tests := []struct {
		name     string
		policy   func(*model.Policy)
		req      capability.InvokeRequest
		decision string // the event's data.decision
		reason   string // in the 403 message and the event's reason
	}{
		{"code execution disabled", func(p *model.Policy) { p.CodeExecution = false },
			capability.InvokeRequest{Runtime: "python", Code: "print(1)"}, "code_execution_disabled", "code execution is disabled"},
		{"runtime not allowed", func(p *model.Policy) { p.Runtimes = []string{"shell"} },
			capability.InvokeRequest{Runtime: "python", Code: "print(1)"}, "runtime_not_allowed", `runtime "python" is not allowed`},
		{"network not permissible", func(p *model.Policy) { p.NetworkAllowed = false },
			capability.InvokeRequest{Runtime: "python", Code: "print(1)", Network: "allow"}, "network_not_permitted", "network access is not permitted"},
		{"network permitted but no egress allowlist", func(p *model.Policy) { p.NetworkAllowed = true },
			capability.InvokeRequest{Runtime: "python", Code: "print(1)", Network: "allow"}, "network_not_permitted", "egress allowlist"},
		{"timeout above workspace max", func(p *model.Policy) { p.MaxTimeout = 5 * time.Second },
			capability.InvokeRequest{Runtime: "python", Code: "print(1)", TimeoutMS: 10_000}, "timeout_above_max", "above the workspace maximum of 5s"},
	}
	forEachStore(t, func(t *testing.T, b backend) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				e := newEnv(t, b, envConfig{credits: 10, policy: func(p *model.Policy) {
					noApproval(p)
					tt.policy(p)
				}})
				e.invoke(tt.req).wantError(t, http.StatusForbidden, "permission_denied", tt.reason)

				denied := e.events("capability.invoke_denied", "")
				if len(denied) != 1 {
					t.Fatalf("invoke_denied events: got %d, want 1", len(denied))
				}
				if ev := denied[0]; !strings.Contains(ev.Reason, tt.reason) || decisionOf(t, ev) != tt.decision || ev.Code != "CAP002W" || ev.Actor == "" {
					t.Errorf("invoke_denied event: got reason %q decision %q code %q actor %q, want %q and %q",
						ev.Reason, decisionOf(t, ev), ev.Code, ev.Actor, tt.reason, tt.decision)
				}
				if allowed := e.events("capability.invoke_allowed", ""); len(allowed) != 0 {
					t.Errorf("invoke_allowed events: got %d, want 0", len(allowed))
				}
				if calls := e.toolCalls(""); len(calls) != 0 {
					t.Errorf("tool_calls rows: got %d, want 0", len(calls))
				}
				e.wantCredits(10, 0)
			})
		}
	})
}

// approvalCardKeys are the fields an approver must be shown.
var approvalCardKeys = []string{"approval_id", "execution_id", "code", "runtime", "risk_level", "network", "timeout_ms", "expires_at"}

// wantCard checks an approval card against the request it describes.
func wantCard(t *testing.T, raw json.RawMessage, req capability.InvokeRequest, approvalID, execID string) capability.ApprovalCard {
	t.Helper()
	var keys map[string]any
	if err := json.Unmarshal(raw, &keys); err != nil {
		t.Fatalf("approval card %s: %v", raw, err)
	}
	for _, k := range approvalCardKeys {
		if _, ok := keys[k]; !ok {
			t.Errorf("approval card %s has no %q", raw, k)
		}
	}
	var c capability.ApprovalCard
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	wantTimeout := req.TimeoutMS
	if wantTimeout == 0 {
		wantTimeout = 30_000 // the default policy's maximum
	}
	if c.ApprovalID == "" || (approvalID != "" && c.ApprovalID != approvalID) || (execID != "" && c.ExecutionID != execID) ||
		c.Code != req.Code || c.Runtime != req.Runtime || c.RiskLevel != "high" || c.Capability != "code.execute" ||
		c.Network != cmp.Or(req.Network, "deny") || c.TimeoutMS != wantTimeout || !c.ExpiresAt.After(time.Now()) {
		t.Errorf("approval card: got %+v, want approval %q execution %q for %+v, risk high, timeout %d ms", c, approvalID, execID, req, wantTimeout)
	}
	return c
}

// awaitApproval POSTs req under an approval-required policy and checks the
// 202 answer.
// deny denies v's approval as the approver and checks that the answer
// and the execution say denied, and that it never started.
func (e *env) deny(t *testing.T, v wire.Execution, reason string) {
	t.Helper()
	var d decision
	e.do("POST", "/v1/approvals/"+v.ApprovalID+"/deny", e.approver, map[string]string{"reason": reason}).want(t, http.StatusOK).decode(t, &d)
	if d.Approval.Status != "denied" || d.Execution.Status != "denied" {
		t.Errorf("deny answer: got approval %q execution %q, want denied and denied", d.Approval.Status, d.Execution.Status)
	}
	if got := e.wait(v.ID, 5*time.Second); string(got.Status) != string(model.StatusDenied) || got.StartedAt != nil {
		t.Errorf("after denial: got status %q started %v, want denied, never started", got.Status, got.StartedAt)
	}
}

func (e *env) awaitApproval(req capability.InvokeRequest) wire.Execution {
	t := e.t
	t.Helper()
	r := e.invoke(req).want(t, http.StatusAccepted)
	v := r.execution(t)
	if string(v.Status) != string(model.StatusAwaitingApproval) || v.ApprovalID == "" {
		t.Fatalf("202 answer: got status %q approval %q, want awaiting_approval with an approval id", v.Status, v.ApprovalID)
	}
	if loc := r.header.Get("Location"); loc != "/v1/executions/"+v.ID {
		t.Errorf("Location: got %q, want /v1/executions/%s", loc, v.ID)
	}
	wantCard(t, cardJSON(v.Approval), req, v.ApprovalID, v.ID)
	return v
}

// decision is the answer of approve and deny.
type decision struct {
	Approval  wire.Approval  `json:"approval"`
	Execution wire.Execution `json:"execution"`
}

func TestApprovalPaths(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		t.Run("approve", func(t *testing.T) {
			e := newEnv(t, b, envConfig{credits: 10})
			req := capability.InvokeRequest{Runtime: "python", Code: `print("approved run")`, TimeoutMS: 5000}
			v := e.awaitApproval(req)
			e.wantCredits(8, 2)

			pending := list[wire.Approval](t, e.url, e.approver, "/v1/approvals", "status=pending")
			if len(pending) != 1 || pending[0].ID != v.ApprovalID || pending[0].ExecutionID != v.ID || pending[0].Status != "pending" {
				t.Fatalf("pending approvals: got %+v, want %s", pending, v.ApprovalID)
			}
			wantCard(t, cardJSON(&pending[0].Card), req, v.ApprovalID, v.ID)
			if got := e.do("GET", "/v1/executions/"+v.ID, e.agent, nil).want(t, http.StatusOK).execution(t); got.Status != "awaiting_approval" {
				t.Errorf("GET before the decision: got %q, want awaiting_approval", got.Status)
			}

			var d decision
			e.do("POST", "/v1/approvals/"+v.ApprovalID+"/approve", e.approver, map[string]string{"reason": "looks fine"}).want(t, http.StatusOK).decode(t, &d)
			if d.Approval.Status != "approved" || d.Approval.DecidedBy == "" || d.Approval.DecidedAt == nil || d.Approval.Reason != "looks fine" {
				t.Errorf("decided approval: got %+v", d.Approval)
			}
			got := e.wait(v.ID, 30*time.Second)
			if string(got.Status) != string(model.StatusSucceeded) || result(t, got).Stdout != "approved run\n" {
				t.Fatalf("after approval: got status %q result %s, want succeeded", got.Status, got.Result)
			}
			e.wantCredits(8, 0)
			if tc := e.toolCall(v.ID); tc.CreditsCharged != 2 || tc.Status != "succeeded" {
				t.Errorf("tool_calls row: got %s with %d credits, want succeeded with 2", tc.Status, tc.CreditsCharged)
			}
			for typ, n := range map[string]int{"capability.invoke_allowed": 1, "approval.requested": 1, "approval.approved": 1} {
				if got := len(e.events(typ, v.ID)); got != n {
					t.Errorf("%s events: got %d, want %d", typ, got, n)
				}
			}
			e.do("POST", "/v1/approvals/"+v.ApprovalID+"/approve", e.approver, nil).wantError(t, http.StatusConflict, "conflict")
		})

		t.Run("deny", func(t *testing.T) {
			e := newEnv(t, b, envConfig{credits: 10})
			v := e.awaitApproval(capability.InvokeRequest{Runtime: "shell", Code: "rm -rf /"})
			e.wantCredits(8, 2)
			e.deny(t, v, "no")
			e.wantCredits(10, 0)
			if tc := e.toolCall(v.ID); tc.CreditsCharged != 0 || tc.Status != "denied" {
				t.Errorf("tool_calls row: got %s with %d credits, want denied with 0", tc.Status, tc.CreditsCharged)
			}
			wantLedger(t, e, map[model.LedgerKind]int{model.LedgerGrant: 1, model.LedgerReserve: 1, model.LedgerRelease: 1})
			if got := len(e.events("approval.denied", v.ID)); got != 1 {
				t.Errorf("approval.denied events: got %d, want 1", got)
			}
		})

		t.Run("expiry", func(t *testing.T) {
			e := newEnv(t, b, envConfig{credits: 10, svc: capability.ServiceOptions{ApprovalTTL: time.Second}})
			v := e.awaitApproval(capability.InvokeRequest{Runtime: "python", Code: "print(1)"})
			start := time.Now()
			got := e.wait(v.ID, 15*time.Second)
			if string(got.Status) != string(model.StatusApprovalExpired) {
				t.Fatalf("after the TTL: got status %q, want approval_expired", got.Status)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("the expiry took %s, want a few seconds at most with a 1 s TTL", d)
			}
			e.wantCredits(10, 0)
			if tc := e.toolCall(v.ID); tc.CreditsCharged != 0 || tc.Status != "approval_expired" {
				t.Errorf("tool_calls row: got %s with %d credits, want approval_expired with 0", tc.Status, tc.CreditsCharged)
			}
			if ex := list[wire.Approval](t, e.url, e.approver, "/v1/approvals", "status=expired"); len(ex) != 1 || ex[0].ID != v.ApprovalID {
				t.Errorf("expired approvals: got %+v, want %s", ex, v.ApprovalID)
			}
			if got := len(e.events("approval.expired", v.ID)); got != 1 {
				t.Errorf("approval.expired events: got %d, want 1", got)
			}
			e.do("POST", "/v1/approvals/"+v.ApprovalID+"/approve", e.approver, nil).wantError(t, http.StatusConflict, "conflict")
			e.wantCredits(10, 0)
		})
	})
}

// decideAsync approves or denies from another goroutine, as a human would
// while the agent's stream stays open, and reports the answer's status.
func decideAsync(base, key, approvalID, verb string) <-chan string {
	out := make(chan string, 1)
	go func() {
		req, err := http.NewRequest("POST", base+"/v1/approvals/"+approvalID+"/"+verb, nil)
		if err != nil {
			out <- err.Error()
			return
		}
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}()
	return out
}

func TestServerSentEvents(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		t.Run("approve", func(t *testing.T) {
			e := newEnv(t, b, envConfig{credits: 10})
			req := capability.InvokeRequest{Runtime: "python", Code: `print("streamed")`}
			s := postStream(t, e.url, e.agent, req)
			first := s.next(30 * time.Second)
			if first.name != "approval_required" {
				t.Fatalf("first event: got %q (%s), want approval_required", first.name, first.data)
			}
			card := wantCard(t, json.RawMessage(first.data), req, "", "")
			decided := decideAsync(e.url, e.approver, card.ApprovalID, "approve")

			evs := s.rest(60 * time.Second)
			if got := <-decided; !strings.HasPrefix(got, "200 ") {
				t.Fatalf("approving: got %s", got)
			}
			var names []string
			stdout := ""
			for _, ev := range evs {
				names = append(names, ev.name)
				if ev.name == "stdout" {
					var chunk struct{ Data string }
					if err := json.Unmarshal([]byte(ev.data), &chunk); err != nil {
						t.Fatalf("stdout event %q: %v", ev.data, err)
					}
					stdout += chunk.Data
				}
			}
			if len(names) < 3 || names[0] != "started" || names[len(names)-1] != "result" || !slices.Contains(names, "stdout") {
				t.Fatalf("events after approval_required: got %v, want started, stdout..., result", names)
			}
			if stdout != "streamed\n" {
				t.Errorf("streamed stdout: got %q, want %q", stdout, "streamed\n")
			}
			var v wire.Execution
			if err := json.Unmarshal([]byte(evs[len(evs)-1].data), &v); err != nil {
				t.Fatal(err)
			}
			if v.ID != card.ExecutionID || string(v.Status) != string(model.StatusSucceeded) || result(t, v).Stdout != "streamed\n" {
				t.Errorf("result event: got id %q status %q result %s, want %s succeeded", v.ID, v.Status, v.Result, card.ExecutionID)
			}
			e.wantCredits(8, 0)
		})

		t.Run("deny", func(t *testing.T) {
			e := newEnv(t, b, envConfig{credits: 10})
			req := capability.InvokeRequest{Runtime: "shell", Code: "echo never"}
			s := postStream(t, e.url, e.agent, req)
			first := s.next(30 * time.Second)
			if first.name != "approval_required" {
				t.Fatalf("first event: got %q (%s), want approval_required", first.name, first.data)
			}
			card := wantCard(t, json.RawMessage(first.data), req, "", "")
			decided := decideAsync(e.url, e.approver, card.ApprovalID, "deny")
			evs := s.rest(30 * time.Second)
			if got := <-decided; !strings.HasPrefix(got, "200 ") {
				t.Fatalf("denying: got %s", got)
			}
			if len(evs) != 1 || evs[0].name != "denied" {
				t.Fatalf("events after approval_required: got %v, want one denied", evs)
			}
			var v wire.Execution
			if err := json.Unmarshal([]byte(evs[0].data), &v); err != nil {
				t.Fatal(err)
			}
			if v.ID != card.ExecutionID || string(v.Status) != string(model.StatusDenied) {
				t.Errorf("denied event: got id %q status %q, want %s denied", v.ID, v.Status, card.ExecutionID)
			}
			e.wantCredits(10, 0)
		})
	})
}

func TestRoles(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		e := newEnv(t, b, envConfig{credits: 10})

		// An approver key cannot invoke: a denial, recorded, uncharged.
		e.do("POST", "/v1/executions", e.approver, capability.InvokeRequest{Runtime: "python", Code: "print(1)"}).
			wantError(t, http.StatusForbidden, "permission_denied", "approver keys cannot invoke")
		denied := e.events("capability.invoke_denied", "")
		if len(denied) != 1 || decisionOf(t, denied[0]) != "role_cannot_invoke" {
			t.Fatalf("invoke_denied events: got %+v, want one role_cannot_invoke", denied)
		}
		if calls := e.toolCalls(""); len(calls) != 0 {
			t.Errorf("tool_calls rows after the approver's attempt: got %d, want 0", len(calls))
		}
		e.wantCredits(10, 0)

		// An agent key cannot decide.
		v := e.awaitApproval(capability.InvokeRequest{Runtime: "python", Code: `print("by admin")`})
		for _, verb := range []string{"approve", "deny"} {
			e.do("POST", "/v1/approvals/"+v.ApprovalID+"/"+verb, e.agent, nil).wantError(t, http.StatusForbidden, "permission_denied")
		}
		if p := list[wire.Approval](t, e.url, e.approver, "/v1/approvals", "status=pending"); len(p) != 1 || p[0].ID != v.ApprovalID {
			t.Fatalf("pending approvals after the agent's attempts: got %+v, want %s still pending", p, v.ApprovalID)
		}
		e.wantCredits(8, 2)

		// An admin key may decide.
		e.do("POST", "/v1/approvals/"+v.ApprovalID+"/approve", e.admin, nil).want(t, http.StatusOK)
		if got := e.wait(v.ID, 30*time.Second); string(got.Status) != string(model.StatusSucceeded) {
			t.Errorf("after the admin's approval: got %q, want succeeded", got.Status)
		}
		e.wantCredits(8, 0)

		// No key decides its own invocation, not even an admin's.
		r := e.do("POST", "/v1/executions", e.admin, capability.InvokeRequest{Runtime: "python", Code: `print("self")`}).want(t, http.StatusAccepted)
		self := r.execution(t)
		e.do("POST", "/v1/approvals/"+self.ApprovalID+"/approve", e.admin, nil).wantError(t, http.StatusForbidden, "permission_denied", "own approval")
		e.do("POST", "/v1/approvals/"+self.ApprovalID+"/deny", e.approver, nil).want(t, http.StatusOK)
		e.wantCredits(8, 0)

		// Keys of another workspace see nothing of this one.
		other, err := e.st.CreateWorkspace(t.Context(), "e2e-other", nil)
		if err != nil {
			t.Fatal(err)
		}
		otherKeys := map[model.Role]string{}
		for _, role := range []model.Role{model.RoleAgent, model.RoleApprover} {
			otherKeys[role] = "sk_test_other_" + string(role) + "_" + t.Name()
			if _, err := e.st.CreateAPIKey(t.Context(), store.NewAPIKey{WorkspaceID: other.ID, Role: role, Hash: model.HashKey(otherKeys[role])}); err != nil {
				t.Fatal(err)
			}
		}
		e.do("GET", "/v1/executions/"+v.ID, otherKeys[model.RoleAgent], nil).wantError(t, http.StatusNotFound, "not_found")
		v2 := e.awaitApproval(capability.InvokeRequest{Runtime: "python", Code: "print(2)"})
		e.do("POST", "/v1/approvals/"+v2.ApprovalID+"/approve", otherKeys[model.RoleApprover], nil).wantError(t, http.StatusNotFound, "not_found")
		if calls := list[wire.ToolCall](t, e.url, otherKeys[model.RoleAgent], "/v1/tool-calls", ""); len(calls) != 0 {
			t.Errorf("another workspace's tool calls: got %d, want 0", len(calls))
		}
	})
}

func TestBadAuth(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		e := newEnv(t, b, envConfig{credits: 10, policy: noApproval})
		revoked := "sk_test_revoked_" + t.Name()
		k, err := e.st.CreateAPIKey(t.Context(), store.NewAPIKey{WorkspaceID: e.ws.ID, Role: model.RoleAgent, Hash: model.HashKey(revoked)})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.st.RevokeAPIKey(t.Context(), e.ws.ID, k.ID, nil); err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			name string
			hdr  []string // Authorization, when set
			msg  string
		}{
			{"no key", nil, "missing API key"},
			{"wrong key", []string{"Authorization", "Bearer sk_wrong"}, "invalid or revoked"},
			{"revoked key", []string{"Authorization", "Bearer " + revoked}, "invalid or revoked"},
			{"not a bearer key", []string{"Authorization", "Basic " + e.agent}, ""},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				for _, r := range []struct{ method, path string }{{"POST", "/v1/executions"}, {"GET", "/v1/workspace"}, {"GET", "/v1/audit/events"}} {
					var body any
					if r.method == "POST" {
						body = capability.InvokeRequest{Runtime: "python", Code: "print(1)"}
					}
					got := e.do(r.method, r.path, "", body, tt.hdr...)
					var msg []string
					if tt.msg != "" {
						msg = append(msg, tt.msg)
					}
					got.wantError(t, http.StatusUnauthorized, "unauthenticated", msg...)
					if got.header.Get("WWW-Authenticate") == "" {
						t.Errorf("%s %s: no WWW-Authenticate header", r.method, r.path)
					}
				}
			})
		}
		if calls := e.toolCalls(""); len(calls) != 0 {
			t.Errorf("tool_calls rows after unauthenticated requests: got %d, want 0", len(calls))
		}
		e.wantCredits(10, 0)
	})
}

func TestBadInput(t *testing.T) {
	huge, err := json.Marshal(capability.InvokeRequest{Runtime: "python", Code: "#" + strings.Repeat("x", sandbox.MaxCodeSize)})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		body   string
		status int
		code   string
		msg    []string
	}{
		{"malformed JSON", `{"runtime": "python", "code": `, 400, "invalid_argument", []string{"malformed JSON"}},
		{"not an object", `["python", "print(1)"]`, 400, "invalid_argument", nil},
		{"empty body", ``, 400, "invalid_argument", []string{"empty"}},
		{"trailing data", `{"runtime":"python","code":"print(1)"} {}`, 400, "invalid_argument", []string{"trailing"}},
		{"unknown field", `{"runtime":"python","code":"print(1)","memory_mb":64}`, 400, "invalid_argument", []string{`unknown field "memory_mb"`}},
		{"wrong type of code", `{"runtime":"python","code":42}`, 400, "invalid_argument", []string{`"code"`, "string"}},
		{"wrong type of timeout_ms", `{"runtime":"python","code":"print(1)","timeout_ms":"5s"}`, 400, "invalid_argument", []string{`"timeout_ms"`}},
		{"unknown runtime", `{"runtime":"ruby","code":"puts 1"}`, 400, "invalid_argument", []string{`unknown runtime "ruby"`}},
		{"bad network", `{"runtime":"python","code":"print(1)","network":"maybe"}`, 400, "invalid_argument", []string{"network"}},
		{"negative timeout", `{"runtime":"python","code":"print(1)","timeout_ms":-1}`, 400, "invalid_argument", []string{"timeout_ms"}},
		{"empty code", `{"runtime":"python","code":""}`, 400, "invalid_argument", []string{"code is empty"}},
		{"code over 1 MiB", string(huge), 413, "too_large", []string{"1 MiB"}},
	}
	forEachStore(t, func(t *testing.T, b backend) {
		e := newEnv(t, b, envConfig{credits: 10, policy: noApproval})
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				e.do("POST", "/v1/executions", e.agent, tt.body).wantError(t, tt.status, tt.code, tt.msg...)
			})
		}
		if calls := e.toolCalls(""); len(calls) != 0 {
			t.Errorf("tool_calls rows after bad requests: got %d, want 0", len(calls))
		}
		e.wantCredits(10, 0)
		// ?wait= reads durations as people write them, and refuses a
		// number without a unit; the execution asked for does not exist.
		e.do("GET", "/v1/executions/ex_none?wait=10", e.agent, nil).wantError(t, 400, "invalid_argument", "a number needs a unit")
		e.do("GET", "/v1/executions/ex_none?wait=1%20min", e.agent, nil).wantError(t, 404, "not_found")
	})
}

// TestListFilterBounds checks the comma-separated filters of the list
// routes: at most 32 distinct values, duplicates counted once, on both
// stores alike.
func TestListFilterBounds(t *testing.T) {
	many := func(v string, n int) string {
		vs := make([]string, n)
		for i := range vs {
			vs[i] = fmt.Sprintf("%s%d", v, i)
		}
		return strings.Join(vs, ",")
	}
	forEachStore(t, func(t *testing.T, b backend) {
		e := newEnv(t, b, envConfig{credits: 10, policy: noApproval})
		e.do("GET", "/v1/audit/events?type="+many("t", 32), e.agent, nil).want(t, http.StatusOK)
		e.do("GET", "/v1/audit/events?type="+many("t", 33), e.agent, nil).wantError(t, 400, "invalid_argument", "at most 32")
		e.do("GET", "/v1/audit/events?type="+strings.Repeat("a,", 40000)+"a", e.agent, nil).want(t, http.StatusOK)
		e.do("GET", "/v1/tool-calls?status="+strings.Repeat("succeeded,", 100)+"failed", e.agent, nil).want(t, http.StatusOK)
		e.do("GET", "/v1/tool-calls?status=succeeded,nope", e.agent, nil).wantError(t, 400, "invalid_argument", `"nope"`)
	})
}

// wantLedger checks how many ledger entries of each kind the workspace has.
func wantLedger(t *testing.T, e *env, want map[model.LedgerKind]int) {
	t.Helper()
	p, err := e.st.ListLedger(t.Context(), e.ws.ID, store.PageRequest{Limit: store.MaxPageLimit})
	if err != nil {
		t.Fatal(err)
	}
	got := map[model.LedgerKind]int{}
	for _, l := range p.Items {
		got[l.Kind]++
	}
	for _, k := range []model.LedgerKind{model.LedgerGrant, model.LedgerReserve, model.LedgerCommit, model.LedgerRelease} {
		if got[k] != want[k] {
			t.Errorf("ledger %s entries: got %d, want %d (ledger %v)", k, got[k], want[k], got)
		}
	}
}

func TestFailedLaunchChargesNothing(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		// An empty image store: every runtime's image is missing.
		e := newEnv(t, b, envConfig{credits: 10, policy: noApproval, images: t.TempDir()})
		v := e.invoke(capability.InvokeRequest{Runtime: "python", Code: "print(1)"}).want(t, http.StatusOK).execution(t)
		if string(v.Status) != string(model.StatusLaunchFailed) || v.StartedAt != nil {
			t.Fatalf("execution: got status %q started %v, want launch_failed, never started", v.Status, v.StartedAt)
		}
		var res struct{ Error string }
		if err := json.Unmarshal(v.Result.JSON(), &res); err != nil || !strings.Contains(res.Error, "python") {
			t.Errorf("result: got %s, want an error naming the missing python image", v.Result)
		}
		e.wantCredits(10, 0)
		if tc := e.toolCall(v.ID); tc.CreditsCharged != 0 || tc.Status != "launch_failed" {
			t.Errorf("tool_calls row: got %s with %d credits, want launch_failed with 0", tc.Status, tc.CreditsCharged)
		}
		wantLedger(t, e, map[model.LedgerKind]int{model.LedgerGrant: 1, model.LedgerReserve: 1, model.LedgerRelease: 1})
	})
}

func TestShortBalance(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		for _, credits := range []int64{0, 1} {
			t.Run(fmt.Sprintf("%d credits", credits), func(t *testing.T) {
				e := newEnv(t, b, envConfig{credits: credits, policy: noApproval})
				e.invoke(capability.InvokeRequest{Runtime: "python", Code: "print(1)"}).
					wantError(t, http.StatusPaymentRequired, "insufficient_credits", "insufficient credits", "costs 2")
				denied := e.events("capability.invoke_denied", "")
				if len(denied) != 1 || decisionOf(t, denied[0]) != "insufficient_credits" || !strings.Contains(denied[0].Reason, "insufficient credits") {
					t.Fatalf("invoke_denied events: got %+v, want one insufficient_credits", denied)
				}
				if allowed := e.events("capability.invoke_allowed", ""); len(allowed) != 0 {
					t.Errorf("invoke_allowed events: got %d, want 0 (the admission was rolled back)", len(allowed))
				}
				if calls := e.toolCalls(""); len(calls) != 0 {
					t.Errorf("tool_calls rows: got %d, want 0", len(calls))
				}
				e.wantCredits(credits, 0)
			})
		}
	})
}

func TestIdempotentRetry(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		e := newEnv(t, b, envConfig{credits: 10, policy: noApproval})
		req := capability.InvokeRequest{Runtime: "shell", Code: "echo once"}
		first := e.invoke(req, "Idempotency-Key", "retry-1").want(t, http.StatusOK).execution(t)
		again := e.invoke(req, "Idempotency-Key", "retry-1").want(t, http.StatusOK).execution(t)
		if again.ID != first.ID || !again.Replayed || first.Replayed {
			t.Fatalf("retry: got id %q replayed %v (first %q replayed %v), want the first execution replayed", again.ID, again.Replayed, first.ID, first.Replayed)
		}
		if string(again.Status) != string(model.StatusSucceeded) || result(t, again).Stdout != "once\n" {
			t.Errorf("replayed result: got %q %s", again.Status, again.Result)
		}
		e.wantCredits(8, 0)
		if calls := e.toolCalls(""); len(calls) != 1 {
			t.Errorf("tool_calls rows: got %d, want 1", len(calls))
		}
		if allowed := e.events("capability.invoke_allowed", ""); len(allowed) != 1 {
			t.Errorf("invoke_allowed events: got %d, want 1", len(allowed))
		}

		// The same key on a different request is a client's mistake, not a
		// retry: it must not silently return the first result.
		reuse := func(t *testing.T, diff capability.InvokeRequest) {
			t.Helper()
			r := e.invoke(diff, "Idempotency-Key", "retry-1")
			if r.code != http.StatusConflict {
				t.Errorf("reusing the key for %+v: got %d, want 409", diff, r.code)
				return
			}
			r.wantError(t, http.StatusConflict, "conflict", "retry-1")
		}
		reuse(t, capability.InvokeRequest{Runtime: "shell", Code: "echo different"})
		reuse(t, capability.InvokeRequest{Runtime: "python", Code: "echo once"})
		e.wantCredits(8, 0)
		t.Run("reuse with different stdin or timeout", func(t *testing.T) {
			reuse(t, capability.InvokeRequest{Runtime: "shell", Code: "echo once", Stdin: "other input"})
			reuse(t, capability.InvokeRequest{Runtime: "shell", Code: "echo once", TimeoutMS: 1000})
			e.wantCredits(8, 0)
		})

		other := e.invoke(req, "Idempotency-Key", "retry-2").want(t, http.StatusOK).execution(t)
		if other.ID == first.ID || other.Replayed {
			t.Errorf("a new key: got id %q replayed %v, want a new execution", other.ID, other.Replayed)
		}
		e.wantCredits(6, 0)
		if calls := e.toolCalls(""); len(calls) != 2 {
			t.Errorf("tool_calls rows: got %d, want 2", len(calls))
		}

		t.Run("replayed over SSE", func(t *testing.T) {
			s := postStreamWith(t, e.url, e.agent, req, "Idempotency-Key", "retry-1")
			evs := s.rest(30 * time.Second)
			if len(evs) != 1 || evs[0].name != "result" {
				t.Fatalf("SSE replay of a finished execution: got %v, want one result", evs)
			}
			var v wire.Execution
			if err := json.Unmarshal([]byte(evs[0].data), &v); err != nil {
				t.Fatal(err)
			}
			if v.ID != first.ID || !v.Replayed || string(v.Status) != string(model.StatusSucceeded) {
				t.Errorf("SSE replay: got id %q replayed %v status %q, want %s replayed, succeeded", v.ID, v.Replayed, v.Status, first.ID)
			}
			e.wantCredits(6, 0)
		})
	})
}

func TestIdempotentRetryAwaitingApproval(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		e := newEnv(t, b, envConfig{credits: 10})
		req := capability.InvokeRequest{Runtime: "shell", Code: "echo once"}
		first := e.invoke(req, "Idempotency-Key", "wait-1").want(t, http.StatusAccepted).execution(t)
		again := e.invoke(req, "Idempotency-Key", "wait-1").want(t, http.StatusAccepted).execution(t)
		if again.ID != first.ID || again.ApprovalID != first.ApprovalID || !again.Replayed {
			t.Fatalf("retry while awaiting approval: got %q/%q replayed %v, want %q/%q replayed", again.ID, again.ApprovalID, again.Replayed, first.ID, first.ApprovalID)
		}
		wantCard(t, cardJSON(again.Approval), req, first.ApprovalID, first.ID)
		if p := list[wire.Approval](t, e.url, e.approver, "/v1/approvals", "status=pending"); len(p) != 1 {
			t.Errorf("pending approvals: got %d, want 1", len(p))
		}
		e.wantCredits(8, 2)
		e.do("POST", "/v1/approvals/"+first.ApprovalID+"/approve", e.approver, nil).want(t, http.StatusOK)
		if got := e.wait(first.ID, 30*time.Second); string(got.Status) != string(model.StatusSucceeded) {
			t.Fatalf("after approval: got %q, want succeeded", got.Status)
		}
		e.wantCredits(8, 0)
	})
}

// answer is one concurrent request's outcome.
type answer struct {
	code       int
	retryAfter string
	body       []byte
	err        error
}

// invokeConcurrently POSTs n executions at once with key and the header
// name/value pairs hdr, and returns the answers in no particular order.
func invokeConcurrently(base, key string, n int, req capability.InvokeRequest, hdr ...string) []answer {
	body, _ := json.Marshal(req)
	out := make([]answer, n)
	var start, done sync.WaitGroup
	start.Add(1)
	for i := range n {
		done.Add(1)
		go func() {
			defer done.Done()
			start.Wait()
			hr, err := http.NewRequest("POST", base+"/v1/executions", strings.NewReader(string(body)))
			if err != nil {
				out[i].err = err
				return
			}
			hr.Header.Set("Authorization", "Bearer "+key)
			for j := 0; j+1 < len(hdr); j += 2 {
				hr.Header.Set(hdr[j], hdr[j+1])
			}
			resp, err := http.DefaultClient.Do(hr)
			if err != nil {
				out[i].err = err
				return
			}
			defer resp.Body.Close()
			out[i].code, out[i].retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
			out[i].body, out[i].err = io.ReadAll(resp.Body)
		}()
	}
	start.Done()
	done.Wait()
	return out
}

// checkConcurrentRun checks the books after concurrent invocations: every
// execution has one tool_calls row and one invoke_allowed event, every
// refusal one invoke_denied event with refusal's decision, and the credits
// charged are exactly 2 x the executions that launched. It returns the
// number of executions that launched.
func checkConcurrentRun(t *testing.T, e *env, answers []answer, granted int64, refusal int, refusalDecision string) int {
	t.Helper()
	var ok []wire.Execution
	refused := 0
	for _, a := range answers {
		switch {
		case a.err != nil:
			t.Fatalf("request failed: %v", a.err)
		case a.code == http.StatusOK:
			var v wire.Execution
			if err := json.Unmarshal(a.body, &v); err != nil {
				t.Fatalf("decoding %s: %v", a.body, err)
			}
			ok = append(ok, v)
		case a.code == refusal:
			refused++
			if refusal == http.StatusTooManyRequests {
				if s, err := strconv.Atoi(a.retryAfter); err != nil || s < 1 {
					t.Errorf("429 Retry-After: got %q, want a number of seconds", a.retryAfter)
				}
			}
		default:
			t.Errorf("unexpected answer %d: %s", a.code, a.body)
		}
	}
	launched := 0
	for _, v := range ok {
		if v.StartedAt != nil {
			launched++
		}
		if string(v.Status) != string(model.StatusSucceeded) || result(t, v).Stdout != "hi\n" {
			t.Errorf("execution %s: got status %q result %s, want succeeded with hi", v.ID, v.Status, v.Result)
		}
	}
	t.Logf("%d answers: %d ran (%d launched), %d refused with %d", len(answers), len(ok), launched, refused, refusal)

	available, reserved := e.credits()
	if reserved != 0 || granted-available != int64(2*launched) {
		t.Errorf("credits: got available %d reserved %d, want %d charged (2 x %d launched) and 0 reserved",
			available, reserved, 2*launched, launched)
	}
	storetest.CheckLedger(t, e.st, e.ws.ID)

	execs, err := e.st.ListExecutions(t.Context(), e.ws.ID, store.ExecutionFilter{PageRequest: store.PageRequest{Limit: store.MaxPageLimit}})
	if err != nil {
		t.Fatal(err)
	}
	if len(execs.Items) != len(ok) {
		t.Errorf("executions: got %d, want %d (one per 200)", len(execs.Items), len(ok))
	}
	callsOf := map[string]int{}
	charged := int64(0)
	for _, c := range e.toolCalls("") {
		callsOf[c.ExecutionID]++
		charged += c.CreditsCharged
	}
	allowedOf := map[string]int{}
	allowed := e.events("capability.invoke_allowed", "")
	for _, ev := range allowed {
		allowedOf[ev.ExecutionID]++
	}
	for _, x := range execs.Items {
		if callsOf[x.ID] != 1 || allowedOf[x.ID] != 1 {
			t.Errorf("execution %s: %d tool_calls rows and %d invoke_allowed events, want 1 and 1", x.ID, callsOf[x.ID], allowedOf[x.ID])
		}
	}
	if len(allowed) != len(execs.Items) || len(callsOf) != len(execs.Items) {
		t.Errorf("invoke_allowed events %d, tool_calls rows %d, executions %d: want all equal", len(allowed), len(callsOf), len(execs.Items))
	}
	if charged != int64(2*launched) {
		t.Errorf("credits_charged over tool_calls rows: got %d, want %d", charged, 2*launched)
	}
	denied := e.events("capability.invoke_denied", "")
	if len(denied) != refused {
		t.Errorf("invoke_denied events: got %d, want %d (one per refusal)", len(denied), refused)
	}
	for _, ev := range denied {
		if d := decisionOf(t, ev); d != refusalDecision {
			t.Errorf("invoke_denied decision: got %q, want %q", d, refusalDecision)
		}
	}
	if ok, broken, err := e.st.VerifyChain(t.Context(), e.ws.ID); !ok || err != nil {
		t.Errorf("audit chain after concurrent writes: ok %v broken %+v err %v", ok, broken, err)
	}
	return launched
}

func TestConcurrentInvocations(t *testing.T) {
	const n = 50
	req := capability.InvokeRequest{Runtime: "shell", Code: "echo hi"}
	forEachStore(t, func(t *testing.T, b backend) {
		t.Run("balance for 30 of 50", func(t *testing.T) {
			e := newEnv(t, b, envConfig{credits: 60, policy: noApproval, svc: capability.ServiceOptions{MaxConcurrent: 4, MaxQueue: 100}})
			answers := invokeConcurrently(e.url, e.agent, n, req)
			launched := checkConcurrentRun(t, e, answers, 60, http.StatusPaymentRequired, "insufficient_credits")
			if launched != 30 {
				t.Errorf("launched: got %d, want 30 (60 credits at 2 each)", launched)
			}
		})
		t.Run("small queue", func(t *testing.T) {
			e := newEnv(t, b, envConfig{credits: 1000, policy: noApproval, svc: capability.ServiceOptions{MaxConcurrent: 2, MaxQueue: 2}})
			answers := invokeConcurrently(e.url, e.agent, n, req)
			launched := checkConcurrentRun(t, e, answers, 1000, http.StatusTooManyRequests, "server_at_capacity")
			if launched == n || launched == 0 {
				t.Errorf("launched: got %d of %d, want some refused with 429 and some run", launched, n)
			}
		})
	})
}

func TestAdmissionControl(t *testing.T) {
	// ServiceOptions cannot express "no queue" (MaxQueue 0 means the default,
	// 2 x MaxConcurrent), so the smallest configuration is one slot and a
	// queue of one: a running execution, a queued one, then 429.
	forEachStore(t, func(t *testing.T, b backend) {
		e := newEnv(t, b, envConfig{credits: 10, policy: noApproval, svc: capability.ServiceOptions{MaxConcurrent: 1, MaxQueue: 1}})
		longReq := capability.InvokeRequest{Runtime: "shell", Code: "sleep 3; echo hi"}
		long := make(chan answer, 1)
		go func() {
			long <- invokeConcurrently(e.url, e.agent, 1, longReq, "Idempotency-Key", "long-1")[0]
		}()
		e.waitToolCalls("status=running", 1)
		queued := make(chan answer, 1)
		go func() {
			queued <- invokeConcurrently(e.url, e.agent, 1, capability.InvokeRequest{Runtime: "shell", Code: "echo hi"})[0]
		}()
		e.waitToolCalls("status=queued", 1)

		r := e.invoke(capability.InvokeRequest{Runtime: "shell", Code: "echo refused"})
		r.wantError(t, http.StatusTooManyRequests, "resource_exhausted", "capacity")
		if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 {
			t.Errorf("Retry-After: got %q, want a number of seconds", r.header.Get("Retry-After"))
		}
		// A retry of the running request is the same request, decided
		// already: the full server does not refuse it.
		retry := e.invoke(longReq, "Idempotency-Key", "long-1").want(t, http.StatusOK).execution(t)
		answers := map[string]answer{}
		for name, ch := range map[string]chan answer{"running": long, "queued": queued} {
			a := <-ch
			if a.err != nil || a.code != http.StatusOK {
				t.Fatalf("the %s execution: got %d %v %s", name, a.code, a.err, a.body)
			}
			answers[name] = a
		}
		var first wire.Execution
		if err := json.Unmarshal(answers["running"].body, &first); err != nil {
			t.Fatal(err)
		}
		if retry.ID != first.ID || !retry.Replayed || first.Replayed {
			t.Errorf("retry at capacity: got %q replayed %v, want %q replayed", retry.ID, retry.Replayed, first.ID)
		}
		e.wantCredits(6, 0)
		denied := e.events("capability.invoke_denied", "")
		if len(denied) != 1 || decisionOf(t, denied[0]) != "server_at_capacity" {
			t.Errorf("invoke_denied events: got %+v, want one server_at_capacity", denied)
		}
		if allowed := e.events("capability.invoke_allowed", ""); len(allowed) != 2 {
			t.Errorf("invoke_allowed events: got %d, want 2", len(allowed))
		}
	})
}

// waitToolCalls waits until the tool_calls rows matching query number n.
func (e *env) waitToolCalls(query string, n int) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := len(e.toolCalls(query))
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("tool_calls rows matching %q: got %d, want %d", query, got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metrics returns the /metrics page.
func (e *env) metrics() string {
	e.t.Helper()
	return string(e.do("GET", "/metrics", "", nil).want(e.t, http.StatusOK).body)
}

// wantMetrics checks that the /metrics page has each of lines.
func (e *env) wantMetrics(when string, lines ...string) {
	e.t.Helper()
	m := e.metrics()
	for _, l := range lines {
		if !strings.Contains(m, l) {
			e.t.Errorf("/metrics %s has no %q; got\n%s", when, l, grepLines(m, "stockade_"))
		}
	}
}

func TestMetrics(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		// A scraper of a daemon that has not run anything yet still sees
		// every metric, so that rates and alerts have a series from the
		// start.
		t.Run("fresh daemon", func(t *testing.T) {
			e := newEnv(t, b, envConfig{})
			e.wantMetrics("of a fresh daemon", "stockade_invocations_total", "stockade_approvals_pending 0", "stockade_credits_charged_total 0",
				"stockade_audit_witness_refusals_total 0")
		})

		t.Run("after a run", func(t *testing.T) {
			e := newEnv(t, b, envConfig{credits: 10, policy: noApproval})
			e.invoke(capability.InvokeRequest{Runtime: "shell", Code: "echo hi"}).want(t, http.StatusOK)
			e.wantMetrics("after one run", "stockade_invocations_total", `stockade_invocations_total{status="succeeded"} 1`,
				"stockade_approvals_pending 0", "stockade_credits_charged_total 2",
				`stockade_execution_duration_seconds_count{driver="runc"} 1`)
		})

		t.Run("pending approvals", func(t *testing.T) {
			e := newEnv(t, b, envConfig{credits: 10})
			e.wantMetrics("at start", "stockade_approvals_pending 0")
			v := e.awaitApproval(capability.InvokeRequest{Runtime: "shell", Code: "echo hi"})
			e.wantMetrics("while an approval is pending", "stockade_approvals_pending 1")
			e.do("POST", "/v1/approvals/"+v.ApprovalID+"/approve", e.approver, nil).want(t, http.StatusOK)
			if got := e.wait(v.ID, 30*time.Second); string(got.Status) != string(model.StatusSucceeded) {
				t.Fatalf("after approval: got %q, want succeeded", got.Status)
			}
			e.wantMetrics("after the approved run", "stockade_approvals_pending 0",
				`stockade_invocations_total{status="succeeded"} 1`, "stockade_credits_charged_total 2")
		})

		// Executions that end without running (denied by the approver, or
		// their approval expired) have a final status too, and
		// stockade_invocations_total counts finished invocations by final
		// status.
		t.Run("denied and expired executions are counted", func(t *testing.T) {
			e := newEnv(t, b, envConfig{credits: 10, svc: capability.ServiceOptions{ApprovalTTL: time.Second}})
			denied := e.awaitApproval(capability.InvokeRequest{Runtime: "shell", Code: "echo no"})
			e.do("POST", "/v1/approvals/"+denied.ApprovalID+"/deny", e.approver, nil).want(t, http.StatusOK)
			expired := e.awaitApproval(capability.InvokeRequest{Runtime: "shell", Code: "echo late"})
			if got := e.wait(expired.ID, 15*time.Second); string(got.Status) != string(model.StatusApprovalExpired) {
				t.Fatalf("after the TTL: got %q, want approval_expired", got.Status)
			}
			e.wantMetrics("after a denial and an expiry", "stockade_approvals_pending 0",
				`stockade_invocations_total{status="denied"} 1`, `stockade_invocations_total{status="approval_expired"} 1`)
		})
	})
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestOpenAPIDocument checks the served document: its version and the
// approval card as the engine sends it.
func TestOpenAPIDocument(t *testing.T) {
	// The document needs no sandbox.
	svc, st, _ := newBareService(t)
	srv := httptest.NewServer(api.New(svc, st, api.Options{Metrics: api.NewMetrics()}))
	defer srv.Close()

	r := do(t, srv.URL, "GET", "/openapi.json", "", nil).want(t, http.StatusOK)
	var doc struct {
		OpenAPI    string                                `json:"openapi"`
		Paths      map[string]map[string]json.RawMessage `json:"paths"`
		Components struct {
			Schemas map[string]struct {
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	r.decode(t, &doc)
	// The approval card as documented: every field an approver receives.
	card := reflect.TypeFor[wire.ApprovalCard]()
	for i := range card.NumField() {
		name, _, _ := strings.Cut(card.Field(i).Tag.Get("json"), ",")
		if _, ok := doc.Components.Schemas["ApprovalCard"].Properties[name]; !ok {
			t.Errorf("/openapi.json's ApprovalCard lacks %q", name)
		}
	}
	if doc.OpenAPI == "" {
		t.Errorf("the document has no openapi version")
	}
	// TestRoutesDocumented compares the paths with the route table.
	if len(doc.Paths) == 0 {
		t.Errorf("the document describes no path")
	}
}

func TestToolCallsAndAuditListing(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		e := newEnv(t, b, envConfig{credits: 20, policy: noApproval})
		var ids []string
		for _, code := range []string{"echo one", "echo two", "exit 3", "echo four"} {
			v := e.invoke(capability.InvokeRequest{Runtime: "shell", Code: code}).want(t, http.StatusOK).execution(t)
			ids = append(ids, v.ID)
		}
		all := e.toolCalls("")
		if got := toolCallIDs(all); !slices.Equal(got, []string{ids[3], ids[2], ids[1], ids[0]}) {
			t.Fatalf("tool calls: got %v, want %v newest first", got, ids)
		}
		created := map[string]string{}
		for _, c := range all {
			created[c.ExecutionID] = c.CreatedAt.Format(time.RFC3339Nano)
		}
		failed := all[1]
		if failed.Status != "failed" || failed.ExitCode == nil || *failed.ExitCode != 3 || failed.CreditsCharged != 2 {
			t.Errorf("the failing run's row: got %+v, want failed, exit 3, charged 2", failed)
		}

		for _, tt := range []struct {
			name  string
			query url.Values
			want  []string
		}{
			{"status failed", url.Values{"status": {"failed"}}, []string{ids[2]}},
			{"status succeeded", url.Values{"status": {"succeeded"}}, []string{ids[3], ids[1], ids[0]}},
			{"two statuses", url.Values{"status": {"succeeded,failed"}}, []string{ids[3], ids[2], ids[1], ids[0]}},
			{"status with none", url.Values{"status": {"denied"}}, nil},
			{"since", url.Values{"since": {created[ids[2]]}}, []string{ids[3], ids[2]}},
			{"until", url.Values{"until": {created[ids[1]]}}, []string{ids[0]}},
			{"since and until", url.Values{"since": {created[ids[1]]}, "until": {created[ids[3]]}}, []string{ids[2], ids[1]}},
			{"status and time", url.Values{"status": {"succeeded"}, "since": {created[ids[1]]}}, []string{ids[3], ids[1]}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				// The subtest's t, not e's: a failure must stop this
				// subtest, on its own goroutine.
				calls := list[wire.ToolCall](t, e.url, e.agent, "/v1/tool-calls", tt.query.Encode())
				if got := toolCallIDs(calls); !slices.Equal(got, tt.want) {
					t.Errorf("got %v, want %v", got, tt.want)
				}
			})
		}

		t.Run("paging", func(t *testing.T) {
			for _, limit := range []int{1, 3, 4} {
				var got []string
				cursor := ""
				for page := 0; ; page++ {
					if page > 10 {
						t.Fatal("paging does not end")
					}
					q := url.Values{"limit": {strconv.Itoa(limit)}}
					if cursor != "" {
						q.Set("cursor", cursor)
					}
					var p struct {
						Items []wire.ToolCall `json:"items"`
						Next  string          `json:"next_cursor"`
					}
					do(t, e.url, "GET", "/v1/tool-calls?"+q.Encode(), e.agent, nil).want(t, http.StatusOK).decode(t, &p)
					if len(p.Items) > limit {
						t.Fatalf("limit %d: a page of %d items", limit, len(p.Items))
					}
					got = append(got, toolCallIDs(p.Items)...)
					if cursor = p.Next; cursor == "" {
						break
					}
				}
				if !slices.Equal(got, toolCallIDs(all)) {
					t.Errorf("limit %d: paged %v, want %v", limit, got, toolCallIDs(all))
				}
			}
			q := url.Values{"limit": {"2"}, "status": {"succeeded"}}
			var p struct {
				Items []wire.ToolCall `json:"items"`
				Next  string          `json:"next_cursor"`
			}
			e.do("GET", "/v1/tool-calls?"+q.Encode(), e.agent, nil).want(t, http.StatusOK).decode(t, &p)
			q.Set("cursor", p.Next)
			var p2 struct {
				Items []wire.ToolCall `json:"items"`
				Next  string          `json:"next_cursor"`
			}
			e.do("GET", "/v1/tool-calls?"+q.Encode(), e.agent, nil).want(t, http.StatusOK).decode(t, &p2)
			if got := append(toolCallIDs(p.Items), toolCallIDs(p2.Items)...); p.Next == "" || p2.Next != "" || !slices.Equal(got, []string{ids[3], ids[1], ids[0]}) {
				t.Errorf("filtered paging: got %v (cursors %q, %q), want %v over two pages", got, p.Next, p2.Next, []string{ids[3], ids[1], ids[0]})
			}
		})

		t.Run("bad queries", func(t *testing.T) {
			for _, q := range []string{"status=bogus", "status=succeeded,bogus", "since=yesterday", "until=2024-13-01", "limit=0", "limit=501", "limit=x"} {
				e.do("GET", "/v1/tool-calls?"+q, e.agent, nil).wantError(t, http.StatusBadRequest, "invalid_argument")
			}
			e.do("GET", "/v1/tool-calls?status=bogus", e.agent, nil).wantError(t, http.StatusBadRequest, "invalid_argument", "bogus")
		})

		t.Run("audit events", func(t *testing.T) {
			evs := e.events("", "")
			if len(evs) < 4 {
				t.Fatalf("events: got %d, want at least the 4 invoke_allowed", len(evs))
			}
			hexHash := regexp.MustCompile(`^[0-9a-f]{64}$`)
			for i, ev := range evs {
				if !hexHash.MatchString(ev.Hash) || ev.ID == "" || ev.Type == "" || ev.Time.IsZero() {
					t.Errorf("event %d: got %+v, want an id, a type, a time and a hex hash", i, ev)
				}
				if want := int64(len(evs) - i); ev.Seq != want {
					t.Errorf("event %d: seq %d, want %d (newest first, no gaps)", i, ev.Seq, want)
				}
				switch {
				case i+1 < len(evs) && ev.PrevHash != evs[i+1].Hash:
					t.Errorf("event seq %d: prev_hash %q, want the hash of seq %d, %q", ev.Seq, ev.PrevHash, evs[i+1].Seq, evs[i+1].Hash)
				case i+1 == len(evs) && ev.PrevHash != "":
					t.Errorf("the first event's prev_hash: got %q, want empty", ev.PrevHash)
				}
			}
			var raw struct {
				Items []map[string]any `json:"items"`
			}
			e.do("GET", "/v1/audit/events?limit=1", e.agent, nil).want(t, http.StatusOK).decode(t, &raw)
			if len(raw.Items) != 1 {
				t.Fatalf("events with limit 1: got %d", len(raw.Items))
			}
			for _, k := range []string{"hash", "prev_hash", "seq", "type", "code", "actor", "time"} {
				if _, ok := raw.Items[0][k]; !ok {
					t.Errorf("an event on the wire has no %q: %v", k, raw.Items[0])
				}
			}
			allowed := e.events("capability.invoke_allowed", "")
			var got []string
			for _, ev := range allowed {
				got = append(got, ev.ExecutionID)
			}
			if !slices.Equal(got, []string{ids[3], ids[2], ids[1], ids[0]}) {
				t.Errorf("invoke_allowed events: got executions %v, want %v newest first", got, ids)
			}
			if one := e.events("", ids[2]); len(one) == 0 || slices.ContainsFunc(one, func(ev wire.AuditEvent) bool { return ev.ExecutionID != ids[2] }) {
				t.Errorf("events of %s: got %+v", ids[2], one)
			}
			if ok, broken, err := e.st.VerifyChain(t.Context(), e.ws.ID); !ok || err != nil {
				t.Errorf("VerifyChain: ok %v broken %+v err %v", ok, broken, err)
			}
		})
	})
}

func toolCallIDs(calls []wire.ToolCall) []string {
	var out []string
	for _, c := range calls {
		out = append(out, c.ExecutionID)
	}
	return out
}
