package telemetry

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/propagation"
)

// traceContext is the W3C Trace Context propagator: traceparent and
// tracestate.
var traceContext = propagation.TraceContext{}

// FromHeader is ctx under the client's span that h's traceparent (and
// tracestate) name, when it is valid; else ctx. The API's requests.
func FromHeader(ctx context.Context, h http.Header) context.Context {
	return traceContext.Extract(ctx, propagation.HeaderCarrier(h))
}

// FromMeta is ctx under the client's span that an MCP request's
// params._meta names in its "traceparent" and "tracestate" string
// values, as the MCP specification's trace context convention puts them;
// else ctx. A value of another type is ignored.
func FromMeta(ctx context.Context, meta map[string]any) context.Context {
	c := propagation.MapCarrier{}
	for _, k := range traceContext.Fields() {
		if v, ok := meta[k].(string); ok {
			c[k] = v
		}
	}
	return traceContext.Extract(ctx, c)
}
