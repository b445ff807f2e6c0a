package client_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/wire"
)

// TestApprovalCardRoundTrip encodes the card as the API sends it and
// decodes it as the client's type: every field the client reads is one
// the API sends, with its value.
func TestApprovalCardRoundTrip(t *testing.T) {
	expires := time.Date(2026, 12, 7, 1, 2, 3, 0, time.UTC)
	for _, network := range []string{"allow", "deny"} {
		t.Run(network, func(t *testing.T) {
			sent := capability.ApprovalCard{ApprovalCard: wire.ApprovalCard{ApprovalID: "apr_1", ExecutionID: "ex_1", Capability: "code.execute", RiskLevel: "high",
				Runtime: "python", Code: "print(1)", Stdin: "in", Network: network, Tool: "fetch", EgressAllow: []string{"example.com"},
				EgressPorts: []int{443}, ToolFingerprint: "sha256:ab", SessionID: "ses_1", Cell: 2, CoversSession: true, TimeoutMS: 5000, RequestedBy: "key_1", ExpiresAt: expires}}
			raw, err := json.Marshal(sent)
			if err != nil {
				t.Fatal(err)
			}
			var got client.ApprovalCard
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatal(err)
			}
			want := client.ApprovalCard{ApprovalID: "apr_1", ExecutionID: "ex_1", Capability: "code.execute", RiskLevel: "high",
				Runtime: "python", Code: "print(1)", Stdin: "in", Network: network, Tool: "fetch", EgressAllow: []string{"example.com"},
				EgressPorts: []int{443}, ToolFingerprint: "sha256:ab", SessionID: "ses_1", Cell: 2, CoversSession: true, TimeoutMS: 5000, RequestedBy: "key_1", ExpiresAt: expires}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got %+v, want %+v", got, want)
			}
			var fields map[string]any
			if err := json.Unmarshal(raw, &fields); err != nil {
				t.Fatal(err)
			}
			ct := reflect.TypeFor[client.ApprovalCard]()
			for i := range ct.NumField() {
				name, _, _ := strings.Cut(ct.Field(i).Tag.Get("json"), ",")
				if _, ok := fields[name]; !ok {
					t.Errorf("the client reads %q, which the API does not send (it sends %v)", name, keys(fields))
				}
			}
		})
	}
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
