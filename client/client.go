package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
)

// MaxAnswer bounds what the client reads of one answer, and of one event
// of a stream: an execution carries up to 1 MiB of stdout and of stderr
// and 1 MiB of code, JSON-escaped, with room to spare. An answer over it is
// an error.
const MaxAnswer = 32 << 20

// Client talks to one Stockade daemon with one API key.
type Client struct {
	base *url.URL
	key  string
	hc   *http.Client
	ua   string
}

// Option configures New.
type Option func(*Client)

// WithHTTPClient makes the client send its requests with hc; without it,
// a client of its own without an overall timeout (long polls and event
// streams last as long as their context).
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithUserAgent sets the User-Agent of the requests.
func WithUserAgent(ua string) Option { return func(c *Client) { c.ua = ua } }

// New returns a client of the daemon at baseURL (http://127.0.0.1:8700)
// that authenticates with key, an API key of a workspace.
func New(baseURL, key string, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("daemon URL %q: want http://HOST:PORT or https://HOST: %w", baseURL, errdefs.ErrInvalidArgument)
	}
	c := &Client{base: u, key: key, hc: &http.Client{}, ua: "stockade-client"}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// URL returns the daemon's base URL.
func (c *Client) URL() *url.URL { u := *c.base; return &u }

// request builds a request of path (with query q) and body, which is sent
// as JSON unless nil.
func (c *Client) request(ctx context.Context, method, path string, q url.Values, body any) (*http.Request, error) {
	u := *c.base
	u.Path += path
	u.RawQuery = q.Encode()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encoding the request: %w", err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), r)
	if err != nil {
		return nil, fmt.Errorf("building the request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	req.Header.Set("User-Agent", c.ua)
	return req, nil
}

// send sends req and returns its answer, or the error an error answer
// means; the caller closes the body.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctxErr := req.Context().Err(); ctxErr != nil {
			return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, ctxErr)
		}
		return nil, fmt.Errorf("%s %s: %w: %w", req.Method, req.URL.Path, err, errdefs.ErrUnavailable)
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return nil, errorOf(resp.StatusCode, resp.Header, b)
	}
	return resp, nil
}

