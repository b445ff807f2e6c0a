package api_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/engine"
)

// TestRecordLimitsOverHTTP checks that a tool's record limits bound what
// an invocation may ask for: a timeout_ms above the record's is a 400
// naming the tool and its limit, and an invocation naming none is
// approved and run with the record's (the approval card's timeout_ms).
func TestRecordLimitsOverHTTP(t *testing.T) {
	set, opts := toolSet(t, `
tools:
  - name: report
    input_trust: trusted
    tier: container
    limits: {timeout: 10s, memory: 256MiB}
`)
	forEachStore(t, func(t *testing.T, b backend) {
		e := newEnv(t, b, envConfig{credits: 10, engine: []engine.Option{engine.WithTools(set, opts)}})
		e.invoke(capability.InvokeRequest{Runtime: "python", Code: "print(1)", Tool: "report", TimeoutMS: 20000}).
			wantError(t, http.StatusBadRequest, "invalid_argument", `tool "report"`, "above the ceiling of 10s")
		e.wantCredits(10, 0)
		v := e.invoke(capability.InvokeRequest{Runtime: "python", Code: "print(1)", Tool: "report"}).want(t, http.StatusAccepted).execution(t)
		var card capability.ApprovalCard
		if err := json.Unmarshal(cardJSON(v.Approval), &card); err != nil {
			t.Fatal(err)
		}
		if card.TimeoutMS != 10000 {
			t.Errorf("approval card timeout_ms: got %d, want the record's 10000", card.TimeoutMS)
		}
	})
}

// TestNoDriverOverHTTP checks what the README says of --driver: it is the
// operator's override on the CLI, and an invocation over the API cannot
// choose its driver.
func TestNoDriverOverHTTP(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		e := newEnv(t, b, envConfig{credits: 10})
		e.do("POST", "/v1/executions", e.agent, `{"runtime":"python","code":"print(1)","driver":"runc"}`).
			wantError(t, http.StatusBadRequest, "invalid_argument", `unknown field "driver"`)
		e.wantCredits(10, 0)
	})
}
