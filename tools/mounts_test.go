package tools

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/sandbox"
)

// dataTree builds, in a temporary directory:
//
//	data/sales/            a data directory
//	data/sales.csv         a data file
//	data/link-in  -> data/sales      (stays inside the root)
//	data/link-out -> outside/        (leads out of the root)
//	data/link-abs -> /etc            (leads out of the root)
//	data/homelike/.ssh/    a directory that holds credentials
//	data/users/alice/.ssh/ the same, deeper down
//	data/api.sock          a unix socket
//	data/run/sub/app.sock  a unix socket deeper down
//	outside/
//	root-link -> data      (the data root named through a symlink)
func dataTree(t *testing.T) (base, root string) {
	t.Helper()
	base = t.TempDir()
	root = filepath.Join(base, "data")
	for _, d := range []string{"data/sales", "data/homelike/.ssh", "data/users/alice/.ssh", "data/run/sub", "outside"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "sales.csv"), []byte("a,b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	links := map[string]string{
		"data/link-in":  filepath.Join(root, "sales"),
		"data/link-out": filepath.Join(base, "outside"),
		"data/link-abs": "/etc",
		"root-link":     root,
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(base, name)); err != nil {
			t.Fatal(err)
		}
	}
	// Unix socket paths are limited to 108 bytes; skip the socket case
	// rather than fail on a long temporary directory.
	for _, name := range []string{"api.sock", "run/sub/app.sock"} {
		if sock := filepath.Join(root, name); len(sock) < 100 {
			l, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
		}
	}
	return base, root
}

