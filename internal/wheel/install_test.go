package wheel_test

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/internal/wheel"
)

// TestInstallRealWheel installs a wheel setuptools built and runs what it
// installed with Debian's python: the package imports, the script's
// "#!python" became /usr/bin/python3, the console script runs, the data
// file is under /usr/local, and INSTALLER and RECORD are written.
func TestInstallRealWheel(t *testing.T) {
	whl := buildWheel(t)
	root := newRoot(t)
	inst, err := wheel.Install(whl, root, sitePackages)
	if err != nil {
		t.Fatalf("Install: %v", err)
	}
	want := wheel.Installed{Name: "stockade-demo", Version: "1.2.0", SHA256: fileSHA256(t, whl), File: filepath.Base(whl)}
	if inst != want {
		t.Errorf("Install = %+v, want %+v", inst, want)
	}
	sp := filepath.Join(root, sitePackages)
	di := filepath.Join(sp, "stockade_demo-1.2.0.dist-info")

	files := tree(t, root)
	checks := map[string]fs.FileMode{
		"usr/local/lib/python3.11/dist-packages/stockade_demo/__init__.py":               0o644,
		"usr/local/lib/python3.11/dist-packages/stockade_demo":                           fs.ModeDir | 0o755,
		"usr/local/lib/python3.11/dist-packages/stockade_demo-1.2.0.dist-info/METADATA":  0o644,
		"usr/local/lib/python3.11/dist-packages/stockade_demo-1.2.0.dist-info/INSTALLER": 0o644,
		"usr/local/lib/python3.11/dist-packages/stockade_demo-1.2.0.dist-info/RECORD":    0o644,
		"usr/local/bin/demo-script":               0o755,
		"usr/local/bin/demo-cli":                  0o755,
		"usr/local/share/stockade-demo/hello.txt": 0o644,
		"usr/local/lib/python3.11/dist-packages/stockade_demo-1.2.0.dist-info/entry_points.txt": 0o644,
	}
	for p, mode := range checks {
		got, ok := files[p]
		if !ok {
			t.Errorf("%s not installed; tree: %v", p, keys(files))
			continue
		}
		if got != mode {
			t.Errorf("%s mode = %v, want %v", p, got, mode)
		}
	}
	for p := range files {
		if strings.Contains(p, ".data") {
			t.Errorf("%s: a .data directory was copied as it is", p)
		}
	}

	script, _ := os.ReadFile(filepath.Join(root, "usr/local/bin/demo-script"))
	if !strings.HasPrefix(string(script), "#!/usr/bin/python3\n") {
		t.Errorf("demo-script starts %q, want #!/usr/bin/python3", firstLine(script))
	}
	installer, _ := os.ReadFile(filepath.Join(di, "INSTALLER"))
	if string(installer) != "stockade\n" {
		t.Errorf("INSTALLER = %q, want stockade", installer)
	}
	record, _ := os.ReadFile(filepath.Join(di, "RECORD"))
	for _, line := range []string{
		"stockade_demo/__init__.py,sha256=",
		"../../../bin/demo-script,sha256=",
		"../../../bin/demo-cli,sha256=",
		"../../../share/stockade-demo/hello.txt,sha256=",
		"stockade_demo-1.2.0.dist-info/INSTALLER,sha256=",
		"stockade_demo-1.2.0.dist-info/RECORD,,",
	} {
		if !strings.Contains(string(record), line) {
			t.Errorf("RECORD lacks %q:\n%s", line, record)
		}
	}

	// Debian's python runs what was installed, from site-packages.
	env := pythonEnv(t.TempDir(), "PYTHONPATH="+sp)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"/usr/bin/python3", "-c", "import stockade_demo, importlib.metadata as m; print(stockade_demo.answer(), m.version('stockade-demo'))"}, "42 1.2.0"},
		{[]string{"/usr/bin/python3", filepath.Join(root, "usr/local/bin/demo-script")}, "demo-script says 42"},
		{[]string{filepath.Join(root, "usr/local/bin/demo-cli")}, "demo-cli says 42"},
	} {
		cmd := exec.Command(c.args[0], c.args[1:]...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != c.want {
			t.Errorf("%v: %q, %v; want %q", c.args, out, err, c.want)
		}
	}
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	return s
}

