package console

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a, b := netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("192.0.2.2/32")
	t.Run("per address", func(t *testing.T) {
		l := newLimiter(rate{3, time.Minute}, rate{100, time.Second}, 10)
		for i := range 3 {
			if ok, _ := l.allow(a, t0); !ok {
				t.Fatalf("attempt %d: refused, want allowed within the burst", i+1)
			}
		}
		if ok, wait := l.allow(a, t0); ok || wait != time.Minute {
			t.Errorf("4th attempt: got %v, wait %s; want refused, wait 1m", ok, wait)
		}
		if ok, _ := l.allow(b, t0); !ok {
			t.Error("another address: refused, want allowed")
		}
		if ok, _ := l.allow(a, t0.Add(time.Minute)); !ok {
			t.Error("a minute later: refused, want allowed")
		}
	})
	t.Run("global", func(t *testing.T) {
		l := newLimiter(rate{3, time.Minute}, rate{4, time.Minute}, 10)
		for i := range 4 {
			addr := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), 32)
			if ok, _ := l.allow(addr, t0); !ok {
				t.Fatalf("address %d: refused within the global burst", i)
			}
		}
		if ok, _ := l.allow(a, t0); ok {
			t.Error("5th address: allowed past the global burst")
		}
		// The refusal was not a's doing: its own bucket is untouched.
		l.global = rate{100, time.Second}
		for i := range 3 {
			if ok, _ := l.allow(a, t0.Add(3*time.Second)); !ok {
				t.Fatalf("a, attempt %d after the global bucket refilled: refused", i+1)
			}
		}
	})
	t.Run("bounded memory", func(t *testing.T) {
		l := newLimiter(rate{2, time.Minute}, rate{1e6, time.Millisecond}, 100)
		for i := range 1000 {
			l.allow(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), 32), t0)
		}
		if len(l.addrs) > 100 {
			t.Errorf("addresses held: got %d, want at most 100", len(l.addrs))
		}
		if ok, _ := l.allow(a, t0); ok {
			t.Error("a new address while the table is full of cooling ones: allowed, want refused")
		}
		if ok, _ := l.allow(a, t0.Add(2*time.Minute)); !ok {
			t.Error("a new address once the others rested: refused, want allowed")
		}
	})
}

func TestClientPrefix(t *testing.T) {
	for _, tc := range []struct{ remote, want string }{
		{"192.0.2.7:5555", "192.0.2.7/32"},
		{"[2001:db8:1:2:3:4:5:6]:80", "2001:db8:1:2::/64"},
		{"[::ffff:192.0.2.7]:80", "192.0.2.7/32"},
		{"garbage", "invalid Prefix"},
	} {
		if got := fmt.Sprint(clientPrefix(tc.remote)); got != tc.want {
			t.Errorf("clientPrefix(%q): got %s, want %s", tc.remote, got, tc.want)
		}
	}
}
