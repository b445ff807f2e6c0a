package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/egress"
)

const (
	envSecret  = "ghp_s3cr3t-from-env-0123456789"
	fileSecret = "file-s3cr3t-abcdefghijklmnop"
)

// upstream is a loopback API that requires the secret and, to be hostile,
// echoes it back in headers, cookies and the body.
func upstream(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization") + r.Header.Get("X-Api-Key")
		if !strings.Contains(auth, envSecret) && !strings.Contains(auth, fileSecret) {
			http.Error(w, "no credential", http.StatusUnauthorized)
			return
		}
		w.Header().Set("X-Echo-Auth", auth)
		w.Header().Set("Set-Cookie", "session="+auth)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Ratelimit-Remaining", "42")
		body, _ := io.ReadAll(r.Body)
		_ = json.NewEncoder(w).Encode(map[string]string{
			"method": r.Method, "path": r.URL.EscapedPath(), "query": r.URL.RawQuery, "body": string(body), "echo": auth,
		})
	}))
	t.Cleanup(srv.Close)
	return srv
}

type audits struct {
	mu sync.Mutex
	ev []Event
}

func (a *audits) add(e Event) { a.mu.Lock(); a.ev = append(a.ev, e); a.mu.Unlock() }
func (a *audits) last(t *testing.T) Event {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.ev) == 0 {
		t.Fatal("no audit event")
	}
	return a.ev[len(a.ev)-1]
}

