package egress

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// startDNS serves a responder on loopback UDP and TCP and returns its
// address.
func startDNS(t *testing.T, cfg DNSConfig) string {
	t.Helper()
	// The TCP listener takes the UDP listener's port number, which another
	// process may hold for TCP: try a few ports.
	var (
		udp net.PacketConn
		tcp net.Listener
		err error
	)
	for try := 0; try < 20; try++ {
		if udp, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if tcp, err = net.Listen("tcp", udp.LocalAddr().String()); err == nil {
			break
		}
		udp.Close()
	}
	if err != nil {
		t.Fatalf("no port free for both UDP and TCP: %v", err)
	}
	d, err := ServeDNS(context.Background(), cfg, udp, tcp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return udp.LocalAddr().String()
}

// query sends one question over network ("udp" or "tcp") and parses the
// answer.
func query(t *testing.T, network, addr, name string, typ dnsmessage.Type) (dnsmessage.RCode, []dnsmessage.Resource) {
	t.Helper()
	q := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: 4242, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}},
	}
	b, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout(network, addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if network == "tcp" {
		b = append([]byte{byte(len(b) >> 8), byte(len(b))}, b...)
	}
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("%s query for %s: %v", network, name, err)
	}
	if network == "tcp" {
		buf, n = buf[2:], n-2
	}
	var m dnsmessage.Message
	if err := m.Unpack(buf[:n]); err != nil {
		t.Fatal(err)
	}
	if m.ID != 4242 || !m.Response || !m.Authoritative {
		t.Fatalf("header %+v, want an authoritative response to id 4242", m.Header)
	}
	return m.RCode, m.Answers
}

func TestDNS(t *testing.T) {
	proxy := netip.MustParseAddr("10.213.0.1")
	rec := &recorder{}
	addr := startDNS(t, DNSConfig{
		Sandbox: "sbx-test", Tool: "web-reader", Allow: []string{allowedName, "*.wild.test"},
		Broker: true, Answer: proxy, OnDecision: rec.add,
	})
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			for _, tc := range []struct {
				name  string
				typ   dnsmessage.Type
				rcode dnsmessage.RCode
				a     bool
			}{
				{allowedName + ".", dnsmessage.TypeA, dnsmessage.RCodeSuccess, true},
				{"API.Allowed.TEST.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, true},
				{"deep.x.wild.test.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, true},
				{BrokerName + ".", dnsmessage.TypeA, dnsmessage.RCodeSuccess, true},
				{allowedName + ".", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, false},
				{allowedName + ".", dnsmessage.TypeTXT, dnsmessage.RCodeSuccess, false},
				{"wild.test.", dnsmessage.TypeA, dnsmessage.RCodeNameError, false},
				{otherName + ".", dnsmessage.TypeA, dnsmessage.RCodeNameError, false},
				{"example.com.", dnsmessage.TypeAAAA, dnsmessage.RCodeNameError, false},
			} {
				t.Run(tc.name+tc.typ.String(), func(t *testing.T) {
					rcode, ans := query(t, network, addr, tc.name, tc.typ)
					if rcode != tc.rcode {
						t.Fatalf("rcode = %v, want %v", rcode, tc.rcode)
					}
					if tc.a {
						if len(ans) != 1 || ans[0].Body.(*dnsmessage.AResource).A != proxy.As4() {
							t.Fatalf("answers = %v, want one A record with the proxy's address", ans)
						}
					} else if len(ans) != 0 {
						t.Fatalf("answers = %v, want none", ans)
					}
				})
			}
		})
	}
	rec.wait(t, "DNS refusal", func(d Decision) bool {
		return d.Protocol == ProtoDNS && d.Name == otherName && d.Reason == ReasonNameNotAllowed && d.Sandbox == "sbx-test"
	})
}

// TestDNSNeverForwards asks for a random label: the answer is NXDOMAIN and
// no resolver (neither the proxy's nor the test override) is consulted.
// The responder has no upstream to forward to at all; the counting
// resolver proves that the proxy sharing the sandbox's policy was not
// consulted either.
func TestDNSNeverForwards(t *testing.T) {
	e := newEnv(t)
	addr := startDNS(t, DNSConfig{Allow: []string{allowedName}, Answer: netip.MustParseAddr("10.213.0.1")})
	var b [8]byte
	_, _ = rand.Read(b[:])
	label := hex.EncodeToString(b[:]) + ".example.com."
	for _, network := range []string{"udp", "tcp"} {
		if rcode, ans := query(t, network, addr, label, dnsmessage.TypeA); rcode != dnsmessage.RCodeNameError || len(ans) != 0 {
			t.Fatalf("%s %s: rcode %v answers %v, want NXDOMAIN", network, label, rcode, ans)
		}
	}
	if n := e.res.calls.Load(); n != 0 {
		t.Fatalf("resolver called %d times, want 0", n)
	}
}

func TestDNSMalformed(t *testing.T) {
	addr := startDNS(t, DNSConfig{Allow: []string{allowedName}, Answer: netip.MustParseAddr("10.213.0.1")})
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte{1, 2, 3})
	// Garbage is dropped; the responder still answers afterwards.
	if rcode, _ := query(t, "udp", addr, allowedName+".", dnsmessage.TypeA); rcode != dnsmessage.RCodeSuccess {
		t.Fatalf("rcode %v after garbage, want success", rcode)
	}
}
