package engine

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// TestPoolDropsUnrestorableSnap: a gVisor session pool's checkpoint that
// cannot be restored (its sealed record spoiled) costs one failed
// restore: the refill starts cold and drops it, and the next refill
// makes a new one, which restores.
func TestPoolDropsUnrestorableSnap(t *testing.T) {
	drivers, _ := shimDrivers(t, nil)
	dir := t.TempDir()
	e, err := New(drivers, "gvisor", image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
		WithPools(PoolOptions{Pools: []PoolSpec{{Runtime: "python", Sessions: 1}}, SessionWorkspace: poolWorkspace, CheckpointDir: dir}))
	if err != nil {
		t.Fatal(err)
	}
	counts := &snapCounts{}
	e.SetPoolObserver(counts)
	stop, err := e.StartPools(context.Background(), map[string]string{LabelOwner: poolOwner})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	checkpoints := func() []string {
		l, _ := filepath.Glob(filepath.Join(dir, "*", "*", "*", poolCheckpointDir))
		return l
	}
	waitReady(t, e, 1)
	first := checkpoints()
	if restored, _, _ := counts.made(); restored != 1 || len(first) != 1 {
		t.Fatalf("the first refill: got %d restored, checkpoints %v; want one restored from one checkpoint", restored, first)
	}
	if err := os.WriteFile(filepath.Join(first[0], "sandbox.json"), []byte(`{"spoiled": true}`), 0o600); err != nil {
		t.Fatal(err)
	}

	a := pooled(t, e, &counts.poolCounts, "gvisor") // its refill fails to restore
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	waitReady(t, e, 1)
	if _, _, failed := counts.made(); failed != 1 {
		t.Fatalf("failed restores after the spoiled checkpoint: got %d, want 1", failed)
	}
	if l := checkpoints(); len(l) != 0 {
		t.Fatalf("checkpoints after the failed restore: got %v, want it dropped", l)
	}
	b := pooled(t, e, &counts.poolCounts, "gvisor") // its refill makes a new one
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	waitReady(t, e, 1)
	restored, _, failed := counts.made()
	if failed != 1 || restored != 2 || len(checkpoints()) != 1 {
		t.Errorf("after the next refill: got %d restored, %d failed, checkpoints %v; want a new checkpoint restored", restored, failed, checkpoints())
	}
}
