package mcp

import (
	"context"
	"errors"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/trace"

	"github.com/stockade-sh/stockade/client"
)

// ctxBackend records the context of the run it is asked for and refuses
// it.
type ctxBackend struct{ got chan context.Context }

func (b ctxBackend) StreamExecution(ctx context.Context, _ client.ExecutionRequest) (*client.Stream, error) {
	b.got <- ctx
	return nil, errors.New("refused by the test")
}

func (ctxBackend) GetExecution(context.Context, string, time.Duration) (*client.Execution, error) {
	return nil, errors.New("refused by the test")
}

// TestCallJoinsClientTrace: a tools/call whose _meta names a traceparent
// reaches the backend under that span; one without carries no span.
func TestCallJoinsClientTrace(t *testing.T) {
	b := ctxBackend{got: make(chan context.Context, 1)}
	st, ct := sdk.NewInMemoryTransports()
	ss, err := New(b, Options{}).Connect(t.Context(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "stockade-test", Version: "1"}, nil).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	const traceID, spanID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for _, tt := range []struct {
		name string
		meta sdk.Meta
		want string
	}{
		{"without", nil, ""},
		{"with", sdk.Meta{"traceparent": "00-" + traceID + "-" + spanID + "-01"}, traceID},
	} {
		params := &sdk.CallToolParams{Name: "run_code", Arguments: map[string]any{"code": "print(1)", "language": "python"}, Meta: tt.meta}
		if _, err := cs.CallTool(t.Context(), params); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		sc := trace.SpanContextFromContext(<-b.got)
		got := ""
		if sc.IsValid() {
			got = sc.TraceID().String()
		}
		if got != tt.want || (tt.want != "" && sc.SpanID().String() != spanID) {
			t.Errorf("%s _meta: the backend's context has trace %q span %s, want trace %q", tt.name, got, sc.SpanID(), tt.want)
		}
	}
}
