package wire

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsNothingOfStockade checks that the wire is data only: the Go
// client, MCP and any other consumer get it without the server's
// packages.
func TestImportsNothingOfStockade(t *testing.T) {
	const module = "github.com/stockade-sh/stockade/"
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 5 {
		t.Fatalf("go list -deps: got %q, want the standard library's packages at least", deps)
	}
	for _, p := range deps {
		if strings.HasPrefix(p, module) && p != module+"wire" {
			t.Errorf("wire imports %s", p)
		}
	}
}