func newBroker(t *testing.T, up string) (*Broker, *audits) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(f, []byte(fileSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := &audits{}
	b, err := New(Config{
		Operations: []Operation{
			{
				Name: "issues.list", Method: "GET", URL: up + "/repos/{owner}/{repo}/issues",
				Params:     []Param{{Name: "owner", Required: true}, {Name: "repo", Required: true}, {Name: "state", Pattern: "open|closed"}},
				Credential: Credential{Env: "GH_TOKEN"}, Prefix: "Bearer ",
			},
			{
				Name: "issues.create", Method: "POST", URL: up + "/repos/{repo}/issues", JSONBody: true,
				Params:     []Param{{Name: "repo", Required: true}, {Name: "title", Pattern: `[ -~]+`, Required: true, MaxLen: 80}},
				Credential: Credential{File: f}, Header: "X-Api-Key",
			},
			{
				Name: "admin.delete", Method: "DELETE", URL: up + "/admin",
				Credential: Credential{Env: "GH_TOKEN"},
			},
		},
		LookupEnv: func(k string) (string, bool) {
			if k == "GH_TOKEN" {
				return envSecret, true
			}
			return "", false
		},
		OnAudit: a.add,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b, a
}

func do(t *testing.T, h http.Handler, method, target, body string) (*http.Response, string) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, r)
	// A sandbox that sends its own credential gets it ignored.
	req.Header.Set("Authorization", "Bearer sandbox-supplied")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	resp := w.Result()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// assertNoSecret fails if a secret appears anywhere in the response.
func assertNoSecret(t *testing.T, resp *http.Response, body string) {
	t.Helper()
	for _, s := range []string{envSecret, fileSecret} {
		if strings.Contains(body, s) {
			t.Errorf("secret in body: %s", body)
		}
		for k, vs := range resp.Header {
			for _, v := range vs {
				if strings.Contains(v, s) {
					t.Errorf("secret in header %s: %s", k, v)
				}
			}
		}
	}
	for _, h := range []string{"Set-Cookie", "X-Echo-Auth"} {
		if resp.Header.Get(h) != "" {
			t.Errorf("header %s passed to the sandbox", h)
		}
	}
}

func TestBrokerAllowed(t *testing.T) {
	up := upstream(t)
	b, a := newBroker(t, up.URL)
	h := b.Handler(Caller{Sandbox: "sbx-1", Tool: "triage", Operations: []string{"issues.list", "issues.create"}})

	t.Run("GET with env credential", func(t *testing.T) {
		resp, body := do(t, h, "GET", "/v1/ops/issues.list?owner=stockade-sh&repo=stockade&state=open", "")
		if resp.StatusCode != 200 {
			t.Fatalf("got %d %s, want 200", resp.StatusCode, body)
		}
		var got map[string]string
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatal(err)
		}
		if got["path"] != "/repos/stockade-sh/stockade/issues" || got["query"] != "state=open" || got["echo"] != "Bearer [redacted by stockade]" {
			t.Errorf("upstream saw %v; want the templated path, the query and a redacted echo", got)
		}
		if resp.Header.Get("X-Ratelimit-Remaining") != "42" || resp.Header.Get("X-Stockade-Broker-Operation") != "issues.list" {
			t.Errorf("headers %v, want the rate limit and the operation", resp.Header)
		}
		assertNoSecret(t, resp, body)
		ev := a.last(t)
		want := hashParams(map[string]string{"owner": "stockade-sh", "repo": "stockade", "state": "open"})
		if !ev.Allowed || ev.Operation != "issues.list" || ev.Status != 200 || ev.ParamsSHA256 != want || ev.Sandbox != "sbx-1" || ev.Tool != "triage" {
			t.Errorf("audit %+v, want allowed issues.list status 200 hash %s", ev, want)
		}
	})
	t.Run("POST with file credential and JSON body", func(t *testing.T) {
		resp, body := do(t, h, "POST", "/v1/ops/issues.create", `{"repo":"stockade","title":"a bug"}`)
		if resp.StatusCode != 200 {
			t.Fatalf("got %d %s, want 200", resp.StatusCode, body)
		}
		var got map[string]string
		_ = json.Unmarshal([]byte(body), &got)
		if got["method"] != "POST" || got["path"] != "/repos/stockade/issues" || got["body"] != `{"title":"a bug"}` {
			t.Errorf("upstream saw %v", got)
		}
		assertNoSecret(t, resp, body)
	})
}

func TestBrokerRefuses(t *testing.T) {
	up := upstream(t)
	b, a := newBroker(t, up.URL)
	h := b.Handler(Caller{Sandbox: "sbx-1", Tool: "triage", Operations: []string{"issues.list", "issues.create", "not.configured"}})
	for _, tc := range []struct {
		name, method, target, body string
		status                     int
		reason                     string
	}{
		{"operation not in record", "DELETE", "/v1/ops/admin.delete", "", 403, "not in tool"},
		{"operation not in record, GET", "GET", "/v1/ops/admin.delete", "", 403, "not in tool"},
		{"unconfigured operation", "GET", "/v1/ops/not.configured", "", 404, "not configured"},
		{"unknown parameter", "GET", "/v1/ops/issues.list?owner=a&repo=b&url=http://evil.test", "", 400, `no parameter "url"`},
		{"missing required", "GET", "/v1/ops/issues.list?owner=a", "", 400, `"repo" is required`},
		{"pattern mismatch", "GET", "/v1/ops/issues.list?owner=a&repo=b&state=all", "", 400, `"state" does not match`},
		{"path traversal", "GET", "/v1/ops/issues.list?owner=a&repo=..", "", 400, `"repo" does not match`},
		{"slash in path parameter", "GET", "/v1/ops/issues.list?owner=a%2F..%2Fadmin&repo=b", "", 400, `"owner" does not match`},
		{"too long", "POST", "/v1/ops/issues.create", `{"repo":"r","title":"` + strings.Repeat("x", 81) + `"}`, 400, "longer than 80"},
		{"repeated parameter", "GET", "/v1/ops/issues.list?owner=a&owner=b&repo=c", "", 400, "given 2 times"},
		{"non-string JSON", "POST", "/v1/ops/issues.create", `{"repo":["r"]}`, 400, "JSON object of strings"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, h, tc.method, tc.target, tc.body)
			var e struct{ Error string }
			_ = json.Unmarshal([]byte(body), &e)
			if resp.StatusCode != tc.status || !strings.Contains(e.Error, tc.reason) {
				t.Fatalf("got %d %s, want %d mentioning %q", resp.StatusCode, body, tc.status, tc.reason)
			}
			ev := a.last(t)
			if ev.Allowed || ev.Status != 0 || !strings.Contains(ev.Reason, tc.reason) {
				t.Errorf("audit %+v, want a refusal with the reason", ev)
			}
		})
	}
	t.Run("no operations", func(t *testing.T) {
		resp, _ := do(t, b.Handler(Caller{Tool: "calc"}), "GET", "/v1/ops/issues.list?owner=a&repo=b", "")
		if resp.StatusCode != 403 {
			t.Fatalf("got %d, want 403", resp.StatusCode)
		}
	})
}

