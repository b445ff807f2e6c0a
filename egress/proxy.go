package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/internal/clip"
)

// BrokerName is the name under which code in a sandbox reaches the
// credential broker: http://broker.stockade.internal/v1/ops/{name}. The
// proxy serves it in-process (it is never resolved or dialed), and only for
// a Policy with a Broker.
const BrokerName = "broker.stockade.internal"

// Config configures a Proxy. Zero fields take the documented defaults.
type Config struct {
	// Resolver resolves allowed names; nil means net.DefaultResolver. The
	// proxy checks each address it returns (see Proxy).
	Resolver Resolver
	// TestOverride lets tests map names to loopback upstreams. It must be
	// nil outside tests; Validate refuses it there.
	TestOverride *TestOverride
	// OnDecision, if set, receives every Decision: refusals when they are
	// made, allowed connections when they end. It is called from the
	// connection's goroutine, concurrently for several connections, and
	// should return quickly. The daemon writes audit events from it.
	OnDecision func(Decision)
	// Logger receives, at Debug, one line per allowed connection and per
	// refusal, the first clip.MaxLines refusals of a Gate only, and one
	// line counting the others when the Gate closes; what the sandbox
	// chose (a name, a detail) is cut to a few hundred bytes. The daemon
	// logs refusals with their execution at Info from OnDecision. Nil
	// discards.
	Logger *slog.Logger

	// HeaderTimeout bounds reading the first request line and headers, the
	// TLS ClientHello, or a CONNECT request; zero means 10 s.
	HeaderTimeout time.Duration
	// DialTimeout bounds resolving and connecting upstream; zero means 10 s.
	DialTimeout time.Duration
	// IdleTimeout closes a connection on which no byte moved in either
	// direction for that long; zero means 60 s.
	IdleTimeout time.Duration
	// MaxConnDuration bounds a connection's whole life; zero means 15 min.
	MaxConnDuration time.Duration
	// MaxHeaderBytes bounds a request's headers or a ClientHello; zero means
	// 64 KiB.
	MaxHeaderBytes int
	// MaxBytes bounds the bytes of one connection in each direction; zero
	// means 1 GiB. A connection that reaches it is closed.
	MaxBytes int64
	// MaxConns bounds the concurrent connections of one Gate; zero means
	// 256. Connections over it are closed at once.
	MaxConns int
	// HostAddrs lists the host's own addresses, which are never dialed; nil
	// means the addresses of every interface, refreshed every 10 s.
	HostAddrs func() ([]netip.Addr, error)
}

// Validate checks cfg. It refuses a TestOverride outside a test binary.
func (c Config) Validate() error {
	if err := checkTestOverride(c.TestOverride); err != nil {
		return err
	}
	for _, d := range []time.Duration{c.HeaderTimeout, c.DialTimeout, c.IdleTimeout, c.MaxConnDuration} {
		if d < 0 {
			return errors.New("egress: timeouts must not be negative")
		}
	}
	if c.MaxHeaderBytes < 0 || c.MaxBytes < 0 || c.MaxConns < 0 {
		return errors.New("egress: limits must not be negative")
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.Resolver == nil {
		c.Resolver = net.DefaultResolver
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.HeaderTimeout, 10*time.Second)
	def(&c.DialTimeout, 10*time.Second)
	def(&c.IdleTimeout, 60*time.Second)
	def(&c.MaxConnDuration, 15*time.Minute)
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = 64 << 10
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = 1 << 30
	}
	if c.MaxConns == 0 {
		c.MaxConns = 256
	}
	if c.HostAddrs == nil {
		c.HostAddrs = interfaceAddrs
	}
}

// Proxy is Stockade's egress proxy. It serves each sandbox's policy on that
// sandbox's own listeners (a Gate). For every connection it learns the
// destination name without terminating anything (plain HTTP's Host header,
// TLS's SNI, a CONNECT target), checks it and the port against the
// sandbox's allowlist, resolves the name itself, refuses any address that
// is not public unicast or is the host's own, and dials exactly the address
// it checked, so DNS rebinding cannot slip a private address in between.
// It is safe for concurrent use.
type Proxy struct {
	cfg  Config
	host *hostAddrs
}

