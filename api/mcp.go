package api

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/mcp"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/wire"
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
	serverFor := func(r *http.Request) *sdk.Server {
		p, ok := r.Context().Value(principalKey{}).(capability.Principal)
		if !ok {
			return nil // not authenticated: auth answered already
		}
		// The SDK asks twice for a request that starts a session (or is
		// stateless): to check its protocol version, then to serve it.
		// The request's slot keeps the first, for the second.
		made, _ := r.Context().Value(mcpServerKey{}).(**sdk.Server)
		if made != nil && *made != nil {
			return *made
		}
		o := s.opts.MCP
		o.SchemaCache = cache
		if o.BaseURL == nil {
			o.BaseURL = origin(r)
		}
		srv := mcp.New(localBackend{s: s, p: p}, o)
		if made != nil {
			*made = srv
		}
		return srv
	}
	h := sdk.NewStreamableHTTPHandler(serverFor, &sdk.StreamableHTTPOptions{SessionTimeout: mcpSessionTimeout, MaxRequestBodyBytes: maxBody})
	// Protocol 2026-07-28 and later are stateless (SEP-2575): no
	// initialize, no Mcp-Session-Id; each request carries its version and
	// capabilities in _meta, and the SDK serves it with a session of its
	// own. The SDK serves them only from a stateless handler, and the
	// versions before only from a stateful one (their elicitation is a
	// request to the client, on the session): a request whose
	// MCP-Protocol-Version header names 2026-07-28 or later goes to the
	// first, as the SDK's client sends it from server/discover on.
	// A stateless request's handler (a tools/call waiting for its
	// execution) ends when its client goes, and with it its place among
	// its key's (below); the execution goes on, as when the client of an
	// API stream goes.
	stateless := sdk.NewStreamableHTTPHandler(serverFor, &sdk.StreamableHTTPOptions{Stateless: true, MaxRequestBodyBytes: maxBody,
		PropagateRequestCancellation: true})
	// The SDK reads the principal's key id from the token info: a request
	// of a session that another key started is refused (403).
	requireKey := auth.RequireBearerToken(func(_ context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		p, ok := r.Context().Value(principalKey{}).(capability.Principal)
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: p.KeyID}, nil
	}, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})
	bind, bindStateless := requireKey(h), requireKey(stateless)
	live := &mcpSessions{max: s.opts.MCPSessionsPerKey, starting: map[string]int{}, serving: map[string]int{}, open: map[string][]*sdk.ServerSession{}}
	if live.max == 0 {
		live.max = config.DefaultMCPMaxSessionsPerKey
	}
	return s.auth(func(w http.ResponseWriter, r *http.Request, p capability.Principal) {
		var made *sdk.Server
		r = r.WithContext(context.WithValue(context.WithValue(r.Context(), principalKey{}, p), mcpServerKey{}, &made))
		if statelessMCP(r) {
			// Each stateless request is a session of its own (a server,
			// a goroutine) for as long as it lasts: a key has at most
			// max in flight, as it keeps at most max sessions.
			if !live.acquire(live.serving, p.KeyID) {
				s.writeError(w, r, errdefs.Publicf("this key has %d stateless MCP requests in flight, the most it may (mcp.max_sessions_per_key); retry: %w",
					live.max, errdefs.ErrResourceExhausted))
				return
			}
			defer live.release(live.serving, p.KeyID)
			bindStateless.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodPost || r.Header.Get("Mcp-Session-Id") != "" {
			bind.ServeHTTP(w, r)
			return
		}
		// A POST without a session's id starts a session.
		if !live.acquire(live.starting, p.KeyID) {
			s.writeError(w, r, errdefs.Publicf("this key is starting %d MCP sessions at once, the most it may keep (mcp.max_sessions_per_key); retry: %w",
				live.max, errdefs.ErrResourceExhausted))
			return
		}
		defer func() { live.hold(p.KeyID, made) }()
		// The SDK makes the session's connection with this request's
		// context, and serves each later call of the session under it:
		// they must not inherit this request's log, id and span.
		bind.ServeHTTP(w, r.WithContext(withoutRequest(r.Context())))
	})
}

