package egress

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// forbiddenRange is a block of addresses the proxy never dials, and why.
type forbiddenRange struct {
	prefix netip.Prefix
	what   string
}

// forbidden lists every range that is not the public internet. The proxy
// checks the address it is about to dial (never only the name), so a name
// that resolves, or is re-bound, to one of these is refused.
var forbidden = func() []forbiddenRange {
	rs := []struct{ p, what string }{
		{"0.0.0.0/8", "this-network (0.0.0.0/8)"},
		{"10.0.0.0/8", "private (RFC 1918)"},
		{"100.64.0.0/10", "carrier-grade NAT (100.64.0.0/10)"},
		{"127.0.0.0/8", "loopback"},
		{"169.254.0.0/16", "link-local (169.254.0.0/16, cloud metadata)"},
		{"172.16.0.0/12", "private (RFC 1918)"},
		{"192.0.0.0/24", "IETF protocol assignments (192.0.0.0/24)"},
		{"192.0.2.0/24", "documentation (TEST-NET-1)"},
		{"192.88.99.0/24", "6to4 relay anycast"},
		{"192.168.0.0/16", "private (RFC 1918)"},
		{"198.18.0.0/15", "benchmarking (198.18.0.0/15)"},
		{"198.51.100.0/24", "documentation (TEST-NET-2)"},
		{"203.0.113.0/24", "documentation (TEST-NET-3)"},
		{"224.0.0.0/4", "multicast"},
		{"240.0.0.0/4", "reserved (240.0.0.0/4) or broadcast"},
		{"::/128", "unspecified"},
		{"::1/128", "loopback"},
		{"::/96", "IPv4-compatible IPv6 (deprecated)"},
		{"100::/64", "discard-only (100::/64)"},
		{"2001::/23", "IETF protocol assignments (2001::/23, incl. Teredo)"},
		{"2001:db8::/32", "documentation (2001:db8::/32)"},
		{"3fff::/20", "documentation (3fff::/20)"},
		{"5f00::/16", "segment routing SIDs (5f00::/16)"},
		{"fc00::/7", "unique local (IPv6 ULA)"},
		{"fe80::/10", "link-local (IPv6)"},
		{"fec0::/10", "site-local (IPv6, deprecated)"},
		{"ff00::/8", "multicast"},
	}
	out := make([]forbiddenRange, len(rs))
	for i, r := range rs {
		out[i] = forbiddenRange{netip.MustParsePrefix(r.p), r.what}
	}
	return out
}()

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	nat64L    = netip.MustParsePrefix("64:ff9b:1::/48")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// classify returns why a must not be dialed, or "" when it is a public
// unicast address that is not one of the host's own. IPv4-mapped IPv6 is
// judged as the IPv4 address it carries; NAT64 and 6to4 addresses as the
// IPv4 address they embed.
func classify(a netip.Addr, own []netip.Addr) string {
	if !a.IsValid() {
		return "invalid address"
	}
	a = a.Unmap()
	if a.Zone() != "" {
		return "scoped (zoned) address"
	}
	b := a.As16()
	switch {
	case nat64.Contains(a):
		if why := classify(netip.AddrFrom4([4]byte(b[12:16])), own); why != "" {
			return "NAT64 of " + why
		}
	case nat64L.Contains(a):
		return "local-use NAT64 (64:ff9b:1::/48)"
	case sixToFour.Contains(a):
		if why := classify(netip.AddrFrom4([4]byte(b[2:6])), own); why != "" {
			return "6to4 of " + why
		}
	}
	for _, r := range forbidden {
		if r.prefix.Contains(a) {
			return r.what
		}
	}
	if !a.IsGlobalUnicast() {
		return "not global unicast"
	}
	for _, o := range own {
		if o.Unmap() == a {
			return "one of this host's own addresses"
		}
	}
	return ""
}

// hostAddrs caches the host's own interface addresses. Interfaces come and
// go (every sandbox adds a veth), so the list is refreshed after ttl.
type hostAddrs struct {
	ttl  time.Duration
	list func() ([]netip.Addr, error)

	mu   sync.Mutex
	at   time.Time
	addr []netip.Addr
}

func (h *hostAddrs) get() []netip.Addr {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.addr == nil || time.Since(h.at) > h.ttl {
		if as, err := h.list(); err == nil {
			h.addr, h.at = as, time.Now()
		}
	}
	return h.addr
}

// interfaceAddrs lists the addresses of every interface of the host.
func interfaceAddrs() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(as))
	for _, a := range as {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out, nil
}
