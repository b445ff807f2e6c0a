package config

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestImportsNoRuntimePackage checks that the configuration imports,
// directly or not, none of Stockade's runtime packages (drivers, netns,
// broker, egress, analytics, image, tools, the store, the engine...): only
// the declarative ones whose values it holds. The conversions into the
// runtime packages' types are internal/wiring's.
func TestImportsNoRuntimePackage(t *testing.T) {
	const module = "github.com/stockade-sh/stockade/"
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, module+"config") || !slices.Contains(deps, module+"sandbox") {
		t.Fatalf("go list -deps: got %q, want config and sandbox's limits among them", deps)
	}
	// What config may import, and why: errdefs (its errors' classes),
	// sandbox (Limits, sizes and durations; it imports only errdefs),
	// internal/strictyaml (the file's strict decoding), templates (the
	// declarations it loads), internal/dataroot (the data root's rule
	// that templates' files are checked against: path checks, no runtime)
	// and internal/registry (kubernetes.registry's grammar; it imports
	// only errdefs).
	allowed := []string{"config", "errdefs", "sandbox", "internal/strictyaml", "templates", "internal/dataroot", "internal/registry"}
	for _, p := range deps {
		if rel, ours := strings.CutPrefix(p, module); ours && !slices.Contains(allowed, rel) {
			t.Errorf("config imports %s", p)
		}
	}
}
