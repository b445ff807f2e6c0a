package mcp

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/wire"
)

// TestFailureByClass checks MCP's advice by the class of the API's
// answer: a busy session's, a conflict's, a failed precondition's and an
// ended session's are four pieces of advice, not one.
func TestFailureByClass(t *testing.T) {
	tests := []struct {
		name, code string
		status     int
		want, not  string
	}{
		{"session busy", wire.CodeSessionBusy, http.StatusConflict, "one cell runs at a time", "state is gone"},
		{"conflict", wire.CodeConflict, http.StatusConflict, "conflicts with what happened meanwhile", "one cell runs at a time"},
		{"failed precondition", wire.CodeFailedPrecondition, http.StatusConflict, "cannot be done in its current state", "one cell runs at a time"},
		{"session expired", wire.CodeSessionExpired, http.StatusGone, "its state is gone", "current state"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := failure(&client.Error{Status: tt.status, Code: tt.code, Message: "session ses_1 says no"}).Error()
			if !strings.Contains(got, "session ses_1 says no") || !strings.Contains(got, tt.want) || strings.Contains(got, tt.not) {
				t.Errorf("got %q, want the message and %q, without %q", got, tt.want, tt.not)
			}
		})
	}
}
