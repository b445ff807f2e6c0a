package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/mcp"
)

// mcpSessionTimeout closes an MCP session that has had no request for
// this long: sessions live in the daemon's memory, and a client that
// vanished never ends its own. A client whose session was closed starts a
// new one (the transport answers 404 to the old one's id).
const mcpSessionTimeout = 30 * time.Minute

// mcpHandler serves /mcp: Stockade's MCP tools over streamable HTTP, for
// the holder of an API key, sent as the bearer token. Each request goes
// through the key check of every other endpoint (auth); a session is
// bound to the key that started it, and its tools act with that key's
// rights through the in-process backend.
func (s *server) mcpHandler() http.Handler {
	cache := sdk.NewSchemaCache()
	h := sdk.NewStreamableHTTPHandler(func(r *http.Request) *sdk.Server {
		p, ok := r.Context().Value(principalKey{}).(capability.Principal)
		if !ok {
			return nil // not authenticated: auth answered already
		}
		o := s.opts.MCP
		o.SchemaCache = cache
		if o.BaseURL == nil {
			o.BaseURL = origin(r)
		}
		return mcp.New(localBackend{s: s, p: p}, o)
	}, &sdk.StreamableHTTPOptions{SessionTimeout: mcpSessionTimeout, MaxRequestBodyBytes: maxBody})
	// The SDK reads the principal's key id from the token info: a request
	// of a session that another key started is refused (403).
	bind := auth.RequireBearerToken(func(_ context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		p, ok := r.Context().Value(principalKey{}).(capability.Principal)
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: p.KeyID}, nil
	}, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(h)
	return s.auth(func(w http.ResponseWriter, r *http.Request, p capability.Principal) {
		bind.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	})
}

// origin is the daemon's URL as the request reached it, which the
// approval console's pages are relative to.
func origin(r *http.Request) *url.URL {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return &url.URL{Scheme: scheme, Host: r.Host}
}

// localBackend is the MCP tools' backend inside the daemon: the API's own
// logic, for one principal, without HTTP. Its events, executions and
// errors are the API's, decoded by the Go client's code, so that /mcp and
// stockade mcp answer alike.
type localBackend struct {
	s *server
	p capability.Principal
}

var _ mcp.Backend = localBackend{}

func (b localBackend) StreamExecution(ctx context.Context, req client.ExecutionRequest) (*client.Stream, error) {
	ir := capability.InvokeRequest{Runtime: req.Runtime, Code: req.Code, TimeoutMS: req.TimeoutMS, Network: req.Network, Stdin: req.Stdin, Tool: req.Tool}
	es, err := b.s.openStream(ctx, b.p, ir, capability.InvokeOptions{IdempotencyKey: req.IdempotencyKey, ExecutionID: capability.NewExecutionID()})
	if err != nil {
		return nil, clientError(err)
	}
	return client.NewStream(func() (string, []byte, error) { return es.next(ctx, nil) }, es.close), nil
}

func (b localBackend) GetExecution(ctx context.Context, id string, wait time.Duration) (*client.Execution, error) {
	v, err := b.s.execution(ctx, b.p, id, wait)
	if err != nil {
		return nil, clientError(err)
	}
	// Through JSON, the execution is exactly what the API would answer.
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding execution %s: %w", id, err)
	}
	var ex client.Execution
	if err := json.Unmarshal(raw, &ex); err != nil {
		return nil, fmt.Errorf("decoding execution %s: %w", id, err)
	}
	return &ex, nil
}

// clientError is err as the Go client reads the API's answer of it.
func clientError(err error) error {
	code, d, retry := answer(err)
	e := &client.Error{Status: code, Code: d.Code, Message: d.Message}
	if retry {
		e.RetryAfter = retryAfter
	}
	return e
}
