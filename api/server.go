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
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/mcp"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
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
	// /mcp (one more ends the key's oldest); zero means
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
	return withRequestID(s.deadlines(mux))
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
		{"POST /mcp", s.mcp},
		{"GET /mcp", s.mcp},
		{"DELETE /mcp", s.mcp},
		{"GET /healthz", http.HandlerFunc(s.healthz)},
		{"GET /openapi.json", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(openapiDoc)
		})},
	}
	rs = append(rs, s.templateRoutes()...)
	if s.opts.Metrics != nil {
		rs = append(rs, route{"GET /metrics", s.opts.Metrics.Handler()})
	}
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

// ExecutionView is an execution on the wire.
type ExecutionView struct {
	ID      string `json:"id"`
	Status  string `json:"status"`
	Runtime string `json:"runtime"`
	Tool    string `json:"tool"`
	// SessionID is the session of an execution that is a session's cell.
	SessionID  string          `json:"session_id,omitempty"`
	ApprovalID string          `json:"approval_id,omitempty"`
	Approval   json.RawMessage `json:"approval,omitempty"`
	Driver     string          `json:"driver,omitempty"`
	CreatedAt  time.Time       `json:"created_at"`
	StartedAt  *time.Time      `json:"started_at,omitempty"`
	FinishedAt *time.Time      `json:"finished_at,omitempty"`
	// Result is the engine's result object once the code ran, or
	// {"error": ...} when the sandbox could not launch.
	Result   json.RawMessage `json:"result,omitempty"`
	Replayed bool            `json:"replayed,omitempty"`
}

func viewOf(e model.Execution) ExecutionView {
	v := ExecutionView{
		ID: e.ID, Status: string(e.Status), Runtime: e.Runtime, Tool: e.Tool, SessionID: e.SessionID, ApprovalID: e.ApprovalID,
		Driver: e.Driver, CreatedAt: e.CreatedAt, Result: e.Result,
	}
	if !e.StartedAt.IsZero() {
		v.StartedAt = &e.StartedAt
	}
	if !e.FinishedAt.IsZero() {
		v.FinishedAt = &e.FinishedAt
	}
	return v
}

// ApprovalView is an approval request on the wire.
type ApprovalView struct {
	ID          string          `json:"id"`
	ExecutionID string          `json:"execution_id"`
	Status      string          `json:"status"`
	Card        json.RawMessage `json:"card"`
	RequestedAt time.Time       `json:"requested_at"`
	ExpiresAt   time.Time       `json:"expires_at"`
	DecidedBy   string          `json:"decided_by,omitempty"`
	DecidedAt   *time.Time      `json:"decided_at,omitempty"`
	Reason      string          `json:"reason,omitempty"`
}

func approvalView(a model.Approval) ApprovalView {
	v := ApprovalView{ID: a.ID, ExecutionID: a.ExecutionID, Status: string(a.Status), Card: card(a),
		RequestedAt: a.RequestedAt, ExpiresAt: a.ExpiresAt, DecidedBy: a.DecidedBy, Reason: a.Reason}
	if !a.DecidedAt.IsZero() {
		v.DecidedAt = &a.DecidedAt
	}
	return v
}

// card returns the approval card with its ids filled in.
func card(a model.Approval) json.RawMessage {
	var c capability.ApprovalCard
	if err := json.Unmarshal(a.Card, &c); err != nil {
		return a.Card
	}
	c.ApprovalID, c.ExecutionID = a.ID, a.ExecutionID
	b, _ := json.Marshal(c)
	return b
}

func (s *server) createExecution(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	var req capability.InvokeRequest
	if err := s.decodeBody(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	opts := capability.InvokeOptions{IdempotencyKey: r.Header.Get("Idempotency-Key"), ExecutionID: capability.NewExecutionID()}
	if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		s.streamExecution(w, r, p, req, opts)
		return
	}
	inv, err := s.svc.Invoke(r.Context(), p, req, opts)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.answerAdmission(w, r, p, inv, func(e model.Execution) (int, any) {
		v := viewOf(e)
		v.Replayed = inv.Replayed
		return http.StatusOK, v
	})
}

