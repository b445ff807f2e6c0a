package templates

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
)

const sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// testRoot makes a data root holding m.json, a directory models/, a
// directory keys/ with .ssh inside, and escape, a symlink out of the root.
func testRoot(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "data")
	for _, d := range []string{root, filepath.Join(root, "models"), filepath.Join(root, "keys", ".ssh")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "m.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "outside.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "outside.json"), filepath.Join(root, "escape")); err != nil {
		t.Fatal(err)
	}
	// deep/keys/.ssh: credentials below the top of a directory source;
	// tree/out: a symlink out of the root inside one, linked/in one
	// within; link-in: a symlink within the root as a source.
	for _, d := range []string{filepath.Join(root, "deep", "keys", ".ssh"), filepath.Join(root, "tree"), filepath.Join(root, "linked")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(dir, "outside.json"), filepath.Join(root, "tree", "out")); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{filepath.Join(root, "linked", "in"), filepath.Join(root, "link-in")} {
		if err := os.Symlink(filepath.Join(root, "m.json"), l); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

const goodYAML = `templates:
  - name: analytics
    base: python
    debian_packages: [python3-bs4, "libfoo1=1.2.3-1", "g++"]
    python_wheels:
      - {file: tabulate-0.9.0-py3-none-any.whl, sha256: ` + sha + `}
      - {name: "Six==1.16.0", sha256: ` + sha + `}
    files:
      - {source: {{ROOT}}/m.json, target: /opt/m.json}
      - {source: {{ROOT}}/models, target: /opt/models}
    env: {MODEL: /opt/m.json, LANG: C.UTF-8}
    workdir: /workspace
    start: "import bs4"
    ready: "assert bs4"
    golden: true
  - name: web
    base: node
    npm_packages: [left-pad@1.3.0, "@types/node@20.11.5", "x@1.0.0-rc.1+build.5"]
    npm_scripts: true
`

func TestLoadGood(t *testing.T) {
	root := testRoot(t)
	path := filepath.Join(t.TempDir(), "templates.yaml")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(goodYAML, "{{ROOT}}", root)), 0o600); err != nil {
		t.Fatal(err)
	}
	set, err := Load(path, Options{DataRoot: root})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got := strings.Join(set.Names(), ","); got != "analytics,web" {
		t.Errorf("Names: got %s, want analytics,web", got)
	}
	a, err := set.Get("analytics")
	if err != nil {
		t.Fatal(err)
	}
	if a.Source != path+":2" || len(a.PythonWheels) != 2 || a.PythonWheels[1].Name != "Six==1.16.0" || a.Env["LANG"] != "C.UTF-8" || !a.Golden {
		t.Errorf("analytics: got %+v", a)
	}
	// A Template from Get is the caller's: changing it changes no Set.
	a.DebianPackages[0] = "changed"
	a.Env["MODEL"] = "changed"
	if b, _ := set.Get("analytics"); b.DebianPackages[0] != "python3-bs4" || b.Env["MODEL"] != "/opt/m.json" {
		t.Errorf("the Set changed through a Template it returned: %+v", b)
	}
	if _, err := set.Get("nope"); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "known: analytics, web") {
		t.Errorf("Get(nope): got %v, want a not-found naming the known templates", err)
	}
	if ts := set.Templates(); len(ts) != 2 || ts[1].Name != "web" {
		t.Errorf("Templates: got %d", len(ts))
	}
}

