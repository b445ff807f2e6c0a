package engine

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestImportsNoConcreteDriverOrStore checks that the engine knows the
// drivers only by the sandbox.Driver contract and the store only by its
// interfaces: nothing it imports, directly or not, is a driver, a store
// implementation, or the wiring that names them (internal/wiring).
func TestImportsNoConcreteDriverOrStore(t *testing.T) {
	const module = "github.com/stockade-sh/stockade/"
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, module+"sandbox") || !slices.Contains(deps, module+"store") {
		t.Fatalf("go list -deps: got %q, want the contracts among them", deps)
	}
	concrete := []string{"internal/ocidriver", "internal/guestbin", "internal/wiring", "internal/storeopen", "store/sqlite", "store/postgres", "store/internal/sqlstore"}
	for _, p := range deps {
		rel, ours := strings.CutPrefix(p, module)
		if ours && (strings.HasPrefix(rel, "driver/") || slices.Contains(concrete, rel)) {
			t.Errorf("engine imports %s", p)
		}
	}
}
