package templates_test

import (
	"slices"
	"testing"

	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/templates"
)

// TestBasesAreTheRuntimes holds Bases to the runtime images it restates.
func TestBasesAreTheRuntimes(t *testing.T) {
	got, want := slices.Sorted(slices.Values(templates.Bases())), slices.Sorted(slices.Values(image.Names()))
	if !slices.Equal(got, want) {
		t.Errorf("templates.Bases() = %v, want image.Names() = %v", got, want)
	}
}