// New returns a proxy.
func New(cfg Config) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	return &Proxy{cfg: cfg, host: &hostAddrs{ttl: 10 * time.Second, list: cfg.HostAddrs}}, nil
}

// Policy is what one sandbox may reach: its tool's egress line, and the
// credential broker when the tool lists broker operations.
type Policy struct {
	// Sandbox and Tool identify the sandbox in Decisions.
	Sandbox string
	Tool    string
	// Allow and Ports are the tool record's egress allowlist (see
	// NewAllowlist). Nil allows nothing.
	Allow []string
	Ports []int
	// Broker serves http://broker.stockade.internal/ for this sandbox, in
	// process; it must already be limited to the operations the tool's
	// record lists (broker.Broker.Handler). Nil means the broker name is
	// refused like any other unlisted name.
	Broker http.Handler
}

// Listener is one listening socket of a Gate.
type Listener struct {
	net.Listener
	// Port is the destination port of transparent connections accepted on
	// the listener: TLS, and HTTP requests whose Host names no port. Zero
	// means the listener's own port, which is right when the sandbox's DNS
	// answers allowed names with the proxy's address and the proxy listens
	// there on each allowed port.
	Port int
}

func (l Listener) port() int {
	if l.Port != 0 {
		return l.Port
	}
	if a, ok := l.Addr().(*net.TCPAddr); ok {
		return a.Port
	}
	return 0
}

// Gate is the proxy serving one sandbox's Policy on its listeners. The
// caller must Close it when the sandbox ends.
type Gate struct {
	p     *Proxy
	pol   Policy
	allow *Allowlist
	ctx   context.Context
	stop  context.CancelFunc
	ls    []Listener

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup

	// refusalLines bounds the refusal lines of the gate's sandbox.
	refusalLines clip.Lines
}

// Start serves pol on ls until Close or until ctx is done. The Gate owns
// the listeners from now on, also when Start fails. The caller must Close
// it.
func (p *Proxy) Start(ctx context.Context, pol Policy, ls ...Listener) (*Gate, error) {
	allow, err := NewAllowlist(pol.Allow, pol.Ports)
	if err != nil {
		for _, l := range ls {
			l.Close()
		}
		return nil, fmt.Errorf("egress policy of sandbox %q: %w", pol.Sandbox, err)
	}
	ctx, stop := context.WithCancel(ctx)
	g := &Gate{p: p, pol: pol, allow: allow, ctx: ctx, stop: stop, ls: ls, conns: map[net.Conn]struct{}{}}
	// When ctx ends the listeners close: no connection is accepted only to
	// be refused (and reported) as the gate winds down.
	context.AfterFunc(ctx, func() {
		for _, l := range ls {
			l.Close()
		}
	})
	for _, l := range ls {
		g.wg.Add(1)
		go g.serve(l)
	}
	return g, nil
}

// Close stops the listeners, closes every connection and waits for their
// goroutines. It is idempotent.
func (g *Gate) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	for c := range g.conns {
		c.Close()
	}
	g.mu.Unlock()
	g.stop()
	for _, l := range g.ls {
		l.Close()
	}
	g.wg.Wait()
	if n := g.refusalLines.Suppressed(); n > 0 {
		g.p.cfg.Logger.Debug("egress refusals not logged one by one", "sandbox", g.pol.Sandbox, "tool", g.pol.Tool, "count", n)
	}
	return nil
}

