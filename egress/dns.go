package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/stockade-sh/stockade/internal/clip"
)

// DNSConfig configures the DNS responder of one sandbox.
type DNSConfig struct {
	// Sandbox and Tool identify the sandbox in Decisions.
	Sandbox string
	Tool    string
	// Allow is the tool record's egress allowlist (names only; see
	// NewAllowlist). Nil answers nothing but BrokerName when Broker is set.
	Allow []string
	// Broker answers BrokerName too: set it when the tool lists broker
	// operations.
	Broker bool
	// Answer is the IPv4 address every allowed name resolves to: the
	// proxy's address on the sandbox's link, so that every connection goes
	// to the proxy. Required.
	Answer netip.Addr
	// AnswerV6 answers AAAA questions; the zero value answers them with no
	// record (the sandbox has no IPv6 route), so clients fall back to A.
	AnswerV6 netip.Addr
	// TTL of the answers; zero means 30 s.
	TTL time.Duration
	// OnDecision receives one Decision per refused question (Protocol
	// ProtoDNS). Called concurrently; should return quickly.
	OnDecision func(Decision)
	// Logger receives, at Debug, one line per refused question, the first
	// clip.MaxLines only, and one line counting the others at Close; nil
	// discards.
	Logger *slog.Logger
	// MaxTCPConns bounds concurrent TCP connections; zero means 16.
	MaxTCPConns int
}

// DNS is a DNS responder for one sandbox. It is authoritative for
// everything: it answers A (and AAAA, when configured) questions for
// allowed names with the proxy's address, gives allowed names no other
// record type, answers NXDOMAIN for every other name, and never sends a
// query anywhere, so a lookup cannot carry data out of the sandbox. The
// caller must Close it.
type DNS struct {
	cfg   DNSConfig
	allow *Allowlist
	ctx   context.Context
	stop  context.CancelFunc
	udp   net.PacketConn
	tcp   net.Listener
	wg    sync.WaitGroup
	slots chan struct{}

	mu    sync.Mutex
	conns map[net.Conn]struct{}

	refusalLines clip.Lines
	logged       atomic.Bool // the count of refusals not logged
}

// ServeDNS serves cfg on udp and tcp (either may be nil) until Close or
// until ctx is done. The DNS owns the sockets from now on, also on error.
func ServeDNS(ctx context.Context, cfg DNSConfig, udp net.PacketConn, tcp net.Listener) (*DNS, error) {
	fail := func(err error) (*DNS, error) {
		if udp != nil {
			udp.Close()
		}
		if tcp != nil {
			tcp.Close()
		}
		return nil, err
	}
	if !cfg.Answer.Is4() {
		return fail(fmt.Errorf("egress DNS of sandbox %q: Answer must be an IPv4 address", cfg.Sandbox))
	}
	if cfg.AnswerV6.IsValid() && !cfg.AnswerV6.Is6() {
		return fail(fmt.Errorf("egress DNS of sandbox %q: AnswerV6 must be an IPv6 address", cfg.Sandbox))
	}
	allow, err := NewAllowlist(cfg.Allow, nil)
	if err != nil {
		return fail(fmt.Errorf("egress DNS of sandbox %q: %w", cfg.Sandbox, err))
	}
	if cfg.TTL == 0 {
		cfg.TTL = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxTCPConns == 0 {
		cfg.MaxTCPConns = 16
	}
	ctx, stop := context.WithCancel(ctx)
	d := &DNS{cfg: cfg, allow: allow, ctx: ctx, stop: stop, udp: udp, tcp: tcp,
		slots: make(chan struct{}, cfg.MaxTCPConns), conns: map[net.Conn]struct{}{}}
	if udp != nil {
		d.wg.Add(1)
		go d.serveUDP()
	}
	if tcp != nil {
		d.wg.Add(1)
		go d.serveTCP()
	}
	// Closing the sockets is what unblocks the loops when ctx ends.
	context.AfterFunc(ctx, d.closeSockets)
	return d, nil
}

// Close stops serving and waits for the responder's goroutines. It is
// idempotent.
func (d *DNS) Close() error {
	d.stop()
	d.closeSockets()
	d.wg.Wait()
	if n := d.refusalLines.Suppressed(); n > 0 && d.logged.CompareAndSwap(false, true) {
		d.cfg.Logger.Debug("egress DNS refusals not logged one by one", "sandbox", d.cfg.Sandbox, "tool", d.cfg.Tool, "count", n)
	}
	return nil
}

func (d *DNS) closeSockets() {
	if d.udp != nil {
		d.udp.Close()
	}
	if d.tcp != nil {
		d.tcp.Close()
	}
	d.mu.Lock()
	for c := range d.conns {
		c.Close()
	}
	d.mu.Unlock()
}

func (d *DNS) serveUDP() {
	defer d.wg.Done()
	buf := make([]byte, 65535)
	for {
		n, from, err := d.udp.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) || d.ctx.Err() != nil {
				return
			}
			continue
		}
		if resp := d.answer(buf[:n], from.String()); resp != nil {
			_, _ = d.udp.WriteTo(resp, from)
		}
	}
}