// TestInstallRefuses checks the wheels Install refuses, with an error
// naming the wheel and what is wrong, and that a refused wheel leaves the
// tree as it was.
func TestInstallRefuses(t *testing.T) {
	good := goodEntries()
	with := func(extra ...entry) []entry {
		lib := append([]entry{{name: "tiny/__init__.py", body: "VALUE = 42\n"}}, extra...)
		return append(lib, distInfo("tiny", "1.0", lib)...)
	}
	tests := []struct {
		name, file string
		entries    []entry
		want       string
	}{
		{"platform", "tiny-1.0-cp311-cp311-manylinux_2_17_x86_64.whl", good, `wheel "tiny-1.0-cp311-cp311-manylinux_2_17_x86_64.whl" is built for cp311-cp311-manylinux_2_17_x86_64: only pure-python wheels`},
		{"python 2 only", "tiny-1.0-py2-none-any.whl", good, "is built for py2-none-any"},
		{"not a wheel name", "tiny.zip", good, "not a wheel file name"},
		{"traversal", "tiny-1.0-py3-none-any.whl", with(entry{name: "../../../../etc/evil.py", body: "x"}), `entry "../../../../etc/evil.py" points outside the wheel`},
		{"traversal inside", "tiny-1.0-py3-none-any.whl", with(entry{name: "tiny/../../x.py", body: "x"}), "points outside the wheel"},
		{"absolute", "tiny-1.0-py3-none-any.whl", with(entry{name: "/etc/evil", body: "x"}), "is an absolute path"},
		{"backslash", "tiny-1.0-py3-none-any.whl", with(entry{name: `..\evil`, body: "x"}), "cannot be installed"},
		{"symlink", "tiny-1.0-py3-none-any.whl", with(entry{name: "tiny/link", body: "/etc/shadow", mode: fs.ModeSymlink | 0o777}), `entry "tiny/link" is a symbolic link`},
		{"device", "tiny-1.0-py3-none-any.whl", with(entry{name: "tiny/dev", mode: fs.ModeDevice | 0o644}), "is not a file or a directory"},
		{"headers", "tiny-1.0-py3-none-any.whl", with(entry{name: "tiny-1.0.data/headers/tiny.h", body: "int x;"}), "C headers"},
		{"unknown scheme", "tiny-1.0-py3-none-any.whl", with(entry{name: "tiny-1.0.data/etc/x", body: "x"}), `unknown .data scheme "etc"`},
		{"nested script", "tiny-1.0-py3-none-any.whl", with(entry{name: "tiny-1.0.data/scripts/a/b", body: "x"}), "scripts must be files directly"},
		{"duplicate", "tiny-1.0-py3-none-any.whl", with(entry{name: "tiny/__init__.py", body: "other"}), "appears twice"},
		{"name mismatch", "other-1.0-py3-none-any.whl", good, `its metadata directory "tiny-1.0.dist-info" is not the file name's`},
		{"metadata name", "tiny-1.0-py3-none-any.whl", []entry{{name: "tiny-1.0.dist-info/METADATA", body: "Name: other\nVersion: 1.0\n"}, {name: "tiny-1.0.dist-info/WHEEL", body: "Wheel-Version: 1.0\n"}}, `METADATA names "other", the file name "tiny"`},
		{"metadata version", "tiny-1.0-py3-none-any.whl", []entry{{name: "tiny-1.0.dist-info/METADATA", body: "Name: tiny\nVersion: 2.0\n"}, {name: "tiny-1.0.dist-info/WHEEL", body: "Wheel-Version: 1.0\n"}}, `METADATA says version "2.0"`},
		{"no metadata", "tiny-1.0-py3-none-any.whl", []entry{{name: "tiny-1.0.dist-info/WHEEL", body: "Wheel-Version: 1.0\n"}}, "no tiny-1.0.dist-info/METADATA"},
		{"no dist-info", "tiny-1.0-py3-none-any.whl", []entry{{name: "tiny/__init__.py", body: "x"}}, "no .dist-info directory"},
		{"wheel version 2", "tiny-1.0-py3-none-any.whl", []entry{{name: "tiny-1.0.dist-info/METADATA", body: "Name: tiny\nVersion: 1.0\n"}, {name: "tiny-1.0.dist-info/WHEEL", body: "Wheel-Version: 2.0\n"}}, `Wheel-Version "2.0" is not 1.x`},
		{"record hash", "tiny-1.0-py3-none-any.whl", tamper(good, "tiny/__init__.py", "VALUE = 43\n"), `entry "tiny/__init__.py" does not have the hash its RECORD says`},
		{"not a zip", "tiny-1.0-py3-none-any.whl", nil, "not a zip archive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			var p string
			if tt.entries == nil {
				p = filepath.Join(dir, tt.file)
				if err := os.WriteFile(p, []byte("not a zip"), 0o644); err != nil {
					t.Fatal(err)
				}
			} else {
				p, _ = writeWheel(t, dir, tt.file, tt.entries)
			}
			root := newRoot(t)
			before := tree(t, root)
			_, err := wheel.Install(p, root, sitePackages)
			if err == nil {
				t.Fatalf("Install succeeded; tree: %v", keys(tree(t, root)))
			}
			msg, public := errdefs.PublicMessage(err)
			if !public || !errdefs.IsInvalidArgument(err) || !strings.Contains(msg, tt.want) {
				t.Errorf("error %q (public %v, invalid argument %v), want a public invalid argument containing %q", err, public, errdefs.IsInvalidArgument(err), tt.want)
			}
			if after := tree(t, root); len(after) != len(before) {
				t.Errorf("a refused wheel left files: %v", keys(after))
			}
		})
	}
}

