package fsmode

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// entry is a path of a test tree and its mode.
type entry struct {
	path string
	mode fs.FileMode
	dir  bool
}

// plant makes the entries below root with their modes (as an older install
// left them).
func plant(t *testing.T, root string, entries []entry) {
	t.Helper()
	for _, e := range entries {
		p := filepath.Join(root, e.path)
		if e.dir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		} else {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(p, e.mode); err != nil {
			t.Fatal(err)
		}
	}
}

func modeOf(t *testing.T, p string) fs.FileMode {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestFix(t *testing.T) {
	tmp := t.TempDir()
	data, state, ckpt, dataRoot := filepath.Join(tmp, "data"), filepath.Join(tmp, "state"), filepath.Join(tmp, "ckpt"), filepath.Join(tmp, "tooldata")
	// As an install before the rule left it: everything open to others.
	plant(t, data, []entry{
		{".", 0o755, true},
		{"stockade.db", 0o644, false},
		{"stockade.db-wal", 0o644, false},
		{"stockade.db.witness", 0o755, true},
		{"stockade.db.witness/ws_1", 0o644, false},
		{"images/sha256/abc/rootfs/etc", 0o755, true},
		{"images/sha256/abc/rootfs/etc/passwd", 0o644, false},
		{"images/sha256/abc/manifest.json", 0o644, false},
		{"images/sha256", 0o755, true},
		{"images/sha256/abc", 0o755, true},
		{"images/refs/python", 0o644, false},
		{"images/tmp/python-1/rootfs/bin", 0o755, true},
		{"images", 0o755, true},
		{"cache/debs/a.deb", 0o644, false},
		{"bin/stockade-guest-1-ab", 0o755, false},
		{"bin/.guest-2", 0o555, false},
		{"bin", 0o755, true},
		{"data/sales/q1.csv", 0o644, false},
		{"checkpoints/ses_1/image/pages", 0o644, false},
	})
	plant(t, state, []entry{
		{".", 0o755, true},
		{"serve.pid", 0o644, false},
		{"runc/state/sbx/state.json", 0o644, false},
		{"gvisor/bundles/sbx/config.json", 0o644, false},
		{"gvisor/bundles/sbx/resolv.conf", 0o600, false},
		{"gvisor/bundles/sbx/rootfs/etc/hosts", 0o644, false},
		{"gvisor/bundles/sbx", 0o755, true},
	})
	plant(t, ckpt, []entry{{".", 0o755, true}, {"ses_2/sandbox.json", 0o644, false}})
	plant(t, dataRoot, []entry{{".", 0o755, true}, {"f", 0o644, false}})
	if err := os.Symlink("/etc/passwd", filepath.Join(data, "link")); err != nil {
		t.Fatal(err)
	}
	l := Layout{DataDir: data, StateDir: state, Private: []string{ckpt, filepath.Join(data, "checkpoints")}, DataRoot: dataRoot}

	bad := Check(l)
	for _, p := range []string{"data/stockade.db:", "data/stockade.db-wal:", "data:", "data/images/refs/python:", "data/cache/debs/a.deb:", "state/serve.pid:", "ckpt/ses_2/sandbox.json:", "tooldata:"} {
		if !slices.ContainsFunc(bad, func(s string) bool { return strings.HasPrefix(s, filepath.Join(tmp, p)) }) {
			t.Errorf("Check before Fix: got %q, want %s among them", bad, p)
		}
	}
	if err := Fix(l); err != nil {
		t.Fatalf("Fix: %v", err)
	}
	if bad := Check(l); len(bad) != 0 {
		t.Errorf("Check after Fix: got %q, want nothing", bad)
	}
	for _, c := range []struct {
		path string
		want fs.FileMode
	}{
		{"data", Traverse},
		{"data/stockade.db", File},
		{"data/stockade.db-wal", File},
		{"data/stockade.db.witness", Dir},
		{"data/stockade.db.witness/ws_1", File},
		{"data/images", Traverse},
		{"data/images/sha256", Traverse},
		{"data/images/sha256/abc", Traverse},
		{"data/images/sha256/abc/manifest.json", File},
		{"data/images/sha256/abc/rootfs/etc", 0o755},
		{"data/images/sha256/abc/rootfs/etc/passwd", 0o644},
		{"data/images/refs", Dir},
		{"data/images/refs/python", File},
		{"data/images/tmp", Dir},
		{"data/images/tmp/python-1/rootfs/bin", 0o755},
		{"data/cache", Traverse},
		{"data/cache/debs/a.deb", File},
		{"data/bin", Traverse},
		{"data/bin/stockade-guest-1-ab", 0o555},
		{"data/bin/.guest-2", 0o555},
		{"data/data", Traverse},
		{"data/data/sales/q1.csv", 0o644},
		{"data/checkpoints/ses_1/image/pages", File},
		{"state", Dir},
		{"state/serve.pid", File},
		{"state/runc/state/sbx/state.json", 0o644},
		{"state/runc/state", 0o755},
		{"state/gvisor/bundles/sbx", Dir},
		{"state/gvisor/bundles/sbx/config.json", File},
		{"state/gvisor/bundles/sbx/resolv.conf", 0o644},
		{"state/gvisor/bundles/sbx/rootfs/etc/hosts", 0o644},
		{"ckpt", Dir},
		{"ckpt/ses_2/sandbox.json", File},
		{"tooldata", Traverse},
		{"tooldata/f", 0o644},
	} {
		t.Run(c.path, func(t *testing.T) {
			if got := modeOf(t, filepath.Join(tmp, c.path)); got != c.want {
				t.Errorf("got mode %#o, want %#o", got, c.want)
			}
		})
	}
	if got := modeOf(t, "/etc/passwd"); got != 0o644 {
		t.Errorf("/etc/passwd, behind a symbolic link: got mode %#o, want 0644 (not followed)", got)
	}
}

func TestPrivateFile(t *testing.T) {
	for _, c := range []struct {
		name     string
		existing fs.FileMode // 0: missing
	}{
		{"missing", 0},
		{"open to others", 0o644},
		{"private", 0o600},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			db := filepath.Join(dir, "x.db")
			if c.existing != 0 {
				for _, p := range []string{db, db + "-wal"} {
					if err := os.WriteFile(p, []byte("x"), c.existing); err != nil {
						t.Fatal(err)
					}
					if err := os.Chmod(p, c.existing); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := PrivateFile(db, db+"-wal", db+"-shm"); err != nil {
				t.Fatalf("PrivateFile: %v", err)
			}
			if got := modeOf(t, db); got != File {
				t.Errorf("the file: got mode %#o, want %#o", got, File)
			}
			if c.existing != 0 {
				if got := modeOf(t, db+"-wal"); got != File {
					t.Errorf("its -wal: got mode %#o, want %#o", got, File)
				}
			}
			if _, err := os.Lstat(db + "-shm"); err == nil {
				t.Errorf("a missing companion was created")
			}
		})
	}
}
