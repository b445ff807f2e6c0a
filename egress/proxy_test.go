package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func get(t *testing.T, c *http.Client, url string) (int, string, error) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func TestProxyAllows(t *testing.T) {
	e := newEnv(t)
	hp, sp := e.up.httpPort, e.up.httpsPort
	for _, tc := range []struct {
		name, url string
		client    *http.Client
		proto     Protocol
		host      string
	}{
		{"http host header", fmt.Sprintf("http://%s:%d/a", allowedName, hp), e.transparentClient(), ProtoHTTP, allowedName},
		{"http wildcard", fmt.Sprintf("http://%s:%d/b", wildName, hp), e.transparentClient(), ProtoHTTP, wildName},
		{"https sni", fmt.Sprintf("https://%s:%d/c", allowedName, sp), e.transparentClient(), ProtoTLS, allowedName},
		{"https connect", fmt.Sprintf("https://%s:%d/d", allowedName, sp), e.proxyClient(), ProtoConnect, allowedName},
		{"http absolute form", fmt.Sprintf("http://%s:%d/e", wildName, hp), e.proxyClient(), ProtoHTTP, wildName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body, err := get(t, tc.client, tc.url)
			if err != nil {
				t.Fatal(err)
			}
			path := tc.url[strings.LastIndex(tc.url, "/"):]
			if code != 200 || !strings.Contains(body, tc.host) || !strings.HasSuffix(body, path) {
				t.Fatalf("got %d %q, want 200 and the upstream's greeting for %s%s", code, body, tc.host, path)
			}
			d := e.rec.wait(t, "allowed "+tc.name, func(d Decision) bool {
				return d.Allowed && d.Protocol == tc.proto && d.Name == tc.host && d.BytesDown > 0
			})
			if d.Reason != ReasonAllowed || d.Sandbox != "sbx-test" || d.Tool != "web-reader" || d.Addr != loopback || d.BytesUp == 0 {
				t.Errorf("decision = %+v, want allowed, sandbox and tool set, addr 127.0.0.1, bytes both ways", d)
			}
		})
	}
}

func TestProxyRefuses(t *testing.T) {
	e := newEnv(t)
	hp, sp := e.up.httpPort, e.up.httpsPort
	for _, tc := range []struct {
		name   string
		url    string
		client *http.Client
		reason string
		dname  string
	}{
		{"http other name", fmt.Sprintf("http://%s:%d/", otherName, hp), e.transparentClient(), ReasonNameNotAllowed, otherName},
		{"http wildcard apex", fmt.Sprintf("http://wild.test:%d/", hp), e.transparentClient(), ReasonNameNotAllowed, "wild.test"},
		{"http port not allowed", fmt.Sprintf("http://%s:%d/", allowedName, 8080), e.transparentClient(), ReasonPortNotAllowed, allowedName},
		{"http direct ip", fmt.Sprintf("http://127.0.0.1:%d/", hp), e.transparentClient(), ReasonIPLiteral, "127.0.0.1"},
		{"http rebinding to loopback", fmt.Sprintf("http://%s:%d/", rebindName, hp), e.transparentClient(), ReasonPrivateAddress, rebindName},
		{"http metadata address", fmt.Sprintf("http://%s:%d/", metaName, hp), e.transparentClient(), ReasonPrivateAddress, metaName},
		{"https other name", fmt.Sprintf("https://%s:%d/", otherName, sp), e.transparentClient(), ReasonNameNotAllowed, otherName},
		{"https rebinding to loopback", fmt.Sprintf("https://%s:%d/", rebindName, sp), e.transparentClient(), ReasonPrivateAddress, rebindName},
		{"connect other name", fmt.Sprintf("https://%s:%d/", otherName, sp), e.proxyClient(), ReasonNameNotAllowed, otherName},
		{"connect direct ip", fmt.Sprintf("https://127.0.0.1:%d/", sp), e.proxyClient(), ReasonIPLiteral, "127.0.0.1"},
		{"absolute form other name", fmt.Sprintf("http://%s:%d/", otherName, hp), e.proxyClient(), ReasonNameNotAllowed, otherName},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body, err := get(t, tc.client, tc.url)
			if err == nil && code != http.StatusForbidden {
				t.Fatalf("got %d %q, want a refusal", code, body)
			}
			if err == nil && !strings.Contains(body, tc.reason) {
				t.Errorf("body %q does not name the reason %q", body, tc.reason)
			}
			d := e.rec.wait(t, tc.reason+" for "+tc.dname, func(d Decision) bool {
				return !d.Allowed && d.Name == tc.dname && d.Reason == tc.reason
			})
			if d.Sandbox != "sbx-test" {
				t.Errorf("decision = %+v, want the sandbox named", d)
			}
			if tc.reason == ReasonPrivateAddress && (!d.Addr.IsValid() || d.Detail == "") {
				t.Errorf("decision = %+v, want the refused address and its range", d)
			}
		})
	}
	// Nothing was dialed for the refused names: only the rebinding names
	// were resolved (and refused after resolution).
	if n := e.res.calls.Load(); n != 3 {
		t.Errorf("resolver called %d times, want 3 (rebind over http and https, metadata)", n)
	}
	// Absolute names: the host's search domains must not turn an allowed
	// name into another one.
	if n := e.res.relative.Load(); n != 0 {
		t.Errorf("the proxy asked the resolver %d relative names, want every name absolute", n)
	}
}

