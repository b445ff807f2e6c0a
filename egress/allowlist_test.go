package egress

import (
	"net/netip"
	"testing"
)

func TestAllowlist(t *testing.T) {
	a, err := NewAllowlist([]string{"api.example.com", "*.cdn.example.net"}, []int{443, 80})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"api.example.com", true},
		{"example.com", false},
		{"x.api.example.com", false},
		{"a.cdn.example.net", true},
		{"a.b.cdn.example.net", true},
		{"cdn.example.net", false},
		{"evilcdn.example.net", false},
		{"api.example.com.evil.test", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := a.AllowsName(tc.name); got != tc.want {
				t.Errorf("AllowsName(%q) = %v, want %v", tc.name, got, tc.want)
			}
		})
	}
	if !a.AllowsPort(443) || a.AllowsPort(8443) {
		t.Errorf("AllowsPort: got 443=%v 8443=%v, want true false", a.AllowsPort(443), a.AllowsPort(8443))
	}
	var zero *Allowlist
	if zero.AllowsName("api.example.com") || zero.AllowsPort(443) || !zero.Empty() {
		t.Errorf("nil allowlist allows something")
	}
}

func TestNewAllowlistRefuses(t *testing.T) {
	for _, bad := range []string{"*", "*.*", "*.com", "127.0.0.1", "Example.com", "a..b", "x.example.com:443", "-a.example.com", "1.2.3.4",
		"*.co.uk", "*.com.au", "*.github.io", "*.s3.amazonaws.com"} {
		t.Run(bad, func(t *testing.T) {
			if _, err := NewAllowlist([]string{bad}, []int{443}); err == nil {
				t.Errorf("NewAllowlist(%q) succeeded, want an error", bad)
			}
		})
	}
	// Below a public suffix, a registered domain may be wildcarded; a
	// public suffix itself is a name like any other.
	if _, err := NewAllowlist([]string{"*.example.co.uk", "*.stockade-sh.github.io", "co.uk"}, []int{443}); err != nil {
		t.Errorf("NewAllowlist of wildcards over registered domains: %v", err)
	}
	if _, err := NewAllowlist([]string{"a.example.com"}, []int{0}); err == nil {
		t.Errorf("port 0 accepted")
	}
}

func TestCanonicalNameAndIPLiterals(t *testing.T) {
	for _, tc := range []struct {
		in     string
		want   string
		ok, ip bool
	}{
		{"Example.COM.", "example.com", true, false},
		{"api.example.com", "api.example.com", true, false},
		{"127.0.0.1", "", false, true},
		{"[::1]", "", false, true},
		{"::1", "", false, true},
		{"2130706433", "", false, true},
		{"127.1", "", false, true},
		{"0x7f.0x1", "", false, true},
		{"a b.example.com", "", false, false},
		{"", "", false, false},
		{"name..", "", false, false},
		{"api.example.com..", "", false, false},
		{"127.0.0.1..", "", false, false},
		{".", "", false, false},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, ok := CanonicalName(tc.in)
			if ok != tc.ok || (ok && got != tc.want) {
				t.Errorf("CanonicalName(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
			}
			if ip := isIPLiteral(tc.in); ip != tc.ip {
				t.Errorf("isIPLiteral(%q) = %v, want %v", tc.in, ip, tc.ip)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	own := []netip.Addr{netip.MustParseAddr("93.184.215.1")}
	for _, tc := range []struct {
		addr    string
		refused bool
	}{
		{"93.184.216.34", false},
		{"2606:2800:220:1::1", false},
		{"127.0.0.1", true},
		{"127.9.9.9", true},
		{"10.1.2.3", true},
		{"172.16.0.1", true},
		{"172.31.255.255", true},
		{"192.168.1.1", true},
		{"169.254.169.254", true},
		{"100.64.0.1", true},
		{"100.127.255.254", true},
		{"0.0.0.0", true},
		{"0.1.2.3", true},
		{"224.0.0.251", true},
		{"239.255.255.250", true},
		{"255.255.255.255", true},
		{"192.0.2.2", true},
		{"93.184.215.1", true}, // the host's own
		{"::1", true},
		{"::", true},
		{"::ffff:127.0.0.1", true},
		{"::ffff:169.254.169.254", true},
		{"fc00::1", true},
		{"fd00::2", true},
		{"fe80::1", true},
		{"ff02::1", true},
		{"64:ff9b::a9fe:a9fe", true},  // NAT64 of 169.254.169.254
		{"64:ff9b::5db8:d822", false}, // NAT64 of a public address
		{"2002:7f00:1::", true},       // 6to4 of 127.0.0.1
		{"2001:db8::1", true},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			why := classify(netip.MustParseAddr(tc.addr), own)
			if (why != "") != tc.refused {
				t.Errorf("classify(%s) = %q, want refused=%v", tc.addr, why, tc.refused)
			}
		})
	}
}
