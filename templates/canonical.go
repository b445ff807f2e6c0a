package templates

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// canonicalTemplate is a declaration in a form where equal declarations
// are equal values: lists sorted and without repeats, empty lists and maps
// present, hex digits lower-case. Its JSON is what Key hashes, so its
// field names and order are part of the key's stability.
type canonicalTemplate struct {
	Name           string            `json:"name"`
	Base           string            `json:"base"`
	DebianPackages []string          `json:"debian_packages"`
	NPMPackages    []string          `json:"npm_packages"`
	NPMScripts     bool              `json:"npm_scripts"`
	PythonWheels   []canonicalWheel  `json:"python_wheels"`
	Files          []canonicalFile   `json:"files"`
	Env            map[string]string `json:"env"`
	Workdir        string            `json:"workdir"`
	Start          string            `json:"start"`
	Ready          string            `json:"ready"`
	Golden         bool              `json:"golden"`
}

type canonicalWheel struct {
	File   string `json:"file,omitempty"`
	Name   string `json:"name,omitempty"`
	SHA256 string `json:"sha256"`
}

type canonicalFile struct {
	Source string `json:"source"`
	Target string `json:"target"`
}

func canonical(t Template) canonicalTemplate {
	sorted := func(s []string) []string {
		s = append([]string{}, s...)
		slices.Sort(s)
		return slices.Compact(s)
	}
	c := canonicalTemplate{
		Name:           t.Name,
		Base:           t.Base,
		DebianPackages: sorted(t.DebianPackages),
		NPMPackages:    sorted(t.NPMPackages),
		NPMScripts:     t.NPMScripts,
		PythonWheels:   []canonicalWheel{},
		Files:          []canonicalFile{},
		Env:            map[string]string{},
		Workdir:        t.Workdir,
		Start:          t.Start,
		Ready:          t.Ready,
		Golden:         t.Golden,
	}
	for _, w := range t.PythonWheels {
		c.PythonWheels = append(c.PythonWheels, canonicalWheel{File: w.File, Name: w.Name, SHA256: strings.ToLower(w.SHA256)})
	}
	slices.SortFunc(c.PythonWheels, func(a, b canonicalWheel) int {
		return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Name, b.Name), cmp.Compare(a.SHA256, b.SHA256))
	})
	c.PythonWheels = slices.Compact(c.PythonWheels)
	for _, f := range t.Files {
		c.Files = append(c.Files, canonicalFile(f))
	}
	slices.SortFunc(c.Files, func(a, b canonicalFile) int {
		return cmp.Or(cmp.Compare(a.Target, b.Target), cmp.Compare(a.Source, b.Source))
	})
	c.Files = slices.Compact(c.Files)
	maps.Copy(c.Env, t.Env)
	return c
}

// Canonical returns the declaration as canonical JSON: lists sorted, keys
// in a fixed order, Source left out. Two templates with equal declarations
// have equal Canonical bytes. A tool's record carries it, and so its audit
// events.
func Canonical(t Template) []byte {
	b, err := json.Marshal(canonical(t))
	if err != nil {
		panic(fmt.Sprintf("templates: marshalling a canonical declaration: %v", err)) // plain data: cannot fail
	}
	return b
}