func (d *DNS) serveTCP() {
	defer d.wg.Done()
	for {
		c, err := d.tcp.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || d.ctx.Err() != nil {
				return
			}
			select {
			case <-time.After(50 * time.Millisecond):
			case <-d.ctx.Done():
				return
			}
			continue
		}
		select {
		case d.slots <- struct{}{}:
		default:
			c.Close()
			continue
		}
		d.mu.Lock()
		d.conns[c] = struct{}{}
		d.mu.Unlock()
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			defer func() { <-d.slots }()
			defer func() {
				d.mu.Lock()
				delete(d.conns, c)
				d.mu.Unlock()
				c.Close()
			}()
			d.serveConn(c)
		}()
	}
}

// tcpMaxQueries bounds the queries of one TCP connection.
const tcpMaxQueries = 100

func (d *DNS) serveConn(c net.Conn) {
	var lenBuf [2]byte
	buf := make([]byte, 65535)
	for range tcpMaxQueries {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(c, lenBuf[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(lenBuf[:]))
		if _, err := io.ReadFull(c, buf[:n]); err != nil {
			return
		}
		resp := d.answer(buf[:n], c.RemoteAddr().String())
		if resp == nil {
			return
		}
		out := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(resp)), uint16(len(resp)))
		if _, err := c.Write(append(out, resp...)); err != nil {
			return
		}
	}
}

// answer builds the response to one query, or returns nil to drop it (it
// is not a query at all).
func (d *DNS) answer(query []byte, client string) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	rh := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, Authoritative: true, RecursionDesired: h.RecursionDesired}
	qs, err := p.AllQuestions()
	var q dnsmessage.Question
	switch {
	case h.OpCode != 0:
		rh.RCode = dnsmessage.RCodeNotImplemented
	case err != nil || len(qs) != 1:
		rh.RCode = dnsmessage.RCodeFormatError
	default:
		q = qs[0]
		rh.RCode = dnsmessage.RCodeSuccess
		host := q.Name.String()
		name, ok := CanonicalName(host)
		allowed := ok && (d.allow.AllowsName(name) || d.cfg.Broker && name == BrokerName)
		if !allowed || q.Class != dnsmessage.ClassINET {
			rh.RCode = dnsmessage.RCodeNameError
			if name == "" {
				name = host
			}
			d.refused(name, q.Type, client)
		}
	}
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), rh)
	b.EnableCompression()
	if len(qs) == 1 {
		_ = b.StartQuestions()
		_ = b.Question(q)
	}
	if rh.RCode == dnsmessage.RCodeSuccess && len(qs) == 1 {
		_ = b.StartAnswers()
		hdr := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: uint32(d.cfg.TTL / time.Second)}
		switch {
		case q.Type == dnsmessage.TypeA:
			_ = b.AResource(hdr, dnsmessage.AResource{A: d.cfg.Answer.As4()})
		case q.Type == dnsmessage.TypeAAAA && d.cfg.AnswerV6.IsValid():
			_ = b.AAAAResource(hdr, dnsmessage.AAAAResource{AAAA: d.cfg.AnswerV6.As16()})
		}
	}
	resp, err := b.Finish()
	if err != nil {
		return nil
	}
	return resp
}

func (d *DNS) refused(name string, t dnsmessage.Type, client string) {
	dec := Decision{
		Reason: ReasonNameNotAllowed, Detail: "NXDOMAIN for " + t.String(),
		Sandbox: d.cfg.Sandbox, Tool: d.cfg.Tool, Protocol: ProtoDNS, Client: client, Name: name, Port: 53, Time: time.Now(),
	}
	if d.refusalLines.Pass() {
		d.cfg.Logger.Debug("egress DNS refused", "sandbox", dec.Sandbox, "tool", dec.Tool, "client", client, "name", clip.String(name, clip.Name), "type", t.String())
	}
	if f := d.cfg.OnDecision; f != nil {
		f(dec)
	}
}

// ServeDNS is the package's ServeDNS with the proxy's OnDecision and
// Logger where cfg sets none, so that one sandbox's proxy and DNS refusals
// go to the same place.
func (p *Proxy) ServeDNS(ctx context.Context, cfg DNSConfig, udp net.PacketConn, tcp net.Listener) (*DNS, error) {
	if cfg.OnDecision == nil {
		cfg.OnDecision = p.cfg.OnDecision
	}
	if cfg.Logger == nil {
		cfg.Logger = p.cfg.Logger
	}
	return ServeDNS(ctx, cfg, udp, tcp)
}