func TestLoadEmptyAndNil(t *testing.T) {
	set, err := Load("", Options{})
	if err != nil || set.Len() != 0 {
		t.Fatalf("Load(\"\"): got %v, %v; want an empty set", set, err)
	}
	var none *Set
	if _, err := none.Get("x"); !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "no template is configured") {
		t.Errorf("nil Set Get: got %v", err)
	}
	if none.Names() != nil || none.Templates() != nil {
		t.Error("nil Set: want no names and no templates")
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml"), Options{}); !errdefs.IsNotFound(err) {
		t.Errorf("missing file: got %v, want not found", err)
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"a.yaml":  "templates:\n  - {name: one, base: shell}\n",
		"b.yaml":  "templates:\n  - {name: two, base: node}\n",
		".h.yaml": "templates:\n  - {name: hidden, base: node}\n",
		"c.txt":   "not yaml: [",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	set, err := Load(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(set.Names(), ","); got != "one,two" {
		t.Errorf("Names: got %s, want one,two", got)
	}
}

func TestLoadRefusesALargeFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(path, []byte("templates: []\n"+strings.Repeat("#", MaxFileSize)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path, Options{}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("got %v, want a refusal of the file's size", err)
	}
}

// TestProblems loads one bad templates file per case and expects a problem
// naming the field, with the message fragment, at the line (0: any).
func TestProblems(t *testing.T) {
	item := func(lines ...string) string {
		return "templates:\n  - name: tpl\n" + strings.Join(lines, "\n") + "\n"
	}
	py := func(lines ...string) string { return item(append([]string{"    base: python"}, lines...)...) }
	node := func(lines ...string) string { return item(append([]string{"    base: node"}, lines...)...) }
	for _, tc := range []struct {
		name, yaml   string
		field, frag  string
		line         int
		noDataRoot   bool
		wantTemplate string
	}{
		{"syntax", "templates: [", "", "did not find expected", 0, false, ""},
		{"top is a list", "- name: x\n", "", `a templates file is a mapping with one key, "templates:"`, 1, false, ""},
		{"unknown key", py("    colour: red"), "templates[0]", `unknown key "colour" (known: name, base, debian_packages`, 4, false, "tpl"},
		{"unknown top key", "tools: []\n", "", `unknown key "tools" (known: templates)`, 1, false, ""},
		{"repeated key", py("    base: node"), "templates[0]", `key "base" is given twice`, 4, false, "tpl"},
		{"repeated env key", py("    env:", "      A: x", "      A: y"), "templates[0].env", `key "A" is given twice`, 6, false, "tpl"},
		{"list for a string", py("    workdir: [a]"), "templates[0].workdir", "want a string, got a list", 4, false, "tpl"},
		{"string for a list", py("    debian_packages: curl"), "templates[0].debian_packages", `want a list of strings, got "curl"`, 4, false, "tpl"},
		{"word for a bool", py("    golden: maybe"), "templates[0].golden", `want true or false, got "maybe"`, 4, false, "tpl"},
		{"wheel shape", py("    python_wheels: [{file: a.whl, sha: x}]"), "templates[0].python_wheels[0]", `unknown key "sha" (known: file, name, sha256)`, 4, false, "tpl"},

		{"name missing", "templates:\n  - base: python\n", "templates[0].name", "name is required", 0, false, ""},
		{"name upper", "templates:\n  - {name: Analytics, base: python}\n", "templates[0].name", `"Analytics" must be 1-40 lower-case letters`, 2, false, "Analytics"},
		{"name too long", "templates:\n  - {name: " + strings.Repeat("a", 41) + ", base: python}\n", "templates[0].name", "must be 1-40", 2, false, ""},
		{"name digit first", "templates:\n  - {name: 1abc, base: python}\n", "templates[0].name", "starting with a letter", 2, false, ""},
		{"runtime name", "templates:\n  - {name: python, base: python}\n", "templates[0].name", `"python" is a runtime's name`, 2, false, "python"},
		{"duplicate name", "templates:\n  - {name: a, base: python}\n  - {name: a, base: node}\n", "templates[1].name", "defined again (first at", 3, false, "a"},
		{"base missing", item(), "templates[0].base", "base is required: python, node, shell", 2, false, "tpl"},
		{"base unknown", item("    base: ruby"), "templates[0].base", `unknown base "ruby"`, 3, false, "tpl"},

		{"debian upper", py("    debian_packages: [Bad_Name]"), "templates[0].debian_packages[0]", `"Bad_Name" is not a Debian package name`, 4, false, "tpl"},
		{"debian one char", py("    debian_packages: [a]"), "templates[0].debian_packages[0]", "at least two characters", 4, false, "tpl"},
		{"debian option", py("    debian_packages: [--allow-unauthenticated]"), "templates[0].debian_packages[0]", "is not a Debian package name", 4, false, "tpl"},
		{"debian arch", py("    debian_packages: [curl:i386]"), "templates[0].debian_packages[0]", "is not a Debian package name", 4, false, "tpl"},
		{"debian version", py("    debian_packages: [curl=latest]"), "templates[0].debian_packages[0]", `"latest" is not a Debian version`, 4, false, "tpl"},
		{"debian twice", py("    debian_packages:", "      - curl", "      - curl=8.0-1"), "templates[0].debian_packages[1]", `package "curl" is listed twice`, 6, false, "tpl"},
		{"debian too many", py("    debian_packages: [" + strings.TrimSuffix(strings.Repeat("ab, ", MaxItems+1), ", ") + "]"), "templates[0].debian_packages", "257 entries is more than 256", 4, false, "tpl"},

		{"npm on python", py("    npm_packages: [left-pad@1.3.0]"), "templates[0].npm_packages", "npm packages need base node (this template's base is python)", 4, false, "tpl"},
		{"npm scripts on shell", item("    base: shell", "    npm_scripts: true"), "templates[0].npm_scripts", "npm scripts need base node", 4, false, "tpl"},
		{"npm no version", node("    npm_packages: [left-pad]"), "templates[0].npm_packages[0]", `"left-pad" needs an exact version: name@1.2.3`, 4, false, "tpl"},
		{"npm scope no version", node("    npm_packages: [\"@types/node\"]"), "templates[0].npm_packages[0]", "needs an exact version", 4, false, "tpl"},
		{"npm range", node("    npm_packages: [\"left-pad@^1.3.0\"]"), "templates[0].npm_packages[0]", `"^1.3.0" is not an exact version`, 4, false, "tpl"},
		{"npm tag", node("    npm_packages: [left-pad@latest]"), "templates[0].npm_packages[0]", "is not an exact version", 4, false, "tpl"},
		{"npm url", node("    npm_packages: [\"x@https://evil.example/x.tgz\"]"), "templates[0].npm_packages[0]", "is not an exact version", 4, false, "tpl"},
		{"npm upper", node("    npm_packages: [Left-Pad@1.3.0]"), "templates[0].npm_packages[0]", `"Left-Pad" is not an npm package name`, 4, false, "tpl"},
		{"npm twice", node("    npm_packages: [a@1.0.0, a@2.0.0]"), "templates[0].npm_packages[1]", `package "a" is listed twice`, 4, false, "tpl"},

		{"wheel on node", node("    python_wheels: [{name: six==1.16.0, sha256: " + sha + "}]"), "templates[0].python_wheels", "python wheels need base python", 4, false, "tpl"},
		{"wheel both", py("    python_wheels: [{file: six-1.16.0-py2.py3-none-any.whl, name: six==1.16.0, sha256: " + sha + "}]"), "templates[0].python_wheels[0]", "give exactly one of file", 4, false, "tpl"},
		{"wheel neither", py("    python_wheels: [{sha256: " + sha + "}]"), "templates[0].python_wheels[0]", "give exactly one of file", 4, false, "tpl"},
		{"wheel path", py("    python_wheels:", "      - file: ../six-1.16.0-py3-none-any.whl", "        sha256: "+sha), "templates[0].python_wheels[0].file", "not a path", 5, false, "tpl"},
		{"wheel not a wheel", py("    python_wheels: [{file: six.tar.gz, sha256: " + sha + "}]"), "templates[0].python_wheels[0].file", `"six.tar.gz" is not a wheel's file name`, 4, false, "tpl"},
		{"wheel not pure", py("    python_wheels: [{file: numpy-2.0.0-cp313-cp313-manylinux_2_17_x86_64.whl, sha256: " + sha + "}]"), "templates[0].python_wheels[0].file", "only pure-python wheels", 4, false, "tpl"},
		{"wheel range", py("    python_wheels: [{name: \"six>=1.16\", sha256: " + sha + "}]"), "templates[0].python_wheels[0].name", "want project==version", 4, false, "tpl"},
		{"wheel sha missing", py("    python_wheels:", "      - file: six-1.16.0-py3-none-any.whl"), "templates[0].python_wheels[0].sha256", "sha256 is required", 5, false, "tpl"},
		{"wheel sha short", py("    python_wheels:", "      - file: six-1.16.0-py3-none-any.whl", "        sha256: abc"), "templates[0].python_wheels[0].sha256", `"abc": want 64 hexadecimal digits`, 6, false, "tpl"},
		{"wheel twice", py("    python_wheels:", "      - {file: Six-1.16.0-py3-none-any.whl, sha256: "+sha+"}", "      - {name: six==1.15.0, sha256: "+sha+"}"), "templates[0].python_wheels[1]", `project "six" is listed twice`, 6, false, "tpl"},

		{"file relative", py("    files: [{source: m.json, target: /opt/m.json}]"), "templates[0].files[0].source", "must be an absolute path under the data root", 4, false, "tpl"},
		{"file unclean", py("    files: [{source: \"{{ROOT}}/../outside.json\", target: /opt/m.json}]"), "templates[0].files[0].source", "must be a clean path", 4, false, "tpl"},
		{"file outside", py("    files: [{source: /etc/passwd, target: /opt/m.json}]"), "templates[0].files[0].source", "/etc/passwd is outside the data root", 4, false, "tpl"},
		{"file missing", py("    files: [{source: \"{{ROOT}}/nope\", target: /opt/m.json}]"), "templates[0].files[0].source", "does not exist", 4, false, "tpl"},
		{"file symlink escape", py("    files: [{source: \"{{ROOT}}/escape\", target: /opt/m.json}]"), "templates[0].files[0].source", "resolves through a symlink to", 4, false, "tpl"},
		{"file credentials", py("    files: [{source: \"{{ROOT}}/keys\", target: /opt/keys}]"), "templates[0].files[0].source", "contains .ssh; credentials are never copied", 4, false, "tpl"},
		{"file deep credentials", py("    files: [{source: \"{{ROOT}}/deep\", target: /opt/deep}]"), "templates[0].files[0].source", "contains keys/.ssh; credentials are never copied", 4, false, "tpl"},
		{"file symlink out of a tree", py("    files: [{source: \"{{ROOT}}/tree\", target: /opt/tree}]"), "templates[0].files[0].source", "tree holds the symlink {{ROOT}}/tree/out to", 4, false, "tpl"},
		// A copy never follows links (the image builder reads with lstat
		// semantics), so a symlink is refused even within the root.
		{"file symlink within a tree", py("    files: [{source: \"{{ROOT}}/linked\", target: /opt/linked}]"), "templates[0].files[0].source", "linked holds the symlink {{ROOT}}/linked/in to {{ROOT}}/m.json; a copy never follows links", 4, false, "tpl"},
		{"file symlink within the root", py("    files: [{source: \"{{ROOT}}/link-in\", target: /opt/m.json}]"), "templates[0].files[0].source", "link-in is a symlink to {{ROOT}}/m.json; a copy never follows links: name {{ROOT}}/m.json", 4, false, "tpl"},
		{"file socket by name", py("    files: [{source: \"{{ROOT}}/agent.sock\", target: /opt/a}]"), "templates[0].files[0].source", "is a unix socket; sockets are never copied", 4, false, "tpl"},
		{"file in credentials", py("    files: [{source: \"{{ROOT}}/keys/.ssh\", target: /opt/keys}]"), "templates[0].files[0].source", "inside a .ssh directory", 4, false, "tpl"},
		{"file source missing", py("    files:", "      - target: /opt/m.json"), "templates[0].files[0].source", "the source is required", 5, false, "tpl"},
		{"file no data root", py("    files: [{source: /srv/m.json, target: /opt/m.json}]"), "templates[0].files", "no data root is configured", 4, true, "tpl"},
		{"target tmp", py("    files: [{source: \"{{ROOT}}/m.json\", target: /tmp/m.json}]"), "templates[0].files[0].target", "/tmp/m.json is inside /tmp", 4, false, "tpl"},
		{"target workspace", py("    files: [{source: \"{{ROOT}}/m.json\", target: /workspace}]"), "templates[0].files[0].target", "inside /workspace", 4, false, "tpl"},
		{"target stockade", py("    files: [{source: \"{{ROOT}}/m.json\", target: /.stockade/guest}]"), "templates[0].files[0].target", "inside /.stockade", 4, false, "tpl"},
		{"target proc", py("    files: [{source: \"{{ROOT}}/m.json\", target: /proc/x}]"), "templates[0].files[0].target", "inside /proc", 4, false, "tpl"},
		{"target run", py("    files: [{source: \"{{ROOT}}/m.json\", target: /run/x}]"), "templates[0].files[0].target", "inside /run", 4, false, "tpl"},
		{"target data", py("    files: [{source: \"{{ROOT}}/m.json\", target: /data/m.json}]"), "templates[0].files[0].target", "where tools' data mounts are bound", 4, false, "tpl"},
		{"target dpkg", py("    files: [{source: \"{{ROOT}}/m.json\", target: /var/lib/dpkg/status}]"), "templates[0].files[0].target", "SBOM is read from", 4, false, "tpl"},
		{"target site-packages", py("    files: [{source: \"{{ROOT}}/m.json\", target: /usr/local/lib/python3.13/dist-packages/evil.py}]"), "templates[0].files[0].target", "install a wheel with python_wheels", 4, false, "tpl"},
		{"target root", py("    files: [{source: \"{{ROOT}}/models\", target: /}]"), "templates[0].files[0].target", "/ would replace the image's whole root", 4, false, "tpl"},
		{"target relative", py("    files: [{source: \"{{ROOT}}/m.json\", target: opt/m.json}]"), "templates[0].files[0].target", "must be an absolute path", 4, false, "tpl"},
		{"target unclean", py("    files: [{source: \"{{ROOT}}/m.json\", target: /opt/../tmp/m.json}]"), "templates[0].files[0].target", "must be a clean path (write /tmp/m.json)", 4, false, "tpl"},
		{"target twice", py("    files:", "      - {source: \"{{ROOT}}/m.json\", target: /opt/m}", "      - {source: \"{{ROOT}}/models\", target: /opt/m}"), "templates[0].files[1].target", "/opt/m is the target of files[0] already", 6, false, "tpl"},
		{"target nested", py("    files:", "      - {source: \"{{ROOT}}/models\", target: /opt/models}", "      - {source: \"{{ROOT}}/m.json\", target: /opt/models/m.json}"), "templates[0].files[1].target", "is inside /opt/models, the target of files[0]", 6, false, "tpl"},

		{"env LD_PRELOAD", py("    env: {LD_PRELOAD: /tmp/x.so}"), "templates[0].env.LD_PRELOAD", "LD_PRELOAD may not be set: the dynamic loader's variables", 4, false, "tpl"},
		{"env PATH", py("    env: {PATH: /workspace/bin}"), "templates[0].env.PATH", "PATH may not be set: the runtime sets PATH", 4, false, "tpl"},
		{"env PYTHONPATH", py("    env:", "      PYTHONPATH: /workspace"), "templates[0].env.PYTHONPATH", "makes an interpreter load code from outside the image", 5, false, "tpl"},
		{"env NODE_OPTIONS", node("    env: {NODE_OPTIONS: --require /tmp/x.js}"), "templates[0].env.NODE_OPTIONS", "may not be set", 4, false, "tpl"},
		{"env stockade", py("    env: {STOCKADE_GUEST_CHANNEL: x}"), "templates[0].env.STOCKADE_GUEST_CHANNEL", "reserved for Stockade's guest", 4, false, "tpl"},
		{"env bad name", py("    env: {1BAD: x}"), "templates[0].env.1BAD", `"1BAD" is not a variable name`, 4, false, "tpl"},
		{"env NUL", py("    env: {A: \"x\\0y\"}"), "templates[0].env.A", "the value contains a NUL byte", 4, false, "tpl"},
		{"env long", py("    env: {A: " + strings.Repeat("x", MaxEnvValue+1) + "}"), "templates[0].env.A", "4097 bytes are more than 4096", 4, false, "tpl"},

		{"workdir relative", py("    workdir: work"), "templates[0].workdir", "work must be an absolute path", 4, false, "tpl"},
		{"workdir proc", py("    workdir: /proc/self"), "templates[0].workdir", "inside /proc", 4, false, "tpl"},
		{"start large", py("    start: " + strings.Repeat("x", MaxCodeSize+1)), "templates[0].start", "65537 bytes is more than 65536", 4, false, "tpl"},
		{"ready NUL", py("    ready: \"a\\0b\""), "templates[0].ready", "contains a NUL byte", 4, false, "tpl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := testRoot(t)
			path := filepath.Join(t.TempDir(), "templates.yaml")
			if err := os.WriteFile(path, []byte(strings.ReplaceAll(tc.yaml, "{{ROOT}}", root)), 0o600); err != nil {
				t.Fatal(err)
			}
			opts := Options{DataRoot: root}
			if tc.noDataRoot {
				opts = Options{}
			}
			_, err := Load(path, opts)
			var ps Problems
			if !errors.As(err, &ps) || !errdefs.IsInvalidArgument(err) {
				t.Fatalf("got %v, want Problems", err)
			}
			for _, p := range ps {
				if p.Field != tc.field || !strings.Contains(p.Message, strings.ReplaceAll(tc.frag, "{{ROOT}}", root)) {
					continue
				}
				wantSource := path
				if tc.line > 0 {
					wantSource = path + ":" + strconv.Itoa(tc.line)
				}
				if tc.line > 0 && p.Source != wantSource {
					t.Errorf("problem %q: source %s, want %s", p, p.Source, wantSource)
				}
				if p.Template != tc.wantTemplate && tc.wantTemplate != "" {
					t.Errorf("problem %q: template %q, want %q", p, p.Template, tc.wantTemplate)
				}
				return
			}
			t.Errorf("no problem at %q containing %q; got:\n%v", tc.field, tc.frag, err)
		})
	}
}

