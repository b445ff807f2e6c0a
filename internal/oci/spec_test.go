package oci

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/guest"
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

// TestICMPSockets evaluates the socket(2) rules of each kernel's filter as
// the runtime that enforces it does: libseccomp for the host kernel (runc),
// the Sentry for the user-space kernel (runsc).
func TestICMPSockets(t *testing.T) {
	img := sandbox.Image{Rootfs: "/images/python"}
	filter := func(t *testing.T, k Kernel) *specs.LinuxSeccomp {
		t.Helper()
		s, err := Build(Options{ID: "x", Spec: sandbox.Spec{Image: img}, Limits: sandbox.DefaultLimits(),
			GuestPath: "/guest", CgroupsPath: "/stockade/x", Kernel: k})
		if err != nil {
			t.Fatal(err)
		}
		return s.Linux.Seccomp
	}
	host, userSpace := filter(t, HostKernel), filter(t, UserSpaceKernel)
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
		{"icmp protocol in another family", unix.AF_UNIX, unix.IPPROTO_ICMP, true, true},
		{"packet", unix.AF_PACKET, 0, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := allows(host, "socket", tt.domain, unix.SOCK_DGRAM, tt.protocol); got != tt.host {
				t.Errorf("host kernel: socket(%d, SOCK_DGRAM, %#x) allowed: got %t, want %t", tt.domain, tt.protocol, got, tt.host)
			}
			if got := allowsInSentry(userSpace, "socket", tt.domain, unix.SOCK_DGRAM, tt.protocol); got != tt.userSpace {
				t.Errorf("user-space kernel: socket(%d, SOCK_DGRAM, %#x) allowed: got %t, want %t", tt.domain, tt.protocol, got, tt.userSpace)
			}
		})
	}
	// The Sentry compiles the filter at every start, in time that grows
	// with its rules: the refusal is one rule per IP family, not one per
	// bit of the protocol (64 rules, 30-65 ms a gVisor sandbox).
	if got, want := len(userSpace.Syscalls), len(host.Syscalls)+len(icmpFamilies); got != want {
		t.Errorf("rules of the user-space kernel's filter: got %d, want %d (the host kernel's %d and one per IP family)", got, want, len(host.Syscalls))
	}
}

// TestBuildGuestChannel checks that the guest's environment tells it to
// take its channel from descriptors 3 and 4 exactly when the runtime
// passes them on (Options.ChannelFDs).
func TestBuildGuestChannel(t *testing.T) {
	for _, fds := range []bool{false, true} {
		s, err := Build(Options{ID: "x", Spec: sandbox.Spec{Image: sandbox.Image{Rootfs: "/images/python"}}, Limits: sandbox.DefaultLimits(),
			GuestPath: "/guest", CgroupsPath: "/stockade/x", ChannelFDs: fds})
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"GOMAXPROCS=1"}
		if fds {
			want = append(want, guest.ChannelEnv+"="+guest.ChannelFDs)
		}
		if !slices.Equal(s.Process.Env, want) {
			t.Errorf("ChannelFDs %v: the guest's environment is %q, want %q", fds, s.Process.Env, want)
		}
	}
}
