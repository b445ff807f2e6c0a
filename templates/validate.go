package templates

import (
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/stockade-sh/stockade/internal/dataroot"
	"github.com/stockade-sh/stockade/internal/strictyaml"
)

// NamePattern is what a template's name matches: a lower-case letter, then
// up to 39 lower-case letters, digits and '-'.
var NamePattern = regexp.MustCompile(`^[a-z][a-z0-9-]{0,39}$`)

// Bounds of a declaration.
const (
	// MaxCodeSize bounds Start and Ready, each.
	MaxCodeSize = 64 << 10
	// MaxItems bounds each list: Debian packages, npm packages, wheels,
	// files.
	MaxItems = 256
	// MaxEnv bounds the entries of Env, and MaxEnvValue each value.
	MaxEnv      = 64
	MaxEnvValue = 4 << 10
)

// Bases returns the runtimes a template may extend. They restate the
// runtime images (image.Names, which a test holds them to): the image
// package builds templates, so this one cannot import it.
func Bases() []string { return []string{"python", "node", "shell"} }

var (
	// Debian policy 5.6.1: lower-case letters, digits, '+', '-' and '.',
	// at least two characters, starting with a letter or digit.
	debianNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	// Debian policy 5.6.12: [epoch:]upstream[-revision], upstream
	// starting with a digit.
	debianVersionRE = regexp.MustCompile(`^([0-9]+:)?[0-9][A-Za-z0-9.+~-]*$`)
	// npm's package names: lower-case, URL-safe, optionally scoped.
	npmNameRE = regexp.MustCompile(`^(@[a-z0-9~-][a-z0-9._~-]*/)?[a-z0-9~-][a-z0-9._~-]*$`)
	// semver.org's exact versions.
	semverRE = regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)` +
		`(-((0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*))*))?` +
		`(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$`)
	// PEP 427's file names: {dist}-{version}(-{build})?-{python}-{abi}-{platform}.whl.
	wheelFileRE = regexp.MustCompile(`^([A-Za-z0-9_.]+)-([A-Za-z0-9_.!+]+)(-[0-9][A-Za-z0-9_.]*)?-([A-Za-z0-9_.]+)-([A-Za-z0-9_.]+)-([A-Za-z0-9_.]+)\.whl$`)
	// PEP 508's project names, pinned to one PEP 440 version.
	wheelNameRE = regexp.MustCompile(`^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])==` +
		`(?i:([0-9]+!)?[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?(\+[a-z0-9]+(\.[a-z0-9]+)*)?)$`)
	sha256RE   = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
	envKeyRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	distPartRE = regexp.MustCompile(`[-_.]+`)
	// Where a wheel's modules go; a file there would hide or forge one.
	sitePackagesRE = regexp.MustCompile(`^/usr/local/lib/python3[^/]*/dist-packages(/|$)`)
)

// Validate checks templates against every rule and returns all the
// problems found, in the order of the templates; none means they may be
// loaded. It reads nothing but the files' sources and the data root (lstat
// and symlink resolution). Load calls it; so does `stockade template lint`.
func Validate(ts []Template, opts Options) Problems {
	var ps Problems
	var root *dataroot.Root
	seen := map[string]string{}
	for i, t := range ts {
		v := validator{t: t, i: i}
		if len(t.Files) > 0 && root == nil {
			r := dataroot.Resolve(opts.DataRoot)
			root = &r
		}
		if first, dup := seen[t.Name]; dup && t.Name != "" {
			v.add("name", "template %q is defined again (first at %s); template names must be unique", t.Name, orUnknown(first))
		} else {
			seen[t.Name] = t.Source
		}
		v.check(root)
		ps = append(ps, v.ps...)
	}
	return ps
}

// validator collects the problems of the i-th template.
type validator struct {
	t  Template
	i  int
	ps Problems
}

// add records a problem with field rel (relative to the template).
func (v *validator) add(rel, format string, a ...any) {
	prefix := v.t.path
	if prefix == "" {
		prefix = fmt.Sprintf("templates[%d]", v.i)
	}
	field := prefix
	if rel != "" {
		field += "." + rel
	}
	v.ps = append(v.ps, Problem{Source: v.source(rel), Template: v.t.Name, Field: field, Message: fmt.Sprintf(format, a...)})
}

// source is the place of rel: its own line if Parse saw it, else its
// closest parent's, else the template's.
func (v *validator) source(rel string) string {
	for rel != "" && v.t.lines != nil {
		if l, ok := v.t.lines[rel]; ok {
			return strictyaml.LineOf(v.t.file, l)
		}
		i := strings.LastIndexAny(rel, ".[")
		if i < 0 {
			break
		}
		rel = rel[:i]
	}
	return v.t.Source
}

func (v *validator) check(root *dataroot.Root) {
	t := v.t
	switch {
	case t.Name == "":
		v.add("name", "name is required")
	case !NamePattern.MatchString(t.Name):
		v.add("name", "%q must be 1-40 lower-case letters, digits or '-', starting with a letter", t.Name)
	case slices.Contains(Bases(), t.Name):
		v.add("name", "%q is a runtime's name; a template extends a runtime and needs a name of its own", t.Name)
	}
	switch {
	case t.Base == "":
		v.add("base", "base is required: %s", strings.Join(Bases(), ", "))
	case !slices.Contains(Bases(), t.Base):
		v.add("base", "unknown base %q (known: %s)", t.Base, strings.Join(Bases(), ", "))
	}
	v.debian()
	v.npm()
	v.wheels()
	v.files(root)
	v.env()
	if t.Workdir != "" {
		if msg := checkImagePath(t.Workdir, false); msg != "" {
			v.add("workdir", "%s", msg)
		}
	}
	for _, c := range []struct{ key, code string }{{"start", t.Start}, {"ready", t.Ready}} {
		switch {
		case len(c.code) > MaxCodeSize:
			v.add(c.key, "%d bytes is more than %d; load large code from a file the template copies in (files)", len(c.code), MaxCodeSize)
		case strings.ContainsRune(c.code, 0):
			v.add(c.key, "contains a NUL byte")
		}
	}
}

func (v *validator) tooMany(key string, n int) bool {
	if n > MaxItems {
		v.add(key, "%d entries is more than %d", n, MaxItems)
		return true
	}
	return false
}

func (v *validator) debian() {
	if v.tooMany("debian_packages", len(v.t.DebianPackages)) {
		return
	}
	seen := map[string]bool{}
	for i, p := range v.t.DebianPackages {
		key := fmt.Sprintf("debian_packages[%d]", i)
		name, version, pinned := strings.Cut(p, "=")
		switch {
		case len(p) > 256 || !debianNameRE.MatchString(name):
			v.add(key, "%q is not a Debian package name (lower-case letters, digits, '+', '-' and '.', at least two characters, starting with a letter or digit), optionally followed by =VERSION", p)
		case pinned && (!debianVersionRE.MatchString(version) || strings.HasSuffix(version, "-")):
			v.add(key, "%q: %q is not a Debian version (such as 4.12.3-1)", p, version)
		case seen[name]:
			v.add(key, "package %q is listed twice", name)
		}
		seen[name] = true
	}
}

func (v *validator) npm() {
	t := v.t
	if t.NPMScripts && t.Base != "node" && t.Base != "" {
		v.add("npm_scripts", "npm scripts need base node (this template's base is %s)", t.Base)
	}
	if len(t.NPMPackages) == 0 || v.tooMany("npm_packages", len(t.NPMPackages)) {
		return
	}
	if t.Base != "node" && t.Base != "" {
		v.add("npm_packages", "npm packages need base node (this template's base is %s)", t.Base)
	}
	seen := map[string]bool{}
	for i, spec := range t.NPMPackages {
		key := fmt.Sprintf("npm_packages[%d]", i)
		at := strings.LastIndexByte(spec, '@')
		if at <= 0 {
			v.add(key, "%q needs an exact version: name@1.2.3", spec)
			continue
		}
		name, version := spec[:at], spec[at+1:]
		switch {
		case len(name) > 214 || !npmNameRE.MatchString(name):
			v.add(key, "%q: %q is not an npm package name (lower-case letters, digits, '-', '.', '_' and '~', optionally @scope/)", spec, name)
		case !semverRE.MatchString(version):
			v.add(key, "%q: %q is not an exact version; ranges, tags and URLs are not allowed (write name@1.2.3)", spec, version)
		case seen[name]:
			v.add(key, "package %q is listed twice", name)
		}
		seen[name] = true
	}
}

func (v *validator) wheels() {
	t := v.t
	if len(t.PythonWheels) == 0 || v.tooMany("python_wheels", len(t.PythonWheels)) {
		return
	}
	if t.Base != "python" && t.Base != "" {
		v.add("python_wheels", "python wheels need base python (this template's base is %s)", t.Base)
	}
	seen := map[string]bool{}
	for i, w := range t.PythonWheels {
		key := fmt.Sprintf("python_wheels[%d]", i)
		var project string
		switch {
		case (w.File == "") == (w.Name == ""):
			v.add(key, "give exactly one of file (a wheel in the wheelhouse) and name (project==version, from the index)")
		case w.File != "":
			project = v.wheelFile(key+".file", w.File)
		default:
			if m := wheelNameRE.FindStringSubmatch(w.Name); m != nil {
				project = m[1]
			} else {
				v.add(key+".name", "%q: want project==version with an exact version, such as tabulate==0.9.0", w.Name)
			}
		}
		switch {
		case w.SHA256 == "":
			v.add(key+".sha256", "sha256 is required: the wheel's SHA-256 in hex (sha256sum prints it)")
		case !sha256RE.MatchString(w.SHA256):
			v.add(key+".sha256", "%q: want 64 hexadecimal digits", w.SHA256)
		}
		if project != "" {
			norm := strings.ToLower(distPartRE.ReplaceAllString(project, "-"))
			if seen[norm] {
				v.add(key, "project %q is listed twice", norm)
			}
			seen[norm] = true
		}
	}
}

// wheelFile checks a wheelhouse file name and returns its project.
func (v *validator) wheelFile(key, f string) string {
	if strings.ContainsAny(f, `/\`) || strings.HasPrefix(f, ".") {
		v.add(key, "%q: want the plain file name of a wheel in the wheelhouse, not a path", f)
		return ""
	}
	m := wheelFileRE.FindStringSubmatch(f)
	if m == nil {
		v.add(key, "%q is not a wheel's file name (project-version-python-abi-platform.whl)", f)
		return ""
	}
	if abi, plat := m[5], m[6]; abi != "none" || plat != "any" {
		v.add(key, "%q is built for abi %s and platform %s; only pure-python wheels (...-none-any.whl) are installed", f, abi, plat)
	}
	return m[1]
}

func (v *validator) files(root *dataroot.Root) {
	t := v.t
	if len(t.Files) == 0 || v.tooMany("files", len(t.Files)) {
		return
	}
	if err := root.Err(); err != nil {
		v.add("files", "%s", err)
	}
	for i, f := range t.Files {
		key := fmt.Sprintf("files[%d]", i)
		if root.Err() == nil {
			if _, p := root.File(f.Source); p != nil {
				v.add(key+".source", "%s", p.Message)
			}
		}
		if msg := checkImagePath(f.Target, true); msg != "" {
			v.add(key+".target", "%s", msg)
			continue
		}
		for j, g := range t.Files[:i] {
			switch {
			case g.Target == f.Target:
				v.add(key+".target", "%s is the target of files[%d] already", f.Target, j)
			case dataroot.Within(f.Target, g.Target):
				v.add(key+".target", "%s is inside %s, the target of files[%d]; a file cannot be copied into another's copy", f.Target, g.Target, j)
			case dataroot.Within(g.Target, f.Target):
				v.add(key+".target", "%s holds %s, the target of files[%d]; a file cannot be copied into another's copy", f.Target, g.Target, j)
			default:
				continue
			}
			break
		}
	}
}

// reservedTargets are the image paths a template never writes: the
// sandbox's scratch and kernel file systems (mounted over the image), the
// guest's and the data mounts' places, and the package databases the
// template's SBOM is read from.
var reservedTargets = []struct{ dir, why string }{
	{"/tmp", "the sandbox's scratch, a tmpfs over the image"},
	{"/workspace", "a session's workspace, a tmpfs over the image"},
	{"/proc", "a kernel file system"},
	{"/sys", "a kernel file system"},
	{"/dev", "the sandbox's devices"},
	{"/run", "a tmpfs of the sandbox"},
	{"/.stockade", "where Stockade's guest is bound"},
	{"/data", "where tools' data mounts are bound"},
	{"/var/lib/dpkg", "the Debian package database the template's SBOM is read from"},
	{"/node_modules", "where npm packages are installed, which the SBOM lists"},
}

// checkImagePath returns why p cannot be a file's target (target) or the
// working directory, or "".
func checkImagePath(p string, target bool) string {
	switch {
	case p == "":
		return "the path is required"
	case !filepath.IsAbs(p):
		return fmt.Sprintf("%s must be an absolute path", p)
	case filepath.Clean(p) != p:
		return fmt.Sprintf("%s must be a clean path (write %s)", p, filepath.Clean(p))
	case target && p == "/":
		return "/ would replace the image's whole root"
	}
	for _, r := range reservedTargets {
		if !target && (r.dir == "/tmp" || r.dir == "/workspace" || r.dir == "/data") {
			continue // code may run there
		}
		if dataroot.Within(p, r.dir) {
			return fmt.Sprintf("%s is inside %s, %s", p, r.dir, r.why)
		}
	}
	if target && sitePackagesRE.MatchString(p) {
		return fmt.Sprintf("%s is where wheels are installed, which the SBOM lists; install a wheel with python_wheels", p)
	}
	return ""
}

// refusedEnv says why a variable may not be set by a template, or "".
//
// Env reaches every process of the sandbox, the kernel that runs Start
// and the callers' code alike. The variables refused change what code a
// process loads: the dynamic loader's, and the interpreters' search paths
// and start-up hooks. A template never needs them (its packages and wheels
// go where the runtime already looks), and each could point at /tmp or
// /workspace, where one caller's code can write what later processes then
// load: code no record's reviewer saw. PATH is refused for the same
// reason; the runtime sets it.
func refusedEnv(key string) string {
	switch {
	case strings.HasPrefix(key, "LD_"):
		return "the dynamic loader's variables load code into every process of the sandbox; install libraries with debian_packages"
	case strings.HasPrefix(key, "STOCKADE_"):
		return "STOCKADE_ variables are reserved for Stockade's guest"
	}
	switch key {
	case "PATH":
		return "the runtime sets PATH; a template replacing it could make the interpreter's name resolve to a file a caller wrote"
	case "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONEXECUTABLE", "PYTHONPLATLIBDIR",
		"NODE_OPTIONS", "NODE_PATH", "BASH_ENV", "ENV", "PERL5LIB", "PERL5OPT", "RUBYOPT", "RUBYLIB":
		return "it makes an interpreter load code from outside the image; packages and wheels are installed where the runtime finds them"
	}
	return ""
}

func (v *validator) env() {
	env := v.t.Env
	if len(env) > MaxEnv {
		v.add("env", "%d variables is more than %d", len(env), MaxEnv)
		return
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		key := "env." + k
		val := env[k]
		switch {
		case len(k) > 128 || !envKeyRE.MatchString(k):
			v.add(key, "%q is not a variable name (letters, digits and '_', not starting with a digit)", k)
		case refusedEnv(k) != "":
			v.add(key, "%s may not be set: %s", k, refusedEnv(k))
		case len(val) > MaxEnvValue:
			v.add(key, "the value's %d bytes are more than %d", len(val), MaxEnvValue)
		case strings.ContainsRune(val, 0):
			v.add(key, "the value contains a NUL byte")
		}
	}
}

func orUnknown(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}
