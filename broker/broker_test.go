package broker

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/internal/clip"
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
				Credential: Credential{Env: "GH_TOKEN"}, Prefix: "Bearer ", ResponseHeaders: []string{"X-RateLimit-Remaining", "X-Echo-Auth"},
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

// TestBrokerRefusalLinesBounded floods one sandbox's broker with calls it
// refuses, each naming a parameter of 60,000 bytes: the log gets the
// first clip.MaxLines refusals, each cut short (the service's log and the
// audit trail count the rest).
func TestBrokerRefusalLinesBounded(t *testing.T) {
	up := upstream(t)
	var logs bytes.Buffer
	b, err := New(Config{
		Operations: []Operation{{Name: "x", Method: "POST", URL: up.URL + "/", Credential: Credential{Env: "T"}}},
		Logger:     slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := b.Handler(Caller{Sandbox: "sbx-1", Tool: "t", Operations: []string{"x"}})
	body := fmt.Sprintf(`{%q: "v"}`, strings.Repeat("p", 60000))
	for range clip.MaxLines + 50 {
		if resp, _ := do(t, h, "POST", "/v1/ops/x", body); resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("got %d, want 400", resp.StatusCode)
		}
	}
	lines := strings.Split(strings.TrimSuffix(logs.String(), "\n"), "\n")
	longest := 0
	for _, l := range lines {
		longest = max(longest, len(l))
	}
	if len(lines) != clip.MaxLines || longest > 2048 {
		t.Errorf("got %d log lines, the longest %d bytes; want %d of at most 2 KiB", len(lines), longest, clip.MaxLines)
	}
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
		{"cookies to the sandbox", Operation{Name: "a", Method: "GET", URL: "https://api.example.com/", Credential: cred, ResponseHeaders: []string{"set-cookie"}}},
		{"the credential's header to the sandbox", Operation{Name: "a", Method: "GET", URL: "https://api.example.com/", Credential: cred, Header: "X-Api-Key", ResponseHeaders: []string{"X-API-Key"}}},
		{"hop-by-hop header to the sandbox", Operation{Name: "a", Method: "GET", URL: "https://api.example.com/", Credential: cred, ResponseHeaders: []string{"Transfer-Encoding"}}},
		{"not a header name", Operation{Name: "a", Method: "GET", URL: "https://api.example.com/", Credential: cred, ResponseHeaders: []string{"X Bad: 1"}}},
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

// TestBrokerRedactsEncodedSecret has the upstream echo the secret in the
// encodings the broker promises to catch, in the body and in a header the
// operation passes: no six consecutive bytes of the secret can be read back
// from the answer by undoing them, and the header is dropped.
func TestBrokerRedactsEncodedSecret(t *testing.T) {
	// The secret has a space, a quote and a backslash, and bytes whose
	// base64 differs between the standard and the URL alphabet.
	const secret = `s3c+r/e t&x-0123??>>~"\z`
	b64, b64u := base64.StdEncoding.EncodeToString([]byte(secret)), base64.URLEncoding.EncodeToString([]byte(secret))
	if !strings.ContainsAny(b64, "+/") || b64 == b64u {
		t.Fatalf("the test secret's base64 %q does not tell the alphabets apart", b64)
	}
	for _, tc := range []struct {
		name string
		enc  string
	}{
		{"plain", secret},
		{"JSON string", jsonString(secret)},
		{"JSON with \\/", strings.ReplaceAll(jsonString(secret), "/", `\/`)},
		{"JSON with every character \\u-escaped", unicodeEscape(secret)},
		{"query escape", url.QueryEscape(secret)},
		{"path escape", url.PathEscape(secret)},
		{"escape leaving / alone", percentEscape(secret, unreserved+"/", "%%%02X")},
		{"lower-case escapes (%2f)", strings.ToLower(url.QueryEscape(secret))},
		{"every byte escaped, lower case", percentEscape(secret, "", "%%%02x")},
		{"base64", b64},
		{"base64 unpadded", base64.RawStdEncoding.EncodeToString([]byte(secret))},
		{"base64 URL alphabet", b64u},
		{"base64 URL alphabet unpadded", base64.RawURLEncoding.EncodeToString([]byte(secret))},
		{"base64 in a query string", url.QueryEscape(b64)},
		{"base64 of user:secret", base64.StdEncoding.EncodeToString([]byte("user:" + secret))},
		{"base64 at offset 1", base64.StdEncoding.EncodeToString([]byte("x" + secret + "yz"))},
		{"base64 at offset 2", base64.RawURLEncoding.EncodeToString([]byte("xy" + secret + "z"))},
		{"hex", hex.EncodeToString([]byte(secret))},
		{"hex upper case", strings.ToUpper(hex.EncodeToString([]byte(secret)))},
		{"hex inside longer hex", hex.EncodeToString([]byte("\x00\x01" + secret + "\xff"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !recoverable(tc.enc, secret) {
				t.Fatalf("the test cannot read the secret back from %q itself", tc.enc)
			}
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Echo", tc.enc)
				w.Header().Set("X-Ratelimit-Remaining", "42")
				fmt.Fprintf(w, `{"echo":"%s","after":"done"}`, tc.enc)
			}))
			defer up.Close()
			b, err := New(Config{
				Operations: []Operation{{Name: "echo", Method: "GET", URL: up.URL + "/echo", Credential: Credential{Env: "TOKEN"},
					ResponseHeaders: []string{"X-Echo", "X-RateLimit-Remaining"}}},
				LookupEnv: func(string) (string, bool) { return secret, true },
			})
			if err != nil {
				t.Fatal(err)
			}
			resp, body := do(t, b.Handler(Caller{Sandbox: "sbx-1", Tool: "t", Operations: []string{"echo"}}), "GET", "/v1/ops/echo", "")
			if resp.StatusCode != 200 || !strings.Contains(body, redacted) || !strings.HasSuffix(body, `","after":"done"}`) {
				t.Errorf("got %d %s, want 200 and the echo redacted, the rest intact", resp.StatusCode, body)
			}
			if recoverable(body, secret) {
				t.Errorf("the secret can be read back from the body %s", body)
			}
			if v := resp.Header.Get("X-Echo"); v != "" {
				t.Errorf("the X-Echo header holding the secret passed: %q", v)
			}
			if v := resp.Header.Get("X-Ratelimit-Remaining"); v != "42" {
				t.Errorf("the declared X-RateLimit-Remaining: got %q, want 42", v)
			}
		})
	}
}

