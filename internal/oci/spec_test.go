package oci

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

func TestBuildNetwork(t *testing.T) {
	img := sandbox.Image{Rootfs: "/images/python"}
	for _, tt := range []struct {
		name           string
		mode           sandbox.NetworkMode
		netns, resolv  string
		ok             bool
		wantNS, wantRC string
	}{
		{name: "none", ok: true},
		{name: "none with a path", netns: "/run/netns/x", ok: false},
		{name: "egress", mode: sandbox.NetworkEgress, netns: "/run/netns/stk-1", resolv: "/b/resolv.conf", ok: true, wantNS: "/run/netns/stk-1", wantRC: "/b/resolv.conf"},
		{name: "egress without a path", mode: sandbox.NetworkEgress, resolv: "/b/resolv.conf", ok: false},
		{name: "egress with a relative path", mode: sandbox.NetworkEgress, netns: "stk-1", resolv: "/b/resolv.conf", ok: false},
		{name: "egress without resolv.conf", mode: sandbox.NetworkEgress, netns: "/run/netns/stk-1", ok: false},
		{name: "unknown mode", mode: "host", ok: false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Build(Options{ID: "x", Spec: sandbox.Spec{Image: img, Network: tt.mode}, Limits: sandbox.DefaultLimits(),
				GuestPath: "/guest", CgroupsPath: "/stockade/x", NetNSPath: tt.netns, ResolvConf: tt.resolv})
			if (err == nil) != tt.ok {
				t.Fatalf("got error %v, want ok %v", err, tt.ok)
			}
			if err != nil {
				return
			}
			ns := namespace(s, specs.NetworkNamespace)
			if ns == nil || ns.Path != tt.wantNS {
				t.Errorf("got network namespace %+v, want path %q", ns, tt.wantNS)
			}
			var rc string
			for _, m := range s.Mounts {
				if m.Destination == "/etc/resolv.conf" {
					rc = m.Source
				}
			}
			if rc != tt.wantRC {
				t.Errorf("got resolv.conf from %q, want %q", rc, tt.wantRC)
			}
		})
	}
}

func TestBuildUserNamespace(t *testing.T) {
	img := sandbox.Image{Rootfs: "/images/python"}
	egress := sandbox.Spec{Image: img, Network: sandbox.NetworkEgress}
	for _, tt := range []struct {
		name     string
		spec     sandbox.Spec
		base     uint32
		userns   string
		netns    string
		ok       bool
		wantUser bool
	}{
		{name: "none", spec: sandbox.Spec{Image: img}, ok: true},
		{name: "new", spec: sandbox.Spec{Image: img}, base: 1 << 30, ok: true, wantUser: true},
		{name: "joined with its network", spec: egress, base: 1 << 30, userns: "/run/stockade/userns/stk-1", netns: "/run/netns/stk-1", ok: true, wantUser: true},
		{name: "joined without a base", spec: egress, userns: "/run/stockade/userns/stk-1", netns: "/run/netns/stk-1", ok: false},
		{name: "joined without a network", spec: sandbox.Spec{Image: img}, base: 1 << 30, userns: "/run/stockade/userns/stk-1", ok: false},
		{name: "joined by a relative path", spec: egress, base: 1 << 30, userns: "stk-1", netns: "/run/netns/stk-1", ok: false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := Options{ID: "x", Spec: tt.spec, Limits: sandbox.DefaultLimits(), GuestPath: "/guest", CgroupsPath: "/stockade/x",
				HostUIDBase: tt.base, UserNSPath: tt.userns, NetNSPath: tt.netns}
			if tt.netns != "" {
				o.ResolvConf = "/b/resolv.conf"
			}
			s, err := Build(o)
			if (err == nil) != tt.ok {
				t.Fatalf("got error %v, want ok %v", err, tt.ok)
			}
			if err != nil {
				return
			}
			user := namespace(s, specs.UserNamespace)
			if (user != nil) != tt.wantUser || (user != nil && user.Path != tt.userns) {
				t.Fatalf("got user namespace %+v, want one %v with path %q", user, tt.wantUser, tt.userns)
			}
			want := IDMappings(tt.base, profile.Default().User.UID)
			if len(s.Linux.UIDMappings) != len(want) || (len(want) > 0 && (s.Linux.UIDMappings[0] != want[0] || s.Linux.UIDMappings[1] != want[1])) {
				t.Errorf("got uid mappings %+v, want %+v", s.Linux.UIDMappings, want)
			}
		})
	}
}

// namespace returns s's namespace of type t, or nil.
func namespace(s *specs.Spec, t specs.LinuxNamespaceType) *specs.LinuxNamespace {
	for i := range s.Linux.Namespaces {
		if s.Linux.Namespaces[i].Type == t {
			return &s.Linux.Namespaces[i]
		}
	}
	return nil
}

// allowsSocket evaluates the allow rules of socket(2) in sc for a call with
// the given domain and protocol, as seccomp does: a rule allows the call
// when every one of its conditions holds.
func allowsSocket(sc *specs.LinuxSeccomp, domain, protocol uint64) bool {
	return allows(sc, "socket", domain, unix.SOCK_DGRAM, protocol)
}

func TestICMPSockets(t *testing.T) {
	img := sandbox.Image{Rootfs: "/images/python"}
	for _, tt := range []struct {
		name             string
		domain, protocol uint64
		host, userSpace  bool // allowed by the filter under each kernel
	}{
		{"udp", unix.AF_INET, 0, true, true},
		{"udp by number", unix.AF_INET, unix.IPPROTO_UDP, true, true},
		{"tcp6", unix.AF_INET6, unix.IPPROTO_TCP, true, true},
		{"unix", unix.AF_UNIX, 0, true, true},
		{"netlink", unix.AF_NETLINK, 0, true, true},
		// The host kernel's ping_group_range refuses these there.
		{"icmp", unix.AF_INET, unix.IPPROTO_ICMP, true, false},
		{"icmp with high bits", unix.AF_INET, unix.IPPROTO_ICMP | 1<<32, true, false},
		{"icmpv6", unix.AF_INET6, unix.IPPROTO_ICMPV6, true, false},
		{"icmpv6 with high bits", unix.AF_INET6, unix.IPPROTO_ICMPV6 | 1<<40, true, false},
		{"packet", unix.AF_PACKET, 0, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, k := range []struct {
				kernel Kernel
				want   bool
			}{{HostKernel, tt.host}, {UserSpaceKernel, tt.userSpace}} {
				s, err := Build(Options{ID: "x", Spec: sandbox.Spec{Image: img}, Limits: sandbox.DefaultLimits(),
					GuestPath: "/guest", CgroupsPath: "/stockade/x", Kernel: k.kernel})
				if err != nil {
					t.Fatal(err)
				}
				if got := allowsSocket(s.Linux.Seccomp, tt.domain, tt.protocol); got != k.want {
					t.Errorf("kernel %d: socket(%d, SOCK_DGRAM, %#x) allowed: got %t, want %t", k.kernel, tt.domain, tt.protocol, got, k.want)
				}
			}
		})
	}
}