func TestMountRules(t *testing.T) {
	base, root := dataTree(t)
	tests := []struct {
		name     string
		source   string
		target   string
		dataRoot string // default root
		rule     string // "" means allowed
		fragment string
		resolved string // for allowed mounts, the source ResolveMounts returns
		// loadOnly is a rule checked when records are loaded, not again
		// for each run (a walk of the tree below the source).
		loadOnly bool
	}{
		{name: "directory", source: root + "/sales", resolved: root + "/sales"},
		{name: "file", source: root + "/sales.csv", resolved: root + "/sales.csv"},
		{name: "credentials deeper down", source: root + "/users", rule: RuleMountCredentials, fragment: "contains " + root + "/users/alice/.ssh", loadOnly: true},
		{name: "symlink inside the root", source: root + "/link-in", resolved: root + "/sales"},
		{name: "root named through a symlink", source: base + "/root-link/sales", dataRoot: base + "/root-link", resolved: root + "/sales"},
		{name: "unclean but inside", source: root + "/sales/../sales.csv", resolved: root + "/sales.csv"},
		{name: "symlink escaping the root", source: root + "/link-out", rule: RuleMountSymlinkEscape,
			fragment: "resolves through a symlink to " + base + "/outside, outside the data root " + root},
		{name: "symlink to /etc", source: root + "/link-abs", rule: RuleMountSymlinkEscape, fragment: "outside the data root"},
		{name: "missing source", source: root + "/nope", rule: RuleMountMissing, fragment: "does not exist"},
		{name: "outside the root", source: base + "/outside", rule: RuleMountOutsideDataRoot, fragment: "is outside the data root " + root},
		{name: "dot-dot out of the root", source: root + "/../outside", rule: RuleMountOutsideDataRoot, fragment: "is outside the data root"},
		{name: "prefix is not a parent", source: root + "2", rule: RuleMountOutsideDataRoot, fragment: "is outside the data root"},
		{name: "holds credentials", source: root + "/homelike", rule: RuleMountCredentials, fragment: "contains .ssh"},
		{name: "docker socket", source: "/var/run/docker.sock", rule: RuleMountSocket, fragment: "is the Docker socket"},
		{name: "docker socket in /run", source: "/run/docker.sock", rule: RuleMountSocket, fragment: "is the Docker socket"},
		{name: "containerd socket", source: "/run/containerd/containerd.sock", rule: RuleMountSocket, fragment: "is the containerd socket"},
		{name: "root's home", source: "/root", rule: RuleMountHome, fragment: "home directory"},
		{name: "a user's home", source: "/home/alice", rule: RuleMountHome, fragment: "home directory"},
		{name: "ssh", source: "/srv/x/.ssh/id_ed25519", rule: RuleMountCredentials, fragment: ".ssh directory"},
		{name: "aws", source: "/opt/.aws", rule: RuleMountCredentials, fragment: ".aws directory"},
		{name: "kube", source: "/home/alice/.kube/config", rule: RuleMountCredentials, fragment: ".kube directory"},
		{name: "gcloud", source: "/root/.config/gcloud", rule: RuleMountCredentials, fragment: ".config/gcloud directory"},
		{name: "proc", source: "/proc", rule: RuleMountSystem, fragment: "inside /proc"},
		{name: "sys", source: "/sys/fs/cgroup", rule: RuleMountSystem, fragment: "inside /sys"},
		{name: "dev", source: "/dev", rule: RuleMountSystem, fragment: "inside /dev"},
		{name: "var run", source: "/var/run", rule: RuleMountSystem, fragment: "inside /var/run"},
		{name: "run", source: "/run/secrets", rule: RuleMountSystem, fragment: "inside /run"},
		{name: "relative", source: "data/sales", rule: RuleMountSource, fragment: "must be an absolute path"},
		{name: "empty source", source: "", rule: RuleMountSource, fragment: "mount source is required"},
		{name: "target in /tmp", source: root + "/sales", target: "/tmp/sales", rule: RuleMountTarget, fragment: "must be below /data"},
		{name: "target in /proc", source: root + "/sales", target: "/proc/x", rule: RuleMountTarget, fragment: "must be below /data"},
		{name: "target /usr/bin", source: root + "/sales", target: "/usr/bin", rule: RuleMountTarget, fragment: "must be below /data"},
		{name: "target unclean", source: root + "/sales", target: "/data/../etc", rule: RuleMountTarget, fragment: "must be a clean path"},
		{name: "target relative", source: root + "/sales", target: "data", rule: RuleMountTarget, fragment: "must be an absolute path"},
		{name: "no data root", source: root + "/sales", dataRoot: "-", rule: RuleMountOutsideDataRoot, fragment: "no usable data root"},
		{name: "missing data root", source: root + "/sales", dataRoot: base + "/nope", rule: RuleMountOutsideDataRoot, fragment: "no usable data root"},
	}
	if _, err := os.Stat(filepath.Join(root, "api.sock")); err == nil {
		tests = append(tests, struct {
			name, source, target, dataRoot, rule, fragment, resolved string
			loadOnly                                                 bool
		}{name: "a socket under the root", source: root + "/api.sock", rule: RuleMountSocket, fragment: "is a unix socket"})
	}
	if _, err := os.Stat(filepath.Join(root, "run/sub/app.sock")); err == nil {
		tests = append(tests, struct {
			name, source, target, dataRoot, rule, fragment, resolved string
			loadOnly                                                 bool
		}{name: "a socket deeper down", source: root + "/run", rule: RuleMountSocket, fragment: "contains the unix socket " + root + "/run/sub/app.sock", loadOnly: true})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := Options{Drivers: drivers, DataRoot: root}
			switch tt.dataRoot {
			case "":
			case "-":
				opts.DataRoot = ""
			default:
				opts.DataRoot = tt.dataRoot
			}
			target := tt.target
			if target == "" {
				target = "/data/x"
			}
			tool := Tool{Name: "reader", InputTrust: Trusted, Tier: sandbox.TierGVisor, Source: "test.yaml:1",
				Filesystem: Filesystem{Mounts: []sandbox.Mount{{Source: tt.source, Target: target}}}}
			ps := Validate([]Tool{tool}, opts)
			ms, err := ResolveMounts(tool, opts)
			if tt.rule == "" {
				if len(ps) > 0 {
					t.Fatalf("got problems:\n%v\nwant none", ps)
				}
				if err != nil {
					t.Fatalf("ResolveMounts: %v", err)
				}
				want := []sandbox.Mount{{Source: tt.resolved, Target: target}}
				if len(ms) != 1 || ms[0] != want[0] {
					t.Errorf("ResolveMounts: got %v, want %v", ms, want)
				}
				return
			}
			found := false
			for _, p := range ps {
				if p.Rule == tt.rule && strings.Contains(p.Message, tt.fragment) {
					found = true
					if p.Tool != "reader" || !strings.HasPrefix(p.String(), `test.yaml:1: tool "reader": rule `+tt.rule+": ") {
						t.Errorf("problem %q does not name the place, the tool and the rule", p)
					}
				}
			}
			if !found {
				t.Errorf("got problems:\n%v\nwant rule %s with %q", ps, tt.rule, tt.fragment)
			}
			var rps Problems
			if !tt.loadOnly && (!errors.As(err, &rps) || ms != nil) {
				t.Errorf("ResolveMounts: got %v, %v, want Problems", ms, err)
			}
		})
	}
}

