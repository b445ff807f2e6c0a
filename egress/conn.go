package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"syscall"
	"time"
)

// This file holds one client connection of a Gate: its check against the
// policy, its dial, and the TLS, HTTP, CONNECT and broker handlers.

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
