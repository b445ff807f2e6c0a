package mcp

import (
	"context"
	"net/http"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/trace"
)

// TestTraceMiddlewareFallsBackToTheHeader checks where a tools/call's
// trace comes from: its _meta's traceparent, else the one of the HTTP
// request that carried it (in a stateful session the call's context is
// the session's, not that request's).
func TestTraceMiddlewareFallsBackToTheHeader(t *testing.T) {
	const (
		fromMeta   = "4bf92f3577b34da6a3ce929d0e0e4736"
		fromHeader = "5c659d9f3577b34da6a3ce929d0e0e47"
	)
	h := http.Header{"Traceparent": {"00-" + fromHeader + "-00f067aa0ba902b7-01"}}
	for _, tc := range []struct {
		name string
		meta sdk.Meta
		want string
	}{
		{"meta", sdk.Meta{"traceparent": "00-" + fromMeta + "-00f067aa0ba902b7-01"}, fromMeta},
		{"header", nil, fromHeader},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got string
			next := func(ctx context.Context, _ string, _ sdk.Request) (sdk.Result, error) {
				got = trace.SpanContextFromContext(ctx).TraceID().String()
				return nil, nil
			}
			req := &sdk.CallToolRequest{Params: &sdk.CallToolParamsRaw{Name: "x", Meta: tc.meta}, Extra: &sdk.RequestExtra{Header: h}}
			if _, err := traceMiddleware(next)(t.Context(), "tools/call", req); err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("trace %s, want %s", got, tc.want)
			}
		})
	}
}
