// Package api is Stockade's HTTP API: REST with JSON bodies, Server-Sent
// Events for executions that wait for approval or stream output, Prometheus
// metrics and the OpenAPI document. Handlers decode and encode; every
// decision is the capability layer's.
//
//	h := api.New(svc, st, api.Options{Metrics: api.NewMetrics()})
//	http.ListenAndServe("127.0.0.1:8700", h)
package api

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/mcp"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

//go:embed openapi.json
var openapiDoc []byte

// Options configure the handler.
type Options struct {
	// Metrics, if set, is served on /metrics.
	Metrics *Metrics
	// MaxWait bounds ?wait= and a synchronous POST's wait for the result;
	// zero means 10 minutes.
	MaxWait time.Duration
	// KeepAlive is the interval of SSE comments while nothing happens; zero
	// means 15 s.
	KeepAlive time.Duration
	// BodyTimeout bounds the wait for a request body, from the end of the
	// headers to the end of the body; zero means
	// config.DefaultBodyTimeout. It does not bound
	// the wait for the answer (long polls, event streams).
	BodyTimeout time.Duration
	// WriteTimeout bounds each write of an answer: a client that has not
	// taken one this long after it began is cut off. Zero means
	// config.DefaultWriteTimeout.
	WriteTimeout time.Duration
	// UI, if set, serves every path under /ui/: the approval console.
	UI http.Handler
	// MCP configures the MCP tools of /mcp; a nil BaseURL is the URL each
	// request reached the daemon by.
	MCP mcp.Options
	// MCPSessionsPerKey bounds the MCP sessions one key keeps open on
	// /mcp (one more ends the key's oldest), and its stateless requests
	// in flight (one more is refused); zero means
	// config.DefaultMCPMaxSessionsPerKey.
	MCPSessionsPerKey int
	// Templates serves /v1/templates; nil is a daemon without templates.
	Templates TemplateService
	// Logger receives a line for every answer that is a 5xx or hides an
	// error's message, with its cause and the request's id; nil is
	// slog.Default().
	Logger *slog.Logger
}

// maxBody bounds a request body: 1 MiB of code and 1 MiB of stdin, JSON
// escaped, with room to spare.
const maxBody = 8 << 20

// Store is what the API reads from the store itself: every change goes
// through the capability layer.
type Store interface {
	GetApproval(ctx context.Context, workspaceID, approvalID string) (model.Approval, error)
	ListApprovals(ctx context.Context, workspaceID string, f store.ApprovalFilter) (store.Page[model.Approval], error)
	ListEvents(ctx context.Context, workspaceID string, f store.EventFilter) (store.Page[model.Event], error)
	ListToolCalls(ctx context.Context, workspaceID string, f store.ToolCallFilter) (store.Page[model.ToolCall], error)
	GetToolCall(ctx context.Context, workspaceID, executionID string) (model.ToolCall, error)
	GetWorkspace(ctx context.Context, id string) (model.Workspace, error)
	GetPolicy(ctx context.Context, workspaceID string) (model.Policy, error)
	GetCredits(ctx context.Context, workspaceID string) (model.Credits, error)
	CheckpointBytes(ctx context.Context, workspaceID string) (bytes int64, paused int, err error)
}

type server struct {
	svc  *capability.Service
	st   Store
	opts Options
	log  *slog.Logger
	// mcp serves /mcp; it holds the MCP sessions.
	mcp http.Handler
}

// New returns the API handler over svc, reading st for what it lists.
// Every known path answers a method it has no route for with 405 and
// Allow, an unknown path with 404, both in the JSON error shape.
func New(svc *capability.Service, st Store, o Options) http.Handler {
	if o.MaxWait == 0 {
		o.MaxWait = 10 * time.Minute
	}
	if o.KeepAlive == 0 {
		o.KeepAlive = 15 * time.Second
	}
	if o.BodyTimeout == 0 {
		o.BodyTimeout = config.DefaultBodyTimeout
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = config.DefaultWriteTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &server{svc: svc, st: st, opts: o, log: o.Logger}
	s.mcp = s.mcpHandler()
	mux := http.NewServeMux()
	for _, rt := range s.routes() {
		mux.Handle(rt.pattern, rt.handler)
	}
	// The console is a handler of its own below /ui/, not an API route:
	// it answers its own methods and paths.
	if o.UI != nil {
		mux.Handle("/ui/", o.UI)
	}
	mux.Handle("/", s.noRoute(mux))
	return withRequestID(s.observe(mux, s.deadlines(mux)))
}

// route is one endpoint: an http.ServeMux pattern, "METHOD /path", and its
// handler.
type route struct {
	pattern string
	handler http.Handler
}

// routes lists the API's endpoints, each described in openapi.json.
func (s *server) routes() []route {
	rs := []route{
		{"POST /v1/executions", s.auth(s.createExecution)},
		{"GET /v1/executions/{id}", s.auth(s.getExecution)},
		{"POST /v1/executions/{id}/cancel", s.auth(s.cancelExecution)},
		{"GET /v1/approvals", s.auth(s.listApprovals)},
		{"POST /v1/approvals/{id}/approve", s.auth(s.decide(true))},
		{"POST /v1/approvals/{id}/deny", s.auth(s.decide(false))},
		{"GET /v1/audit/events", s.auth(s.listEvents)},
		{"GET /v1/tool-calls", s.auth(s.listToolCalls)},
		{"GET /v1/workspace", s.auth(s.getWorkspace)},
		{"GET /v1/tools", s.auth(s.listTools)},
		{"POST /v1/tools/{name}/approve", s.auth(s.approveTool)},
		{"POST /v1/sessions", s.auth(s.createSession)},
		{"GET /v1/sessions", s.auth(s.listSessions)},
		{"GET /v1/sessions/{id}", s.auth(s.getSession)},
		{"DELETE /v1/sessions/{id}", s.auth(s.deleteSession)},
		{"POST /v1/sessions/{id}/exec", s.auth(s.execCell)},
		{"POST /v1/sessions/{id}/interrupt", s.auth(s.interruptCell)},
		{"POST /v1/sessions/{id}/pause", s.auth(s.pauseSession)},
		{"POST /v1/sessions/{id}/resume", s.auth(s.resumeSession)},
		{"PUT /v1/sessions/{id}/files", s.auth(s.putFile)},
		{"GET /v1/sessions/{id}/files", s.auth(s.getFiles)},
		{"DELETE /v1/sessions/{id}/files", s.auth(s.deleteFile)},
		{"POST /v1/sessions/{id}/snapshots", s.auth(s.snapshotSession)},
		{"GET /v1/sessions/{id}/snapshots", s.auth(s.listSnapshots)},
		{"DELETE /v1/snapshots/{id}", s.auth(s.deleteSnapshot)},
		{"POST /v1/sessions/{id}/fork", s.auth(s.forkSession)},
		{"POST /mcp", s.mcp},
		{"GET /mcp", s.mcp},
		{"DELETE /mcp", s.mcp},
		{"GET /healthz", http.HandlerFunc(s.healthz)},
		{"GET /openapi.json", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(openapiDoc)
		})},
	}
	if s.opts.Metrics != nil {
		rs = append(rs, route{"GET /metrics", s.opts.Metrics.Handler()})
	}
	rs = append(rs, s.templateRoutes()...)
	return rs
}

