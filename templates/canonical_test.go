package templates

import (
	"slices"
	"strings"
	"testing"
)

func TestCanonicalIgnoresOrderAndSource(t *testing.T) {
	a := Template{Name: "a", Base: "python", Source: "x.yaml:1",
		DebianPackages: []string{"b", "a"},
		PythonWheels:   []Wheel{{Name: "six==1.16.0", SHA256: strings.ToUpper(sha)}, {File: "t-1-py3-none-any.whl", SHA256: sha}},
		Files:          []File{{Source: "/d/b", Target: "/opt/b"}, {Source: "/d/a", Target: "/opt/a"}},
		Env:            map[string]string{"B": "2", "A": "1"}}
	b := Template{Name: "a", Base: "python", Source: "y.yaml:9",
		DebianPackages: []string{"a", "b"},
		PythonWheels:   []Wheel{{File: "t-1-py3-none-any.whl", SHA256: sha}, {Name: "six==1.16.0", SHA256: sha}},
		Files:          []File{{Source: "/d/a", Target: "/opt/a"}, {Source: "/d/b", Target: "/opt/b"}},
		Env:            map[string]string{"A": "1", "B": "2"}}
	if string(Canonical(a)) != string(Canonical(b)) || Key(a) != Key(b) {
		t.Fatalf("equal declarations differ:\n%s\n%s", Canonical(a), Canonical(b))
	}
	if !Diff(a, b).Empty() {
		t.Errorf("Diff of equal declarations: got %v", Diff(a, b).Lines())
	}
	b.Start = "import six"
	if Key(a) == Key(b) {
		t.Error("a changed start kept the key")
	}
	// Empty lists and maps are present, so that nil and empty agree.
	want := `{"name":"e","base":"shell","debian_packages":[],"npm_packages":[],"npm_scripts":false,"python_wheels":[],"files":[],"env":{},"workdir":"","start":"","ready":"","golden":false}`
	if got := string(Canonical(Template{Name: "e", Base: "shell"})); got != want {
		t.Errorf("Canonical of an empty template:\n got %s\nwant %s", got, want)
	}
	if got := Key(Template{Name: "e", Base: "shell"}); !strings.HasPrefix(got, "sha256:") || len(got) != 71 {
		t.Errorf("Key: got %s", got)
	}
}

func TestFromCanonicalRoundTrips(t *testing.T) {
	in := Template{Name: "a", Base: "node", NPMPackages: []string{"x@1.0.0"}, NPMScripts: true,
		PythonWheels: []Wheel{{Name: "six==1.16.0", SHA256: sha}}, Files: []File{{Source: "/d/a", Target: "/opt/a"}},
		Env: map[string]string{"A": "1"}, Workdir: "/w", Start: "s", Ready: "r", Golden: true}
	out, err := FromCanonical(Canonical(in))
	if err != nil {
		t.Fatal(err)
	}
	if string(Canonical(out)) != string(Canonical(in)) {
		t.Errorf("round trip:\n got %s\nwant %s", Canonical(out), Canonical(in))
	}
	if _, err := FromCanonical([]byte("{")); err == nil {
		t.Error("FromCanonical of bad JSON: got no error")
	}
}

func TestDiff(t *testing.T) {
	v1 := Template{Name: "a", Base: "python", DebianPackages: []string{"python3-bs4", "curl=8.0-1"},
		PythonWheels: []Wheel{{Name: "six==1.16.0", SHA256: sha}},
		Files:        []File{{Source: "/d/m.json", Target: "/opt/m.json"}}, Start: "import bs4"}
	for _, tc := range []struct {
		name   string
		edit   func(*Template)
		lines  []string
		grows  bool
		checkC func(Change) bool
	}{
		{"unchanged", func(*Template) {}, nil, false, func(c Change) bool { return c.Empty() }},
		{"debian added", func(t *Template) { t.DebianPackages = append(t.DebianPackages, "jq") },
			[]string{"debian_packages +jq"}, true, func(c Change) bool { return slices.Equal(c.DebianAdded, []string{"jq"}) }},
		{"debian removed", func(t *Template) { t.DebianPackages = t.DebianPackages[:1] },
			[]string{"debian_packages -curl=8.0-1"}, false, func(c Change) bool { return slices.Equal(c.DebianRemoved, []string{"curl=8.0-1"}) }},
		{"version changed", func(t *Template) { t.DebianPackages = []string{"python3-bs4", "curl=8.1-1"} },
			[]string{"debian_packages +curl=8.1-1", "debian_packages -curl=8.0-1"}, true, nil},
		{"npm added", func(t *Template) { t.NPMPackages = []string{"x@1.0.0"} }, []string{"npm_packages +x@1.0.0"}, true, nil},
		{"wheel hash changed", func(t *Template) { t.PythonWheels = []Wheel{{Name: "six==1.16.0", SHA256: strings.Repeat("f", 64)}} },
			[]string{"python_wheels +six==1.16.0 sha256:" + strings.Repeat("f", 64), "python_wheels -six==1.16.0 sha256:" + sha}, true, nil},
		{"file added", func(t *Template) { t.Files = append(t.Files, File{Source: "/d/x", Target: "/opt/x"}) },
			[]string{"files +/d/x -> /opt/x"}, true, nil},
		{"file removed", func(t *Template) { t.Files = nil }, []string{"files -/d/m.json -> /opt/m.json"}, false, nil},
		{"npm scripts on", func(t *Template) { t.NPMScripts = true }, []string{"npm_scripts changed"}, true, func(c Change) bool { return c.NPMScriptsOn }},
		{"other fields", func(t *Template) { t.Start, t.Env, t.Golden = "pass", map[string]string{"A": "1"}, true },
			[]string{"env changed", "start changed", "golden changed"}, false, func(c Change) bool { return slices.Equal(c.Other, []string{"env", "start", "golden"}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v2 := v1.Clone()
			tc.edit(&v2)
			c := Diff(v1, v2)
			if got := c.Lines(); !slices.Equal(got, tc.lines) {
				t.Errorf("Lines: got %q, want %q", got, tc.lines)
			}
			if c.Grows() != tc.grows {
				t.Errorf("Grows: got %v, want %v", c.Grows(), tc.grows)
			}
			if c.Empty() != (len(tc.lines) == 0) {
				t.Errorf("Empty: got %v", c.Empty())
			}
			if tc.checkC != nil && !tc.checkC(c) {
				t.Errorf("Change: got %+v", c)
			}
		})
	}
	// Turning npm scripts off runs less: no growth.
	on := v1.Clone()
	on.NPMScripts = true
	if c := Diff(on, v1); c.Grows() || c.NPMScriptsOn || !slices.Equal(c.Other, []string{"npm_scripts"}) {
		t.Errorf("npm scripts off: got %+v, want a change that does not grow", c)
	}
	// No template to a template: everything is added.
	if c := Diff(Template{}, v1); !c.Grows() || len(c.DebianAdded) != 2 || !slices.Contains(c.Other, "base") {
		t.Errorf("Diff from none: got %+v", c)
	}
}
