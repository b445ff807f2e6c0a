package wheel_test

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/internal/testenv"
)

// sitePackages is where the tests install, as Debian's python has it.
const sitePackages = "/usr/local/lib/python3.11/dist-packages"

// entry is a file of a hand-made wheel.
type entry struct {
	name, body string
	mode       fs.FileMode // 0: a 0644 file
}

// zipBytes makes a zip archive of entries, in order.
func zipBytes(t testing.TB, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, e := range entries {
		h := &zip.FileHeader{Name: e.name, Method: zip.Deflate}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		h.SetMode(mode)
		w, err := zw.CreateHeader(h)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// distInfo is a wheel's metadata for name and version, with a RECORD of
// the other entries.
func distInfo(name, version string, others []entry) []entry {
	di := strings.ReplaceAll(name, "-", "_") + "-" + version + ".dist-info/"
	meta := []entry{
		{name: di + "METADATA", body: "Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n\nA description.\n"},
		{name: di + "WHEEL", body: "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var rec strings.Builder
	for _, e := range append(append([]entry(nil), others...), meta...) {
		if strings.HasSuffix(e.name, "/") || e.mode&fs.ModeSymlink != 0 {
			continue
		}
		sum := sha256.Sum256([]byte(e.body))
		rec.WriteString(e.name + ",sha256=" + base64.RawURLEncoding.EncodeToString(sum[:]) + "," + itoa(len(e.body)) + "\n")
	}
	rec.WriteString(di + "RECORD,,\n")
	return append(meta, entry{name: di + "RECORD", body: rec.String()})
}

func itoa(n int) string {
	b := []byte{}
	if n == 0 {
		return "0"
	}
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}

// writeWheel writes a hand-made wheel into dir as file and returns its
// path and hex SHA-256.
func writeWheel(t testing.TB, dir, file string, entries []entry) (string, string) {
	t.Helper()
	b := zipBytes(t, entries)
	p := filepath.Join(dir, file)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return p, hex.EncodeToString(sum[:])
}

// goodEntries is a small valid pure-python wheel "tiny" 1.0.
func goodEntries() []entry {
	lib := []entry{
		{name: "tiny/", mode: fs.ModeDir | 0o755},
		{name: "tiny/__init__.py", body: "VALUE = 42\n"},
		{name: "tiny-1.0.data/scripts/tiny-run", body: "#!python\nimport tiny\nprint(tiny.VALUE)\n"},
		{name: "tiny-1.0.data/data/share/tiny/notes.txt", body: "notes\n"},
	}
	return append(lib, distInfo("tiny", "1.0", lib)...)
}

// tree lists the files and directories under root with their modes.
func tree(t testing.TB, root string) map[string]fs.FileMode {
	t.Helper()
	out := map[string]fs.FileMode{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		out[rel] = info.Mode()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func keys(m map[string]fs.FileMode) []string {
	var k []string
	for p := range m {
		k = append(k, p)
	}
	sort.Strings(k)
	return k
}

// newRoot makes an image-like tree with /usr/local/lib and /usr/local/bin.
func newRoot(t testing.TB) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	for _, d := range []string{"usr/local/bin", "usr/local/lib", "usr/bin"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// debianPython returns Debian's python3 with setuptools and wheel, which
// build the real wheel of the tests (CI installs python3-setuptools and
// python3-wheel). The pyenv shims that may come first on PATH are not
// Debian's, so the path is fixed.
func debianPython(t testing.TB) string {
	t.Helper()
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		testenv.Missing(t, "/usr/bin/python3 not found (apt-get install python3)")
	}
	cmd := exec.Command(py, "-c", "import setuptools, wheel")
	cmd.Env = pythonEnv(t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		testenv.Missing(t, "Debian's python3 lacks setuptools or wheel (apt-get install python3-setuptools python3-wheel): "+string(out))
	}
	return py
}

// pythonEnv is a clean environment for Debian's python.
func pythonEnv(home string, extra ...string) []string {
	return append([]string{"PATH=/usr/bin:/bin", "HOME=" + home, "PYTHONNOUSERSITE=1", "PYTHONDONTWRITEBYTECODE=1", "LANG=C.UTF-8"}, extra...)
}

// buildWheel builds the real pure-python wheel "stockade-demo" 1.2.0 with
// setuptools: a package, a script with a "#!python" shebang, a console
// script and a data file. It returns the wheel's path.
func buildWheel(t testing.TB) string {
	t.Helper()
	py := debianPython(t)
	src := t.TempDir()
	files := map[string]string{
		"setup.py": `from setuptools import setup
setup(
    name="stockade-demo",
    version="1.2.0",
    packages=["stockade_demo"],
    scripts=["bin/demo-script"],
    entry_points={"console_scripts": ["demo-cli = stockade_demo:main"]},
    data_files=[("share/stockade-demo", ["data/hello.txt"])],
)
`,
		"stockade_demo/__init__.py": "def main():\n    print('demo-cli says', answer())\n    return 0\n\ndef answer():\n    return 42\n",
		"bin/demo-script":           "#!/usr/bin/env python\nimport stockade_demo\nprint('demo-script says', stockade_demo.answer())\n",
		"data/hello.txt":            "hello\n",
	}
	for name, body := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(py, "setup.py", "-q", "bdist_wheel", "-d", "dist")
	cmd.Dir = src
	cmd.Env = pythonEnv(src)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the wheel: %v\n%s", err, out)
	}
	matches, _ := filepath.Glob(filepath.Join(src, "dist", "*.whl"))
	if len(matches) != 1 {
		t.Fatalf("built wheels: %v, want one", matches)
	}
	return matches[0]
}

func fileSHA256(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
