package api_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/store/storetest"
	"github.com/stockade-sh/stockade/wire"
)

// pgEnv names the PostgreSQL the end-to-end tests use; scripts/pgtest.sh
// starts one and prints its DSN.
const pgEnv = "STOCKADE_TEST_POSTGRES"

// backend is one store implementation. url returns the URL of a fresh,
// empty database that lives as long as the test.
type backend struct {
	name string
	url  func(t *testing.T) string
}

var backends = []backend{
	{"sqlite", func(t *testing.T) string { return "sqlite:" + filepath.Join(t.TempDir(), "stockade.db") }},
	{"postgres", func(t *testing.T) string { return freshSchema(t, postgresDSN(t)) }},
}

// forEachStore runs fn once per store, as subtests named after the store.
func forEachStore(t *testing.T, fn func(t *testing.T, b backend)) {
	t.Helper()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { fn(t, b) })
	}
}

// postgresDSN returns the test server's DSN, skipping the test when none is
// given (failing it in CI).
func postgresDSN(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv(pgEnv)
	if dsn == "" {
		testenv.Missing(t, pgEnv+" is not set; run: export "+pgEnv+"=$(scripts/pgtest.sh)")
	}
	return dsn
}

// freshSchema creates an empty schema for one test, drops it when the test
// ends, and returns a DSN whose search_path selects it.
func freshSchema(t *testing.T, dsn string) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "stockade_e2e_" + hex.EncodeToString(b[:])
	exec := func(ctx context.Context, q string) error {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return fmt.Errorf("connecting to %s: %w", pgEnv, err)
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, q)
		return err
	}
	if err := exec(t.Context(), "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("creating schema: %v", err)
	}
	t.Cleanup(func() {
		if err := exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("%s must be a postgres:// URL, got %q", pgEnv, dsn)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// requireSandboxes gates a test on what real runc sandboxes need.
func requireSandboxes(t *testing.T) {
	t.Helper()
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	testenv.Image(t, "python")
	testenv.Image(t, "shell")
}

// envConfig describes one end-to-end environment. Zero fields take the
// defaults noted.
type envConfig struct {
	// svc configures the service; zero is the service's defaults.
	svc capability.ServiceOptions
	// policy edits the workspace's default policy; nil keeps it.
	policy func(*model.Policy)
	// credits is granted to the workspace; zero grants nothing.
	credits int64
	// images is the image store root; empty is testenv.DataDir().
	images string
	// api configures the handler; its Metrics are set by newEnv.
	api api.Options
	// drivers are added beside runc, the default driver; engine are
	// options of the engine.
	drivers map[string]sandbox.Driver
	engine  []engine.Option
	// defaultDriver is the engine's default driver; empty is runc.
	defaultDriver string
	// sessions gives the runc driver the shim of detached sandboxes, which
	// sessions need; their cells run in the guest's test kernel
	// (engine.WithTestKernel) unless kernels asks for the runtimes' own.
	sessions bool
	kernels  bool
	// startPools starts the engine's pools (engine.WithPools among
	// engine) once the service has started, reporting to its metrics.
	startPools bool
}

// env is a daemon in the test process: a store, the real runc driver, the
// capability layer and the HTTP API on a real listener, with one workspace
// and a key of each role.
type env struct {
	t   *testing.T
	st  store.Store
	svc *capability.Service
	url string
	ws  model.Workspace
	// agent, approver and admin are API keys of the workspace.
	agent, approver, admin string
	// runcState is the runc driver's state directory.
	runcState string
}

func newEnv(t *testing.T, b backend, c envConfig) *env {
	t.Helper()
	requireSandboxes(t)
	ctx := t.Context()
	st, err := storeopen.Open(ctx, b.url(t))
	if err != nil {
		t.Fatalf("opening the %s store: %v", b.name, err)
	}
	t.Cleanup(func() { st.Close() })

	e := &env{t: t, st: st, runcState: t.TempDir()}
	rcfg := runc.Config{StateDir: e.runcState, GuestPath: testenv.Guest(t)}
	if c.sessions {
		rcfg.Shim = testenv.Shim(t)
	}
	d, err := runc.New(rcfg)
	if err != nil {
		t.Fatalf("runc.New: %v", err)
	}
	images := c.images
	if images == "" {
		images = testenv.DataDir()
	}
	drivers := map[string]sandbox.Driver{"runc": d}
	maps.Copy(drivers, c.drivers)
	engOpts := c.engine
	if c.sessions && !c.kernels {
		engOpts = append(slices.Clip(engOpts), engine.WithTestKernel())
	}
	eng, err := engine.New(drivers, cmp.Or(c.defaultDriver, "runc"), image.Open(images), sandbox.DefaultLimits(), sandbox.DefaultCeiling(), engOpts...)
	if err != nil {
		t.Fatalf("engine.New: %v", err)
	}
	metrics := api.NewMetrics()
	opts := c.svc
	opts.Observer = metrics
	e.svc = capability.NewService(eng, st, opts)
	if err := e.svc.Start(ctx); err != nil {
		t.Fatalf("Service.Start: %v", err)
	}
	t.Cleanup(func() { e.svc.Close(context.Background()) })
	if c.startPools {
		eng.SetPoolObserver(metrics)
		stop, err := eng.StartPools(ctx, map[string]string{engine.LabelOwner: cmp.Or(opts.Owner, "stockade")})
		if err != nil {
			t.Fatalf("StartPools: %v", err)
		}
		t.Cleanup(stop)
	}
	ao := c.api
	ao.Metrics = metrics
	srv := httptest.NewServer(api.New(e.svc, st, ao))
	t.Cleanup(srv.Close)
	e.url = srv.URL

	if e.ws, err = st.CreateWorkspace(ctx, "e2e", nil); err != nil {
		t.Fatalf("CreateWorkspace: %v", err)
	}
	for _, k := range []struct {
		role model.Role
		dst  *string
	}{{model.RoleAgent, &e.agent}, {model.RoleApprover, &e.approver}, {model.RoleAdmin, &e.admin}} {
		*k.dst = "sk_test_" + string(k.role) + "_" + rand.Text()
		if _, err := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: e.ws.ID, Role: k.role, Hash: model.HashKey(*k.dst), Name: string(k.role)}); err != nil {
			t.Fatalf("CreateAPIKey(%s): %v", k.role, err)
		}
	}
	if c.policy != nil {
		p, err := st.GetPolicy(ctx, e.ws.ID)
		if err != nil {
			t.Fatalf("GetPolicy: %v", err)
		}
		c.policy(&p)
		if _, err := st.SetPolicy(ctx, e.ws.ID, p, nil); err != nil {
			t.Fatalf("SetPolicy: %v", err)
		}
	}
	if c.credits > 0 {
		if _, err := st.GrantCredits(ctx, e.ws.ID, c.credits, "e2e grant", nil); err != nil {
			t.Fatalf("GrantCredits: %v", err)
		}
	}
	return e
}

