package engine

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// snapCounts is a poolCounts that also counts refills by how they were
// made (a PoolDemandObserver).
type snapCounts struct {
	poolCounts
	smu              sync.Mutex
	restored, cold   int
	restoreFailed    int
	cpuRestored      []time.Duration
	cpuCold          []time.Duration
	targets, waiting int
	waitServed       int
}

func (c *snapCounts) PoolTarget(string, int) { c.smu.Lock(); c.targets++; c.smu.Unlock() }
func (c *snapCounts) PoolWait(_ string, _ time.Duration, served bool) {
	c.smu.Lock()
	defer c.smu.Unlock()
	c.waiting++
	if served {
		c.waitServed++
	}
}
func (c *snapCounts) PoolRestoreFailed(string) { c.smu.Lock(); c.restoreFailed++; c.smu.Unlock() }
func (c *snapCounts) PoolRefillCPU(_ string, cpu time.Duration, restored bool) {
	c.smu.Lock()
	defer c.smu.Unlock()
	if restored {
		c.restored++
		c.cpuRestored = append(c.cpuRestored, cpu)
	} else {
		c.cold++
		c.cpuCold = append(c.cpuCold, cpu)
	}
}

func (c *snapCounts) made() (restored, cold, failed int) {
	c.smu.Lock()
	defer c.smu.Unlock()
	return c.restored, c.cold, c.restoreFailed
}

// randomCell prints what a sandbox's code would draw at random, or name
// at random, one per line: python's random, numpy's global generator,
// the kernel's random source, a uuid4, tempfile's next name.
const randomCell = `import os, random, tempfile, uuid
import numpy
print(random.random())
print(float(numpy.random.random()))
print(os.urandom(16).hex())
print(uuid.uuid4())
print(next(tempfile._get_candidate_names()))
`

var randomNames = []string{"random.random()", "numpy.random.random()", "os.urandom(16)", "uuid.uuid4()", "tempfile name"}

// draws runs randomCell in k and returns its lines.
func draws(t *testing.T, k sandbox.Kernel) []string {
	t.Helper()
	r, err := k.Run(t.Context(), sandbox.Cell{Code: randomCell})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(r.Stdout)), "\n")
	if len(lines) != len(randomNames) {
		t.Fatalf("the random cell printed %q (stderr %q), want %d lines", r.Stdout, r.Stderr, len(randomNames))
	}
	return lines
}

// TestPoolRestoredRandomState checks that the sandboxes a gVisor session
// pool restores from its checkpoint are each their own: two sessions
// served by restored sandboxes draw different random numbers and names
// from each other and from the checkpoint's own state, and have their own
// sandbox IDs. The checkpoint's state is read by restoring it twice
// without the pool's reseed: those two draw the same numbers from
// python's random and numpy's generator, which shows the check sees a
// shared state when there is one.
func TestPoolRestoredRandomState(t *testing.T) {
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

	a := pooled(t, e, &counts.poolCounts, "gvisor")
	b := pooled(t, e, &counts.poolCounts, "gvisor")
	if restored, cold, failed := counts.made(); restored < 2 || failed > 0 {
		t.Fatalf("got %d restored refills, %d cold, %d failed restores; want the two sessions' sandboxes restored", restored, cold, failed)
	}
	if a.SandboxID() == b.SandboxID() {
		t.Fatalf("two sessions got one sandbox %s", a.SandboxID())
	}

	// The checkpoint's own state: two raw restores, not reseeded.
	ckpts, _ := filepath.Glob(filepath.Join(dir, "*", "*", "*", poolCheckpointDir))
	if len(ckpts) != 1 {
		t.Fatalf("got checkpoints %v, want one", ckpts)
	}
	if fi, err := os.Stat(filepath.Dir(ckpts[0])); err != nil || fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("the checkpoint's directory: %v, %v; want it root-only", fi.Mode(), err)
	}
	snap := drivers["gvisor"].(sandbox.Snapshotter)
	var raw [2][]string
	for i := range raw {
		sb, err := snap.Restore(t.Context(), ckpts[0], nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
		if sb.ID() == a.SandboxID() || sb.ID() == b.SandboxID() {
			t.Fatalf("a raw restore got the ID %s of a session's sandbox", sb.ID())
		}
		ks, err := sb.(sandbox.Kernels).ListKernels(t.Context())
		if err != nil || len(ks) != 1 {
			t.Fatalf("the raw restore's kernels: %d, %v", len(ks), err)
		}
		raw[i] = draws(t, ks[0])
	}
	for i := range 2 { // random.random() and numpy's
		if raw[0][i] != raw[1][i] {
			t.Fatalf("two raw restores drew %s %s and %s: the checkpoint holds no state of it to compare with", randomNames[i], raw[0][i], raw[1][i])
		}
	}

	ka, kb := a.currentKernel(), b.currentKernel()
	da, db := draws(t, ka), draws(t, kb)
	for i, name := range randomNames {
		if da[i] == db[i] {
			t.Errorf("two restored pool sandboxes drew the same %s: %s", name, da[i])
		}
		for _, r := range raw {
			if da[i] == r[i] || db[i] == r[i] {
				t.Errorf("a restored pool sandbox drew the checkpoint's %s: %s", name, r[i])
			}
		}
	}
}

