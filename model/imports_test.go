package model_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestImportDirections checks the layering around the domain model: model
// is a leaf that imports nothing of Stockade's; policy decides over its
// types and audit words events of them without the store; and the store
// persists them knowing nothing of the policy, the audit events or the
// capability layer above it.
func TestImportDirections(t *testing.T) {
	const module = "github.com/stockade-sh/stockade/"
	tests := []struct {
		// pkg is what go list is asked for, relative to the module.
		pkg string
		// want is one of the dependencies, to show the listing sees them.
		want string
		// only, when not nil, is every package of the module allowed
		// among the dependencies.
		only []string
		// forbid are packages of the module not allowed among them; one
		// that ends in "/" stands for every package below it.
		forbid []string
	}{
		{pkg: "model", want: "time", only: []string{"model"}},
		{pkg: "policy", want: module + "model", forbid: []string{"store", "store/", "audit", "capability"}},
		{pkg: "audit", want: module + "model", forbid: []string{"store", "store/", "capability"}},
		{pkg: "store/...", want: module + "model", forbid: []string{"policy", "audit", "capability"}},
	}
	for _, tt := range tests {
		t.Run(tt.pkg, func(t *testing.T) {
			out, err := exec.Command("go", "list", "-deps", module+tt.pkg).Output()
			if err != nil {
				t.Fatalf("go list -deps %s: %v", tt.pkg, err)
			}
			deps := strings.Fields(string(out))
			if !slices.Contains(deps, tt.want) {
				t.Fatalf("go list -deps %s: got %q, want %s among them", tt.pkg, deps, tt.want)
			}
			for _, p := range deps {
				rel, ours := strings.CutPrefix(p, module)
				if !ours {
					continue
				}
				if tt.only != nil && !slices.Contains(tt.only, rel) {
					t.Errorf("%s imports %s", tt.pkg, p)
				}
				for _, f := range tt.forbid {
					if rel == f || strings.HasSuffix(f, "/") && strings.HasPrefix(rel, f) {
						t.Errorf("%s imports %s", tt.pkg, p)
					}
				}
			}
		})
	}
}
