package console

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/internal/wiring"
	"github.com/stockade-sh/stockade/internal/witness"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
	"github.com/stockade-sh/stockade/wire"
)

// env is a daemon in the test process, wired as `stockade serve` wires
// it: a SQLite store, the real runc driver, the capability layer, and the
// HTTP API with the console mounted at /ui/, on a real listener; one
// workspace with credits and a key of each role.
type env struct {
	t       *testing.T
	st      store.Store
	svc     *capability.Service
	console *Console
	srv     *httptest.Server
	url     string
	ws      model.Workspace
	// agent, approver and admin are API keys of the workspace;
	// approverID is the approver key's id.
	agent, approver, admin string
	approverID, adminID    string
	// clock shifts the service's clock, to expire approvals at will.
	clock *clock
}

// clock is time.Now plus an offset the test moves.
type clock struct{ offset atomic.Int64 }

func (c *clock) now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *clock) advance(d time.Duration) { c.offset.Add(int64(d)) }
func requireSandboxes(t *testing.T) {
	t.Helper()
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	testenv.Image(t, "python")
	testenv.Image(t, "shell")
}

// envConfig describes an environment; the zero value is the default
// tool only.
type envConfig struct {
	// tools is a YAML file of tools for the daemon; toolsBefore, if set,
	// those of a daemon that served the store before it (a record that
	// changed between two starts).
	tools, toolsBefore string
	// noWitness runs the console without the audit witness.
	noWitness bool
}

func newEnv(t *testing.T, o Options) *env { return newEnvWith(t, o, envConfig{}) }

