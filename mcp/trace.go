package mcp

import (
	"context"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/stockade-sh/stockade/internal/telemetry"
)

// traceMiddleware puts a tools/call under the client's span that its
// params._meta names ("traceparent", "tracestate"), as MCP carries trace
// context: the call's spans join the client's trace rather than the one
// of the HTTP request that carried it (docs/design.md, section 11). A
// call whose _meta names none is under the traceparent (and tracestate)
// of the HTTP request that carried it, when it sent one: in a stateful
// session the call's context is the session's, not that request's.
func traceMiddleware(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
		if ctr, ok := req.(*sdk.CallToolRequest); ok && ctr.Params != nil {
			if _, ok := ctr.Params.Meta["traceparent"].(string); ok {
				ctx = telemetry.FromMeta(ctx, ctr.Params.Meta)
			} else if ex := req.GetExtra(); ex != nil && ex.Header != nil {
				ctx = telemetry.FromHeader(ctx, ex.Header)
			}
		}
		return next(ctx, method, req)
	}
}