// statelessMCP reports whether r speaks a stateless version of MCP
// (2026-07-28 or later), by its MCP-Protocol-Version header; the dates
// compare as strings, as the SDK compares them.
func statelessMCP(r *http.Request) bool {
	return r.Header.Get("MCP-Protocol-Version") >= mcp.StatelessProtocol
}

// mcpSessions bounds the MCP sessions each key keeps open, which live in
// the daemon's memory until they end (DELETE /mcp, mcpSessionTimeout, the
// daemon's shutdown) and which the SDK's handler does not bound. A key at
// its bound that starts one more ends its oldest: clients that start
// sessions and never end them (the MCP conformance suite does, one per
// scenario) keep working, and the client of the ended one starts anew, as
// after a timeout. It bounds the key's stateless requests in flight too,
// each a session of its own while it lasts; one more is refused, as none
// of them may be ended for it.
type mcpSessions struct {
	max      int
	mu       sync.Mutex
	starting map[string]int                  // sessions starting, by key id
	serving  map[string]int                  // stateless requests in flight, by key id
	open     map[string][]*sdk.ServerSession // by key id, oldest first
}

// mcpServerKey carries, to the SDK's getServer (serverFor), where to put
// the server it makes for a request, and find it when asked again.
type mcpServerKey struct{}

// acquire counts one more of key in n (m.starting or m.serving); it
// reports false when key has max there already.
func (m *mcpSessions) acquire(n map[string]int, key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n[key] >= m.max {
		return false
	}
	n[key]++
	return true
}

// release counts one fewer of key in n, as acquired.
func (m *mcpSessions) release(n map[string]int, key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.drop(n, key)
}

// drop is release with m.mu held.
func (m *mcpSessions) drop(n map[string]int, key string) {
	if n[key]--; n[key] <= 0 {
		delete(n, key)
	}
}

