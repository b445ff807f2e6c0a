package oci

import (
	"path/filepath"
	"testing"

	"github.com/stockade-sh/stockade/sandbox"
)

// TestBuildGolden pins the whole bundle of each kind of sandbox to a golden
// file, so that a change of the profile shows in review as a change of
// config.json. The seccomp filter has golden files of its own per
// architecture (TestSeccompPerArchitecture) and depends on the host's
// kernel, so it is left out here; what the user-space kernel changes in it
// is TestICMPSockets'.
func TestBuildGolden(t *testing.T) {
	img := sandbox.Image{Name: "python", Digest: "sha256:00", Rootfs: "/images/python"}
	for _, tt := range []struct {
		name string
		o    Options
	}{
		{"runc", Options{ID: "sbx-1", Spec: sandbox.Spec{Image: img, Labels: map[string]string{"tool": "code.execute"}},
			Limits: sandbox.DefaultLimits().WithDefaults(sandbox.Limits{CPU: 0.5}), GuestPath: "/var/lib/stockade/bin/stockade-guest",
			CgroupsPath: "/stockade/sbx-1", HostUIDBase: sandbox.FirstHostID}},
		{"gvisor-egress-mounts", Options{ID: "sbx-2", Spec: sandbox.Spec{Image: img, Network: sandbox.NetworkEgress,
			Mounts: []sandbox.Mount{{Source: "/var/lib/stockade/data/sales", Target: "/data/sales"}}},
			Limits: sandbox.DefaultLimits().WithDefaults(sandbox.Limits{CPU: 1}), GuestPath: "/var/lib/stockade/bin/stockade-guest",
			CgroupsPath: "/stockade/sbx-2", Kernel: UserSpaceKernel, NetNSPath: "/run/netns/stk-2", ResolvConf: "/run/stockade/gvisor/bundles/sbx-2/resolv.conf"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Build(tt.o)
			if err != nil {
				t.Fatal(err)
			}
			s.Linux.Seccomp = nil
			golden(t, filepath.Join("testdata", "spec_"+tt.name+".json"), s)
		})
	}
}
