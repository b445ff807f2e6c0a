package profile

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/sandbox"
)

// readmeProblems says where readme's sandbox section differs from profile
// p: it must hold p's Markdown and DifferencesMarkdown, each as a whole
// table.
func readmeProblems(readme string, p Profile) []string {
	var out []string
	for name, table := range map[string]string{"profile": p.Markdown(), "differences": p.DifferencesMarkdown()} {
		// A table ends at the first line that is not a row.
		if i := strings.Index(readme, "\n"+table); i < 0 || !strings.HasPrefix(readme[i+1+len(table):], "\n") {
			out = append(out, "README.md does not hold the "+name+" table as the profile renders it:\n"+table)
		}
	}
	return out
}

// TestREADME checks that the README states the profile and the tiers'
// differences exactly as declared, and that it would notice a change of
// any one entry.
func TestREADME(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	for _, p := range readmeProblems(readme, Default()) {
		t.Error(p)
	}
	for _, e := range edits {
		t.Run(e.name, func(t *testing.T) {
			p := Default()
			e.edit(&p)
			if len(readmeProblems(readme, p)) == 0 {
				t.Errorf("the README check passes a profile with %s, want it to fail", e.name)
			}
		})
	}
}

// edits change one entry each of a profile.
var edits = []struct {
	name string
	edit func(*Profile)
}{
	{"a writable root", func(p *Profile) { p.ReadOnlyRoot = false }},
	{"a kernel mount's option", func(p *Profile) {
		p.Mounts[3].Options = slices.DeleteFunc(p.Mounts[3].Options, func(o string) bool { return o == "noexec" })
	}},
	{"a scratch option", func(p *Profile) { p.Scratch[0].Options = append(p.Scratch[0].Options, "noexec") }},
	{"another masked path", func(p *Profile) { p.MaskedPaths = append(p.MaskedPaths, "/proc/interrupts") }},
	{"another read-only path", func(p *Profile) { p.ReadOnlyPaths = append(p.ReadOnlyPaths, "/proc/kmsg") }},
	{"another device", func(p *Profile) { p.Dev.Devices = append(p.Dev.Devices, Device{"kmsg", 1, 11}) }},
	{"the guest elsewhere", func(p *Profile) { p.Guest.Path = "/.agent" }},
	{"data mounts elsewhere", func(p *Profile) { p.Data.Dir = "/mnt" }},
	{"another uid", func(p *Profile) { p.User.UID = 1000 }},
	{"a capability", func(p *Profile) { p.Capabilities = []string{"CAP_NET_BIND_SERVICE"} }},
	{"no no_new_privs", func(p *Profile) { p.NoNewPrivs = false }},
	{"keyctl allowed", func(p *Profile) {
		p.Seccomp.Denied = slices.DeleteFunc(p.Seccomp.Denied, func(n string) bool { return n == "keyctl" })
	}},
	{"AF_ALG sockets", func(p *Profile) {
		p.Seccomp.SocketFamilies = append(p.Seccomp.SocketFamilies, SocketFamily{"AF_ALG", 38})
	}},
	{"no cgroup namespace", func(p *Profile) { p.Namespaces = p.Namespaces[:len(p.Namespaces)-1] }},
	{"ping sockets for every group", func(p *Profile) { p.Network.Sysctls[0].Value = "0 2147483647" }},
	{"more memory", func(p *Profile) { p.Limits.Memory = 1 << 30 }},
	{"more files", func(p *Profile) { p.Rlimits[0].Soft, p.Rlimits[0].Hard = 4096, 4096 }},
	{"a variable", func(p *Profile) { p.Env = append(p.Env, "LANG=C.UTF-8") }},
	{"another hostname", func(p *Profile) { p.Hostname = "box" }},
	{"a difference stated otherwise", func(p *Profile) { p.Differences[0].Reason += " (reworded)" }},
}

func TestDefaultIsACopy(t *testing.T) {
	p := Default()
	p.User.UID = 0
	p.Seccomp.Denied[0] = "read"
	p.Differences[0].Tier = sandbox.TierContainer
	q := Default()
	if q.User.UID != 65534 || q.Seccomp.Denied[0] != "ptrace" || q.Differences[0].Tier != sandbox.TierGVisor {
		t.Errorf("changing one Default changed the next: got uid %d, first denial %s, first difference's tier %s", q.User.UID, q.Seccomp.Denied[0], q.Differences[0].Tier)
	}
}