// TestProblemString shows a problem as operators read it.
func TestProblemString(t *testing.T) {
	p := Problem{Source: "t.yaml:7", Template: "analytics", Field: "templates[0].python_wheels[1].sha256", Message: "want 64 hexadecimal digits"}
	want := `t.yaml:7: template "analytics": templates[0].python_wheels[1].sha256: want 64 hexadecimal digits`
	if p.String() != want {
		t.Errorf("got %s, want %s", p, want)
	}
}

// TestValidateByHand checks templates built without Parse: fields are
// named by their index, sources are the templates'.
func TestValidateByHand(t *testing.T) {
	ps := Validate([]Template{
		{Name: "ok", Base: "shell"},
		{Name: "bad", Base: "shell", Source: "api", PythonWheels: []Wheel{{Name: "six==1.16.0"}}},
	}, Options{})
	if len(ps) != 2 {
		t.Fatalf("got %d problems, want 2:\n%v", len(ps), ps)
	}
	if ps[0].Field != "templates[1].python_wheels" || ps[0].Source != "api" || ps[1].Field != "templates[1].python_wheels[0].sha256" {
		t.Errorf("got %v", ps)
	}
}

// TestDataRootRefused: a data root tools would refuse (a home directory,
// a runtime directory, one reached through a symlink to them, the host's
// root) lets a template copy no file either.
func TestDataRootRefused(t *testing.T) {
	link := filepath.Join(t.TempDir(), "run-link")
	if err := os.Symlink("/run", link); err != nil {
		t.Fatal(err)
	}
	for root, want := range map[string]string{
		"/root":  "data root /root cannot be used: it is a home directory",
		"/home":  "data root /home cannot be used: it is a home directory",
		"/run":   "data root /run cannot be used: it is inside /run",
		link:     "data root " + link + " cannot be used: it is inside /run",
		"/":      "data root / cannot be used: it is the host's root filesystem",
		"/nope/": "data root /nope/ cannot be used: no such file or directory",
	} {
		t.Run(root, func(t *testing.T) {
			if _, err := os.Stat(root); err != nil && root != "/nope/" {
				t.Skipf("%s: %v", root, err)
			}
			ts := []Template{{Name: "tpl", Base: "python", Files: []File{{Source: filepath.Join(root, "m.json"), Target: "/opt/m.json"}}}}
			ps := Validate(ts, Options{DataRoot: root})
			for _, p := range ps {
				if p.Field == "templates[0].files" && strings.Contains(p.Message, want) {
					return
				}
			}
			t.Errorf("got %v, want a problem at templates[0].files with %q", ps, want)
		})
	}
}