// Key is "sha256:" and the hex SHA-256 of Canonical(t): it names the
// declaration. A build records it, and a declaration whose Key differs from
// its build's is stale.
func Key(t Template) string {
	sum := sha256.Sum256(Canonical(t))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// FromCanonical decodes a declaration stored as Canonical bytes (in a
// tool's record in the audit trail, say). The result is not validated.
func FromCanonical(b []byte) (Template, error) {
	var c canonicalTemplate
	if err := json.Unmarshal(b, &c); err != nil {
		return Template{}, fmt.Errorf("decoding a template's declaration: %w", err)
	}
	t := Template{Name: c.Name, Base: c.Base, DebianPackages: c.DebianPackages, NPMPackages: c.NPMPackages,
		NPMScripts: c.NPMScripts, Workdir: c.Workdir, Start: c.Start, Ready: c.Ready, Golden: c.Golden}
	for _, w := range c.PythonWheels {
		t.PythonWheels = append(t.PythonWheels, Wheel(w))
	}
	for _, f := range c.Files {
		t.Files = append(t.Files, File(f))
	}
	if len(c.Env) > 0 {
		t.Env = c.Env
	}
	return t, nil
}

// Change is the difference between two declarations of a template (or of
// what a tool's template is: the zero Template is no template). The lists
// hold the entries as they are written (a wheel with its SHA-256, a file
// as "source -> target"); a changed entry, a package's version say, is one
// removed and one added.
type Change struct {
	DebianAdded, DebianRemoved []string
	NPMAdded, NPMRemoved       []string
	WheelsAdded, WheelsRemoved []string
	FilesAdded, FilesRemoved   []string
	// NPMScriptsOn is set when npm_scripts turned true: the packages'
	// install scripts run at build time where they did not.
	NPMScriptsOn bool
	// Other names the other fields that changed, in declaration order:
	// name, base, npm_scripts, env, workdir, start, ready, golden.
	Other []string
}

// Diff compares two declarations. Only the declaration counts: lists are
// compared as sets, Source not at all.
func Diff(old, new Template) Change {
	o, n := canonical(old), canonical(new)
	c := Change{}
	c.DebianAdded, c.DebianRemoved = without(n.DebianPackages, o.DebianPackages), without(o.DebianPackages, n.DebianPackages)
	c.NPMAdded, c.NPMRemoved = without(n.NPMPackages, o.NPMPackages), without(o.NPMPackages, n.NPMPackages)
	ow, nw := wheelStrings(o.PythonWheels), wheelStrings(n.PythonWheels)
	c.WheelsAdded, c.WheelsRemoved = without(nw, ow), without(ow, nw)
	of, nf := fileStrings(o.Files), fileStrings(n.Files)
	c.FilesAdded, c.FilesRemoved = without(nf, of), without(of, nf)
	c.NPMScriptsOn = n.NPMScripts && !o.NPMScripts
	for _, f := range []struct {
		name    string
		changed bool
	}{
		{"name", o.Name != n.Name},
		{"base", o.Base != n.Base},
		{"npm_scripts", o.NPMScripts != n.NPMScripts},
		{"env", !maps.Equal(o.Env, n.Env)},
		{"workdir", o.Workdir != n.Workdir},
		{"start", o.Start != n.Start},
		{"ready", o.Ready != n.Ready},
		{"golden", o.Golden != n.Golden},
	} {
		if f.changed {
			c.Other = append(c.Other, f.name)
		}
	}
	return c
}

// Empty reports whether the declarations are equal.
func (c Change) Empty() bool { return len(c.Lines()) == 0 }

// Grows reports whether the new declaration adds packages, wheels or files,
// or turns npm install scripts on: code or data a tool's sandboxes did not
// have or run, which needs a review as a record's wider egress does.
// Removing them, turning scripts off and changing the other fields does
// not.
func (c Change) Grows() bool {
	return c.NPMScriptsOn || len(c.DebianAdded)+len(c.NPMAdded)+len(c.WheelsAdded)+len(c.FilesAdded) > 0
}

// Lines renders the change, one entry a line:
//
//	debian_packages +python3-bs4
//	files -/var/lib/stockade/data/m.json -> /opt/m.json
//	start changed
func (c Change) Lines() []string {
	var ls []string
	for _, l := range []struct {
		key            string
		added, removed []string
	}{
		{"debian_packages", c.DebianAdded, c.DebianRemoved},
		{"npm_packages", c.NPMAdded, c.NPMRemoved},
		{"python_wheels", c.WheelsAdded, c.WheelsRemoved},
		{"files", c.FilesAdded, c.FilesRemoved},
	} {
		for _, a := range l.added {
			ls = append(ls, l.key+" +"+a)
		}
		for _, r := range l.removed {
			ls = append(ls, l.key+" -"+r)
		}
	}
	for _, o := range c.Other {
		ls = append(ls, o+" changed")
	}
	return ls
}

func wheelStrings(ws []canonicalWheel) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = Wheel(w).String()
	}
	return out
}

func fileStrings(fs []canonicalFile) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = File(f).String()
	}
	return out
}

// without returns the entries of a that are not in b.
func without(a, b []string) []string {
	var d []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			d = append(d, x)
		}
	}
	return d
}
