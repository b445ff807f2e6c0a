package conformance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDifferencesInREADME checks that the README lists every known
// difference of the tiers, as the table states it, and no other.
func TestDifferencesInREADME(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	const header = "| tier | difference | why the profile holds |\n| --- | --- | --- |\n"
	_, rest, ok := strings.Cut(string(b), header)
	if !ok {
		t.Fatalf("README.md has no table of the tiers' differences (%q)", header)
	}
	var listed []string
	for _, line := range strings.Split(rest, "\n") {
		if !strings.HasPrefix(line, "| ") {
			break
		}
		listed = append(listed, line)
	}
	var want []string
	ids := map[string]bool{}
	for _, d := range Differences {
		if ids[d.ID] {
			t.Errorf("difference %q is declared twice", d.ID)
		}
		ids[d.ID] = true
		want = append(want, "| "+string(d.Tier)+" | "+d.Fact+" | "+d.Reason+" |")
	}
	if strings.Join(listed, "\n") != strings.Join(want, "\n") {
		t.Errorf("README.md lists the differences\n%s\nwant\n%s", strings.Join(listed, "\n"), strings.Join(want, "\n"))
	}
}
