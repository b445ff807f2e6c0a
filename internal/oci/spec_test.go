package oci

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/stockade-sh/stockade/sandbox"
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
			var ns *specs.LinuxNamespace
			for i := range s.Linux.Namespaces {
				if s.Linux.Namespaces[i].Type == specs.NetworkNamespace {
					ns = &s.Linux.Namespaces[i]
				}
			}
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
