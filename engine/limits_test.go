package engine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// withToolsFile is the engine option of the tools a file holding yaml
// defines, loaded with opts.
func withToolsFile(t *testing.T, yaml string, opts tools.Options) Option {
	t.Helper()
	file := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	set, err := tools.Load(file, opts)
	if err != nil {
		t.Fatal(err)
	}
	return WithTools(set, opts)
}

// boundedTool is a tool whose record limits its sandboxes to 10 s and
// 256 MiB.
func boundedTool(t *testing.T) Option {
	return withToolsFile(t, `
tools:
  - name: report
    input_trust: trusted
    tier: gvisor
    limits: {timeout: 10s, memory: 256MiB}
`, tools.Options{Drivers: DriverCapabilities()})
}

// TestRecordLimitsAreCeilings checks that a tool's record limits are the
// most a request may ask for, not only defaults: a request above one is
// refused naming the tool and the limit, and one that asks for nothing
// gets the record's.
func TestRecordLimitsAreCeilings(t *testing.T) {
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}
	eng, err := New(map[string]sandbox.Driver{"gvisor": drv}, "gvisor", sandboxfake.Images{}, sandbox.DefaultLimits(), sandbox.DefaultCeiling(), boundedTool(t))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		limits  sandbox.Limits
		refusal string // in the error; empty when the request is allowed
	}{
		{"nothing asked", sandbox.Limits{}, ""},
		{"at the record's limits", sandbox.Limits{Timeout: 10 * time.Second, Memory: 256 << 20}, ""},
		{"below them", sandbox.Limits{Timeout: 5 * time.Second, Memory: 128 << 20}, ""},
		{"more time", sandbox.Limits{Timeout: 20 * time.Second}, "timeout 20s is above the ceiling of 10s"},
		{"more memory", sandbox.Limits{Memory: 1 << 30}, "memory 1GiB is above the ceiling of 256MiB"},
		{"a limit the record leaves to the server", sandbox.Limits{Pids: 512}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, _, err := eng.Validate(Request{Runtime: "python", Tool: "report", Code: []byte("print(1)"), Limits: tt.limits})
			if tt.refusal == "" {
				if err != nil {
					t.Fatalf("Validate: got %v, want it allowed", err)
				}
				return
			}
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `tool "report"`) || !strings.Contains(err.Error(), tt.refusal) {
				t.Fatalf("Validate: got %v, want an invalid argument naming tool \"report\" and %q", err, tt.refusal)
			}
			if _, err := eng.Run(t.Context(), Request{Runtime: "python", Tool: "report", Code: []byte("print(1)"), Limits: tt.limits}); !errdefs.IsInvalidArgument(err) {
				t.Errorf("Run: got %v, want the same refusal", err)
			}
		})
	}
	if _, err := eng.Run(t.Context(), Request{Runtime: "python", Tool: "report", Code: []byte("print(1)")}); err != nil {
		t.Fatal(err)
	}
	got := drv.Specs()[len(drv.Specs())-1].Limits
	if got.Timeout != 10*time.Second || got.Memory != 256<<20 {
		t.Errorf("sandbox limits of a request asking for nothing: got timeout %s memory %d, want the record's 10s and 256 MiB", got.Timeout, got.Memory)
	}
}
