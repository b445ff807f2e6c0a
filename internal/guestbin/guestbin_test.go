package guestbin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
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

// TestPrune keeps this build's guest and the newest others, and removes
// the rest and nothing else.
func TestPrune(t *testing.T) {
	dir := t.TempDir()
	current := filepath.Join(dir, "stockade-guest-1-current")
	files := []string{current, "stockade-guest-1-a", "stockade-guest-1-b", "stockade-guest-1-c", "other-file"}
	for i, f := range files {
		p := filepath.Join(dir, filepath.Base(f))
		if err := os.WriteFile(p, nil, 0o555); err != nil {
			t.Fatal(err)
		}
		// a is the oldest, c the newest; current is the oldest of all.
		at := time.Now().Add(time.Duration(i-10) * time.Minute)
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := Prune(dir, current, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "stockade-guest-1-b"), filepath.Join(dir, "stockade-guest-1-a")}
	if !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	var left []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if wantLeft := []string{"other-file", "stockade-guest-1-c", "stockade-guest-1-current"}; !slices.Equal(left, wantLeft) {
		t.Errorf("left %v, want %v", left, wantLeft)
	}
	if removed, err := Prune(filepath.Join(dir, "missing"), current, 1); err != nil || removed != nil {
		t.Errorf("a missing directory: %v, %v", removed, err)
	}
}

// TestInstallNeedsTheDataDirectory checks that Install refuses a data
// directory that does not exist, naming what to do, and creates nothing.
func TestInstallNeedsTheDataDirectory(t *testing.T) {
	root := t.TempDir()
	_, err := Install(filepath.Join(root, "nonexistent", "x", "bin"))
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "stockade setup --data-dir "+filepath.Join(root, "nonexistent", "x")) {
		t.Errorf("got %v, want a not-found error naming stockade setup", err)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Errorf("created %v, want nothing", entries)
	}
}
