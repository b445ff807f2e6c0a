package engine

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestImportsNoConcreteDriverOrStore checks that the engine knows the
// drivers only by the sandbox.Driver contract and nothing of the store or
// the capability layer above it: nothing it imports, directly or not, is
// a driver, the wiring that names them (internal/wiring), a store or the
// capability layer, which runs the engine as its Runner.
func TestImportsNoConcreteDriverOrStore(t *testing.T) {
	const module = "github.com/stockade-sh/stockade/"
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, module+"sandbox") {
		t.Fatalf("go list -deps: got %q, want the sandbox contract among them", deps)
	}
	concrete := []string{"internal/ocidriver", "internal/guestbin", "internal/wiring", "internal/storeopen", "capability"}
	for _, p := range deps {
		rel, ours := strings.CutPrefix(p, module)
		if ours && (strings.HasPrefix(rel, "driver/") || rel == "store" || strings.HasPrefix(rel, "store/") || slices.Contains(concrete, rel)) {
			t.Errorf("engine imports %s", p)
		}
	}
}
