package api_test

import (
	"net/http/httptest"
	"testing"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
)

// TestErrorMessages checks that an error's message is a sentence for
// people: the class texts that wrapping appends (": not found"), several
// when an error is classified again on its way up, are not in it.
func TestErrorMessages(t *testing.T) {
	svc, st, agent := newBareService(t)
	srv := httptest.NewServer(api.New(svc, st, api.Options{}))
	defer srv.Close()
	tests := []struct {
		name   string
		req    capability.InvokeRequest
		status int
		code   string
		want   string
	}{
		// The tool store's "not found", classified again as a bad argument.
		{"unknown tool", capability.InvokeRequest{Runtime: "python", Code: "print(1)", Tool: "nope"}, 400, "invalid_argument", `unknown tool "nope" (known: code.execute)`},
		{"unknown runtime", capability.InvokeRequest{Runtime: "ruby", Code: "puts 1"}, 400, "invalid_argument", `unknown runtime "ruby" (known: node, python, shell)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := do(t, srv.URL, "POST", "/v1/executions", agent, tt.req).wantError(t, tt.status, tt.code)
			if msg != tt.want {
				t.Errorf("message: got %q, want %q", msg, tt.want)
			}
		})
	}
}