func TestBrokerMissingCredential(t *testing.T) {
	up := upstream(t)
	b, err := New(Config{Operations: []Operation{{Name: "x", Method: "GET", URL: up.URL + "/", Credential: Credential{Env: "MISSING"}}}})
	if err != nil {
		t.Fatal(err)
	}
	resp, body := do(t, b.Handler(Caller{Operations: []string{"x"}}), "GET", "/v1/ops/x", "")
	if resp.StatusCode != 503 || strings.Contains(body, "MISSING") {
		t.Fatalf("got %d %s, want 503 that does not name the variable", resp.StatusCode, body)
	}
}

func TestNewRefusesBadOperations(t *testing.T) {
	cred := Credential{Env: "T"}
	for _, tc := range []struct {
		name string
		op   Operation
	}{
		{"placeholder in host", Operation{Name: "a", Method: "GET", URL: "https://{host}.example.com/", Params: []Param{{Name: "host"}}, Credential: cred}},
		{"unlisted placeholder", Operation{Name: "a", Method: "GET", URL: "https://api.example.com/{x}", Credential: cred}},
		{"scheme", Operation{Name: "a", Method: "GET", URL: "file:///etc/passwd", Credential: cred}},
		{"method", Operation{Name: "a", Method: "TRACE", URL: "https://api.example.com/", Credential: cred}},
		{"two credentials", Operation{Name: "a", Method: "GET", URL: "https://api.example.com/", Credential: Credential{Env: "T", File: "/f"}}},
		{"no credential", Operation{Name: "a", Method: "GET", URL: "https://api.example.com/"}},
		{"bad name", Operation{Name: "A B", Method: "GET", URL: "https://api.example.com/", Credential: cred}},
		{"bad pattern", Operation{Name: "a", Method: "GET", URL: "https://api.example.com/", Params: []Param{{Name: "p", Pattern: "("}}, Credential: cred}},
		{"long parameter name", Operation{Name: "a", Method: "GET", URL: "https://api.example.com/", Params: []Param{{Name: strings.Repeat("p", 65)}}, Credential: cred}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(Config{Operations: []Operation{tc.op}}); err == nil {
				t.Fatal("New accepted a bad operation")
			}
		})
	}
	// The longest names are accepted.
	op := Operation{Name: strings.Repeat("a", 64), Method: "GET", URL: "https://api.example.com/", Params: []Param{{Name: strings.Repeat("p", 64)}}, Credential: cred}
	if _, err := New(Config{Operations: []Operation{op}, LookupEnv: func(string) (string, bool) { return "s", true }}); err != nil {
		t.Fatalf("New refused 64-character names: %v", err)
	}
}

// TestBrokerThroughProxy calls the broker the way sandbox code does: plain
// HTTP to broker.stockade.internal through the egress proxy, which routes
// the name to the broker in process.
func TestBrokerThroughProxy(t *testing.T) {
	up := upstream(t)
	b, a := newBroker(t, up.URL)
	p, err := egress.New(egress.Config{Resolver: noResolver{}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g, err := p.Start(ctx, egress.Policy{Sandbox: "sbx-2", Tool: "triage", Broker: b.Handler(Caller{Sandbox: "sbx-2", Tool: "triage", Operations: []string{"issues.list"}})},
		egress.Listener{Listener: l, Port: 80})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", l.Addr().String())
		},
	}}
	for _, tc := range []struct {
		target string
		status int
	}{
		{"/v1/ops/issues.list?owner=o&repo=r", 200},
		{"/v1/ops/issues.create", 403},
	} {
		resp, err := client.Get(fmt.Sprintf("http://%s%s", egress.BrokerName, tc.target))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Fatalf("%s: got %d %s, want %d", tc.target, resp.StatusCode, body, tc.status)
		}
		assertNoSecret(t, resp, string(body))
	}
	if ev := a.last(t); ev.Allowed || ev.Sandbox != "sbx-2" {
		t.Errorf("last audit %+v, want the refusal of issues.create", ev)
	}
}

// noResolver fails every lookup: the broker name must never be resolved.
type noResolver struct{}

func (noResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return nil, fmt.Errorf("resolver must not be called")
}