func (g *Gate) serve(l Listener) {
	defer g.wg.Done()
	port := l.port()
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || g.ctx.Err() != nil {
				return
			}
			// EMFILE and friends: back off instead of spinning.
			g.p.cfg.Logger.Warn("egress proxy accept failed", "sandbox", g.pol.Sandbox, "err", err)
			select {
			case <-time.After(50 * time.Millisecond):
			case <-g.ctx.Done():
				return
			}
			continue
		}
		// The listener closes only some time after ctx ends (AfterFunc
		// runs on a goroutine of its own), and the kernel completes
		// handshakes until then: a connection accepted after the end is
		// closed unread and unreported, or its handler would report the
		// read its own end cut short as a malformed request.
		if g.ctx.Err() != nil {
			c.Close()
			return
		}
		if !g.track(c) {
			g.report(Decision{Reason: ReasonTooManyConns, Client: c.RemoteAddr().String(), Time: time.Now()})
			c.Close()
			continue
		}
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			defer g.untrack(c)
			g.handle(c, port)
		}()
	}
}

func (g *Gate) track(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || len(g.conns) >= g.p.cfg.MaxConns {
		return false
	}
	g.conns[c] = struct{}{}
	return true
}

func (g *Gate) untrack(c net.Conn) {
	g.mu.Lock()
	delete(g.conns, c)
	g.mu.Unlock()
}

// report completes d with the policy's identity and hands it on.
func (g *Gate) report(d Decision) {
	d.Sandbox, d.Tool = g.pol.Sandbox, g.pol.Tool
	if d.Allowed && d.Reason == "" {
		d.Reason = ReasonAllowed
	}
	if log := g.p.cfg.Logger; d.Allowed || g.refusalLines.Pass() {
		attrs := []any{"sandbox", d.Sandbox, "tool", d.Tool, "protocol", d.Protocol, "client", d.Client,
			"name", clip.String(d.Name, clip.Name), "port", d.Port}
		if d.Addr.IsValid() {
			attrs = append(attrs, "addr", d.Addr.String())
		}
		if d.Allowed {
			log.Debug("egress allowed", append(attrs, "bytes_up", d.BytesUp, "bytes_down", d.BytesDown, "duration", d.Duration)...)
		} else {
			log.Debug("egress refused", append(attrs, "reason", d.Reason, "detail", clip.String(d.Detail, clip.Detail))...)
		}
	}
	if f := g.p.cfg.OnDecision; f != nil {
		f(d)
	}
}

// conn is one client connection being handled.
type conn struct {
	g     *Gate
	c     net.Conn
	ic    *idleConn
	lim   *limitReader
	br    *bufio.Reader
	start time.Time
	d     Decision
}

func (g *Gate) handle(c net.Conn, port int) {
	defer c.Close()
	cfg := &g.p.cfg
	ctx, cancel := context.WithTimeout(g.ctx, cfg.MaxConnDuration)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()

	ic := &idleConn{Conn: c, idle: cfg.IdleTimeout}
	lim := &limitReader{r: ic, n: int64(cfg.MaxHeaderBytes)}
	cx := &conn{g: g, c: c, ic: ic, lim: lim, br: bufio.NewReaderSize(lim, 16<<10), start: time.Now()}
	cx.d = Decision{Client: c.RemoteAddr().String(), Port: port, Time: cx.start}

	ic.until = time.Now().Add(cfg.HeaderTimeout)
	first, err := cx.br.Peek(1)
	if err != nil {
		cx.d.Protocol = ProtoHTTP
		cx.refuse(readFailure(err), err.Error(), 0)
		return
	}
	if first[0] == 0x16 { // TLS handshake record
		cx.d.Protocol = ProtoTLS
		cx.handleTLS(ctx)
		return
	}
	cx.d.Protocol = ProtoHTTP
	cx.handleHTTP(ctx)
}

func readFailure(err error) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ReasonTimeout
	}
	return ReasonBadRequest
}

// refuse reports a refusal and, for HTTP and CONNECT, answers the client
// with status (zero answers nothing: TLS clients get a closed connection).
func (cx *conn) refuse(reason, detail string, status int) {
	cx.d.Allowed, cx.d.Reason, cx.d.Detail = false, reason, detail
	cx.d.Duration = time.Since(cx.start)
	cx.g.report(cx.d)
	if status != 0 {
		body := "stockade egress: " + reason + "\n"
		_ = cx.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(cx.c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Stockade-Egress: refused\r\n\r\n%s",
			status, http.StatusText(status), len(body), body)
	}
}

