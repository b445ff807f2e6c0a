package api_test

// Sessions with network through the API: the session's sandbox gets a
// network namespace of its own served by the egress proxy, as a
// one-shot's, for as long as the session lives. They need root, as
// egress_test.go's.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/wire"
)

// sessionFetchCode is a cell of a session of the fetch tool, as
// sessionFetchCode % (port, label): it keeps the port and a count in the
// kernel, then reaches the upstream by the allowed name, and tries another
// name.
const sessionFetchCode = `
import urllib.request
port = %d
count = globals().get("count", 0) + 1
def attempt(label, url):
    try:
        print(label, "OK", urllib.request.urlopen(url, timeout=5).read().decode())
    except Exception as e:
        print(label, "FAILED", type(e).__name__)
attempt("allowed", "http://allowed.test:%%d/%s" %% port)
attempt("other-name", "http://other.test:%%d/x" %% port)
print("count", count)
`

// sessionCell runs code in session id, approving it when it waits, and
// returns its execution and result.
func (e *egressEnv) sessionCell(id, code string, wantApproval bool) (wire.Execution, capability.CellResultDoc) {
	e.t.Helper()
	r := e.do("POST", "/v1/sessions/"+id+"/exec", e.agent, capability.CellRequest{Code: code})
	var v wire.Execution
	if wantApproval {
		v = r.want(e.t, http.StatusAccepted).execution(e.t)
		if v.Status != "awaiting_approval" || v.ApprovalID == "" {
			e.t.Fatalf("the first cell of a session with network: got %+v, want it awaiting approval", v)
		}
		e.wantFetchCard(cardJSON(v.Approval))
		var card capability.ApprovalCard
		if err := json.Unmarshal(cardJSON(v.Approval), &card); err != nil || card.SessionID != id || !card.CoversSession {
			e.t.Errorf("its card: got %s (%v), want session %s, covering it", cardJSON(v.Approval), err, id)
		}
		if n := e.hits.Load(); n != 0 {
			e.t.Fatalf("the upstream answered %d requests before the approval, want 0", n)
		}
		e.do("POST", "/v1/approvals/"+v.ApprovalID+"/approve", e.approver, map[string]string{"reason": "the session may reach " + allowedName}).
			want(e.t, http.StatusOK)
	} else {
		var c wire.Cell
		r.want(e.t, http.StatusOK).decode(e.t, &c)
		v.ID = c.ExecutionID
	}
	got := e.wait(v.ID, 50*time.Second)
	var doc capability.CellResultDoc
	if err := json.Unmarshal(got.Result.JSON(), &doc); err != nil || got.Status != "succeeded" {
		e.t.Fatalf("cell %s: got status %q, result %s (%v); want succeeded", v.ID, got.Status, got.Result, err)
	}
	return got, doc
}