// hold counts key's starting session as open while the session that
// server (one server per session, see mcpHandler) serves lives, ending
// the key's oldest when that makes more than max; a request that started
// none counts no more, and ends none.
func (m *mcpSessions) hold(key string, server *sdk.Server) {
	var ss *sdk.ServerSession
	if server != nil {
		for s := range server.Sessions() {
			ss = s
			break
		}
	}
	m.mu.Lock()
	m.drop(m.starting, key)
	var oldest *sdk.ServerSession
	if ss != nil {
		m.open[key] = append(m.open[key], ss)
		if len(m.open[key]) > m.max {
			oldest, m.open[key] = m.open[key][0], m.open[key][1:]
		}
	}
	m.mu.Unlock()
	if oldest != nil {
		_ = oldest.Close()
	}
	if ss == nil {
		return
	}
	go func() {
		_ = ss.Wait()
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.open[key] = slices.DeleteFunc(m.open[key], func(o *sdk.ServerSession) bool { return o == ss }); len(m.open[key]) == 0 {
			delete(m.open, key)
		}
	}()
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
// logic, for one principal, without HTTP. Its executions, sessions and
// cells are the API's own wire values; its events are the API's stream
// decoded by the Go client's code, and its errors the client's reading of
// the API's answer, so that /mcp and stockade mcp answer alike.
type localBackend struct {
	s *server
	p capability.Principal
}

var _ mcp.Backend = localBackend{}

func (b localBackend) StreamExecution(ctx context.Context, req wire.ExecutionRequest) (*client.Stream, error) {
	es, err := b.s.openStream(ctx, b.p, req, capability.InvokeOptions{IdempotencyKey: req.IdempotencyKey, ExecutionID: capability.NewExecutionID()})
	if err != nil {
		return nil, b.s.clientError(ctx, err)
	}
	return client.NewStream(func() (string, []byte, error) { return es.next(ctx, nil) }, es.close), nil
}

func (b localBackend) GetExecution(ctx context.Context, id string, wait time.Duration) (*wire.Execution, error) {
	v, err := b.s.execution(ctx, b.p, id, wait)
	if err != nil {
		return nil, b.s.clientError(ctx, err)
	}
	return &v, nil
}

// clientError is err as the Go client reads the API's answer of it,
// logged as writeError logs it.
func (s *server) clientError(ctx context.Context, err error) error {
	code, d, retry := s.answer(ctx, err)
	e := &client.Error{Status: code, Code: d.Code, Message: d.Message, EndedAt: d.EndedAt, EndReason: d.EndReason}
	if retry {
		e.RetryAfter = retryAfter
	}
	return e
}

var _ mcp.CancelBackend = localBackend{}

func (b localBackend) CancelExecution(ctx context.Context, id, reason string) (*wire.Execution, error) {
	e, err := b.s.svc.Cancel(ctx, b.p, id, reason)
	if err != nil {
		return nil, b.s.clientError(ctx, err)
	}
	v := viewOf(e)
	return &v, nil
}

var _ mcp.SessionBackend = localBackend{}

func (b localBackend) CreateSession(ctx context.Context, req wire.SessionRequest) (*wire.Session, error) {
	c, err := b.s.svc.CreateSession(ctx, b.p, req, capability.CreateSessionOptions{IdempotencyKey: req.IdempotencyKey})
	if err != nil {
		return nil, b.s.clientError(ctx, err)
	}
	v := b.s.sessionView(c.Session)
	v.Replayed = c.Replayed
	return &v, nil
}

func (b localBackend) CloseSession(ctx context.Context, id string) (*wire.Session, error) {
	st, err := b.s.svc.CloseSession(ctx, b.p, id)
	if err != nil {
		return nil, b.s.clientError(ctx, err)
	}
	v := b.s.sessionView(st)
	return &v, nil
}

func (b localBackend) StreamCell(ctx context.Context, id string, req wire.CellRequest) (*client.Stream, error) {
	opts := capability.InvokeOptions{IdempotencyKey: req.IdempotencyKey, ExecutionID: capability.NewExecutionID()}
	es, err := b.s.openAdmitted(ctx, b.p, opts.ExecutionID, func() (*capability.Invocation, error) { return b.s.svc.ExecCell(ctx, b.p, id, req, opts) })
	if err != nil {
		return nil, b.s.clientError(ctx, err)
	}
	es.result = func(ctx context.Context, e model.Execution) any { return b.s.cellView(ctx, b.p, e) }
	return client.NewCellStream(func() (string, []byte, error) { return es.next(ctx, nil) }, es.close), nil
}

func (b localBackend) WaitCell(ctx context.Context, executionID string, wait time.Duration) (*wire.Cell, error) {
	v, err := b.s.execution(ctx, b.p, executionID, wait)
	if err != nil {
		return nil, b.s.clientError(ctx, err)
	}
	c := wire.CellOf(v)
	return &c, nil
}

func (b localBackend) PutFile(ctx context.Context, id, path string, r io.Reader, size int64) (*wire.FileInfo, error) {
	if most := b.s.svc.Options().Sessions.MaxFileSize; size > most {
		return nil, b.s.clientError(ctx, errdefs.Publicf("the file is %d bytes, more than this server's limit of %d (sessions.max_file_size): %w", size, most, errdefs.ErrTooLarge))
	}
	f, err := b.s.svc.PutFile(ctx, b.p, id, path, r)
	if err != nil {
		return nil, b.s.clientError(ctx, err)
	}
	return &f, nil
}

func (b localBackend) GetFile(ctx context.Context, id, path string, w io.Writer, max int64) (*wire.FileInfo, error) {
	data, f, err := b.s.svc.GetFile(ctx, b.p, id, path)
	if err != nil {
		return nil, b.s.clientError(ctx, err)
	}
	if int64(len(data)) > max {
		return nil, b.s.clientError(ctx, errdefs.Publicf("reading %s in session %s: the file is %d bytes, more than %d: %w", path, id, len(data), max, errdefs.ErrTooLarge))
	}
	if _, err := w.Write(data); err != nil {
		return nil, b.s.clientError(ctx, err)
	}
	return &wire.FileInfo{Path: path, Size: int64(len(data)), SHA256: f.SHA256}, nil
}

func (b localBackend) ListFiles(ctx context.Context, id, dir string) ([]wire.FileEntry, bool, error) {
	entries, truncated, err := b.s.svc.ListFiles(ctx, b.p, id, dir)
	if err != nil {
		return nil, false, b.s.clientError(ctx, err)
	}
	out := make([]wire.FileEntry, 0, len(entries))
	for _, e := range entries {
		out = append(out, fileEntry(e))
	}
	return out, truncated, nil
}
