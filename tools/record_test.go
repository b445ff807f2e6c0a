package tools

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/sandbox"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

// fetcher is a record with every line filled in. Record does no I/O, so its
// mount source need not exist.
func fetcher() Tool {
	return Tool{
		Name:       "pypi-fetcher",
		Runtimes:   []string{"python"},
		Limits:     sandbox.Limits{Timeout: 2 * time.Minute, Memory: 1 << 30},
		InputTrust: Untrusted,
		Tier:       sandbox.TierGVisor,
		Filesystem: Filesystem{
			Mounts: []sandbox.Mount{{Source: "/var/lib/stockade/data/wheels", Target: "/data/wheels"}},
		},
		Egress:      Egress{Allow: []string{"pypi.org", "*.pythonhosted.org"}, Ports: []int{443}},
		Credentials: []string{"pypi.upload"},
		AcceptRisk:  &AcceptRisk{By: "bob@example.com", Reason: "uploads only to our own project; reviewed in SEC-12"},
		Source:      "tools.d/pypi.yaml:3",
	}
}

func TestRecordGolden(t *testing.T) {
	set, err := Load("testdata/good/tools.yaml", Options{Drivers: drivers})
	if err != nil {
		t.Fatal(err)
	}
	sql, _ := set.Get("sql-reader")
	calc, _ := set.Get("calculator")
	tests := []struct {
		name string
		tool Tool
	}{
		{"default", Default()},
		{"sql-reader", sql},
		{"calculator", calc},
		{"pypi-fetcher", fetcher()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Record(tt.tool, Options{Drivers: drivers})
			path := filepath.Join("testdata", "golden", tt.name+".md")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./tools/ -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("Record(%s) differs from %s (go test ./tools/ -update rewrites it)\ngot:\n%s", tt.name, path, got)
			}
		})
	}
}

// The parts of a record an auditor relies on, checked one by one so that a
// golden-file update cannot silently drop them.
func TestRecordContents(t *testing.T) {
	set, err := Load("testdata/good/tools.yaml", Options{Drivers: drivers})
	if err != nil {
		t.Fatal(err)
	}
	sql, _ := set.Get("sql-reader")
	tests := []struct {
		name string
		tool Tool
		want []string
	}{
		{"default", Default(), []string{
			"# Tool `code.execute`",
			"runtimes: all",
			"- **Input trust:** untrusted",
			"- **Runtime tier:** gvisor (driver `gvisor`)",
			"- **Filesystem scope:** no host data; writable scratch `/tmp` 64MiB, destroyed with the sandbox after each invocation; root filesystem read-only",
			"- **Egress allowlist:** none",
			"- **Credentials reachable:** none",
			drivers["gvisor"].Boundary,
			"| wall clock | 30s per execution |",
			"| memory | 512MiB, no swap |",
			"| cpu | 1 vCPU |",
			"| processes | 128 |",
			"## Accepted risk\n\nNone.",
		}},
		{"container with accepted risk", sql, []string{
			"- **Runtime tier:** container (driver `runc`)",
			drivers["runc"].Boundary,
			"| cpu | 0.5 vCPU |",
			"Accepted by alice@example.com.",
			"Reason: the reporting host has no other tenant",
			"Overrides: untrusted-on-container.",
			"Defined in testdata/good/tools.yaml:20.",
		}},
		{"every line", fetcher(), []string{
			"runtimes: python",
			"`/var/lib/stockade/data/wheels` read-only at `/data/wheels`",
			"destroyed with the sandbox after each invocation",
			"- **Egress allowlist:** `*.pythonhosted.org`, `pypi.org` on port 443, through the egress proxy",
			"- **Credentials reachable:** broker operations `pypi.upload`",
			"| wall clock | 2m per execution |",
			"| memory | 1GiB, no swap |",
			"Overrides: lethal-trifecta.",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Record(tt.tool, Options{Drivers: drivers})
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("record lacks %q; got:\n%s", w, got)
				}
			}
		})
	}
}

func TestFingerprint(t *testing.T) {
	// The default tool's fingerprint is pinned: a change here changes every
	// fingerprint the daemon has stored, and must be deliberate.
	const wantDefault = "sha256:40a571f3a35036df4241cf78c0dfdad4246afa561cc172d206b26dc989bd0760"
	if got := Fingerprint(Default()); got != wantDefault {
		t.Errorf("got default fingerprint %s, want %s", got, wantDefault)
	}

	a := fetcher()
	b := fetcher()
	// Order, explicit defaults and Source do not change a record.
	b.Egress.Allow = []string{"*.pythonhosted.org", "pypi.org"}
	b.Limits.Pids = 128
	b.Limits.OutputCap = 1 << 20
	b.Source = "elsewhere.yaml:9"
	b.Capability = CapabilityCodeExecute
	if Fingerprint(a) != Fingerprint(b) {
		t.Errorf("equal records have different fingerprints:\n%s\n%s", Canonical(a), Canonical(b))
	}
	b.Egress.Ports = []int{443, 8443}
	if Fingerprint(a) == Fingerprint(b) {
		t.Errorf("different records have the same fingerprint")
	}
}

// TestSessionLifetime checks that a record may say its scratch lives as
// long as a session (refused before sessions existed), that its record
// says so, and that the lifetime is part of the fingerprint (a change of
// it is a change of the record).
func TestSessionLifetime(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tools.yaml")
	if err := os.WriteFile(path, []byte("tools:\n  - name: notebook\n    input_trust: untrusted\n    tier: gvisor\n    filesystem:\n      scratch: {lifetime: session}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	set, err := Load(path, Options{Drivers: drivers})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	nb, err := set.Get("notebook")
	if err != nil {
		t.Fatal(err)
	}
	if nb.Filesystem.ScratchLifetime != LifetimeSession {
		t.Fatalf("lifetime: got %q, want session", nb.Filesystem.ScratchLifetime)
	}
	rec := Record(nb, Options{Drivers: drivers})
	if !strings.Contains(rec, "and a session's `/workspace`, kept across a session's cells and destroyed with its sandbox when the session ends") {
		t.Errorf("record does not say what lives as long as a session:\n%s", rec)
	}
	other := nb
	other.Filesystem.ScratchLifetime = LifetimeInvocation
	if Fingerprint(nb) == Fingerprint(other) {
		t.Error("the lifetime is not part of the fingerprint")
	}
}
