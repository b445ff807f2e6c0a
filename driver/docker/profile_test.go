package docker

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/moby/api/types/container"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestContainerConfigGolden pins the whole container configuration to a
// golden file, so that a change of the profile shows in review. The
// seccomp profile, internal/oci's, has golden files of its own.
func TestContainerConfigGolden(t *testing.T) {
	d, err := New(Config{GuestPath: "/nonexistent/guest"})
	if err != nil {
		t.Fatal(err)
	}
	spec := sandbox.Spec{Labels: map[string]string{"tool": "x"}, Mounts: []sandbox.Mount{{Source: "/var/lib/stockade/data/sales", Target: "/data/sales"}}}
	cc, hc, err := d.containerConfig("sbx-1", spec, d.cfg.Defaults, "stockade/shell:t")
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range hc.SecurityOpt {
		if strings.HasPrefix(o, "seccomp=") {
			hc.SecurityOpt[i] = "seccomp=<internal/oci's profile>"
		}
	}
	got, err := json.MarshalIndent(struct {
		Config     any
		HostConfig any
	}{cc, hc}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	file := filepath.Join("testdata", "container_config.json")
	if *update {
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (run go test -run TestContainerConfigGolden -update to write it)", err)
	}
	if string(got) != string(want) {
		t.Errorf("%s differs from the container configuration:\n%s\nreview and run go test ./driver/docker -run TestContainerConfigGolden -update", file, got)
	}
}

// TestBuildConfigFollowsProfile changes one entry of a copy of the profile
// at a time and checks that the container configuration follows it: it
// is built from the table, not from facts of its own.
func TestBuildConfigFollowsProfile(t *testing.T) {
	l := sandbox.DefaultLimits()
	tmpOf := func(hc *container.HostConfig) string { return hc.Tmpfs["/tmp"] }
	for _, tt := range []struct {
		name    string
		edit    func(*profile.Profile)
		follows func(*container.Config, *container.HostConfig) bool
	}{
		{"another uid", func(p *profile.Profile) { p.User = profile.User{UID: 1000, GID: 1001} }, func(cc *container.Config, _ *container.HostConfig) bool {
			return cc.User == "1000:1001"
		}},
		{"a writable root", func(p *profile.Profile) { p.ReadOnlyRoot = false }, func(_ *container.Config, hc *container.HostConfig) bool { return !hc.ReadonlyRootfs }},
		{"a scratch option", func(p *profile.Profile) { p.Scratch[0].Options = append(p.Scratch[0].Options, "noatime") }, func(_ *container.Config, hc *container.HostConfig) bool {
			return strings.Contains(tmpOf(hc), ",noatime,")
		}},
		{"the workspace in every sandbox", func(p *profile.Profile) { p.Scratch[1].SessionOnly = false }, func(_ *container.Config, hc *container.HostConfig) bool {
			return hc.Tmpfs["/workspace"] != ""
		}},
		{"another masked path", func(p *profile.Profile) { p.MaskedPaths = append(p.MaskedPaths, "/proc/interrupts") }, func(_ *container.Config, hc *container.HostConfig) bool {
			return slices.Contains(hc.MaskedPaths, "/proc/interrupts")
		}},
		{"another read-only path", func(p *profile.Profile) { p.ReadOnlyPaths = append(p.ReadOnlyPaths, "/proc/kmsg") }, func(_ *container.Config, hc *container.HostConfig) bool {
			return slices.Contains(hc.ReadonlyPaths, "/proc/kmsg")
		}},
		{"a writable /sys", func(p *profile.Profile) { p.Mounts[5].Options = []string{"nosuid"} }, func(_ *container.Config, hc *container.HostConfig) bool {
			return !slices.Contains(hc.ReadonlyPaths, "/sys/fs/cgroup")
		}},
		{"the guest elsewhere", func(p *profile.Profile) { p.Guest.Path = "/.agent" }, func(cc *container.Config, _ *container.HostConfig) bool {
			return slices.Equal(cc.Entrypoint, []string{"/.agent"})
		}},
		{"no no_new_privs", func(p *profile.Profile) { p.NoNewPrivs = false }, func(_ *container.Config, hc *container.HostConfig) bool {
			return !slices.Contains(hc.SecurityOpt, "no-new-privileges:true")
		}},
		{"no cgroup namespace", func(p *profile.Profile) { p.Namespaces = p.Namespaces[:len(p.Namespaces)-1] }, func(_ *container.Config, hc *container.HostConfig) bool {
			return hc.CgroupnsMode == "host" && hc.IpcMode == "private"
		}},
		{"ping sockets for every group", func(p *profile.Profile) { p.Network.Sysctls[0].Value = "0 2147483647" }, func(_ *container.Config, hc *container.HostConfig) bool {
			return hc.Sysctls["net.ipv4.ping_group_range"] == "0 2147483647"
		}},
		{"more files", func(p *profile.Profile) { p.Rlimits[0].Soft, p.Rlimits[0].Hard = 4096, 4096 }, func(_ *container.Config, hc *container.HostConfig) bool {
			u := hc.Ulimits[0]
			return u.Name == "nofile" && u.Soft == 4096 && u.Hard == 4096
		}},
		{"another hostname", func(p *profile.Profile) { p.Hostname = "box" }, func(cc *container.Config, _ *container.HostConfig) bool { return cc.Hostname == "box" }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := profile.Default()
			tt.edit(&p)
			cc, hc, err := buildConfig(p, "{}", "sbx-1", sandbox.Spec{}, l, "t")
			if err != nil {
				t.Fatal(err)
			}
			if !tt.follows(cc, hc) {
				t.Errorf("the container configuration does not follow the profile with %s: %+v %+v", tt.name, cc, hc)
			}
			cc, hc, err = buildConfig(profile.Default(), "{}", "sbx-1", sandbox.Spec{}, l, "t")
			if err != nil || tt.follows(cc, hc) {
				t.Errorf("the default profile's configuration passes the check of %s (%v): the check proves nothing", tt.name, err)
			}
		})
	}
	// What Docker cannot express is refused, not approximated.
	for name, edit := range map[string]func(*profile.Profile){
		"a capability":       func(p *profile.Profile) { p.Capabilities = []string{"CAP_NET_BIND_SERVICE"} },
		"no mount namespace": func(p *profile.Profile) { p.Namespaces = p.Namespaces[:4] },
	} {
		p := profile.Default()
		edit(&p)
		if _, _, err := buildConfig(p, "{}", "sbx-1", sandbox.Spec{}, l, "t"); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", name, err)
		}
	}
}