// newBareService returns a service over an empty SQLite store and a runc
// driver whose guest does not exist, with workspace "bare" and its agent
// key: enough for what the API answers without running code, on any host.
func newBareService(t *testing.T) (svc *capability.Service, st store.Store, agent string) {
	t.Helper()
	st, err := storeopen.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "stockade.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: "/nonexistent/stockade-guest"})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(map[string]sandbox.Driver{"runc": d}, "runc", image.Open(t.TempDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		t.Fatal(err)
	}
	ws, err := st.CreateWorkspace(t.Context(), "bare", nil)
	if err != nil {
		t.Fatal(err)
	}
	agent = "sk_test_bare_" + rand.Text()
	if _, err := st.CreateAPIKey(t.Context(), store.NewAPIKey{WorkspaceID: ws.ID, Role: model.RoleAgent, Hash: model.HashKey(agent), Name: "agent"}); err != nil {
		t.Fatal(err)
	}
	return capability.NewService(eng, st, capability.ServiceOptions{}), st, agent
}

// noApproval is a policy edit: invocations run without a human.
func noApproval(p *model.Policy) { p.Approval = model.ApprovalNone }

// reply is an HTTP answer, body read whole.
type reply struct {
	code   int
	header http.Header
	body   []byte
}

// requestTimeout bounds every request of the tests, so that a hung server
// fails a test instead of the whole run.
const requestTimeout = 60 * time.Second

// do sends one request to base. body is sent as is when it is a string or
// []byte and as JSON otherwise; nil sends none. hdr is name, value pairs.
func do(t *testing.T, base, method, path, key string, body any, hdr ...string) reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, base+path, encodeBody(t, body))
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	return reply{code: resp.StatusCode, header: resp.Header, body: b}
}

func encodeBody(t *testing.T, body any) io.Reader {
	t.Helper()
	switch b := body.(type) {
	case nil:
		return nil
	case string:
		return strings.NewReader(b)
	case []byte:
		return bytes.NewReader(b)
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b)
}