// tamper replaces an entry's body, keeping the RECORD that hashed the old.
func tamper(entries []entry, name, body string) []entry {
	out := append([]entry(nil), entries...)
	for i := range out {
		if out[i].name == name {
			out[i].body = body
		}
	}
	return out
}

// TestInstallGood installs the hand-made wheel and checks what lands
// where, then installs it again into the same tree: identical files are
// accepted, a file of other content is not.
func TestInstallGood(t *testing.T) {
	dir := t.TempDir()
	p, sum := writeWheel(t, dir, "tiny-1.0-py3-none-any.whl", goodEntries())
	root := newRoot(t)
	inst, err := wheel.Install(p, root, sitePackages)
	if err != nil {
		t.Fatalf("Install: %v", err)
	}
	if inst.Name != "tiny" || inst.Version != "1.0" || inst.SHA256 != sum {
		t.Errorf("Install = %+v, want tiny 1.0 %s", inst, sum)
	}
	for p, body := range map[string]string{
		"usr/local/lib/python3.11/dist-packages/tiny/__init__.py": "VALUE = 42\n",
		"usr/local/bin/tiny-run":                                  "#!/usr/bin/python3\nimport tiny\nprint(tiny.VALUE)\n",
		"usr/local/share/tiny/notes.txt":                          "notes\n",
	} {
		got, err := os.ReadFile(filepath.Join(root, p))
		if err != nil || string(got) != body {
			t.Errorf("%s = %q, %v; want %q", p, got, err, body)
		}
	}
	st, err := os.Stat(filepath.Join(root, "usr/local/share/tiny"))
	if err != nil || st.Mode() != fs.ModeDir|0o755 {
		t.Errorf("usr/local/share/tiny: %v, %v; want a 0755 directory", st, err)
	}

	// The same files again (a rebuild on the same tree, a shared namespace
	// __init__.py): the RECORD and INSTALLER it writes exist, with the
	// same content, so the second install is accepted as a whole.
	if _, err := wheel.Install(p, root, sitePackages); err != nil {
		t.Errorf("reinstalling the same wheel: %v", err)
	}
	other, _ := writeWheel(t, t.TempDir(), "tiny-1.0-py3-none-any.whl", tamperRecorded("tiny/__init__.py", "VALUE = 0\n"))
	_, err = wheel.Install(other, root, sitePackages)
	if msg, _ := errdefs.PublicMessage(err); !strings.Contains(msg, "/usr/local/lib/python3.11/dist-packages/tiny/__init__.py exists in the image with other content") {
		t.Errorf("installing over other content: %v", err)
	}
}

