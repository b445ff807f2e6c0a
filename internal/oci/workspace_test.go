package oci

import (
	"slices"
	"testing"

	"github.com/stockade-sh/stockade/sandbox"
)

// TestBuildWorkspace checks that a sandbox has a /workspace exactly when
// its spec sizes one: a tmpfs of that size, nosuid and nodev, writable by
// the sandbox user (sticky, world-writable), and never one larger than
// asked.
func TestBuildWorkspace(t *testing.T) {
	img := sandbox.Image{Rootfs: "/images/python"}
	for _, tt := range []struct {
		name string
		size int64
		ok   bool
		want []string // the mount's options; nil: no mount
	}{
		{"none", 0, true, nil},
		{"256 MiB", 256 << 20, true, []string{"nosuid", "nodev", "mode=1777", "size=268435456"}},
		{"negative", -1, false, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Build(Options{ID: "x", Spec: sandbox.Spec{Image: img, Workspace: tt.size}, Limits: sandbox.DefaultLimits(),
				GuestPath: "/guest", CgroupsPath: "/stockade/x"})
			if (err == nil) != tt.ok {
				t.Fatalf("got error %v, want ok %v", err, tt.ok)
			}
			if err != nil {
				return
			}
			m, ok := mountAt(s, "/workspace")
			if ok != (tt.want != nil) {
				t.Fatalf("got a /workspace mount %v, want one: %v", ok, tt.want != nil)
			}
			if ok && (m.Type != "tmpfs" || !slices.Equal(m.Options, tt.want)) {
				t.Fatalf("got %s %v, want tmpfs %v", m.Type, m.Options, tt.want)
			}
			if tmp, _ := mountAt(s, "/tmp"); slices.Contains(tmp.Options, "size=268435456") && tt.size != 0 && sandbox.DefaultLimits().TmpSize != tt.size {
				t.Fatalf("/tmp took the workspace's size: %v", tmp.Options)
			}
		})
	}
}
