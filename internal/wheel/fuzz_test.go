package wheel_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/internal/wheel"
)

// FuzzInstall feeds Install arbitrary archives: it must not panic, must
// write nothing outside /usr/local, and must leave the tree as it was
// when it fails.
func FuzzInstall(f *testing.F) {
	f.Add(zipBytes(f, goodEntries()))
	f.Add(zipBytes(f, append(goodEntries(), entry{name: "../escape", body: "x"})))
	f.Add(zipBytes(f, append(goodEntries(), entry{name: "tiny/l", body: "/", mode: fs.ModeSymlink | 0o777})))
	f.Add(zipBytes(f, tamper(goodEntries(), "tiny/__init__.py", "changed")))
	f.Add([]byte("PK\x05\x06" + strings.Repeat("\x00", 18)))
	// One directory per worker process, emptied after each input: cheaper
	// than t.TempDir's, which matters at CI's 20000 inputs.
	base := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		defer os.RemoveAll(filepath.Join(base, "root"))
		p := filepath.Join(base, "tiny-1.0-py3-none-any.whl")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		root := filepath.Join(base, "root")
		if err := os.MkdirAll(filepath.Join(root, "usr/local"), 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := wheel.Install(p, root, sitePackages)
		after := tree(t, root)
		if err != nil && len(after) != 3 { // root, usr, usr/local
			t.Fatalf("failed install (%v) left files: %v", err, keys(after))
		}
		for p := range after {
			if p != "." && p != "usr" && p != "usr/local" && !strings.HasPrefix(p, "usr/local/") {
				t.Fatalf("Install wrote %s", p)
			}
		}
	})
}