// TestBrokerCallsInFlight holds the upstream while a sandbox makes calls:
// past MaxCallsInFlight they are refused (429, audited) without reaching
// it, and once one answers the sandbox may call again.
func TestBrokerCallsInFlight(t *testing.T) {
	arrived, release := make(chan struct{}, 16), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		w.Write([]byte(`{}`))
	}))
	defer up.Close()
	a := &audits{}
	b, err := New(Config{
		Operations: []Operation{{Name: "slow", Method: "GET", URL: up.URL + "/slow", Credential: Credential{Env: "TOKEN"}}},
		LookupEnv:  func(string) (string, bool) { return "token-0123456789", true },
		OnAudit:    a.add, MaxCallsInFlight: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := b.Handler(Caller{Sandbox: "sbx-1", Tool: "t", Operations: []string{"slow"}})
	wait := func() {
		t.Helper()
		select {
		case <-arrived:
		case <-time.After(10 * time.Second):
			close(release)
			t.Fatal("a call did not reach the upstream")
		}
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if resp, body := do(t, h, "GET", "/v1/ops/slow", ""); resp.StatusCode != 200 {
				t.Errorf("a call within the bound: got %d %s, want 200", resp.StatusCode, body)
			}
		})
	}
	wait()
	wait()
	third := make(chan string, 1)
	go func() {
		resp, body := do(t, h, "GET", "/v1/ops/slow", "")
		third <- fmt.Sprintf("%d %s", resp.StatusCode, body)
	}()
	select {
	case got := <-third:
		if !strings.HasPrefix(got, "429 ") || !strings.Contains(got, "in flight") {
			t.Errorf("a third call in flight: got %s, want 429", got)
		}
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("a third call in flight was not refused: it waits for the upstream")
	}
	if ev := a.last(t); ev.Allowed || ev.Operation != "slow" || !strings.Contains(ev.Reason, "in flight") {
		t.Errorf("audit of the refused call: %+v", ev)
	}
	// Another sandbox has its own bound.
	other := b.Handler(Caller{Sandbox: "sbx-2", Tool: "t", Operations: []string{"slow"}})
	wg.Go(func() {
		if resp, body := do(t, other, "GET", "/v1/ops/slow", ""); resp.StatusCode != 200 {
			t.Errorf("another sandbox's call: got %d %s, want 200", resp.StatusCode, body)
		}
	})
	wait()
	close(release)
	wg.Wait()
	if resp, body := do(t, h, "GET", "/v1/ops/slow", ""); resp.StatusCode != 200 {
		t.Errorf("a call once the others answered: got %d %s, want 200", resp.StatusCode, body)
	}
}

// TestBrokerRedactsEncodedSecret has the upstream echo the secret the ways
// a real API might: escaped in JSON and in a URL.
func TestBrokerRedactsEncodedSecret(t *testing.T) {
	const secret = "s3c+r/e=t&x-0123"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "<https://api.example/next?token="+url.QueryEscape(secret)+">; rel=next")
		fmt.Fprintf(w, `{"query":%q,"path":%q,"php":"%s"}`, url.QueryEscape(secret), url.PathEscape(secret), strings.ReplaceAll(secret, "/", `\/`))
		json.NewEncoder(w).Encode(map[string]string{"json": secret})
	}))
	defer up.Close()
	b, err := New(Config{
		Operations: []Operation{{Name: "echo", Method: "GET", URL: up.URL + "/echo", Credential: Credential{Env: "TOKEN"}}},
		LookupEnv:  func(string) (string, bool) { return secret, true },
	})
	if err != nil {
		t.Fatal(err)
	}
	resp, body := do(t, b.Handler(Caller{Sandbox: "sbx-1", Tool: "t", Operations: []string{"echo"}}), "GET", "/v1/ops/echo", "")
	if resp.StatusCode != 200 || strings.Count(body, redacted) < 4 {
		t.Errorf("got %d %s, want every form of the secret redacted", resp.StatusCode, body)
	}
	for _, f := range secretForms(secret) {
		if strings.Contains(body, f) {
			t.Errorf("the body holds the secret as %q: %s", f, body)
		}
	}
	if l := resp.Header.Get("Link"); l != "" {
		t.Errorf("the Link header holding the secret passed: %s", l)
	}
}
