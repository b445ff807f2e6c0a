package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
