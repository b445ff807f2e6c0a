package engine

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// TestToolsRunOnTheirRecords runs tools on real drivers and checks that each
// runs on the tier its record names, with the record's mounts read-only.
func TestToolsRunOnTheirRecords(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	testenv.RequiresBinary(t, "runsc")
	guest := testenv.Guest(t)
	rc, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: guest})
	if err != nil {
		t.Fatal(err)
	}
	gv, err := gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: guest})
	if err != nil {
		t.Fatal(err)
	}
	dataRoot := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dataRoot, "sales"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dataRoot, "sales", "q3.csv"), []byte("region,total\nnorth,42\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(cfg, []byte(`
tools:
  - name: report
    input_trust: trusted
    tier: container
    runtimes: [shell]
    filesystem:
      mounts:
        - {source: `+filepath.Join(dataRoot, "sales")+`, target: /data/sales}
  - name: explore
    input_trust: untrusted
    tier: gvisor
    runtimes: [shell]
    filesystem:
      mounts:
        - {source: `+filepath.Join(dataRoot, "sales")+`, target: /data/sales}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := tools.Options{DataRoot: dataRoot, Drivers: DriverCapabilities()}
	set, err := tools.Load(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := New(map[string]sandbox.Driver{"runc": rc, "gvisor": gv}, "gvisor", image.Open(testenv.DataDir()),
		sandbox.DefaultLimits(), sandbox.DefaultCeiling(), WithTools(set, opts))
	if err != nil {
		t.Fatal(err)
	}
	code := `cat /data/sales/q3.csv; if echo x > /data/sales/new 2>/dev/null; then echo WROTE; else echo refused; fi; ls /data`
	for _, tt := range []struct{ tool, driver string }{{"report", "runc"}, {"explore", "gvisor"}} {
		t.Run(tt.tool, func(t *testing.T) {
			res, err := eng.Run(context.Background(), Request{Tool: tt.tool, Runtime: "shell", Code: []byte(code)})
			if err != nil {
				t.Fatal(err)
			}
			if res.Driver != tt.driver {
				t.Errorf("driver: got %s, want %s (the record's tier)", res.Driver, tt.driver)
			}
			if !strings.Contains(res.Stdout, "north,42") || !strings.Contains(res.Stdout, "refused") || strings.Contains(res.Stdout, "WROTE") {
				t.Errorf("got stdout %q stderr %q, want the mounted file readable and the mount read-only", res.Stdout, res.Stderr)
			}
			if _, err := os.Stat(filepath.Join(dataRoot, "sales", "new")); err == nil {
				t.Error("the sandbox wrote into the host's data directory")
			}
		})
	}
	t.Run("image untouched", func(t *testing.T) {
		// The runtimes make the mount points on a tmpfs, never in the
		// shared image on disk.
		img := testenv.Image(t, "shell")
		entries, err := os.ReadDir(filepath.Join(img.Rootfs, "data"))
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) > 0 {
			t.Errorf("the image's /data holds %d entries after runs with data mounts, want none", len(entries))
		}
	})
	t.Run("runtime outside the record", func(t *testing.T) {
		_, err := eng.Run(context.Background(), Request{Tool: "report", Runtime: "python", Code: []byte("print(1)")})
		if err == nil || !strings.Contains(err.Error(), `does not allow runtime "python"`) {
			t.Errorf("got %v, want the record's runtime list enforced", err)
		}
	})
	t.Run("default tool on the default driver", func(t *testing.T) {
		res, err := eng.Run(context.Background(), Request{Runtime: "shell", Code: []byte("ls -A /data")})
		if err != nil {
			t.Fatal(err)
		}
		if res.Driver != "gvisor" || res.Stdout != "" || res.Status != sandbox.StatusSucceeded {
			t.Errorf("got driver %s status %s stdout %q, want gvisor and an empty /data", res.Driver, res.Status, res.Stdout)
		}
	})
}
