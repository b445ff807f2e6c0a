package egress

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Test names live under .test (RFC 6761): they never exist outside tests.
const (
	allowedName = "api.allowed.test"
	wildName    = "x.wild.test"
	rebindName  = "rebind.allowed.test" // allowlisted, resolves to loopback WITHOUT the override
	metaName    = "meta.allowed.test"   // allowlisted, resolves to 169.254.169.254
	otherName   = "evil.test"
)

var loopback = netip.MustParseAddr("127.0.0.1")

// mapResolver is the test's Resolver: it answers from a map (of names
// without the final dot) and counts calls, and the names it was asked that
// were not absolute. It never sends a packet.
type mapResolver struct {
	m        map[string][]netip.Addr
	calls    atomic.Int64
	relative atomic.Int64
}

func (r *mapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.calls.Add(1)
	name, absolute := strings.CutSuffix(host, ".")
	if !absolute {
		r.relative.Add(1)
	}
	if as, ok := r.m[name]; ok {
		return as, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// recorder collects Decisions.
type recorder struct {
	mu sync.Mutex
	ds []Decision
}

func (r *recorder) add(d Decision) {
	r.mu.Lock()
	r.ds = append(r.ds, d)
	r.mu.Unlock()
}

// wait returns the first decision matching f, waiting up to 5 s.
func (r *recorder) wait(t *testing.T, what string, f func(Decision) bool) Decision {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		for _, d := range r.ds {
			if f(d) {
				r.mu.Unlock()
				return d
			}
		}
		r.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t.Fatalf("no decision %s; got %+v", what, r.ds)
	return Decision{}
}

// upstreams are an HTTP and an HTTPS server on 127.0.0.1, and the CA that
// signed the HTTPS server's certificate.
type upstreams struct {
	http, https *httptest.Server
	httpPort    int
	httpsPort   int
	roots       *x509.CertPool
}

// bigSize is the size of /big, the throughput download.
const bigSize = 10 << 20

var bigBody = make([]byte, bigSize)

func upstreamHandler(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/big":
		w.Header().Set("Content-Length", strconv.Itoa(bigSize))
		_, _ = w.Write(bigBody)
	default:
		_, _ = w.Write([]byte("hello " + r.Host + " " + r.URL.Path))
	}
}

func startUpstreams(t testing.TB) *upstreams {
	t.Helper()
	u := &upstreams{}
	u.http = httptest.NewServer(http.HandlerFunc(upstreamHandler))
	t.Cleanup(u.http.Close)
	cert, roots := testCert(t, allowedName, "*.wild.test", "other.allowed.test", rebindName)
	u.https = httptest.NewUnstartedServer(http.HandlerFunc(upstreamHandler))
	u.https.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	u.https.StartTLS()
	t.Cleanup(u.https.Close)
	u.roots = roots
	u.httpPort = u.http.Listener.Addr().(*net.TCPAddr).Port
	u.httpsPort = u.https.Listener.Addr().(*net.TCPAddr).Port
	return u
}

// testCert returns a self-signed certificate for names and a pool that
// trusts it.
func testCert(t testing.TB, names ...string) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// env is a proxy with one gate serving a policy that allows allowedName,
// *.wild.test, rebindName and metaName on the upstreams' ports.
type env struct {
	up       *upstreams
	res      *mapResolver
	rec      *recorder
	proxy    *Proxy
	gate     *Gate
	httpAddr string // transparent listener for the HTTP upstream's port
	tlsAddr  string // transparent listener for the HTTPS upstream's port
	proxAddr string // explicit-proxy listener (CONNECT, absolute-form)
}

type envOption func(*Policy, *Config)

func newEnv(t testing.TB, opts ...envOption) *env {
	t.Helper()
	e := &env{up: startUpstreams(t), rec: &recorder{}}
	e.res = &mapResolver{m: map[string][]netip.Addr{
		rebindName: {loopback},
		metaName:   {netip.MustParseAddr("169.254.169.254")},
	}}
	cfg := Config{
		Resolver:   e.res,
		OnDecision: e.rec.add,
		TestOverride: NewTestOverride(t, map[string][]netip.Addr{
			allowedName: {loopback}, wildName: {loopback}, "other.allowed.test": {loopback},
		}),
		HeaderTimeout: 2 * time.Second,
		IdleTimeout:   5 * time.Second,
	}
	pol := Policy{
		Sandbox: "sbx-test", Tool: "web-reader",
		Allow: []string{allowedName, "*.wild.test", rebindName, metaName, "other.allowed.test"},
		Ports: []int{e.up.httpPort, e.up.httpsPort},
	}
	for _, o := range opts {
		o(&pol, &cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.proxy = p
	listen := func(port int) Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return Listener{Listener: l, Port: port}
	}
	lh, lt, lp := listen(e.up.httpPort), listen(e.up.httpsPort), listen(0)
	e.httpAddr, e.tlsAddr, e.proxAddr = lh.Addr().String(), lt.Addr().String(), lp.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	g, err := p.Start(ctx, pol, lh, lt, lp)
	if err != nil {
		t.Fatal(err)
	}
	e.gate = g
	t.Cleanup(func() { g.Close() })
	return e
}

// transparentClient connects every request to the proxy, as a sandbox
// whose DNS answers the proxy's address does.
func (e *env) transparentClient() *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			_, port, _ := net.SplitHostPort(addr)
			to := e.httpAddr
			if port == strconv.Itoa(e.up.httpsPort) {
				to = e.tlsAddr
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", to)
		},
		TLSClientConfig: &tls.Config{RootCAs: e.up.roots},
		// The test counts connections; no pooling across requests.
		DisableKeepAlives: true,
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// proxyClient uses the proxy as its HTTP proxy: CONNECT for https,
// absolute-form requests for http.
func (e *env) proxyClient() *http.Client {
	tr := &http.Transport{
		Proxy:             http.ProxyURL(mustURL("http://" + e.proxAddr)),
		TLSClientConfig:   &tls.Config{RootCAs: e.up.roots},
		DisableKeepAlives: true,
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func mustURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return u
}
