package api

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/errdefs"
)

// TestMCPErrorsHideCauses checks that the in-daemon MCP backend answers
// an error as the HTTP API does (the class's sentence for a message not
// made for clients, a public one whole) and logs what it hid with the
// request's id.
func TestMCPErrorsHideCauses(t *testing.T) {
	for _, tt := range []struct {
		name   string
		err    error
		status int
		msg    string
		logged bool
	}{
		{"the database down", fmt.Errorf("reading session ses_1: %w: %w", errdefs.ErrUnavailable,
			fmt.Errorf("failed to connect to `user=alice database=secretdb`: 127.0.0.1:5432")), http.StatusServiceUnavailable, "the service is unavailable; retry later", true},
		{"public", errdefs.Publicf("session %q not found: %w", "ses_x", errdefs.ErrNotFound), http.StatusNotFound, `session "ses_x" not found`, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			s := &server{log: slog.New(slog.NewTextHandler(&logs, nil))}
			ctx := context.WithValue(t.Context(), requestIDKey{}, "req-mcp-1")
			e, ok := client.AsError(s.clientError(ctx, tt.err))
			if !ok {
				t.Fatal("got no *client.Error")
			}
			if e.Status != tt.status || e.Message != tt.msg {
				t.Errorf("got %d %q, want %d %q", e.Status, e.Message, tt.status, tt.msg)
			}
			if tt.status == http.StatusServiceUnavailable && e.RetryAfter != time.Second {
				t.Errorf("RetryAfter: got %s, want 1s", e.RetryAfter)
			}
			l := logs.String()
			if got := strings.Contains(l, "request_id=req-mcp-1") && strings.Contains(l, "secretdb"); got != tt.logged {
				t.Errorf("a log line with the request id and the cause: got %v, want %v (log %q)", got, tt.logged, l)
			}
		})
	}
}