// answerAdmission answers a POST that admitted inv: 202 with its execution
// and approval card while it waits for a decision; otherwise, once it has
// ended or MaxWait has passed, the status and body outcome gives for it.
func (s *server) answerAdmission(w http.ResponseWriter, r *http.Request, p capability.Principal, inv *capability.Invocation, outcome func(model.Execution) (int, any)) {
	if inv.Approval != nil && inv.Execution.Status == model.StatusAwaitingApproval {
		v := viewOf(inv.Execution)
		v.Approval, v.Replayed = card(*inv.Approval), inv.Replayed
		w.Header().Set("Location", "/v1/executions/"+v.ID)
		writeJSON(w, http.StatusAccepted, v)
		return
	}
	e, err := s.svc.Wait(r.Context(), p, inv.Execution.ID, s.opts.MaxWait)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	code, v := outcome(e)
	writeJSON(w, code, v)
}

// streamExecution answers POST /v1/executions with Server-Sent Events:
// the events of executionStream, with keep-alive comments while nothing
// happens.
func (s *server) streamExecution(w http.ResponseWriter, r *http.Request, p capability.Principal, req capability.InvokeRequest, opts capability.InvokeOptions) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		s.writeError(w, r, errdefs.Publicf("streaming is not supported by this connection: %w", errdefs.ErrInvalidArgument))
		return
	}
	es, err := s.openStream(r.Context(), p, req, opts)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer es.close()
	s.writeStream(w, r, flusher, es)
}

// executionStream is an execution's events as POST /v1/executions streams
// them, for the event stream and the in-process MCP backend alike:
// approval_required (when a human must decide), started, stdout and
// stderr chunks, then result, or denied when the approver said no. Call
// close when done; closing does not end the execution.
type executionStream struct {
	s        *server
	p        capability.Principal
	id       string
	replayed bool
	events   <-chan capability.StreamEvent
	cancel   func()
	// queued are events to send before the engine's.
	queued []streamEvent
	// done is set once the engine's events have ended: the outcome is
	// next; over once it has been returned.
	done, over bool
	// result, when set, is the result event's data for the execution as
	// it ended (a session's cell); otherwise its ExecutionView.
	result func(ctx context.Context, e model.Execution) any
}

type streamEvent struct {
	name string
	data []byte
}

// openStream admits req and returns its events. An error is the
// admission's (a policy that refuses, too few credits, at capacity).
func (s *server) openStream(ctx context.Context, p capability.Principal, req capability.InvokeRequest, opts capability.InvokeOptions) (*executionStream, error) {
	return s.openAdmitted(ctx, p, opts.ExecutionID, func() (*capability.Invocation, error) { return s.svc.Invoke(ctx, p, req, opts) })
}

// openAdmitted returns the events of the execution admit admits, whose
// id is id (see capability.InvokeOptions.ExecutionID).
func (s *server) openAdmitted(ctx context.Context, p capability.Principal, id string, admit func() (*capability.Invocation, error)) (*executionStream, error) {
	// Subscribing before admitting means not one event of the run is missed.
	events, cancel := s.svc.Subscribe(id)
	inv, err := admit()
	if err != nil {
		cancel()
		return nil, err
	}
	es := &executionStream{s: s, p: p, id: inv.Execution.ID, replayed: inv.Replayed, events: events, cancel: cancel,
		done: inv.Execution.Status.Terminal()}
	if es.id != id { // an idempotent replay of an earlier execution
		cancel()
		es.events, es.cancel = s.svc.Subscribe(es.id)
		// It may have ended before the new subscription.
		e, err := s.svc.Wait(ctx, p, es.id, 0)
		if err != nil {
			es.cancel()
			return nil, err
		}
		es.done = e.Status.Terminal()
	}
	if inv.Approval != nil && inv.Execution.Status == model.StatusAwaitingApproval {
		es.queued = append(es.queued, streamEvent{"approval_required", card(*inv.Approval)})
	}
	return es, nil
}

// next returns the next event's name and data, and io.EOF after the
// outcome. It waits for the event until ctx ends; at each tick of tick
// (which may be nil) it returns an empty name, a keep-alive.
func (es *executionStream) next(ctx context.Context, tick <-chan time.Time) (string, []byte, error) {
	if len(es.queued) > 0 {
		ev := es.queued[0]
		es.queued = es.queued[1:]
		return ev.name, ev.data, nil
	}
	if es.over {
		return "", nil, io.EOF
	}
	for !es.done {
		select {
		case ev, ok := <-es.events:
			if !ok {
				es.done = true
				continue
			}
			return ev.Type, ev.Data, nil
		case <-tick:
			return "", nil, nil
		case <-ctx.Done():
			return "", nil, ctx.Err()
		}
	}
	es.over = true
	e, err := es.s.svc.Wait(context.WithoutCancel(ctx), es.p, es.id, 0)
	if err != nil {
		// The stream's answer is the error's, as writeError's would be,
		// and its cause is logged with the request's id.
		_, d := Report(ctx, es.s.log, fmt.Errorf("reading the outcome of execution %s: %w", es.id, err))
		b, _ := json.Marshal(ErrorBody{Error: d})
		return "error", b, nil
	}
	v := viewOf(e)
	v.Replayed = es.replayed
	b, _ := json.Marshal(v)
	if es.result != nil && e.Status != model.StatusDenied {
		b, _ = json.Marshal(es.result(ctx, e))
	}
	if e.Status == model.StatusDenied {
		return "denied", b, nil
	}
	return "result", b, nil
}

