package egress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
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
