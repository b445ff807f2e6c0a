package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/stockade-sh/stockade/egress"
)

// BrokerPort is the port on which the proxy serves the credential broker
// (http://broker.stockade.internal/).
const BrokerPort = 80

// Egress is everything on the host that one sandbox with egress uses: its
// namespace and rules (Net), and the egress proxy and DNS responder serving
// its policy on the host end of its veth. The caller must Close it.
type Egress struct {
	*Net
	// ResolvConf is the sandbox's /etc/resolv.conf: the DNS responder on
	// the host end, and nothing else.
	ResolvConf []byte
	// Ports are the TCP ports the proxy listens on, and the only ones the
	// rules let through besides DNS.
	Ports []uint16

	gate    *egress.Gate
	dns     *egress.DNS
	stopped sync.Once
	once    sync.Once
	err     error
}

// OpenEgress prepares a sandbox's network for pol: a namespace whose rules
// let through only DNS and the proxy's ports, the proxy listening on the
// host end on each port of pol.Ports (and BrokerPort when pol.Broker is
// set), and the DNS responder there answering pol.Allow (and the broker's
// name) with the host end's address. The proxy and the responder serve
// until Close or until ctx is done; on error nothing is left.
//
// userNS makes the namespace belong to a user namespace of its own (see
// Options.UserNamespace).
func (m *Manager) OpenEgress(ctx context.Context, p *egress.Proxy, pol egress.Policy, userNS bool) (*Egress, error) {
	return m.OpenEgressWith(ctx, p, pol, Options{UserNamespace: userNS})
}

// OpenEgressWith is OpenEgress with the network's options o (UserNamespace,
// Kept); its ProxyPorts are pol's.
func (m *Manager) OpenEgressWith(ctx context.Context, p *egress.Proxy, pol egress.Policy, o Options) (*Egress, error) {
	ports, err := m.portsOf(pol)
	if err != nil {
		return nil, err
	}
	o.ProxyPorts = ports
	n, err := m.Create(ctx, o)
	if err != nil {
		return nil, err
	}
	return m.serve(ctx, p, pol, n, ports)
}

// ServeEgress serves pol again on n, a kept network a restarted daemon
// adopted (Adopt): the proxy and the DNS responder listen on its host end
// as OpenEgress's do. The rules are those n was made with: a port that
// pol adds since is not let through. On error n is removed.
func (m *Manager) ServeEgress(ctx context.Context, p *egress.Proxy, pol egress.Policy, n *Net) (*Egress, error) {
	ports, err := m.portsOf(pol)
	if err != nil {
		_ = n.Remove()
		return nil, err
	}
	return m.serve(ctx, p, pol, n, ports)
}

// portsOf are the TCP ports the proxy listens on for pol.
func (m *Manager) portsOf(pol egress.Policy) ([]uint16, error) {
	var ports []uint16
	for _, port := range pol.Ports {
		if port < 1 || port > 65535 {
			return nil, fmt.Errorf("egress port %d is out of range", port)
		}
		if port == int(m.cfg.DNSPort) {
			return nil, fmt.Errorf("egress port %d is the sandbox's DNS responder; an allowlist cannot name it", port)
		}
		ports = append(ports, uint16(port))
	}
	if pol.Broker != nil {
		ports = append(ports, BrokerPort)
	}
	slices.Sort(ports)
	ports = slices.Compact(ports)
	if len(ports) == 0 {
		return nil, errors.New("an egress policy needs at least one port or a broker")
	}
	return ports, nil
}

// serve starts the proxy on ports and the DNS responder on n's host end,
// for pol; on error n is removed.
func (m *Manager) serve(ctx context.Context, p *egress.Proxy, pol egress.Policy, n *Net, ports []uint16) (_ *Egress, err error) {
	e := &Egress{Net: n, Ports: ports,
		ResolvConf: []byte("nameserver " + n.HostAddr.String() + "\noptions ndots:0 attempts:2 timeout:2\n")}
	defer func() {
		if err != nil {
			_ = e.Close()
		}
	}()
	var ls []egress.Listener
	for _, port := range ports {
		l, err := net.Listen("tcp", netip.AddrPortFrom(n.HostAddr, port).String())
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			return nil, fmt.Errorf("listening for the egress proxy: %w", err)
		}
		ls = append(ls, egress.Listener{Listener: l})
	}
	if e.gate, err = p.Start(ctx, pol, ls...); err != nil {
		return nil, err
	}
	dnsAddr := netip.AddrPortFrom(n.HostAddr, m.cfg.DNSPort).String()
	udp, err := net.ListenPacket("udp", dnsAddr)
	if err != nil {
		return nil, fmt.Errorf("listening for DNS: %w", err)
	}
	tcp, err := net.Listen("tcp", dnsAddr)
	if err != nil {
		udp.Close()
		return nil, fmt.Errorf("listening for DNS: %w", err)
	}
	e.dns, err = p.ServeDNS(ctx, egress.DNSConfig{Sandbox: pol.Sandbox, Tool: pol.Tool, Allow: pol.Allow, Broker: pol.Broker != nil, Answer: n.HostAddr}, udp, tcp)
	if err != nil {
		return nil, err
	}
	return e, nil
}

// Stop stops the proxy and the responder and returns once the requests
// they were serving are decided (each decision reaches the proxy's and the
// responder's observers before): their connections, to the sandbox and
// upstream, are closed, so it does not wait for a slow upstream. It is
// idempotent; the namespace, veth and rules stay until Close.
func (e *Egress) Stop() {
	e.stopped.Do(func() {
		if e.gate != nil {
			e.gate.Close()
		}
		if e.dns != nil {
			e.dns.Close()
		}
	})
}

// Close stops the proxy and the responder, then removes the namespace,
// veth and rules (see Net.Remove for its cost). It is idempotent.
func (e *Egress) Close() error {
	e.once.Do(func() {
		e.Stop()
		e.err = e.Net.Remove()
	})
	return e.err
}