// TestRedactLeavesOtherTextAlone checks that redaction changes nothing
// but the secret: text around it, escapes of other bytes and near misses
// stay as they were.
func TestRedactLeavesOtherTextAlone(t *testing.T) {
	const secret = "tok-0123456789abcdef"
	r := newRedactor(secret)
	for _, tc := range []struct{ in, want string }{
		{`{"a":"%41%2f+x","b":"tok-0123456789abcde"}`, `{"a":"%41%2f+x","b":"tok-0123456789abcde"}`},
		{"before tok-0123456789abcdef after", "before " + redacted + " after"},
		{"tok-0123456789abcdeftok%2D0123456789ABCDEF", redacted + "tok%2D0123456789ABCDEF"},
		{"tok%2d0123456789abcdef!", redacted + "!"},
		{"", ""},
	} {
		if got := string(r.redact([]byte(tc.in))); got != tc.want {
			t.Errorf("redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestBrokerPassesOnlyDeclaredHeaders checks that the sandbox gets
// Content-Type and the headers its operation declares, nothing else, and
// that an answer in a content encoding the broker cannot look into is
// refused.
func TestBrokerPassesOnlyDeclaredHeaders(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, v := range map[string]string{"Content-Type": "application/json", "Etag": `"v1"`, "Link": "<https://api.example/next>", "X-Internal-Trace": "abc",
			"Set-Cookie": "s=1", "Date": "Mon, 01 Jan 2026 00:00:00 GMT"} {
			w.Header().Set(k, v)
		}
		if r.URL.Path == "/brotli" {
			w.Header().Set("Content-Encoding", "br")
		}
		w.Write([]byte(`{}`))
	}))
	defer up.Close()
	b, err := New(Config{
		Operations: []Operation{
			{Name: "get", Method: "GET", URL: up.URL + "/get", Credential: Credential{Env: "TOKEN"}, ResponseHeaders: []string{"etag", "Link"}},
			{Name: "brotli", Method: "GET", URL: up.URL + "/brotli", Credential: Credential{Env: "TOKEN"}},
		},
		LookupEnv: func(string) (string, bool) { return "token-0123456789", true },
	})
	if err != nil {
		t.Fatal(err)
	}
	h := b.Handler(Caller{Sandbox: "sbx-1", Tool: "t", Operations: []string{"get", "brotli"}})
	resp, body := do(t, h, "GET", "/v1/ops/get", "")
	if resp.StatusCode != 200 {
		t.Fatalf("got %d %s, want 200", resp.StatusCode, body)
	}
	var got []string
	for k := range resp.Header {
		got = append(got, k)
	}
	slices.Sort(got)
	if want := []string{"Content-Type", "Etag", "Link", "X-Stockade-Broker-Operation"}; !slices.Equal(got, want) {
		t.Errorf("headers passed: got %q, want %q", got, want)
	}
	resp, body = do(t, h, "GET", "/v1/ops/brotli", "")
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "content encoding (br)") {
		t.Errorf("an answer in brotli: got %d %s, want 502 naming the encoding", resp.StatusCode, body)
	}
}