func (es *executionStream) close() error {
	es.cancel()
	return nil
}

func (s *server) getExecution(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	var wait time.Duration
	if v := r.URL.Query().Get("wait"); v != "" {
		d, err := sandbox.ParseDuration(v)
		if err != nil {
			s.writeError(w, r, errdefs.Publicf("wait: %s: %w", err.Error(), errdefs.ErrInvalidArgument))
			return
		}
		wait = d
	}
	v, err := s.execution(r.Context(), p, r.PathValue("id"), wait)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// execution is GET /v1/executions/{id}?wait=: the execution once it has
// ended or wait (at most MaxWait) has passed, with its approval card.
func (s *server) execution(ctx context.Context, p capability.Principal, id string, wait time.Duration) (ExecutionView, error) {
	e, err := s.svc.Wait(ctx, p, id, min(wait, s.opts.MaxWait))
	if err != nil {
		return ExecutionView{}, err
	}
	v := viewOf(e)
	if e.ApprovalID != "" {
		if a, err := s.st.GetApproval(ctx, p.WorkspaceID, e.ApprovalID); err == nil {
			v.Approval = card(a)
		}
	}
	return v, nil
}

// DecisionRequest is the optional body of approve and deny.
type DecisionRequest struct {
	Reason string `json:"reason"`
}

func (s *server) decide(approve bool) func(http.ResponseWriter, *http.Request, capability.Principal) {
	return func(w http.ResponseWriter, r *http.Request, p capability.Principal) {
		var body DecisionRequest
		if r.ContentLength != 0 {
			if err := s.decodeBody(w, r, &body); err != nil {
				s.writeError(w, r, err)
				return
			}
		}
		a, e, err := s.svc.Decide(r.Context(), p, r.PathValue("id"), approve, body.Reason)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, struct {
			Approval  ApprovalView  `json:"approval"`
			Execution ExecutionView `json:"execution"`
		}{approvalView(a), viewOf(e)})
	}
}

// pageOf reads ?limit= and ?cursor=.
func pageOf(r *http.Request) (store.PageRequest, error) {
	q := r.URL.Query()
	pr := store.PageRequest{Cursor: q.Get("cursor")}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > store.MaxPageLimit {
			return pr, errdefs.Publicf("limit=%q: expected 1 to %d: %w", v, store.MaxPageLimit, errdefs.ErrInvalidArgument)
		}
		pr.Limit = n
	}
	return pr, nil
}

// timeRange reads ?since= and ?until= (RFC 3339).
func timeRange(r *http.Request) (since, until time.Time, err error) {
	for _, f := range []struct {
		name string
		dst  *time.Time
	}{{"since", &since}, {"until", &until}} {
		if v := r.URL.Query().Get(f.name); v != "" {
			t, perr := time.Parse(time.RFC3339Nano, v)
			if perr != nil {
				return since, until, errdefs.Publicf("%s=%q: expected an RFC 3339 time: %w", f.name, v, errdefs.ErrInvalidArgument)
			}
			*f.dst = t
		}
	}
	return since, until, nil
}

// pageInTime reads the paging and time-range parameters together.
func pageInTime(r *http.Request) (store.PageRequest, time.Time, time.Time, error) {
	pr, err := pageOf(r)
	if err != nil {
		return pr, time.Time{}, time.Time{}, err
	}
	since, until, err := timeRange(r)
	return pr, since, until, err
}

// listResponse is one page of items.
type listResponse[T any] struct {
	Items []T    `json:"items"`
	Next  string `json:"next_cursor,omitempty"`
}

