package templates

import (
	"strings"
	"testing"
)

// FuzzParse decodes arbitrary templates files: Parse never panics, and a
// template it decodes without a problem has a canonical form that decodes
// back to itself.
func FuzzParse(f *testing.F) {
	f.Add([]byte(strings.ReplaceAll(goodYAML, "{{ROOT}}", "/srv/data")))
	f.Add([]byte("templates:\n  - {name: a, base: python, env: {A: x, A: y}}\n"))
	f.Add([]byte("templates: [{name: a, python_wheels: [{file: x, sha256: y}], files: [{source: a, target: b}]}]"))
	f.Add([]byte("- a\n- b\n"))
	f.Add([]byte("templates: &a [*a]"))
	f.Add([]byte("a: b\n---\nc: d\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ts, ps := Parse("f.yaml", data)
		for _, p := range ps {
			_ = p.String()
		}
		if len(ps) > 0 {
			return
		}
		// Validation without a data root touches no file.
		_ = Validate(ts, Options{})
		for _, tm := range ts {
			back, err := FromCanonical(Canonical(tm))
			if err != nil {
				t.Fatalf("FromCanonical(Canonical(%+v)): %v", tm, err)
			}
			if string(Canonical(back)) != string(Canonical(tm)) {
				t.Fatalf("canonical round trip:\n%s\n%s", Canonical(back), Canonical(tm))
			}
			if !Diff(tm, back).Empty() {
				t.Fatalf("Diff after a round trip: %v", Diff(tm, back).Lines())
			}
		}
	})
}
