package capability

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestImportsNoConcreteDriverOrStore checks that the capability layer knows
// the store only by the small interfaces it declares (Journal, Queries)
// and the engine only as the runner of its sandboxes: nothing it imports, directly or not,
// is a store implementation, a driver, or the wiring that names them.
func TestImportsNoConcreteDriverOrStore(t *testing.T) {
	const module = "github.com/stockade-sh/stockade/"
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, module+"store") || !slices.Contains(deps, module+"engine") {
		t.Fatalf("go list -deps: got %q, want the store's types and the engine among them", deps)
	}
	concrete := []string{"internal/ocidriver", "internal/guestbin", "internal/wiring", "internal/storeopen", "store/sqlite", "store/postgres", "store/internal/sqlstore"}
	for _, p := range deps {
		rel, ours := strings.CutPrefix(p, module)
		if ours && (strings.HasPrefix(rel, "driver/") || slices.Contains(concrete, rel)) {
			t.Errorf("capability imports %s", p)
		}
	}
}
