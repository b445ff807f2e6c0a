package api_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/internal/testenv"
)

// TestRequestLogLine checks the daemon's JSON log: one line per request,
// with its request id (the client's X-Request-Id), route, status and the
// trace id of the client's traceparent, tracing off; Warn for a refused
// key, Info for a 404.
func TestRequestLogLine(t *testing.T) {
	svc, st, agent := newBareService(t)
	var logs testenv.Buffer
	srv := httptest.NewServer(api.New(svc, st, api.Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))}))
	t.Cleanup(srv.Close)
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	do(t, srv.URL, "GET", "/v1/workspace", agent, nil, "X-Request-Id", "req-log-1",
		"traceparent", "00-"+traceID+"-00f067aa0ba902b7-01").want(t, http.StatusOK)
	do(t, srv.URL, "GET", "/v1/workspace", "sk_unknown", nil, "X-Request-Id", "req-log-2").want(t, http.StatusUnauthorized)
	do(t, srv.URL, "GET", "/v1/nothing", agent, nil, "X-Request-Id", "req-log-3").want(t, http.StatusNotFound)

	type line struct {
		Level, Msg, RequestID, Route, TraceID string
		Status                                int
	}
	var lines []line
	for l := range strings.Lines(logs.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("a log line that is not JSON: %q: %v", l, err)
		}
		s := func(k string) string { v, _ := m[k].(string); return v }
		st, _ := m["status"].(float64)
		lines = append(lines, line{s("level"), s("msg"), s("request_id"), s("route"), s("trace_id"), int(st)})
	}
	want := []line{
		{"INFO", "request", "req-log-1", "GET /v1/workspace", traceID, 200},
		{"WARN", "request", "req-log-2", "GET /v1/workspace", "", 401},
		{"INFO", "request", "req-log-3", "GET", "", 404}, // no route: the method alone
	}
	if !slices.Equal(lines, want) {
		t.Errorf("log lines:\ngot  %+v\nwant %+v\nlog %s", lines, want, logs.String())
	}
}