func (s *server) listApprovals(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	pr, err := pageOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	f := store.ApprovalFilter{PageRequest: pr}
	if v := r.URL.Query().Get("status"); v != "" {
		st := model.ApprovalStatus(v)
		switch st {
		case model.ApprovalPending, model.ApprovalApproved, model.ApprovalDenied, model.ApprovalExpired, model.ApprovalCancelled:
		default:
			s.writeError(w, r, errdefs.Publicf("status=%q: expected pending, approved, denied, expired or cancelled: %w", v, errdefs.ErrInvalidArgument))
			return
		}
		f.Statuses = []model.ApprovalStatus{st}
	}
	page, err := s.st.ListApprovals(r.Context(), p.WorkspaceID, f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := listResponse[ApprovalView]{Items: []ApprovalView{}, Next: page.Next}
	for _, a := range page.Items {
		out.Items = append(out.Items, approvalView(a))
	}
	writeJSON(w, http.StatusOK, out)
}

// EventView is an audit event on the wire, with its chain links.
type EventView struct {
	ID          string          `json:"id"`
	Seq         int64           `json:"seq"`
	Type        string          `json:"type"`
	Code        string          `json:"code"`
	Actor       string          `json:"actor"`
	Reason      string          `json:"reason,omitempty"`
	ExecutionID string          `json:"execution_id,omitempty"`
	Data        json.RawMessage `json:"data,omitempty"`
	Time        time.Time       `json:"time"`
	PrevHash    string          `json:"prev_hash"`
	Hash        string          `json:"hash"`
}

// maxListValues bounds a comma-separated filter: each value becomes a
// query parameter, and SQLite and PostgreSQL cap those at different counts.
const maxListValues = 32

// listParam returns the distinct values of the comma-separated query
// parameter name (none when it is absent), at most maxListValues.
func listParam(r *http.Request, name string) ([]string, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return nil, nil
	}
	var out []string
	for _, x := range strings.Split(v, ",") {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
		if len(out) > maxListValues {
			return nil, errdefs.Publicf("%s: at most %d values: %w", name, maxListValues, errdefs.ErrInvalidArgument)
		}
	}
	return out, nil
}