// do sends a request and decodes its JSON answer into out (unless nil),
// reading at most MaxAnswer bytes. It returns the status.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body, out any, hdr ...string) (int, error) {
	req, err := c.request(ctx, method, path, q, body)
	if err != nil {
		return 0, err
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] != "" {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := c.send(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return resp.StatusCode, decodeBounded(resp.Body, out)
}

// decodeBounded decodes a JSON answer of at most MaxAnswer bytes.
func decodeBounded(r io.Reader, out any) error {
	b, err := io.ReadAll(io.LimitReader(r, MaxAnswer+1))
	if err != nil {
		return fmt.Errorf("reading the answer: %w: %w", err, errdefs.ErrUnavailable)
	}
	if len(b) > MaxAnswer {
		return fmt.Errorf("the answer is larger than %d bytes: %w", MaxAnswer, errdefs.ErrTooLarge)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decoding the answer: %w", err)
	}
	return nil
}

// CreateExecution asks for req to run and waits for the answer: the ended
// execution when no approval is needed (the daemon waits for the run), or
// the execution awaiting approval (StatusAwaitingApproval, with its
// Approval card), whose outcome GetExecution waits for.
func (c *Client) CreateExecution(ctx context.Context, req ExecutionRequest) (*Execution, error) {
	var ex Execution
	if _, err := c.do(ctx, http.MethodPost, "/v1/executions", nil, req, &ex, "Idempotency-Key", req.IdempotencyKey); err != nil {
		return nil, fmt.Errorf("creating an execution: %w", err)
	}
	return &ex, nil
}

// GetExecution returns execution id, once it has ended or wait has passed,
// whichever comes first; zero returns at once. The daemon bounds wait (10
// minutes by default).
func (c *Client) GetExecution(ctx context.Context, id string, wait time.Duration) (*Execution, error) {
	q := url.Values{}
	if wait > 0 {
		q.Set("wait", wait.String())
	}
	var ex Execution
	if _, err := c.do(ctx, http.MethodGet, "/v1/executions/"+url.PathEscape(id), q, nil, &ex); err != nil {
		return nil, fmt.Errorf("getting execution %s: %w", id, err)
	}
	return &ex, nil
}

// CancelExecution ends execution id, with an optional reason: one
// awaiting approval or queued never runs, a running one is killed. An
// execution that has ended already is returned as it is.
func (c *Client) CancelExecution(ctx context.Context, id, reason string) (*Execution, error) {
	var body any
	if reason != "" {
		body = map[string]string{"reason": reason}
	}
	var ex Execution
	if _, err := c.do(ctx, http.MethodPost, "/v1/executions/"+url.PathEscape(id)+"/cancel", nil, body, &ex); err != nil {
		return nil, fmt.Errorf("cancelling execution %s: %w", id, err)
	}
	return &ex, nil
}

// ApprovalFilter selects approval requests; zero lists all, newest first,
// one default page.
type ApprovalFilter struct {
	Status ApprovalStatus
	Limit  int
	Cursor string
}

// ListApprovals lists the workspace's approval requests.
func (c *Client) ListApprovals(ctx context.Context, f ApprovalFilter) (*Page[Approval], error) {
	q := pageQuery(f.Limit, f.Cursor)
	if f.Status != "" {
		q.Set("status", string(f.Status))
	}
	var p Page[Approval]
	if _, err := c.do(ctx, http.MethodGet, "/v1/approvals", q, nil, &p); err != nil {
		return nil, fmt.Errorf("listing approvals: %w", err)
	}
	return &p, nil
}

// Approve approves approval request id, with an optional reason; the
// execution then runs. It needs an approver or admin key.
func (c *Client) Approve(ctx context.Context, id, reason string) (*Decision, error) {
	return c.decide(ctx, id, "approve", reason)
}

// Deny denies approval request id, with an optional reason; the execution
// ends uncharged. It needs an approver or admin key.
func (c *Client) Deny(ctx context.Context, id, reason string) (*Decision, error) {
	return c.decide(ctx, id, "deny", reason)
}

func (c *Client) decide(ctx context.Context, id, verb, reason string) (*Decision, error) {
	var body any
	if reason != "" {
		body = map[string]string{"reason": reason}
	}
	var d Decision
	if _, err := c.do(ctx, http.MethodPost, "/v1/approvals/"+url.PathEscape(id)+"/"+verb, nil, body, &d); err != nil {
		return nil, fmt.Errorf("deciding (%s) approval %s: %w", verb, id, err)
	}
	return &d, nil
}

// EventFilter selects audit events; zero lists the first page of all.
type EventFilter struct {
	Types        []string
	ExecutionID  string
	Since, Until time.Time
	Limit        int
	Cursor       string
}

// ListAuditEvents lists the workspace's audit events, oldest first.
func (c *Client) ListAuditEvents(ctx context.Context, f EventFilter) (*Page[AuditEvent], error) {
	q := pageQuery(f.Limit, f.Cursor)
	timeQuery(q, f.Since, f.Until)
	if len(f.Types) > 0 {
		q.Set("type", strings.Join(f.Types, ","))
	}
	if f.ExecutionID != "" {
		q.Set("execution_id", f.ExecutionID)
	}
	var p Page[AuditEvent]
	if _, err := c.do(ctx, http.MethodGet, "/v1/audit/events", q, nil, &p); err != nil {
		return nil, fmt.Errorf("listing audit events: %w", err)
	}
	return &p, nil
}

// ToolCallFilter selects tool calls; zero lists the first page of all.
type ToolCallFilter struct {
	Statuses     []ExecutionStatus
	Since, Until time.Time
	Limit        int
	Cursor       string
}

// ListToolCalls lists the workspace's tool_calls rows.
func (c *Client) ListToolCalls(ctx context.Context, f ToolCallFilter) (*Page[ToolCall], error) {
	q := pageQuery(f.Limit, f.Cursor)
	timeQuery(q, f.Since, f.Until)
	if len(f.Statuses) > 0 {
		s := make([]string, len(f.Statuses))
		for i, st := range f.Statuses {
			s[i] = string(st)
		}
		q.Set("status", strings.Join(s, ","))
	}
	var p Page[ToolCall]
	if _, err := c.do(ctx, http.MethodGet, "/v1/tool-calls", q, nil, &p); err != nil {
		return nil, fmt.Errorf("listing tool calls: %w", err)
	}
	return &p, nil
}

// Workspace returns the key's workspace, its policy and credits.
func (c *Client) Workspace(ctx context.Context) (*Workspace, error) {
	var w Workspace
	if _, err := c.do(ctx, http.MethodGet, "/v1/workspace", nil, nil, &w); err != nil {
		return nil, fmt.Errorf("getting the workspace: %w", err)
	}
	return &w, nil
}

// Tools lists the daemon's tools and their records.
func (c *Client) Tools(ctx context.Context) ([]Tool, error) {
	var p Page[Tool]
	if _, err := c.do(ctx, http.MethodGet, "/v1/tools", nil, nil, &p); err != nil {
		return nil, fmt.Errorf("listing tools: %w", err)
	}
	return p.Items, nil
}

// ApproveTool re-approves tool name after a change of its record, with an
// optional reason. It needs an approver or admin key.
func (c *Client) ApproveTool(ctx context.Context, name, reason string) (*Tool, error) {
	var body any
	if reason != "" {
		body = map[string]string{"reason": reason}
	}
	var t Tool
	if _, err := c.do(ctx, http.MethodPost, "/v1/tools/"+url.PathEscape(name)+"/approve", nil, body, &t); err != nil {
		return nil, fmt.Errorf("approving tool %s: %w", name, err)
	}
	return &t, nil
}

// Health returns the daemon's health. A degraded daemon (its default
// driver unhealthy, 503) returns its health and an ErrUnavailable error.
func (c *Client) Health(ctx context.Context) (*Health, error) {
	req, err := c.request(ctx, http.MethodGet, "/healthz", nil, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET /healthz: %w: %w", err, errdefs.ErrUnavailable)
	}
	defer resp.Body.Close()
	var h Health
	if err := decodeBounded(resp.Body, &h); err != nil {
		return nil, fmt.Errorf("reading the health: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return &h, fmt.Errorf("the daemon is %s (default driver %s: %s): %w", h.Status, h.DefaultDriver, h.Drivers[h.DefaultDriver], errdefs.ErrUnavailable)
	}
	return &h, nil
}

func pageQuery(limit int, cursor string) url.Values {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	return q
}

func timeQuery(q url.Values, since, until time.Time) {
	if !since.IsZero() {
		q.Set("since", since.Format(time.RFC3339Nano))
	}
	if !until.IsZero() {
		q.Set("until", until.Format(time.RFC3339Nano))
	}
}