// TestPoolRemovesStaleSnaps checks that the pools' start removes the
// checkpoints of pools it no longer has and the saves a crash cut short
// (.new-*), keeps those of its own and leaves another daemon's (other
// owner labels) alone.
func TestPoolRemovesStaleSnaps(t *testing.T) {
	e := &Engine{poolOpts: PoolOptions{CheckpointDir: t.TempDir()}, log: slog.New(slog.DiscardHandler),
		ownerLabels: map[string]string{LabelOwner: "a"}}
	dir := e.snapDaemonDir()
	other := &Engine{poolOpts: e.poolOpts, ownerLabels: map[string]string{LabelOwner: "b"}}
	for _, d := range []string{filepath.Join(dir, "code.execute_python_session/abc/checkpoint"), filepath.Join(dir, "code.execute_python_session/.new-123/checkpoint"),
		filepath.Join(dir, "gone_python_session/def/checkpoint"),
		filepath.Join(other.snapDaemonDir(), "gone_python_session/def/checkpoint")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	e.removeStaleSnaps([]*pool{{snap: &poolSnap{root: filepath.Join(dir, "code.execute_python_session")}}, {}})
	if _, err := os.Stat(filepath.Join(other.snapDaemonDir(), "gone_python_session")); err != nil {
		t.Errorf("another daemon's checkpoint: %v, want it left alone", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 || entries[0].Name() != "code.execute_python_session" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("left %v (%v), want only the configured pool's checkpoints", names, err)
	}
	kept, _ := os.ReadDir(filepath.Join(dir, "code.execute_python_session"))
	if len(kept) != 1 || kept[0].Name() != "abc" {
		var names []string
		for _, e := range kept {
			names = append(names, e.Name())
		}
		t.Errorf("the configured pool's directory holds %v, want its checkpoint abc and no save cut short", names)
	}
}

// TestPoolStopRemovesSnaps checks that the pools' stop removes the
// daemon's pool checkpoints, and only the daemon's.
func TestPoolStopRemovesSnaps(t *testing.T) {
	dir := t.TempDir()
	e, err := New(realDrivers(t), "runc", image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
		WithPools(PoolOptions{CheckpointDir: dir}))
	if err != nil {
		t.Fatal(err)
	}
	stop, err := e.StartPools(t.Context(), map[string]string{LabelOwner: poolOwner})
	if err != nil {
		t.Fatal(err)
	}
	other := &Engine{poolOpts: e.poolOpts, ownerLabels: map[string]string{LabelOwner: "another"}}
	mine := filepath.Join(e.snapDaemonDir(), "code.execute_python_session", "abc", poolCheckpointDir)
	theirs := filepath.Join(other.snapDaemonDir(), "code.execute_python_session", "abc", poolCheckpointDir)
	for _, d := range []string{mine, theirs} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	if _, err := os.Stat(e.snapDaemonDir()); !os.IsNotExist(err) {
		t.Errorf("the daemon's checkpoints after the pools' stop: %v, want them removed", err)
	}
	if _, err := os.Stat(theirs); err != nil {
		t.Errorf("another daemon's checkpoint after the pools' stop: %v, want it left", err)
	}
}