func (s *server) listEvents(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	pr, since, until, err := pageInTime(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	f := store.EventFilter{PageRequest: pr, Since: since, Until: until, ExecutionID: r.URL.Query().Get("execution_id")}
	if f.Types, err = listParam(r, "type"); err != nil {
		s.writeError(w, r, err)
		return
	}
	page, err := s.st.ListEvents(r.Context(), p.WorkspaceID, f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := listResponse[EventView]{Items: []EventView{}, Next: page.Next}
	for _, e := range page.Items {
		out.Items = append(out.Items, EventView{ID: e.ID, Seq: e.Seq, Type: e.Type, Code: e.Code, Actor: e.Actor, Reason: e.Reason,
			ExecutionID: e.ExecutionID, Data: e.Data, Time: e.Time, PrevHash: e.PrevHash, Hash: e.Hash})
	}
	writeJSON(w, http.StatusOK, out)
}

// ToolCallView is a tool_calls row on the wire.
type ToolCallView struct {
	ID              string     `json:"id"`
	ExecutionID     string     `json:"execution_id"`
	Tool            string     `json:"tool"`
	Runtime         string     `json:"runtime"`
	InputSHA256     string     `json:"input_sha256"`
	Status          string     `json:"status"`
	ExitCode        *int       `json:"exit_code"`
	StdoutPreview   string     `json:"stdout_preview"`
	StderrPreview   string     `json:"stderr_preview"`
	StdoutTruncated bool       `json:"stdout_truncated"`
	StderrTruncated bool       `json:"stderr_truncated"`
	Driver          string     `json:"driver,omitempty"`
	CreditsCharged  int64      `json:"credits_charged"`
	CreatedAt       time.Time  `json:"created_at"`
	StartedAt       *time.Time `json:"started_at,omitempty"`
	FinishedAt      *time.Time `json:"finished_at,omitempty"`
}

func (s *server) listToolCalls(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	pr, since, until, err := pageInTime(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	f := store.ToolCallFilter{PageRequest: pr, Since: since, Until: until}
	statuses, err := listParam(r, "status")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	for _, st := range statuses {
		if !model.ExecutionStatus(st).Valid() {
			s.writeError(w, r, errdefs.Publicf("status: unknown status %q: %w", st, errdefs.ErrInvalidArgument))
			return
		}
		f.Statuses = append(f.Statuses, model.ExecutionStatus(st))
	}
	page, err := s.st.ListToolCalls(r.Context(), p.WorkspaceID, f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := listResponse[ToolCallView]{Items: []ToolCallView{}, Next: page.Next}
	for _, c := range page.Items {
		v := ToolCallView{ID: c.ID, ExecutionID: c.ExecutionID, Tool: c.Tool, Runtime: c.Runtime, InputSHA256: c.InputSHA256,
			Status: string(c.Status), ExitCode: c.ExitCode, StdoutPreview: string(c.StdoutPreview), StderrPreview: string(c.StderrPreview),
			StdoutTruncated: c.StdoutTruncated, StderrTruncated: c.StderrTruncated, Driver: c.Driver, CreditsCharged: c.CreditsCharged,
			CreatedAt: c.CreatedAt}
		if !c.StartedAt.IsZero() {
			v.StartedAt = &c.StartedAt
		}
		if !c.FinishedAt.IsZero() {
			v.FinishedAt = &c.FinishedAt
		}
		out.Items = append(out.Items, v)
	}
	writeJSON(w, http.StatusOK, out)
}

// WorkspaceView is GET /v1/workspace.
type WorkspaceView struct {
	ID      string     `json:"id"`
	Name    string     `json:"name"`
	Policy  PolicyView `json:"policy"`
	Credits struct {
		Available int64 `json:"available"`
		Reserved  int64 `json:"reserved"`
	} `json:"credits"`
	// Sessions is its usage of sessions: its paused sessions and the disk
	// their checkpoints take.
	Sessions struct {
		Paused          int   `json:"paused"`
		CheckpointBytes int64 `json:"checkpoint_bytes"`
	} `json:"sessions"`
}

// PolicyView is a workspace policy on the wire.
type PolicyView struct {
	CodeExecution bool   `json:"code_execution"`
	Approval      string `json:"approval"`
	// Network is "allow" or "deny": whether invocations may ask for it.
	Network string `json:"network"`
	// MaxSessions bounds the workspace's live sessions; 0 is the server's
	// bound.
	MaxSessions  int      `json:"max_sessions"`
	MaxTimeoutMS int64    `json:"max_timeout_ms"`
	Runtimes     []string `json:"runtimes"`
	ToolChanges  string   `json:"tool_changes"`
}

// PolicyViewOf returns the wire form of a policy.
func PolicyViewOf(p model.Policy) PolicyView {
	return PolicyView{CodeExecution: p.CodeExecution, Approval: string(p.Approval), Network: policy.NetworkWord(p.NetworkAllowed),
		MaxSessions: p.MaxSessions, MaxTimeoutMS: p.MaxTimeout.Milliseconds(), Runtimes: p.Runtimes, ToolChanges: string(p.ToolChanges)}
}

func (s *server) getWorkspace(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	st := s.st
	ws, err := st.GetWorkspace(r.Context(), p.WorkspaceID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	pol, err := st.GetPolicy(r.Context(), p.WorkspaceID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	cr, err := st.GetCredits(r.Context(), p.WorkspaceID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	v := WorkspaceView{ID: ws.ID, Name: ws.Name, Policy: PolicyViewOf(pol)}
	v.Credits.Available, v.Credits.Reserved = cr.Available, cr.Reserved
	if v.Sessions.CheckpointBytes, v.Sessions.Paused, err = st.CheckpointBytes(r.Context(), p.WorkspaceID); err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	drivers := map[string]string{}
	healthy := true
	for name, err := range s.svc.Health(r.Context()) {
		if err != nil {
			drivers[name] = sentence(err.Error())
			if name == s.svc.Runner().DefaultDriver() {
				healthy = false
			}
		} else {
			drivers[name] = "ok"
		}
	}
	code, statusText := http.StatusOK, "ok"
	if !healthy {
		code, statusText = http.StatusServiceUnavailable, "degraded"
	}
	writeJSON(w, code, map[string]any{"status": statusText, "default_driver": s.svc.Runner().DefaultDriver(), "drivers": drivers})
}

// ToolView is a tool and its isolation record on the wire.
type ToolView struct {
	Name           string          `json:"name"`
	Fingerprint    string          `json:"fingerprint"`
	Record         json.RawMessage `json:"record"`
	ReviewRequired bool            `json:"review_required"`
}

func toolView(ts capability.ToolStatus) ToolView {
	return ToolView{Name: ts.Tool.Name, Fingerprint: ts.Fingerprint, Record: tools.Canonical(ts.Tool), ReviewRequired: ts.ReviewRequired}
}

func (s *server) listTools(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	ts, err := s.svc.Tools(r.Context(), p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := listResponse[ToolView]{Items: []ToolView{}}
	for _, t := range ts {
		out.Items = append(out.Items, toolView(t))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) approveTool(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	var body DecisionRequest
	if r.ContentLength != 0 {
		if err := s.decodeBody(w, r, &body); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	ts, err := s.svc.ApproveTool(r.Context(), p, r.PathValue("name"), body.Reason)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toolView(ts))
}
