package capability

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
)

// TestSweepCheckpointsKeepsForeignFiles starts a service over a checkpoint
// directory that holds, besides the checkpoint of a session that is not
// paused, files that are not checkpoints (the directory is the operator's
// choice): the start removes the checkpoint only.
func TestSweepCheckpointsKeepsForeignFiles(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, NewSessionID())
	foreign := []string{filepath.Join(dir, "stockade.db"), filepath.Join(dir, "ses_notanid", "keep"), filepath.Join(dir, "bin", "keep")}
	for _, f := range append([]string{filepath.Join(stale, "sandbox.json")}, foreign...) {
		if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	newServiceEnv(t, nil, &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor}, model.DefaultPolicy(), ServiceOptions{Sessions: SessionOptions{CheckpointDir: dir}})
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the checkpoint of a session that is not paused: got %v, want it removed", err)
	}
	for _, f := range foreign {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("%s, no checkpoint: %v, want it kept", f, err)
		}
	}
}
