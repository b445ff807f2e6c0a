package client

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
)

func TestErrorOf(t *testing.T) {
	for _, tc := range []struct {
		name       string
		status     int
		header     http.Header
		body       string
		class      error
		code       string
		msg        string
		retryAfter time.Duration
	}{
		{"invalid argument", 400, nil, `{"error":{"code":"invalid_argument","message":"unknown runtime \"ruby\""}}`, errdefs.ErrInvalidArgument, "invalid_argument", `unknown runtime "ruby"`, 0},
		{"unauthenticated", 401, nil, `{"error":{"code":"unauthenticated","message":"invalid or revoked API key"}}`, errdefs.ErrUnauthenticated, "unauthenticated", "invalid or revoked", 0},
		{"credits", 402, nil, `{"error":{"code":"insufficient_credits","message":"insufficient credits: an invocation costs 2"}}`, errdefs.ErrPaymentRequired, "insufficient_credits", "costs 2", 0},
		{"policy", 403, nil, `{"error":{"code":"permission_denied","message":"runtime node is not allowed"}}`, errdefs.ErrPermissionDenied, "permission_denied", "not allowed", 0},
		{"not found", 404, nil, `{"error":{"code":"not_found","message":"execution ex_1 not found"}}`, errdefs.ErrNotFound, "not_found", "ex_1", 0},
		{"method", 405, nil, `{"error":{"code":"method_not_allowed","message":"PUT is not a method of /v1/tools"}}`, errdefs.ErrInvalidArgument, "method_not_allowed", "PUT", 0},
		{"request timeout", 408, nil, `{"error":{"code":"request_timeout","message":"the request body did not arrive"}}`, errdefs.ErrUnavailable, "request_timeout", "did not arrive", 0},
		{"conflict", 409, nil, `{"error":{"code":"conflict","message":"already decided"}}`, errdefs.ErrConflict, "conflict", "already decided", 0},
		{"session busy", 409, nil, `{"error":{"code":"session_busy","message":"session ses_1 is running a cell"}}`, errdefs.ErrConflict, "session_busy", "running a cell", 0},
		{"failed precondition", 409, nil, `{"error":{"code":"failed_precondition","message":"session ses_1 is paused; resume it"}}`, errdefs.ErrFailedPrecondition, "failed_precondition", "paused", 0},
		{"session expired", 410, nil, `{"error":{"code":"session_expired","message":"session ses_1 ended (ttl)"}}`, errdefs.ErrGone, "session_expired", "ended", 0},
		{"gone", 410, nil, `{"error":{"code":"gone","message":"it has ended"}}`, errdefs.ErrGone, "gone", "ended", 0},
		{"a plain 410", 410, nil, ``, errdefs.ErrGone, "Gone", "410", 0},
		{"too large", 413, nil, `{"error":{"code":"too_large","message":"code is larger than 1 MiB"}}`, errdefs.ErrTooLarge, "too_large", "1 MiB", 0},
		{"at capacity", 429, http.Header{"Retry-After": {"3"}}, `{"error":{"code":"resource_exhausted","message":"the server is at capacity"}}`, errdefs.ErrResourceExhausted, "resource_exhausted", "at capacity", 3 * time.Second},
		{"unavailable", 503, http.Header{"Retry-After": {"1"}}, `{"error":{"code":"unavailable","message":"the runc sandbox driver is unavailable"}}`, errdefs.ErrUnavailable, "unavailable", "driver", time.Second},
		{"internal", 500, nil, `{"error":{"code":"internal","message":"internal error"}}`, nil, "internal", "internal error", 0},
		{"a proxy's page", 502, nil, `<html>bad gateway</html>`, errdefs.ErrUnavailable, "Bad Gateway", "502 Bad Gateway", 0},
		{"a plain 429", 429, http.Header{"Retry-After": {"7"}}, ``, errdefs.ErrResourceExhausted, "Too Many Requests", "429", 7 * time.Second},
		{"a plain 403", 403, nil, `forbidden`, errdefs.ErrPermissionDenied, "Forbidden", "forbidden", 0},
		{"an unknown code", 418, nil, `{"error":{"code":"teapot","message":"short and stout"}}`, errdefs.ErrInvalidArgument, "teapot", "short and stout", 0},
		{"a retry-after date", 503, http.Header{"Retry-After": {"Mon, 02 Jan 2006 15:04:05 GMT"}}, ``, errdefs.ErrUnavailable, "Service Unavailable", "503", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.header
			if h == nil {
				h = http.Header{}
			}
			err := errorOf(tc.status, h, []byte(tc.body))
			if got := err.Unwrap(); got != tc.class {
				t.Errorf("class: got %v, want %v", got, tc.class)
			}
			if tc.class != nil && !errors.Is(err, tc.class) {
				t.Errorf("errors.Is(err, %v): got false, want true", tc.class)
			}
			if err.Code != tc.code {
				t.Errorf("code: got %q, want %q", err.Code, tc.code)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("message: got %q, want it to contain %q", err.Error(), tc.msg)
			}
			if err.RetryAfter != tc.retryAfter {
				t.Errorf("RetryAfter: got %s, want %s", err.RetryAfter, tc.retryAfter)
			}
			if err.Status != tc.status {
				t.Errorf("status: got %d, want %d", err.Status, tc.status)
			}
		})
	}
}

func TestErrorRetryAfterInMessage(t *testing.T) {
	err := errorOf(429, http.Header{"Retry-After": {"2"}}, []byte(`{"error":{"code":"resource_exhausted","message":"at capacity"}}`))
	if got, want := err.Error(), "at capacity (retry after 2s)"; got != want {
		t.Errorf("Error(): got %q, want %q", got, want)
	}
}

// TestErrorRequestID checks that a server's error names the request id
// that its log line carries, and that a client's error does not.
func TestErrorRequestID(t *testing.T) {
	for _, tc := range []struct {
		status int
		want   string
	}{
		{500, "internal error (request r-1)"},
		{503, "internal error (request r-1) (retry after 1s)"},
		{404, "internal error"},
	} {
		h := http.Header{"X-Request-Id": {"r-1"}}
		if tc.status == 503 {
			h.Set("Retry-After", "1")
		}
		err := errorOf(tc.status, h, []byte(`{"error":{"code":"x","message":"internal error"}}`))
		if err.RequestID != "r-1" {
			t.Errorf("%d: RequestID: got %q, want r-1", tc.status, err.RequestID)
		}
		if got := err.Error(); got != tc.want {
			t.Errorf("%d: Error(): got %q, want %q", tc.status, got, tc.want)
		}
	}
}