// check applies the allowlist to host (as the client sent it) and port.
// It fills the decision's name and port and returns a refusal reason, or "".
func (cx *conn) check(host string, port int) (name, reason string) {
	cx.d.Name, cx.d.Port = host, port
	if isIPLiteral(host) {
		return "", ReasonIPLiteral
	}
	name, ok := CanonicalName(host)
	if !ok {
		return "", ReasonBadName
	}
	cx.d.Name = name
	if !cx.g.allow.AllowsName(name) {
		return "", ReasonNameNotAllowed
	}
	if !cx.g.allow.AllowsPort(port) {
		return "", ReasonPortNotAllowed
	}
	return name, ""
}

// dial resolves name and connects to the first permitted address. It
// returns a refusal reason and detail on failure.
func (cx *conn) dial(ctx context.Context, name string, port int) (net.Conn, string, string) {
	cfg := &cx.g.p.cfg
	connCtx := ctx
	ctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	addrs, overridden := cfg.TestOverride.lookup(name)
	if !overridden {
		var err error
		// The name is absolute: a relative one would be tried with the
		// host's search domains too (an allowed name under a corporate
		// zone would reach whatever that zone answers).
		addrs, err = cfg.Resolver.LookupNetIP(ctx, "ip", name+".")
		if err != nil || len(addrs) == 0 {
			return nil, ReasonNoSuchName, fmt.Sprint(err)
		}
	}
	// IPv4 first: most hosts have no IPv6 route out.
	slices.SortStableFunc(addrs, func(a, b netip.Addr) int {
		return boolInt(a.Unmap().Is6()) - boolInt(b.Unmap().Is6())
	})
	own := cx.g.p.host.get()
	var permitted []netip.Addr
	var firstWhy string
	for _, a := range addrs {
		a = a.Unmap()
		if why := classify(a, own); why != "" && !overridden {
			if firstWhy == "" {
				firstWhy = a.String() + " is " + why
				cx.d.Addr = a
			}
			continue
		}
		permitted = append(permitted, a)
	}
	if len(permitted) == 0 {
		return nil, ReasonPrivateAddress, firstWhy
	}
	cx.d.Addr = netip.Addr{}
	d := net.Dialer{
		// The address is checked once more at connect time, on the very
		// sockaddr the kernel gets.
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return err
			}
			if !slices.Contains(permitted, ap.Addr().Unmap()) {
				return fmt.Errorf("egress: refusing to dial unchecked address %s", ap)
			}
			return nil
		},
	}
	var lastErr error
	for _, a := range permitted[:min(len(permitted), 4)] {
		up, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String())
		if err == nil {
			cx.d.Addr = a
			// The upstream is closed when the connection's context ends
			// (the gate closes, MaxConnDuration, the handler returns), as
			// the client is: a copy waiting on either side then ends,
			// and Gate.Close does not wait for a silent upstream.
			context.AfterFunc(connCtx, func() { up.Close() })
			return up, "", ""
		}
		lastErr = err
	}
	return nil, ReasonUpstreamFailed, lastErr.Error()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// endHeaders lifts the header-phase bounds: from here the connection is
// bounded by MaxBytes, IdleTimeout and MaxConnDuration.
func (cx *conn) endHeaders() {
	cx.ic.until = time.Time{}
	cx.lim.n = cx.g.p.cfg.MaxBytes
}

// finish reports an allowed connection that has ended.
func (cx *conn) finish(up, down int64) {
	cx.d.Allowed = true
	cx.d.BytesUp, cx.d.BytesDown = up, down
	cx.d.Duration = time.Since(cx.start)
	cx.g.report(cx.d)
}