func (e *env) do(method, path, key string, body any, hdr ...string) reply {
	e.t.Helper()
	return do(e.t, e.url, method, path, key, body, hdr...)
}

// decode decodes the body into v, failing the test on a bad body.
func (r reply) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decoding %q: %v", r.body, err)
	}
}

// want fails the test unless the status is code.
func (r reply) want(t *testing.T, code int) reply {
	t.Helper()
	if r.code != code {
		t.Fatalf("status: got %d, want %d (body %s)", r.code, code, r.body)
	}
	return r
}

// wantError checks an error answer: the status, the JSON shape
// {"error":{"code","message"}} with exactly those keys, the stable code,
// and a message containing each of msg. It returns the message.
func (r reply) wantError(t *testing.T, status int, code string, msg ...string) string {
	t.Helper()
	r.want(t, status)
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type: got %q, want application/json", ct)
	}
	var raw map[string]map[string]any
	r.decode(t, &raw)
	detail, ok := raw["error"]
	if len(raw) != 1 || !ok || len(detail) != 2 {
		t.Fatalf("error body: got %s, want {\"error\":{\"code\",\"message\"}}", r.body)
	}
	gotCode, _ := detail["code"].(string)
	gotMsg, _ := detail["message"].(string)
	if gotCode != code {
		t.Errorf("error code: got %q, want %q", gotCode, code)
	}
	if gotMsg == "" {
		t.Errorf("error message is empty")
	}
	for _, m := range msg {
		if !strings.Contains(gotMsg, m) {
			t.Errorf("error message: got %q, want it to contain %q", gotMsg, m)
		}
	}
	return gotMsg
}

// invoke POSTs an execution with the agent key.
func (e *env) invoke(req capability.InvokeRequest, hdr ...string) reply {
	e.t.Helper()
	return e.do("POST", "/v1/executions", e.agent, req, hdr...)
}

// execution decodes an execution answer (wire.Execution).
func (r reply) execution(t *testing.T) wire.Execution {
	t.Helper()
	var v wire.Execution
	r.decode(t, &v)
	if v.ID == "" {
		t.Fatalf("execution without an id: %s", r.body)
	}
	return v
}

// result decodes an execution's engine result.
func result(t *testing.T, v wire.Execution) engine.Result {
	t.Helper()
	var res engine.Result
	if err := json.Unmarshal(v.Result.JSON(), &res); err != nil {
		t.Fatalf("decoding the result of %s (%s): %v", v.ID, v.Result, err)
	}
	return res
}

// wait long-polls an execution until it ends or d passes.
func (e *env) wait(id string, d time.Duration) wire.Execution {
	e.t.Helper()
	return e.do("GET", "/v1/executions/"+id+"?wait="+d.String(), e.agent, nil).want(e.t, http.StatusOK).execution(e.t)
}

// credits returns the balance GET /v1/workspace reports.
func (e *env) credits() (available, reserved int64) {
	e.t.Helper()
	var v wire.Workspace
	e.do("GET", "/v1/workspace", e.agent, nil).want(e.t, http.StatusOK).decode(e.t, &v)
	return v.Credits.Available, v.Credits.Reserved
}

// wantCredits checks the balance through the API and the ledger invariant
// through the store.
func (e *env) wantCredits(available, reserved int64) {
	e.t.Helper()
	a, r := e.credits()
	if a != available || r != reserved {
		e.t.Errorf("credits: got available %d reserved %d, want %d and %d", a, r, available, reserved)
	}
	storetest.CheckLedger(e.t, e.st, e.ws.ID)
}

// list pages through a list endpoint with the agent key and returns every
// item. query is added to each page's request.
func list[T any](t *testing.T, base, key, path, query string) []T {
	t.Helper()
	var out []T
	cursor := ""
	for range 1000 {
		q := url.Values{}
		if query != "" {
			var err error
			if q, err = url.ParseQuery(query); err != nil {
				t.Fatal(err)
			}
		}
		q.Set("limit", "500")
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page struct {
			Items []T    `json:"items"`
			Next  string `json:"next_cursor"`
		}
		do(t, base, "GET", path+"?"+q.Encode(), key, nil).want(t, http.StatusOK).decode(t, &page)
		out = append(out, page.Items...)
		if cursor = page.Next; cursor == "" {
			return out
		}
	}
	t.Fatalf("paging %s does not end", path)
	return nil
}