func TestDifferences(t *testing.T) {
	p := Default()
	for i, d := range p.Differences {
		on := On{Driver: d.Driver, Tier: d.Tier}
		if got, ok := p.Difference(on, d.ID); !ok || got.Fact != d.Fact {
			t.Errorf("Difference(%+v, %s): got %+v, %t; want the declared one", on, d.ID, got, ok)
		}
		// Two declarations of one ID must not both apply anywhere: the
		// checks would read the first only.
		for _, e := range p.Differences[i+1:] {
			if e.ID == d.ID && (d.Tier == "" || e.Tier == "" || d.Tier == e.Tier) && (d.Driver == "" || e.Driver == "" || d.Driver == e.Driver) {
				t.Errorf("difference %q is declared twice for one place: %s and %s", d.ID, d.Where(), e.Where())
			}
		}
	}
	for _, tt := range []struct {
		on   On
		id   string
		want string // the place it is declared for; empty: none
	}{
		{On{"runc", sandbox.TierContainer}, "tmp-nodev", ""},
		{On{"gvisor", sandbox.TierGVisor}, "tmp-nodev", "gvisor"},
		{On{KubernetesDriver, sandbox.TierGVisor}, "tmp-nodev", "gvisor"},
		{On{KubernetesDriver, sandbox.TierContainer}, "tmp-nodev", "kubernetes driver, container tier"},
		{On{"runc", sandbox.TierContainer}, "tmp-nosuid", ""},
		{On{"gvisor", sandbox.TierGVisor}, "tmp-nosuid", ""},
		{On{KubernetesDriver, sandbox.TierContainer}, "tmp-nosuid", "kubernetes driver"},
		{On{KubernetesDriver, sandbox.TierGVisor}, "kubelet-files", "kubernetes driver"},
		{On{"docker", sandbox.TierDocker}, "kubelet-files", ""},
		{On{"docker", sandbox.TierDocker}, "docker-etc-files", "docker"},
	} {
		d, ok := p.Difference(tt.on, tt.id)
		if got := d.Where(); !ok {
			got = ""
		} else if got != tt.want {
			t.Errorf("Difference(%+v, %s): got the one of %q, want %q", tt.on, tt.id, got, tt.want)
		}
		if ok != (tt.want != "") {
			t.Errorf("Difference(%+v, %s): got declared %t, want %t", tt.on, tt.id, ok, tt.want != "")
		}
	}
}

func TestCapabilityMask(t *testing.T) {
	for _, tt := range []struct {
		caps []string
		want string
		ok   bool
	}{
		{nil, "0000000000000000", true},
		{[]string{"CAP_CHOWN"}, "0000000000000001", true},
		{[]string{"CAP_NET_BIND_SERVICE", "CAP_CHECKPOINT_RESTORE"}, "0000010000000400", true},
		{[]string{"CAP_EVERYTHING"}, "", false},
	} {
		p := Profile{Capabilities: tt.caps}
		got, err := p.CapabilityMask()
		if got != tt.want || (err == nil) != tt.ok {
			t.Errorf("CapabilityMask(%v): got %q, %v; want %q (ok %t)", tt.caps, got, err, tt.want, tt.ok)
		}
	}
}

func TestDevOn(t *testing.T) {
	p := Default()
	if d := p.DevOn(On{"runc", sandbox.TierContainer}); !d.Allows(1, 3) || !d.Allows(136, 4) || d.Allows(10, 229) || slices.Contains(d.Names, "fuse") {
		t.Errorf("container: got %+v, want the minimal /dev alone", d)
	}
	if d := p.DevOn(On{KubernetesDriver, sandbox.TierGVisor}); !d.Allows(10, 229) || !d.Allows(10, 200) || !slices.Contains(d.Names, "fuse") || !slices.Contains(d.Names, "net") {
		t.Errorf("gvisor: got %+v, want the Sentry's fuse and net/tun besides", d)
	}
	if len(p.Dev.Names) != len(Default().Dev.Names) || p.Dev.Allows(10, 229) {
		t.Errorf("DevOn changed the profile's own /dev: %+v", p.Dev)
	}
}

// TestDifferencesAreScoped checks that every declared difference names
// the tier or the driver it is of: one with neither applies to every
// sandbox (as the unscoped one here shows), which would weaken every
// driver's conformance checks and audit at once.
func TestDifferencesAreScoped(t *testing.T) {
	everywhere := Difference{ID: "unscoped"}
	for _, on := range []On{{"runc", sandbox.TierContainer}, {"gvisor", sandbox.TierGVisor}, {"docker", sandbox.TierDocker}} {
		if !everywhere.Applies(on) {
			t.Fatalf("a difference with neither tier nor driver does not apply to %+v; the check below would see nothing", on)
		}
	}
	for _, d := range Default().Differences {
		if d.Tier == "" && d.Driver == "" {
			t.Errorf("difference %q sets neither Tier nor Driver: it applies to every sandbox", d.ID)
		}
	}
}