func (cx *conn) handleTLS(ctx context.Context) {
	sni, hello, err := readClientHello(cx.br)
	if err != nil {
		cx.refuse(readFailure(err), "reading TLS ClientHello: "+err.Error(), 0)
		return
	}
	if sni == "" {
		cx.refuse(ReasonNoSNI, "", 0)
		return
	}
	name, why := cx.check(sni, cx.d.Port)
	if why != "" {
		cx.refuse(why, "", 0)
		return
	}
	up, why, detail := cx.dial(ctx, name, cx.d.Port)
	if why != "" {
		cx.refuse(why, detail, 0)
		return
	}
	defer up.Close()
	cx.endHeaders()
	upc := &idleConn{Conn: up, idle: cx.g.p.cfg.IdleTimeout}
	if _, err := upc.Write(hello); err != nil {
		cx.finish(0, 0)
		return
	}
	n1, n2 := splice(cx.ic, cx.br, upc, cx.g.p.cfg.MaxBytes, cx.g.p.cfg.IdleTimeout)
	cx.finish(n1+int64(len(hello)), n2)
}

func (cx *conn) handleHTTP(ctx context.Context) {
	req, err := http.ReadRequest(cx.br)
	if err != nil {
		cx.refuse(readFailure(err), "reading HTTP request: "+err.Error(), http.StatusBadRequest)
		return
	}
	if req.Method == http.MethodConnect {
		cx.d.Protocol = ProtoConnect
		cx.handleConnect(ctx, req)
		return
	}
	defaultPort := cx.d.Port
	if req.URL.IsAbs() {
		// Absolute form: the client treats us as its HTTP proxy.
		if req.URL.Scheme != "http" {
			cx.refuse(ReasonUnsupported, "absolute-form request for scheme "+req.URL.Scheme+"; use CONNECT for https", http.StatusBadRequest)
			return
		}
		defaultPort = 80
	}
	if req.Host == "" {
		cx.refuse(ReasonNoHost, "", http.StatusBadRequest)
		return
	}
	host, port, err := splitHostPort(req.Host, defaultPort)
	if err != nil {
		cx.d.Name = req.Host
		cx.refuse(ReasonBadName, err.Error(), http.StatusBadRequest)
		return
	}
	if c, _ := CanonicalName(host); c == BrokerName {
		cx.serveBroker(ctx, req)
		return
	}
	up, _, ok := cx.checkAndDial(ctx, host, port)
	if !ok {
		return
	}
	defer up.Close()
	cx.endHeaders()
	// One request per connection: every request's Host is checked, and a
	// client that keeps the connection alive simply opens another.
	for _, h := range hopHeaders {
		req.Header.Del(h)
	}
	req.Close = true
	upc := &idleConn{Conn: up, idle: cx.g.p.cfg.IdleTimeout}
	cw := &countWriter{w: upc}
	if err := req.Write(cw); err != nil {
		cx.finish(cw.n, 0)
		return
	}
	down, _ := copyBounded(cx.ic, upc, cx.g.p.cfg.MaxBytes, nil, 0)
	cx.finish(cw.n, down)
}

// checkAndDial checks host:port against the allowlist and dials it,
// returning the connection and the canonical name checked; or it answers
// the client with the refusal (403 for a policy refusal, 502 when the
// upstream cannot be reached) and returns false.
func (cx *conn) checkAndDial(ctx context.Context, host string, port int) (net.Conn, string, bool) {
	name, why := cx.check(host, port)
	if why != "" {
		cx.refuse(why, "", http.StatusForbidden)
		return nil, "", false
	}
	up, why, detail := cx.dial(ctx, name, port)
	if why != "" {
		status := http.StatusForbidden
		if why == ReasonUpstreamFailed || why == ReasonNoSuchName {
			status = http.StatusBadGateway
		}
		cx.refuse(why, detail, status)
		return nil, "", false
	}
	return up, name, true
}

// hopHeaders are the hop-by-hop headers a proxy must not forward.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Upgrade"}