// jsonString is s as the inside of a JSON string, as encoding/json writes it.
func jsonString(s string) string {
	j, _ := json.Marshal(s)
	return string(j[1 : len(j)-1])
}

// unicodeEscape writes every byte of the ASCII string s as a JSON \u escape.
func unicodeEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, `\u%04x`, s[i])
	}
	return b.String()
}

// percentEscape percent-escapes every byte of s not in keep, in format
// ("%%%02X" or "%%%02x").
func percentEscape(s, keep, format string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(keep, s[i]) >= 0 {
			b.WriteByte(s[i])
		} else {
			fmt.Fprintf(&b, format, s[i])
		}
	}
	return b.String()
}

// unreserved are the bytes RFC 3986 never needs escaped.
const unreserved = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"

// recoverable reports whether six consecutive bytes of secret can be read
// back from text by undoing, independently of the redactor, the encodings
// the broker promises to catch: JSON string escapes, percent-escapes,
// base64 in either alphabet at any alignment, hex at either.
func recoverable(text, secret string) bool {
	texts := []string{text, jsonUnescape(text)}
	for _, t := range slices.Clone(texts) {
		if u, err := url.QueryUnescape(t); err == nil {
			texts = append(texts, u)
		}
		if u, err := url.PathUnescape(t); err == nil {
			texts = append(texts, u)
		}
	}
	var decoded []string
	for _, t := range texts {
		decoded = append(decoded, t)
		for _, run := range regexp.MustCompile(`[A-Za-z0-9+/=_-]{4,}`).FindAllString(t, -1) {
			run = strings.TrimRight(run, "=")
			for off := range 4 {
				for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
					r := run[min(off, len(run)):]
					if d, err := enc.DecodeString(r[:len(r)/4*4]); err == nil {
						decoded = append(decoded, string(d))
					}
				}
			}
		}
		for _, run := range regexp.MustCompile(`[0-9A-Fa-f]{2,}`).FindAllString(t, -1) {
			for off := range 2 {
				r := run[min(off, len(run)):]
				if d, err := hex.DecodeString(r[:len(r)/2*2]); err == nil {
					decoded = append(decoded, string(d))
				}
			}
		}
	}
	for _, d := range decoded {
		for i := 0; i+6 <= len(secret); i++ {
			if strings.Contains(d, secret[i:i+6]) {
				return true
			}
		}
	}
	return false
}

// jsonUnescape undoes the escapes of a JSON string in text, wherever
// they are.
func jsonUnescape(text string) string {
	return regexp.MustCompile(`\\(u[0-9A-Fa-f]{4}|.)`).ReplaceAllStringFunc(text, func(m string) string {
		if m[1] == 'u' {
			n, _ := strconv.ParseUint(m[2:], 16, 32)
			return string(rune(n))
		}
		return m[1:]
	})
}

// BenchmarkRedact redacts an 8 MiB JSON answer that holds the secret once
// and reports its throughput beside a plain search for the secret alone in
// the same body (bytes.ReplaceAll), the floor of any redaction.
func BenchmarkRedact(b *testing.B) {
	const secret = "ghp_s3cr3t-from-env-0123456789"
	var buf strings.Builder
	for i := 0; buf.Len() < 8<<20; i++ {
		fmt.Fprintf(&buf, `{"id":%d,"title":"issue %d: a bug in the parser","url":"https://api.example.com/repos/o/r/issues/%d%%3Fpage%%3D2"},`, i, i, i)
	}
	buf.WriteString(secret)
	body := []byte(buf.String())
	var red, plain time.Duration
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		t0 := time.Now()
		if out := newRedactor(secret).redact(body); bytes.Contains(out, []byte(secret)) {
			b.Fatal("the secret was not redacted")
		}
		t1 := time.Now()
		_ = bytes.ReplaceAll(body, []byte(secret), []byte(redacted))
		red, plain = red+t1.Sub(t0), plain+time.Since(t1)
	}
	mb := float64(len(body)) / (1 << 20) * float64(b.N)
	b.ReportMetric(mb/red.Seconds(), "redact-MiB/s")
	b.ReportMetric(mb/plain.Seconds(), "plain-MiB/s")
	b.ReportMetric(red.Seconds()/plain.Seconds(), "redact/plain")
}
