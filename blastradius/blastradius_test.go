package blastradius_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/blastradius"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/docker"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/internal/wiring"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/conformance"
	"github.com/stockade-sh/stockade/tools"
)

// drivers are the drivers the audit runs on here, with the tier of their
// tools.
var drivers = []struct {
	name string
	tier sandbox.Tier
}{
	{"runc", sandbox.TierContainer},
	{"gvisor", sandbox.TierGVisor},
	{"docker", sandbox.TierDocker},
}

// newEngine returns an engine whose default driver is name, with opts.
func newEngine(t *testing.T, name string, opts ...engine.Option) *engine.Engine {
	t.Helper()
	testenv.RequiresRoot(t)
	var (
		d   sandbox.Driver
		err error
	)
	switch name {
	case "runc":
		testenv.RequiresBinary(t, "runc")
		d, err = runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t)})
	case "gvisor":
		testenv.RequiresBinary(t, "runsc")
		d, err = gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t)})
	case "docker":
		host := os.Getenv("STOCKADE_TEST_DOCKER_HOST")
		if host == "" {
			testenv.Missing(t, "STOCKADE_TEST_DOCKER_HOST is not set; start a dockerd with `scripts/dockerd.sh start DIR` and set it to what that prints")
		}
		var dk *docker.Driver
		dk, err = docker.New(docker.Config{Host: host, GuestPath: testenv.Guest(t)})
		if err == nil {
			t.Cleanup(func() { dk.Close() })
		}
		d = dk
	}
	if err != nil {
		t.Fatal(err)
	}
	testenv.Image(t, "shell")
	e, err := engine.New(map[string]sandbox.Driver{name: d}, name, image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func audit(t *testing.T, e *engine.Engine, opts blastradius.Options) *blastradius.Report {
	t.Helper()
	opts.Probe = conformance.BuildProbe(t)
	r, err := blastradius.Run(t.Context(), e, opts)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return r
}

// deviationsAbout returns the deviations whose subject or observation
// mentions s.
func deviationsAbout(r *blastradius.Report, s string) []blastradius.Check {
	var out []blastradius.Check
	for _, c := range r.Deviations {
		if strings.Contains(c.Subject, s) || strings.Contains(c.Observed, s) {
			out = append(out, c)
		}
	}
	return out
}

// TestDefaultTool runs the audit on the default tool: a sandbox exactly as
// the record and the profile say has no deviation.
func TestDefaultTool(t *testing.T) {
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) {
			e := newEngine(t, d.name)
			r := audit(t, e, blastradius.Options{})
			t.Logf("report:\n%s", r.Markdown())
			if r.Tool != tools.DefaultName || r.Driver != d.name || r.Tier != d.tier {
				t.Errorf("audited tool %q on driver %q (tier %s), want %q on %q (%s)", r.Tool, r.Driver, r.Tier, tools.DefaultName, d.name, d.tier)
			}
			if len(r.Deviations) != 0 {
				t.Errorf("got %d deviations, want none:", len(r.Deviations))
				for _, c := range r.Deviations {
					t.Errorf("  %s", c)
				}
			}
			if !strings.HasSuffix(r.Markdown(), "\ndeviations: 0\n") {
				t.Errorf("the text report does not end with \"deviations: 0\"")
			}
		})
	}
}

// TestWidenedSandbox proves that the audit notices a sandbox wider than its
// record: a host directory mounted beyond the record, and an environment
// variable beyond the program environment.
func TestWidenedSandbox(t *testing.T) {
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) {
			e := newEngine(t, d.name)
			host := t.TempDir()
			if err := os.WriteFile(filepath.Join(host, "secret.txt"), []byte("host data\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Run("ExtraMount", func(t *testing.T) {
				const target = "/data/extra"
				r := audit(t, e, blastradius.Options{ExtraMounts: []sandbox.Mount{{Source: host, Target: target}}})
				got := deviationsAbout(r, target)
				if len(got) == 0 {
					t.Fatalf("a host directory mounted at %s beyond the record: got no deviation naming it; deviations: %v\n%s", target, r.Deviations, r.Markdown())
				}
				t.Logf("deviations: %v", r.Deviations)
				if !strings.Contains(r.Markdown(), "**DEVIATION** "+target) {
					t.Errorf("the text report does not mark %s as a deviation", target)
				}
			})
			t.Run("ExtraEnv", func(t *testing.T) {
				const name = "STOCKADE_TEST_LEAKED_TOKEN"
				const value = "s3cr3t-value-never-printed"
				r := audit(t, e, blastradius.Options{ExtraEnv: []string{name + "=" + value}})
				got := deviationsAbout(r, name)
				if len(got) != 1 || len(r.Deviations) != 1 {
					t.Fatalf("an extra variable %s: got deviations %v, want exactly one naming it\n%s", name, r.Deviations, r.Markdown())
				}
				if text := r.Markdown(); strings.Contains(text, value) {
					t.Errorf("the report contains the variable's value; want it redacted")
				}
			})
		})
	}
}

// TestRecordMount audits a tool whose record mounts a data directory: the
// mount is there, read-only, and is no deviation; the record's smaller
// limits are the ones enforced.
func TestRecordMount(t *testing.T) {
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) {
			root := t.TempDir()
			data := filepath.Join(root, "sales")
			if err := os.Mkdir(data, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{"q1.csv", "q2.csv"} {
				if err := os.WriteFile(filepath.Join(data, f), []byte("region,total\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			file := filepath.Join(t.TempDir(), "tools.yaml")
			yaml := `tools:
  - name: sales-reader
    runtimes: [shell]
    limits: {memory: 256MiB, pids: 64, timeout: 1s, output_cap: 4KiB}
    input_trust: trusted
    tier: ` + string(d.tier) + `
    filesystem:
      mounts:
        - {source: ` + data + `, target: /data/sales}
      scratch: {size: 16MiB}
`
			if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			opts := tools.Options{DataRoot: root, Drivers: wiring.DriverCapabilities(config.Default()), DefaultTier: d.tier}
			set, err := tools.Load(file, opts)
			if err != nil {
				t.Fatal(err)
			}
			e := newEngine(t, d.name, engine.WithTools(set, opts))
			r := audit(t, e, blastradius.Options{Tool: "sales-reader"})
			t.Logf("report:\n%s", r.Markdown())
			// The probe runs past the record's wall clock and output cap,
			// which bound the tool's code, not what it reaches.
			if len(r.Deviations) != 0 {
				t.Errorf("got deviations %v, want none: the record's own mount is within the record", r.Deviations)
			}
			if r.RecordLimits.Pids != 64 || r.RecordLimits.MemoryBytes != 256<<20 || r.RecordLimits.TmpSizeBytes != 16<<20 {
				t.Errorf("record limits: got %+v, want 64 pids, 256 MiB, 16 MiB scratch", r.RecordLimits)
			}
			var mounted, readOnly bool
			for _, s := range r.Sections {
				for _, c := range s.Checks {
					if s.Name == "mounts" && c.Subject == "/data/sales" {
						mounted, readOnly = true, c.Observed == "read-only" && !c.Deviation
					}
				}
			}
			if !mounted || !readOnly {
				t.Errorf("the record's mount at /data/sales: got mounted %t, read-only %t; want both", mounted, readOnly)
			}
		})
	}
}
