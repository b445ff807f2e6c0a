package api_test

import (
	"net/http"
	"testing"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/model"
)

// TestFreeInvocations checks that a price of zero credits means free, not
// the default price: a run leaves the balance as it was, reserves nothing
// and charges nothing.
func TestFreeInvocations(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		e := newEnv(t, b, envConfig{policy: noApproval, credits: 10, svc: capability.ServiceOptions{CreditsPerInvocation: new(int64(0))}})
		v := e.invoke(capability.InvokeRequest{Runtime: "python", Code: "print(1)"}).want(t, http.StatusOK).execution(t)
		if string(v.Status) != string(model.StatusSucceeded) {
			t.Fatalf("execution: got %s (%s), want succeeded", v.Status, v.Result)
		}
		e.wantCredits(10, 0)
		if tc := e.toolCall(v.ID); tc.CreditsCharged != 0 {
			t.Errorf("tool_calls row: got %d credits charged, want 0", tc.CreditsCharged)
		}
		wantLedger(t, e, map[model.LedgerKind]int{model.LedgerGrant: 1})
	})
}
