// Package templates holds templates: environments a team declares for its
// tools' sandboxes (README, "Templates"). A template names a base runtime
// ("python", "node", "shell") and what is added to it: Debian packages,
// npm packages, python wheels, files, environment, a working directory,
// and the code a sandbox runs when it starts (Start) with the check that
// must pass after it (Ready). Templates are configuration, loaded from a
// YAML file or a directory of *.yaml files, as tools are; a tool's record
// names its template.
//
// The package is pure: it parses, validates, compares and digests
// declarations. Building a template's image is the image package's work
// (image.Store.BuildTemplate); running one is the engine's.
//
//	set, err := templates.Load("/etc/stockade/templates.d", templates.Options{DataRoot: "/var/lib/stockade/data"})
//	t, err := set.Get("analytics")
package templates

import (
	"maps"
	"slices"
	"strings"
)

// Template is one declared environment. Values come from Load (validated);
// a Template built by hand must pass Validate before it is built.
type Template struct {
	// Name identifies the template: a tool's `template:` and the API's
	// /v1/templates/{name}. It matches NamePattern and is never a runtime's
	// name.
	Name string
	// Base is the runtime the template extends: "python", "node" or
	// "shell". Its interpreter runs the code; its kernel runs Start.
	Base string
	// DebianPackages are installed from the Debian mirror on top of the
	// base's packages, their dependencies resolved at build time. Each is a
	// package name, optionally "name=version".
	DebianPackages []string
	// NPMPackages are "name@version" with an exact version, installed with
	// their dependencies from the npm registry into /node_modules, which
	// node resolves from every directory. Only a base that has node.
	NPMPackages []string
	// NPMScripts lets npm packages' install scripts run (in the build
	// sandbox, without network); false (the default) runs none, and a
	// package that needs one is a build error naming it.
	NPMScripts bool
	// PythonWheels are wheels installed into the image's
	// /usr/local/lib/python3/dist-packages without pip (which stays absent
	// at run time): each from the operator's wheelhouse directory or the
	// configured index, pinned by its SHA-256.
	PythonWheels []Wheel
	// Files are operator files copied into the image, read-only.
	Files []File
	// Env is added to the environment of every process of a sandbox of the
	// template. Nil means none.
	Env map[string]string
	// Workdir is the directory code runs in; empty means the runtime's
	// default (/tmp).
	Workdir string
	// Start runs in the kernel of a sandbox when it starts, before any
	// code of a caller (python statements, node statements, or a shell
	// command): imports, model loads. Empty means nothing.
	Start string
	// Ready is a check run after Start that must pass (python or node
	// statements that must not raise, a shell command that must exit 0).
	// Empty means none.
	Ready string
	// Golden asks for a golden checkpoint where the tier can save a
	// sandbox (gVisor): the build starts a sandbox, runs Start and Ready,
	// and checkpoints it once; sandboxes of the template then restore it
	// instead of starting cold. Elsewhere the template starts cold.
	Golden bool

	// Source is where the template was defined ("templates.yaml:3"). It
	// is not part of the declaration.
	Source string

	// Where Parse found the template, so that problems name the line of
	// the value at fault: the file, the key path of the template in it
	// ("templates[2]") and the line of each key path below it.
	file, path string
	lines      map[string]int
}

// Clone returns t with its own copies of every slice and map, so that a
// caller cannot change a Set through a Template it got from it.
func (t Template) Clone() Template {
	t.DebianPackages = slices.Clone(t.DebianPackages)
	t.NPMPackages = slices.Clone(t.NPMPackages)
	t.PythonWheels = slices.Clone(t.PythonWheels)
	t.Files = slices.Clone(t.Files)
	t.Env = maps.Clone(t.Env)
	return t
}

// Wheel is one python wheel of a template.
type Wheel struct {
	// File is the wheel's file name in the operator's wheelhouse
	// directory; empty when Name is set.
	File string
	// Name is "project==version", fetched from the configured index;
	// empty when File is set.
	Name string
	// SHA256 is the hex SHA-256 the wheel must have. Required.
	SHA256 string
}

// File is one operator file copied into a template's image.
type File struct {
	// Source is an absolute, clean host path under the data root (a
	// regular file, or a directory of regular files and directories
	// copied whole), checked by the rules of internal/dataroot (Root.File):
	// neither it nor anything below it is a symlink.
	Source string
	// Target is the absolute path in the image; not under /tmp,
	// /workspace, /proc, /sys, /dev or /run.
	Target string
}

// String renders the wheel as a change lists it: "FILE sha256:HEX" or
// "PROJECT==VERSION sha256:HEX".
func (w Wheel) String() string {
	name := w.File
	if name == "" {
		name = w.Name
	}
	return name + " sha256:" + strings.ToLower(w.SHA256)
}

// String renders the file as a change lists it: "SOURCE -> TARGET".
func (f File) String() string { return f.Source + " -> " + f.Target }