func newEnvWith(t *testing.T, o Options, c envConfig) *env {
	t.Helper()
	requireSandboxes(t)
	ctx := t.Context()
	dir := t.TempDir()
	db := "sqlite:" + filepath.Join(dir, "stockade.db")
	st, err := storeopen.Open(ctx, db)
	if err != nil {
		t.Fatalf("opening the store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	d, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t)})
	if err != nil {
		t.Fatalf("runc.New: %v", err)
	}
	newEngine := func(yaml string) *engine.Engine {
		var opts []engine.Option
		if yaml != "" {
			path := filepath.Join(t.TempDir(), "tools.yaml")
			if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			to := tools.Options{EgressSupported: true, Drivers: wiring.DriverCapabilities(config.Default()), DefaultTier: sandbox.TierContainer}
			set, err := tools.Load(path, to)
			if err != nil {
				t.Fatalf("loading tools: %v", err)
			}
			opts = append(opts, engine.WithTools(set, to))
		}
		eng, err := engine.New(map[string]sandbox.Driver{"runc": d}, "runc", image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling(), opts...)
		if err != nil {
			t.Fatalf("engine.New: %v", err)
		}
		return eng
	}
	if c.toolsBefore != "" {
		before := capability.NewService(newEngine(c.toolsBefore), st, capability.ServiceOptions{})
		if err := before.Start(ctx); err != nil {
			t.Fatalf("starting the daemon before: %v", err)
		}
		before.Close(t.Context())
	}
	e := &env{t: t, st: st, clock: &clock{}}
	wit := witness.Dir(witness.Default(db))
	e.svc = capability.NewService(newEngine(c.tools), st, capability.ServiceOptions{Witness: wit, Now: e.clock.now})
	if err := e.svc.Start(ctx); err != nil {
		t.Fatalf("Service.Start: %v", err)
	}
	t.Cleanup(func() { e.svc.Close(context.Background()) })
	if !c.noWitness {
		o.Witness = wit
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	e.console = New(e.svc, st, o)
	e.srv = httptest.NewServer(api.New(e.svc, st, api.Options{UI: e.console}))
	t.Cleanup(e.srv.Close)
	e.url = e.srv.URL

	if e.ws, err = st.CreateWorkspace(ctx, "console", nil); err != nil {
		t.Fatalf("CreateWorkspace: %v", err)
	}
	if _, err := st.GrantCredits(ctx, e.ws.ID, 100, "test", nil); err != nil {
		t.Fatalf("GrantCredits: %v", err)
	}
	for _, k := range []struct {
		role model.Role
		key  *string
		id   *string
	}{{model.RoleAgent, &e.agent, nil}, {model.RoleApprover, &e.approver, &e.approverID}, {model.RoleAdmin, &e.admin, &e.adminID}} {
		*k.key = "sk_test_" + string(k.role) + "_" + rand.Text()
		ak, err := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: e.ws.ID, Role: k.role, Hash: model.HashKey(*k.key), Name: string(k.role)})
		if err != nil {
			t.Fatalf("CreateAPIKey(%s): %v", k.role, err)
		}
		if k.id != nil {
			*k.id = ak.ID
		}
	}
	return e
}

// do sends an API request with key and returns the status and body.
func (e *env) do(method, path, key string, body any) (int, []byte) {
	e.t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(e.t.Context(), method, e.url+path, r)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// ask has the agent ask, through the API, to run code; it returns the
// execution's and the approval request's ids.
func (e *env) ask(req capability.InvokeRequest) (exec, approval string) {
	e.t.Helper()
	code, b := e.do("POST", "/v1/executions", e.agent, req)
	var v wire.Execution
	if err := json.Unmarshal(b, &v); code != http.StatusAccepted || err != nil || v.ApprovalID == "" {
		e.t.Fatalf("POST /v1/executions: got %d %s; want 202 with an approval", code, b)
	}
	return v.ID, v.ApprovalID
}

// execution reads an execution through the API, waiting up to wait for
// its end.
func (e *env) execution(id string, wait time.Duration) wire.Execution {
	e.t.Helper()
	code, b := e.do("GET", fmt.Sprintf("/v1/executions/%s?wait=%s", id, wait), e.agent, nil)
	var v wire.Execution
	if err := json.Unmarshal(b, &v); code != http.StatusOK || err != nil {
		e.t.Fatalf("GET execution %s: got %d %s", id, code, b)
	}
	return v
}

// revoke revokes the approver's key, as `stockade key revoke` does.
func (e *env) revoke(id string) {
	e.t.Helper()
	if err := e.st.RevokeAPIKey(context.WithoutCancel(e.t.Context()), e.ws.ID, id, nil); err != nil {
		e.t.Fatalf("RevokeAPIKey: %v", err)
	}
}

// client is a browser-less visitor of the console: it keeps cookies and
// follows no redirects, so that each answer can be checked.
type client struct {
	t    *testing.T
	e    *env
	hc   *http.Client
	csrf string
}

func (e *env) newClient() *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: e.t, e: e, hc: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// request sends one request to the console; header may be nil.
func (c *client) request(method, path string, form url.Values, header http.Header) (*http.Response, string) {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(c.t.Context(), method, c.e.url+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// signIn signs in with key and returns the answer to the form's POST.
func (c *client) signIn(key string) (*http.Response, string) {
	c.t.Helper()
	resp, page := c.request("GET", "/ui/sign-in", nil, nil)
	if resp.StatusCode != http.StatusOK {
		c.t.Fatalf("GET /ui/sign-in: got %d", resp.StatusCode)
	}
	return c.request("POST", "/ui/sign-in", url.Values{"csrf": {formToken(c.t, page)}, "key": {key}}, nil)
}

// signedIn signs in with key, which must succeed, and keeps the CSRF
// token of the page it lands on.
func (c *client) signedIn(key string) {
	c.t.Helper()
	resp, body := c.signIn(key)
	if resp.StatusCode != http.StatusSeeOther {
		c.t.Fatalf("signing in: got %d, want 303\n%s", resp.StatusCode, body)
	}
	_, page := c.request("GET", "/ui/approvals", nil, nil)
	c.csrf = formToken(c.t, page)
}

// formToken is the value of the first csrf field of a page.
func formToken(t *testing.T, page string) string {
	t.Helper()
	const marker = `name="csrf" value="`
	i := strings.Index(page, marker)
	if i < 0 {
		t.Fatalf("no csrf field in the page:\n%s", page)
	}
	rest := page[i+len(marker):]
	return rest[:strings.IndexByte(rest, '"')]
}