// A symlink swapped in after the load is caught when the engine resolves the
// mounts for a run.
func TestResolveMountsRechecks(t *testing.T) {
	base, root := dataTree(t)
	opts := Options{Drivers: drivers, DataRoot: root}
	tool := Tool{Name: "reader", InputTrust: Trusted, Tier: sandbox.TierGVisor,
		Filesystem: Filesystem{Mounts: []sandbox.Mount{{Source: root + "/sales", Target: "/data/sales"}}}}
	if ps := Validate([]Tool{tool}, opts); len(ps) > 0 {
		t.Fatal(ps)
	}
	if err := os.RemoveAll(root + "/sales"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(base+"/outside", root+"/sales"); err != nil {
		t.Fatal(err)
	}
	_, err := ResolveMounts(tool, opts)
	if err == nil || !strings.Contains(err.Error(), "rule "+RuleMountSymlinkEscape) {
		t.Errorf("got %v, want %s", err, RuleMountSymlinkEscape)
	}
}

// A tools file with a good mount and a symlink escape, loaded as the daemon
// loads it.
func TestLoadWithMounts(t *testing.T) {
	_, root := dataTree(t)
	file := filepath.Join(t.TempDir(), "tools.yaml")
	yaml := `tools:
  - name: sales-report
    input_trust: trusted
    tier: container
    filesystem:
      mounts:
        - {source: ` + root + `/sales, target: /data/sales}
`
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	set, err := Load(file, Options{Drivers: drivers, DataRoot: root})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if tl, _ := set.Get("sales-report"); len(tl.Filesystem.Mounts) != 1 {
		t.Errorf("got mounts %v", tl.Filesystem.Mounts)
	}

	yaml += "        - {source: " + root + "/link-out, target: /data/out}\n"
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(file, Options{Drivers: drivers, DataRoot: root})
	want := file + `:8: tool "sales-report": rule mount-symlink-escape: mount source ` + root + "/link-out resolves through a symlink"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("got %v, want %q", err, want)
	}
}

func TestDataRootRefused(t *testing.T) {
	tool := Tool{Name: "reader", InputTrust: Trusted, Tier: sandbox.TierGVisor,
		Filesystem: Filesystem{Mounts: []sandbox.Mount{{Source: "/etc", Target: "/data/etc"}}}}
	for _, root := range []string{"/", "relative/data", "/proc"} {
		t.Run(root, func(t *testing.T) {
			ps := Validate([]Tool{tool}, Options{Drivers: drivers, DataRoot: root})
			if !hasRule(ps, RuleDataRoot) {
				t.Errorf("got %v, want rule %s", ps, RuleDataRoot)
			}
		})
	}
	// Without mounts the data root does not matter.
	tool.Filesystem.Mounts = nil
	if ps := Validate([]Tool{tool}, Options{Drivers: drivers, DataRoot: "/"}); len(ps) > 0 {
		t.Errorf("got %v, want no problem", ps)
	}
}
