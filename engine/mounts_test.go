package engine

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// TestMountsCheckedBeforeEachRun checks that a unix socket put below a
// tool's mount after the tools were loaded refuses the next run before any
// sandbox is made, where the check ran only when the records loaded.
func TestMountsCheckedBeforeEachRun(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "sales", "q3"), 0o755); err != nil {
		t.Fatal(err)
	}
	report := withToolsFile(t, `
tools:
  - name: report
    input_trust: trusted
    tier: gvisor
    filesystem:
      mounts:
        - {source: `+filepath.Join(root, "sales")+`, target: /data/sales}
`, tools.Options{DataRoot: root, Drivers: DriverCapabilities()})
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}
	eng, err := New(map[string]sandbox.Driver{"gvisor": drv}, "gvisor", sandboxfake.Images{}, sandbox.DefaultLimits(), sandbox.DefaultCeiling(), report)
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Runtime: "python", Tool: "report", Code: []byte("print(1)")}
	if _, err := eng.Run(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(root, "sales", "q3", "db.sock")
	if len(sock) > 100 {
		t.Skip("temporary directory too long for a unix socket path")
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = eng.Run(t.Context(), req)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "rule "+tools.RuleMountSocket) || !strings.Contains(err.Error(), "db.sock") {
		t.Fatalf("run after a socket appeared below the mount: got %v, want a failed precondition naming the socket", err)
	}
	if n := len(drv.Specs()); n != 1 {
		t.Errorf("sandboxes created: got %d, want 1 (none for the refused run)", n)
	}
}
