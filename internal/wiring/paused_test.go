package wiring

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestPausedImages checks that the images of paused sessions' checkpoints
// are listed from their records, and other directories skipped.
func TestPausedImages(t *testing.T) {
	dir := t.TempDir()
	for name, record := range map[string]string{
		"ses_a": `{"from": "sb_1", "image": {"Name": "analytics", "Digest": "sha256:aa"}}`,
		"ses_b": "",
		"ses_c": `{"image": `,
	} {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
		if record != "" {
			if err := os.WriteFile(filepath.Join(dir, name, "sandbox.json"), []byte(record), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := PausedImages(dir); !slices.Equal(got, []string{"sha256:aa"}) {
		t.Errorf("got %v, want [sha256:aa]", got)
	}
	if got := PausedImages(filepath.Join(dir, "missing")); len(got) != 0 {
		t.Errorf("a missing directory: got %v, want none", got)
	}
}
