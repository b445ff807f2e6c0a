package guestbin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestInstall checks that the installed guest is the embedded one, named by
// its size and the hash the build recorded, and that a second Install
// reuses it.
func TestInstall(t *testing.T) {
	want, err := fs.ReadFile(payload, guestFile)
	if err != nil {
		t.Fatalf("no embedded guest (run `make build` first): %v", err)
	}
	dir := filepath.Join(t.TempDir(), "bin")
	p, err := Install(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(want)
	if name := fmt.Sprintf("stockade-guest-%d-%s", len(want), hex.EncodeToString(h[:8])); filepath.Base(p) != name {
		t.Errorf("installed as %s, want %s", filepath.Base(p), name)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("installed guest differs from the embedded one (err %v)", err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o555 {
		t.Errorf("mode %v (err %v), want 0555", fi.Mode().Perm(), err)
	}
	again, err := Install(dir)
	if err != nil || again != p {
		t.Errorf("second Install: %q, %v; want %q", again, err, p)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%d files in %s, want 1 (no temporary file left)", len(entries), dir)
	}
}