// probedMethods are the methods noRoute looks for routes of.
var probedMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
	http.MethodPatch, http.MethodDelete, http.MethodOptions}

// noRoute answers what no route of mux takes, mux's pattern "/": 405 with
// the methods the path has routes for in Allow, or 404 when it has none.
// It asks mux itself which methods those are, so that a new route needs
// nothing more to be answered so.
func (s *server) noRoute(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 {
			s.closeWithoutBody(w, r)
		}
		var allow []string
		for _, m := range probedMethods {
			probe := r.WithContext(r.Context())
			probe.Method = m
			if _, pattern := mux.Handler(probe); pattern != "/" {
				allow = append(allow, m)
			}
		}
		if len(allow) == 0 {
			s.writeError(w, r, errdefs.Publicf("no route for %s %s (see /openapi.json): %w", r.Method, r.URL.Path, errdefs.ErrNotFound))
			return
		}
		w.Header().Set("Allow", strings.Join(allow, ", "))
		s.writeError(w, r, errdefs.Publicf("%s is not a method of %s, which takes %s (see /openapi.json): %w",
			r.Method, r.URL.Path, strings.Join(allow, ", "), errMethodNotAllowed))
	})
}

type principalKey struct{}

// auth authenticates the bearer key and passes the principal on.
func (s *server) auth(next func(http.ResponseWriter, *http.Request, capability.Principal)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// The scheme is case-insensitive (RFC 7235).
		key := r.Header.Get("Authorization")
		if len(key) >= 7 && strings.EqualFold(key[:7], "bearer ") {
			key = key[7:]
		} else {
			key = ""
		}
		p, err := s.svc.Authenticate(r.Context(), strings.TrimSpace(key))
		if err != nil {
			// A client without a valid key keeps no connection, and the
			// body it announced is not waited for.
			s.closeWithoutBody(w, r)
			w.Header().Set("WWW-Authenticate", `Bearer realm="stockade"`)
			s.writeError(w, r, err)
			return
		}
		next(w, r, p)
	}
}

// decodeBody strictly decodes a JSON body into v, naming the offending
// field. A body it refuses is not read further.
func (s *server) decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("trailing data after the JSON object")
	}
	if err == nil {
		return nil
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// The connection's reading is over: there is nothing to wait for.
		w.Header().Set("Connection", "close")
		return errdefs.Publicf("the request body did not arrive within %s of its headers: %w", s.opts.BodyTimeout, errRequestTimeout)
	}
	s.closeWithoutBody(w, r)
	var typeErr *json.UnmarshalTypeError
	var maxErr *http.MaxBytesError
	switch {
	case errors.As(err, &maxErr):
		return errdefs.Publicf("request body is larger than %d bytes: %w", maxBody, errdefs.ErrTooLarge)
	case errors.As(err, &typeErr):
		return errdefs.Publicf("field %q: expected %s, got JSON %s: %w", typeErr.Field, typeErr.Type, typeErr.Value, errdefs.ErrInvalidArgument)
	case errors.Is(err, io.EOF):
		return errdefs.Publicf("request body is empty; expected a JSON object: %w", errdefs.ErrInvalidArgument)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return errdefs.Publicf("unknown field %s: %w", strings.TrimPrefix(err.Error(), "json: unknown field "), errdefs.ErrInvalidArgument)
	}
	return errdefs.Publicf("malformed JSON body: %s: %w", err.Error(), errdefs.ErrInvalidArgument)
}