func (cx *conn) handleConnect(ctx context.Context, req *http.Request) {
	host, portStr, err := net.SplitHostPort(req.RequestURI)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil || port < 1 || port > 65535 {
		cx.d.Name = req.RequestURI
		cx.refuse(ReasonBadRequest, "CONNECT target must be host:port", http.StatusBadRequest)
		return
	}
	up, name, ok := cx.checkAndDial(ctx, host, port)
	if !ok {
		return
	}
	defer up.Close()
	if _, err := cx.ic.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		return
	}
	cfg := &cx.g.p.cfg
	upc := &idleConn{Conn: up, idle: cfg.IdleTimeout}
	// The server may speak first (SSH, SMTP): its bytes flow at once. The
	// client's first bytes, if they are a TLS ClientHello, must name the
	// CONNECT name, so that a tunnel to an allowed name cannot carry a
	// handshake for another name served from the same address.
	act := &activity{}
	act.touch()
	var down int64
	downDone := make(chan struct{})
	go func() {
		defer close(downDone)
		var err error
		if down, err = copyBounded(cx.ic, upc, cfg.MaxBytes, act, cfg.IdleTimeout); err != nil {
			cx.c.Close()
			up.Close()
			return
		}
		closeWrite(cx.c)
	}()
	refuse := func(reason, detail string) {
		up.Close()
		<-downDone
		cx.refuse(reason, detail, 0)
	}
	var hello []byte
	cx.ic.until = time.Now().Add(cfg.HeaderTimeout)
	if b, err := cx.br.Peek(1); err == nil && b[0] == 0x16 {
		sni, raw, err := readClientHello(cx.br)
		if err != nil {
			refuse(readFailure(err), "reading TLS ClientHello in CONNECT tunnel: "+err.Error())
			return
		}
		if c, _ := CanonicalName(sni); sni != "" && c != name {
			refuse(ReasonSNIMismatch, "SNI "+sni)
			return
		}
		hello = raw
	}
	cx.endHeaders()
	var upN int64
	if _, err = upc.Write(hello); err == nil {
		upN, err = copyBounded(upc, cx.br, cfg.MaxBytes-int64(len(hello)), act, cfg.IdleTimeout)
	}
	if err != nil {
		cx.c.Close()
		up.Close()
	} else {
		closeWrite(up)
	}
	<-downDone
	cx.finish(upN+int64(len(hello)), down)
}

// serveBroker answers a request for BrokerName with the policy's broker,
// in process. One request per connection, like every plain HTTP request.
func (cx *conn) serveBroker(ctx context.Context, req *http.Request) {
	cx.d.Protocol, cx.d.Name = ProtoBroker, BrokerName
	if cx.g.pol.Broker == nil {
		cx.refuse(ReasonNameNotAllowed, "the tool's record lists no broker operations", http.StatusForbidden)
		return
	}
	// The request body, like the headers, must arrive within the header
	// timeout and is bounded.
	cx.lim.n = maxBrokerRequest
	req.RemoteAddr = cx.d.Client
	rw := &bufferedResponse{header: http.Header{}, max: maxBrokerResponse}
	cx.g.pol.Broker.ServeHTTP(rw, req.WithContext(ctx))
	if rw.code == 0 {
		rw.code = http.StatusOK
	}
	if rw.over {
		rw.code, rw.header = http.StatusBadGateway, http.Header{}
		rw.buf.Reset()
		rw.buf.WriteString("stockade broker: response too large\n")
	}
	resp := &http.Response{
		StatusCode: rw.code, ProtoMajor: 1, ProtoMinor: 1, Header: rw.header,
		Body: io.NopCloser(&rw.buf), ContentLength: int64(rw.buf.Len()), Close: true, Request: req,
	}
	cw := &countWriter{w: cx.ic}
	_ = resp.Write(cw)
	cx.finish(0, cw.n)
}

// Bounds of a broker exchange.
const (
	maxBrokerRequest  = 1 << 20
	maxBrokerResponse = 16 << 20
)

// splitHostPort splits "host[:port]" (with brackets around IPv6), taking
// def when no port is given.
func splitHostPort(hostport string, def int) (string, int, error) {
	host, portStr, err := net.SplitHostPort(hostport)
	if err != nil {
		// No port (or a bare IPv6 address, which the check refuses anyway).
		return hostport, def, nil
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("invalid port in %q", hostport)
	}
	return host, port, nil
}
