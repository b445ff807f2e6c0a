package console

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
)

// TestDescribeHidesCauses checks that the console shows an error as the
// API answers it: the class's sentence for a message not made for
// clients, logged with its cause, and a public message whole.
func TestDescribeHidesCauses(t *testing.T) {
	for _, tt := range []struct {
		name   string
		err    error
		status int
		msg    string
		logged string // in the log; "" for nothing
	}{
		{"the database down", fmt.Errorf("listing approvals: %w: %w", errdefs.ErrUnavailable, errors.New("dial tcp 10.0.0.5:5432: connection refused")),
			http.StatusServiceUnavailable, "The service is unavailable; retry later.", "10.0.0.5:5432"},
		{"a constraint", fmt.Errorf("deciding: %w: %w", errdefs.ErrConflict, errors.New(`duplicate key value violates unique constraint "approval_requests_pkey"`)),
			http.StatusConflict, "The request conflicts with the current state.", "approval_requests_pkey"},
		{"public", errdefs.Publicf("approval %s is already %s: %w", "apr_1", "approved", errdefs.ErrConflict), http.StatusConflict, "Approval apr_1 is already approved.", ""},
		{"internal", errors.New("open /var/lib/stockade/x: permission denied"), http.StatusInternalServerError,
			"Something went wrong on the server; the log has the details.", "/var/lib/stockade/x"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			c := &Console{log: slog.New(slog.NewTextHandler(&logs, nil))}
			code, msg := c.describe(httptest.NewRequest("GET", "/ui/approvals", nil), "rendering", tt.err)
			if code != tt.status || msg != tt.msg {
				t.Errorf("got %d %q, want %d %q", code, msg, tt.status, tt.msg)
			}
			if l := logs.String(); (tt.logged == "") != (l == "") || !strings.Contains(l, tt.logged) {
				t.Errorf("the log: got %q, want a line with %q", l, tt.logged)
			}
		})
	}
}