// events lists the workspace's audit events of one type (all when typ is
// empty), for one execution when execID is set.
func (e *env) events(typ, execID string) []wire.AuditEvent {
	e.t.Helper()
	q := url.Values{}
	if typ != "" {
		q.Set("type", typ)
	}
	if execID != "" {
		q.Set("execution_id", execID)
	}
	return list[wire.AuditEvent](e.t, e.url, e.agent, "/v1/audit/events", q.Encode())
}

// toolCalls lists the workspace's tool_calls rows matching query.
func (e *env) toolCalls(query string) []wire.ToolCall {
	e.t.Helper()
	return list[wire.ToolCall](e.t, e.url, e.agent, "/v1/tool-calls", query)
}

// toolCall returns the one tool_calls row of an execution.
func (e *env) toolCall(execID string) wire.ToolCall {
	e.t.Helper()
	var found []wire.ToolCall
	for _, c := range e.toolCalls("") {
		if c.ExecutionID == execID {
			found = append(found, c)
		}
	}
	if len(found) != 1 {
		e.t.Fatalf("tool_calls rows of %s: got %d, want 1", execID, len(found))
	}
	return found[0]
}

// decisionOf returns the "decision" field of an invoke_denied event's data.
func decisionOf(t *testing.T, ev wire.AuditEvent) string {
	t.Helper()
	var d struct {
		Decision string `json:"decision"`
	}
	if err := json.Unmarshal(ev.Data, &d); err != nil {
		t.Fatalf("decoding the data of event %s (%s): %v", ev.ID, ev.Data, err)
	}
	return d.Decision
}

// sseEvent is one Server-Sent Event.
type sseEvent struct {
	name string
	data string
}

// stream is an SSE response being read.
type stream struct {
	t      *testing.T
	resp   *http.Response
	events chan sseEvent
	cancel context.CancelFunc
}

// postStream POSTs an execution asking for Server-Sent Events and returns
// the open stream; a non-200 answer fails the test. The stream is closed
// when the test ends.
func postStream(t *testing.T, base, key string, req capability.InvokeRequest) *stream {
	t.Helper()
	return postStreamWith(t, base, key, req)
}

// postStreamWith is postStream with extra headers, as name, value pairs.
func postStreamWith(t *testing.T, base, key string, req capability.InvokeRequest, hdr ...string) *stream {
	t.Helper()
	return postStreamTo(t, base, "/v1/executions", key, req, hdr...)
}

// postStreamTo POSTs body to path asking for Server-Sent Events (see
// postStream).
func postStreamTo(t *testing.T, base, path, key string, body any, hdr ...string) *stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*requestTimeout)
	hr, err := http.NewRequestWithContext(ctx, "POST", base+path, encodeBody(t, body))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	hr.Header.Set("Authorization", "Bearer "+key)
	hr.Header.Set("Accept", "text/event-stream")
	hr.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		hr.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		cancel()
		t.Fatalf("POST %s (SSE): %v", path, err)
	}
	s := &stream{t: t, resp: resp, events: make(chan sseEvent, 64), cancel: cancel}
	t.Cleanup(s.close)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("SSE status: got %d, want 200 (body %s)", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("SSE Content-Type: got %q", ct)
	}
	go s.read()
	return s
}

func (s *stream) read() {
	defer close(s.events)
	sc := bufio.NewScanner(s.resp.Body)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	var ev sseEvent
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.name != "" || len(data) > 0 {
				ev.data = strings.Join(data, "\n")
				s.events <- ev
			}
			ev, data = sseEvent{}, nil
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event:"):
			ev.name = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
}

// next returns the next event, failing the test when the stream ends or
// nothing arrives within d.
func (s *stream) next(d time.Duration) sseEvent {
	s.t.Helper()
	select {
	case ev, ok := <-s.events:
		if !ok {
			s.t.Fatal("the event stream ended early")
		}
		return ev
	case <-time.After(d):
		s.t.Fatalf("no event within %s", d)
	}
	return sseEvent{}
}

// rest returns the remaining events until the stream ends.
func (s *stream) rest(d time.Duration) []sseEvent {
	s.t.Helper()
	var out []sseEvent
	deadline := time.After(d)
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				return out
			}
			out = append(out, ev)
		case <-deadline:
			s.t.Fatalf("the event stream did not end within %s; got %v", d, out)
		}
	}
}

func (s *stream) close() {
	s.cancel()
	s.resp.Body.Close()
}

// cardJSON is an approval card as the API sent it.
func cardJSON(c *wire.ApprovalCard) json.RawMessage {
	if c == nil {
		return nil
	}
	b, err := json.Marshal(c)
	if err != nil {
		panic(err)
	}
	return b
}