func TestProxyNoSNI(t *testing.T) {
	e := newEnv(t)
	// An IP as ServerName makes crypto/tls send no SNI at all.
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", e.tlsAddr, &tls.Config{ServerName: "127.0.0.1", InsecureSkipVerify: true})
	if err == nil {
		c.Close()
		t.Fatal("TLS handshake without SNI succeeded through the proxy")
	}
	e.rec.wait(t, "no SNI", func(d Decision) bool { return !d.Allowed && d.Reason == ReasonNoSNI && d.Protocol == ProtoTLS })
}

func TestProxyConnectSNIMismatch(t *testing.T) {
	e := newEnv(t)
	c, err := net.Dial("tcp", e.proxAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n", allowedName, e.up.httpsPort, allowedName, e.up.httpsPort)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	tc := tls.Client(&bufConn{Conn: c, r: br}, &tls.Config{ServerName: otherName, RootCAs: e.up.roots})
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err == nil {
		t.Fatal("handshake for another name inside a CONNECT tunnel succeeded")
	}
	e.rec.wait(t, "SNI mismatch", func(d Decision) bool { return !d.Allowed && d.Reason == ReasonSNIMismatch })
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

func TestProxyMalformedAndTimeouts(t *testing.T) {
	e := newEnv(t, func(_ *Policy, c *Config) { c.HeaderTimeout = 300 * time.Millisecond; c.MaxHeaderBytes = 4096 })
	t.Run("silent client times out", func(t *testing.T) {
		c, err := net.Dial("tcp", e.httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(c); err != nil {
			t.Fatalf("proxy did not close a silent connection: %v", err)
		}
		e.rec.wait(t, "timeout", func(d Decision) bool { return d.Reason == ReasonTimeout })
	})
	t.Run("oversized headers", func(t *testing.T) {
		c, err := net.Dial("tcp", e.httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nX-Big: %s\r\n\r\n", allowedName, strings.Repeat("a", 8192))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(c)
		if !strings.HasPrefix(string(b), "HTTP/1.1 400") {
			t.Fatalf("got %q, want 400", b)
		}
	})
	t.Run("no host", func(t *testing.T) {
		c, err := net.Dial("tcp", e.httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET / HTTP/1.0\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(c)
		if !strings.HasPrefix(string(b), "HTTP/1.1 400") || !strings.Contains(string(b), ReasonNoHost) {
			t.Fatalf("got %q, want 400 %s", b, ReasonNoHost)
		}
	})
	// An empty last label is an invalid name, not a numeric IPv4 form.
	for _, host := range []string{"name..", allowedName + ".."} {
		t.Run("host "+host, func(t *testing.T) {
			c, err := net.Dial("tcp", e.httpAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			b, _ := io.ReadAll(c)
			if !strings.HasPrefix(string(b), "HTTP/1.1 403") || !strings.Contains(string(b), ReasonBadName) {
				t.Errorf("got %q, want 403 %s", b, ReasonBadName)
			}
			d := e.rec.wait(t, "refusal of "+host, func(d Decision) bool { return d.Name == host })
			if d.Reason != ReasonBadName {
				t.Errorf("got reason %q, want %q", d.Reason, ReasonBadName)
			}
		})
	}
}

func TestProxyBrokerRoute(t *testing.T) {
	broker := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Op", r.URL.Path)
		fmt.Fprintf(w, "broker saw %s %s from %s", r.Method, r.URL.Path, r.RemoteAddr)
	})
	e := newEnv(t, func(p *Policy, _ *Config) { p.Broker = broker })
	for _, c := range []*http.Client{e.transparentClient(), e.proxyClient()} {
		code, body, err := get(t, c, "http://"+BrokerName+"/v1/ops/list-issues")
		if err != nil || code != 200 || !strings.Contains(body, "broker saw GET /v1/ops/list-issues from 127.0.0.1:") {
			t.Fatalf("got %d %q %v, want the broker's answer", code, body, err)
		}
	}
	if n := e.res.calls.Load(); n != 0 {
		t.Errorf("the broker name was resolved %d times, want never", n)
	}

	noBroker := newEnv(t)
	code, body, err := get(t, noBroker.transparentClient(), "http://"+BrokerName+"/v1/ops/list-issues")
	if err != nil || code != http.StatusForbidden {
		t.Fatalf("without a broker: got %d %q %v, want 403", code, body, err)
	}
	noBroker.rec.wait(t, "broker refused", func(d Decision) bool { return !d.Allowed && d.Protocol == ProtoBroker })
}

func TestProxyMaxBytes(t *testing.T) {
	e := newEnv(t, func(_ *Policy, c *Config) { c.MaxBytes = 1 << 20 })
	resp, err := e.transparentClient().Get(fmt.Sprintf("http://%s:%d/big", allowedName, e.up.httpPort))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if n >= bigSize {
		t.Fatalf("downloaded %d bytes through a proxy bounded to 1 MiB", n)
	}
	d := e.rec.wait(t, "bounded download", func(d Decision) bool { return d.Allowed && d.BytesDown > 0 })
	if d.BytesDown > 1<<20 {
		t.Errorf("BytesDown = %d, want at most 1 MiB", d.BytesDown)
	}
}

func TestGateCloseEndsConnections(t *testing.T) {
	e := newEnv(t)
	c, err := net.Dial("tcp", e.proxAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT %s:%d HTTP/1.1\r\n\r\n", allowedName, e.up.httpPort)
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	e.closeWithin(t, 5*time.Second, "with a tunnel open")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("tunnel still open after Close")
	}
	if _, err := net.DialTimeout("tcp", e.proxAddr, time.Second); err == nil {
		t.Fatal("listener still accepting after Close")
	}
	_ = e.gate.Close() // idempotent
}

// TestGateCloseEndsRequestsWaitingForUpstream checks that Close does not
// wait for an upstream that never answers (the engine closes a sandbox's
// gate before its run returns): the request in flight is cut, and decided.
func TestGateCloseEndsRequestsWaitingForUpstream(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	silentPort := silent.Addr().(*net.TCPAddr).Port
	requested := make(chan struct{})
	go func() {
		c, err := silent.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		// Read the forwarded request, then say nothing until the proxy
		// hangs up.
		if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			close(requested)
		}
		_, _ = io.Copy(io.Discard, c)
	}()
	e := newEnv(t, func(p *Policy, c *Config) {
		p.Allow = append(p.Allow, "silent.test")
		p.Ports = append(p.Ports, silentPort)
		c.TestOverride = NewTestOverride(t, map[string][]netip.Addr{"silent.test": {loopback}})
		c.IdleTimeout = time.Hour
	})
	c, err := net.Dial("tcp", e.proxAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET http://silent.test:%d/x HTTP/1.1\r\nHost: silent.test:%d\r\n\r\n", silentPort, silentPort)
	select {
	case <-requested:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached the upstream")
	}
	e.closeWithin(t, 10*time.Second, "waiting for the upstream (idle timeout 1 h)")
	e.rec.wait(t, "the request to silent.test", func(d Decision) bool { return d.Name == "silent.test" })
}

// closeWithin closes the gate and fails t unless Close returns within d.
func (e *env) closeWithin(t *testing.T, d time.Duration, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { e.gate.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("Close did not return within %s, %s", d, what)
	}
}

func TestTestOverrideOnlyInTests(t *testing.T) {
	o := NewTestOverride(t, map[string][]netip.Addr{allowedName: {loopback}})
	if err := (Config{TestOverride: o}).Validate(); err != nil {
		t.Fatalf("inside a test binary: %v", err)
	}
	if testing.Short() {
		t.Skip("building a program takes a few seconds")
	}
	// A real program (not a test binary) that sets an override is refused.
	out, err := exec.Command("go", "run", "./testdata/override").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "refused: egress: a test resolver override is set outside a test binary") {
		t.Fatalf("go run ./testdata/override: %v\n%s", err, out)
	}
}

// TestGateStopsWithItsContext ends a gate's context: its listeners close,
// and a connection attempt afterwards is neither accepted nor reported.
func TestGateStopsWithItsContext(t *testing.T) {
	rec := &recorder{}
	p, err := New(Config{OnDecision: rec.add})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	ctx, cancel := context.WithCancel(t.Context())
	g, err := p.Start(ctx, Policy{Sandbox: "sbx-ctx", Allow: []string{"api.example.com"}, Ports: []int{443}}, Listener{Listener: l, Port: 443})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the gate's listener still accepts connections 5 s after its context ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.ds) != 0 {
		t.Errorf("decisions after the context ended: %+v, want none", rec.ds)
	}
}