// TestInstallNameSpelling installs a wheel whose file name spells the
// project otherwise than its metadata directory does ("Tiny", "tiny"):
// names compare normalized, and the .data directory is the metadata
// directory's.
func TestInstallNameSpelling(t *testing.T) {
	p, _ := writeWheel(t, t.TempDir(), "Tiny-1.0-py3-none-any.whl", goodEntries())
	root := newRoot(t)
	inst, err := wheel.Install(p, root, sitePackages)
	if err != nil {
		t.Fatalf("Install: %v", err)
	}
	if inst.Name != "tiny" || inst.File != "Tiny-1.0-py3-none-any.whl" {
		t.Errorf("Install = %+v", inst)
	}
	if _, err := os.Stat(filepath.Join(root, "usr/local/bin/tiny-run")); err != nil {
		t.Errorf("the .data script was not installed: %v", err)
	}
}

// tamperRecorded is goodEntries with one body changed and a RECORD that
// agrees.
func tamperRecorded(name, body string) []entry {
	lib := tamper(goodEntries()[:4], name, body)
	return append(lib, distInfo("tiny", "1.0", lib)...)
}

// TestInstallLinkOut checks that a symbolic link in the tree leading out
// of it is not followed: site-packages reached through one is refused and
// nothing is written where it points.
func TestInstallLinkOut(t *testing.T) {
	p, _ := writeWheel(t, t.TempDir(), "tiny-1.0-py3-none-any.whl", goodEntries())
	root := newRoot(t)
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(root, "usr/local/lib/python3.11")); err != nil {
		t.Fatal(err)
	}
	_, err := wheel.Install(p, root, sitePackages)
	msg, _ := errdefs.PublicMessage(err)
	if !strings.Contains(msg, "through a link leading out of the image") {
		t.Errorf("Install through a link out: %v; want refused", err)
	}
	entries, _ := os.ReadDir(outside)
	if len(entries) != 0 {
		t.Errorf("Install wrote outside the tree: %v", entries)
	}
}

// TestInstallDebianWheel installs the pip wheel Debian ships
// (python3-pip-whl, which CI installs): hundreds of files, console
// scripts, a wheel built by another tool than the tests'. Debian's python
// then runs the pip3 command Install wrote.
func TestInstallDebianWheel(t *testing.T) {
	whls, _ := filepath.Glob("/usr/share/python-wheels/pip-*-py3-none-any.whl")
	if len(whls) == 0 {
		testenv.Missing(t, "Debian's pip wheel is not installed (apt-get install python3-pip-whl)")
		return
	}
	root := newRoot(t)
	inst, err := wheel.Install(whls[0], root, sitePackages)
	if err != nil {
		t.Fatalf("Install: %v", err)
	}
	if inst.Name != "pip" {
		t.Errorf("Install = %+v, want pip", inst)
	}
	pip3 := filepath.Join(root, "usr/local/bin/pip3")
	cmd := exec.Command(pip3, "--version")
	cmd.Env = pythonEnv(t.TempDir(), "PYTHONPATH="+filepath.Join(root, sitePackages))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "pip "+inst.Version+" from "+filepath.Join(root, sitePackages, "pip")) {
		t.Errorf("pip3 --version: %q, %v", out, err)
	}
	record, err := os.ReadFile(filepath.Join(root, sitePackages, "pip-"+inst.Version+".dist-info", "RECORD"))
	if err != nil {
		t.Fatal(err)
	}
	files := 0
	for p, mode := range tree(t, root) {
		if mode.IsRegular() && strings.HasPrefix(p, "usr/local/") {
			files++
		}
	}
	if lines := strings.Count(string(record), "\n"); lines != files || files < 100 {
		t.Errorf("RECORD has %d lines for %d files installed", lines, files)
	}
}

// TestInstallTooManyEntries checks the bound on a wheel's entries, which
// is enforced before anything is written.
func TestInstallTooManyEntries(t *testing.T) {
	entries := goodEntries()
	for i := 0; i < 50001; i++ {
		entries = append(entries, entry{name: fmt.Sprintf("tiny/m%d.py", i)})
	}
	p, _ := writeWheel(t, t.TempDir(), "tiny-1.0-py3-none-any.whl", entries)
	root := newRoot(t)
	_, err := wheel.Install(p, root, sitePackages)
	if msg, _ := errdefs.PublicMessage(err); !strings.Contains(msg, "more than 50000 entries") {
		t.Errorf("Install: %v; want too many entries", err)
	}
	if n := len(tree(t, root)); n != len(tree(t, newRoot(t))) {
		t.Errorf("a refused wheel left files")
	}
}