// TestSessionEgressOverHTTP opens a session with network on each driver:
// its first cell waits for a human whose approval, with the allowlist on
// its card, covers the session; the sandbox reaches the upstream by the
// allowed name only, in every cell, with the kernel's state kept between
// them; the refusals are audit events of the cell that made them; the
// session cannot pause (409, saying why); and once it is closed its
// network is gone.
func TestSessionEgressOverHTTP(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		for _, driver := range []string{"runc", "gvisor"} {
			t.Run(driver, func(t *testing.T) {
				e := newEgressEnv(t, b, driver, func(c *envConfig) { c.sessions, c.kernels = true, true })
				ss := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "python", Tool: "fetch", Network: "allow"})
				if ss.Network != "allow" || ss.Driver != driver || ss.Tool != "fetch" {
					t.Fatalf("created: got %+v, want network allow on %s for fetch", ss, driver)
				}
				if left := e.nets.Leftovers(); len(left) == 0 {
					t.Fatalf("no sandbox network while the session is open")
				}
				created := eventData[struct {
					Network string `json:"network"`
				}](t, e.env, "session.created")
				if len(created) != 1 || created[0].Network != "allow" {
					t.Errorf("session.created events: got %+v, want one with network allow", created)
				}

				ex1, c1 := e.sessionCell(ss.ID, fmt.Sprintf(sessionFetchCode, e.port, "one"), true)
				for _, want := range []string{fmt.Sprintf("allowed OK upstream saw %s:%d/one", allowedName, e.port), "other-name FAILED", "count 1"} {
					if !strings.Contains(c1.Stdout, want) {
						t.Errorf("cell 1's stdout lacks %q:\nstdout %s\nstderr %s", want, c1.Stdout, c1.Stderr)
					}
				}
				// Cell 2 leaves a thread that reaches out after it has ended.
				late := fmt.Sprintf(sessionFetchCode, e.port, "two") + `
import threading, time
threading.Thread(target=lambda: (time.sleep(2), attempt("late", "http://late.test:%d/x" % port)), daemon=True).start()
`
				_, c2 := e.sessionCell(ss.ID, late, false)
				for _, want := range []string{fmt.Sprintf("allowed OK upstream saw %s:%d/two", allowedName, e.port), "other-name FAILED", "count 2"} {
					if !strings.Contains(c2.Stdout, want) {
						t.Errorf("cell 2's stdout lacks %q (the state and the network carry across cells):\nstdout %s\nstderr %s", want, c2.Stdout, c2.Stderr)
					}
				}
				if n := e.hits.Load(); n != 2 {
					t.Errorf("the upstream answered %d requests, want 2 (one allowed fetch per cell)", n)
				}
				denied := e.waitRefusals(ex1.ID, refusal{egress.ReasonNameNotAllowed, string(egress.ProtoDNS), "other.test"})
				for _, ev := range denied {
					var d egressData
					if err := json.Unmarshal(ev.Data, &d); err != nil || ev.Code != "EGR001W" || ev.Actor != "system" || d.Tool != "fetch" {
						t.Errorf("egress.denied event of cell 1: got %s by %q code %s", eventSummary([]wire.AuditEvent{ev}), ev.Actor, ev.Code)
					}
				}
				// Between cells a refusal is of the session's sandbox, of no
				// execution.
				deadline := time.Now().Add(15 * time.Second)
				for {
					var lateEv []wire.AuditEvent
					for _, ev := range e.events("egress.denied", "") {
						var d egressData
						if json.Unmarshal(ev.Data, &d) == nil && d.Name == "late.test" {
							lateEv = append(lateEv, ev)
						}
					}
					if len(lateEv) > 0 && !slices.ContainsFunc(lateEv, func(ev wire.AuditEvent) bool {
						return ev.ExecutionID != "" || ev.Reason != egress.ReasonNameNotAllowed
					}) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("the refusal between cells: got %s, want egress.denied for late.test of no execution", eventSummary(lateEv))
					}
					time.Sleep(50 * time.Millisecond)
				}
				if n := len(e.events("approval.approved", "")); n != 1 {
					t.Errorf("approval.approved events: got %d, want 1 (the first cell's covers the session)", n)
				}

				e.do("POST", "/v1/sessions/"+ss.ID+"/pause", e.agent, nil).
					wantError(t, http.StatusConflict, "failed_precondition", "network")

				e.do("DELETE", "/v1/sessions/"+ss.ID, e.agent, nil).want(t, http.StatusOK)
				e.wantNoNetworks()
				if ok, broken, err := e.st.VerifyChain(t.Context(), e.ws.ID); !ok || err != nil {
					t.Errorf("VerifyChain: ok %v broken %+v err %v", ok, broken, err)
				}
				e.wantCredits(6, 0)
			})
		}
	})
}

// TestSessionEgressRefused asks for a session with network of a tool whose
// record has no egress allowlist: refused (403) saying so, recorded as a
// denial, and nothing is made.
func TestSessionEgressRefused(t *testing.T) {
	e := newEgressEnv(t, backends[0], "runc", func(c *envConfig) { c.sessions = true })
	e.do("POST", "/v1/sessions", e.agent, capability.CreateSessionRequest{Runtime: "python", Network: "allow"}).
		wantError(t, http.StatusForbidden, "permission_denied", "egress allowlist")
	if left := e.nets.Leftovers(); len(left) > 0 {
		t.Errorf("networks after the refusal: %v, want none", left)
	}
	if n := len(e.events("capability.invoke_denied", "")); n != 1 {
		t.Errorf("capability.invoke_denied events: got %d, want 1", n)
	}
	if n := len(e.events("session.created", "")); n != 0 {
		t.Errorf("session.created events: got %d, want 0", n)
	}
}
