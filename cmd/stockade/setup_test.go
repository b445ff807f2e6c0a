package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/internal/testenv"
)

// TestSetupCreatesTheDataRoot runs `stockade setup` on a fresh data
// directory (the host's runc, runsc and debootstrap are present, so it
// only checks them; no image is built) and then the README's tools steps
// against it: setup creates the data root, and the example lints clean
// once its data directory is made inside it, as the README says.
func TestSetupCreatesTheDataRoot(t *testing.T) {
	testenv.RequiresRoot(t)
	dir := filepath.Join(t.TempDir(), "stockade")
	code, _, stderr := runCLI(t, nil, "setup", "--data-dir", dir, "--state-dir", t.TempDir(), "--images", "none", "-q")
	if code != 0 {
		t.Fatalf("setup: exit %d: %s", code, stderr)
	}
	if fi, err := os.Stat(filepath.Join(dir, "data")); err != nil || !fi.IsDir() {
		t.Fatalf("after setup the data root %s: %v, want a directory", filepath.Join(dir, "data"), err)
	}
	// The README: mkdir /var/lib/stockade/data/sales (not -p: the data
	// root is setup's), then lint.
	if err := os.Mkdir(filepath.Join(dir, "data", "sales"), 0o755); err != nil {
		t.Fatal(err)
	}
	tools := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(tools, []byte(readmeToolsExample(t, dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t, nil, "tools", "lint", tools, "--data-dir", dir)
	if code != 0 || strings.TrimSpace(stdout) != "ok: 1 tool" {
		t.Errorf("lint of the README's example: got exit %d, stdout %q, stderr %q; want ok: 1 tool", code, stdout, stderr)
	}
}

// TestBadDataDirLeavesNothing runs `stockade run` with a data directory
// that does not exist, as given by mistake, without --guest (so that the
// embedded guest would be installed): the error says what to do, and
// nothing is created, neither the data directory nor its guest agent.
func TestBadDataDirLeavesNothing(t *testing.T) {
	root := t.TempDir()
	data := filepath.Join(root, "nonexistent", "x")
	state := filepath.Join(root, "state")
	code, stdout, stderr := runCLI(t, nil, "run", "--data-dir", data, "--state-dir", state, "--runtime", "python", "-c", "print(1)")
	if code != 2 || stdout != "" || len(strings.Split(strings.TrimSpace(stderr), "\n")) != 1 || !strings.Contains(stderr, "stockade setup --data-dir "+data) {
		t.Errorf("got exit %d, stdout %q, stderr %q; want exit 2 and one line naming stockade setup", code, stdout, stderr)
	}
	if _, err := os.Stat(filepath.Join(root, "nonexistent")); !os.IsNotExist(err) {
		t.Errorf("%s: got %v, want it not created", filepath.Join(root, "nonexistent"), err)
	}
	if left := listTree(t, state); len(left) > 0 {
		t.Errorf("left behind in the state directory: %v", left)
	}
}
