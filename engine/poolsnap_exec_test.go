package engine

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// snapPoolEngine returns an engine over drivers with the default tool on
// driver and a one-shot python pool of size that refills from a
// checkpoint in dir where driver can (gVisor).
func snapPoolEngine(t *testing.T, drivers map[string]sandbox.Driver, driver string, size int, dir string) (*Engine, *snapCounts) {
	t.Helper()
	return snapPoolEngineWarm(t, drivers, driver, size, dir, true)
}

// snapPoolEngineWarm is snapPoolEngine whose restored sandboxes are
// warmed or not (PoolOptions.Unwarmed).
func snapPoolEngineWarm(t *testing.T, drivers map[string]sandbox.Driver, driver string, size int, dir string, warmed bool) (*Engine, *snapCounts) {
	t.Helper()
	e, err := New(drivers, driver, image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
		WithPools(PoolOptions{Pools: []PoolSpec{{Runtime: "python", Size: size}}, CheckpointDir: dir, Unwarmed: !warmed}))
	if err != nil {
		t.Fatal(err)
	}
	counts := &snapCounts{}
	e.SetPoolObserver(counts)
	stop, err := e.StartPools(context.Background(), map[string]string{LabelOwner: "pool-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return e, counts
}

// runDraws runs randomCell as a one-shot program of e, which must be a
// pool hit, and returns its lines.
func runDraws(t *testing.T, e *Engine, counts *poolCounts) []string {
	t.Helper()
	waitReady(t, e, 1)
	hits, _ := counts.get()
	res, err := e.Run(t.Context(), Request{Runtime: "python", Code: []byte(randomCell)})
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := counts.get(); h != hits+1 {
		t.Fatalf("got %d pool hits, want %d: the run was not served by the pool", h, hits+1)
	}
	return drawLines(t, []byte(res.Stdout), []byte(res.Stderr))
}

func drawLines(t *testing.T, out, errOut []byte) []string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(randomNames) {
		t.Fatalf("the random program printed %q (stderr %q), want %d lines", out, errOut, len(randomNames))
	}
	return lines
}

// TestPoolOneShotRestoredRandomState checks that the sandboxes a gVisor
// one-shot pool restores from its checkpoint (its interpreter saved
// waiting for its program) are each their own: two runs served by
// restored sandboxes draw different random numbers and names from each
// other and from the checkpoint's own state. The checkpoint's state is
// read by restoring it twice and sending the interpreter its program
// without the reseed (pool.py's header "reseed": false): those two draw
// the same numbers from python's random and numpy's generator, which
// shows the check sees a shared state when there is one.
func TestPoolOneShotRestoredRandomState(t *testing.T) {
	drivers, _ := shimDrivers(t, nil)
	dir := t.TempDir()
	e, counts := snapPoolEngine(t, drivers, "gvisor", 1, dir)
	da := runDraws(t, e, &counts.poolCounts)
	db := runDraws(t, e, &counts.poolCounts)
	if restored, cold, failed := counts.made(); restored < 2 || failed > 0 {
		t.Fatalf("got %d restored refills, %d cold, %d failed restores; want the two runs' sandboxes restored", restored, cold, failed)
	}

	ckpts, _ := filepath.Glob(filepath.Join(dir, "*", "*", "*", poolCheckpointDir))
	if len(ckpts) != 1 {
		t.Fatalf("got checkpoints %v, want one", ckpts)
	}
	snap := drivers["gvisor"].(sandbox.ExecRestorer)
	var raw [2][]string
	for i := range raw {
		sb, ex, err := snap.RestoreExec(t.Context(), ckpts[0], nil, sandbox.ExecRequest{
			File: sandbox.File{Name: "main.py"}, Argv: []string{"/usr/bin/python3"}, StdinStream: true, ExitNotice: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
		h, _ := json.Marshal(map[string]any{"path": "/tmp/main.py", "argv": []string{"/tmp/main.py"}, "size": len(randomCell), "reseed": false})
		in := ex.Stdin()
		if _, err := in.Write(append(append(poolHeaderLen(len(h)), h...), randomCell...)); err != nil {
			t.Fatal(err)
		}
		_ = in.Close()
		res, err := ex.Wait(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		raw[i] = drawLines(t, res.Stdout, res.Stderr)
	}
	t.Logf("raw restores drew %q and %q", raw[0], raw[1])
	for i := range 2 { // random.random() and numpy's
		if raw[0][i] != raw[1][i] {
			t.Fatalf("two raw restores drew %s %s and %s: the checkpoint holds no state of it to compare with", randomNames[i], raw[0][i], raw[1][i])
		}
	}
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

// TestPoolOneShotRestoreFallsBack checks that a one-shot pool whose
// checkpoint cannot be restored (its record overwritten) refills cold,
// counts the failed restore, and serves its runs all the same.
func TestPoolOneShotRestoreFallsBack(t *testing.T) {
	drivers, _ := shimDrivers(t, nil)
	dir := t.TempDir()
	e, counts := snapPoolEngine(t, drivers, "gvisor", 1, dir)
	const probe = "import sys\nprint('numpy' in sys.modules)"
	run := func() {
		t.Helper()
		waitReady(t, e, 1)
		hits, _ := counts.get()
		res, err := e.Run(t.Context(), Request{Runtime: "python", Code: []byte(probe)})
		if err != nil {
			t.Fatal(err)
		}
		if h, _ := counts.get(); h != hits+1 || res.Stdout != "True\n" {
			t.Fatalf("got %q with %d hits after %d, want a pool hit with numpy imported", res.Stdout, h, hits)
		}
	}
	run()
	if restored, _, failed := counts.made(); restored < 1 || failed > 0 {
		t.Fatalf("got %d restored refills and %d failed restores, want the pool restoring", restored, failed)
	}
	ckpts, _ := filepath.Glob(filepath.Join(dir, "*", "*", "*", poolCheckpointDir))
	if len(ckpts) != 1 {
		t.Fatalf("got checkpoints %v, want one", ckpts)
	}
	entries, _ := os.ReadDir(ckpts[0])
	broken := 0
	for _, d := range entries {
		if d.Type().IsRegular() {
			if err := os.WriteFile(filepath.Join(ckpts[0], d.Name()), []byte("{}"), 0o600); err != nil {
				t.Fatal(err)
			}
			broken++
		}
	}
	if broken == 0 {
		t.Fatalf("the checkpoint %s has no file to break", ckpts[0])
	}
	_, coldBefore, _ := counts.made()
	run() // takes the sandbox restored before; its refill fails to restore
	run()
	if _, cold, failed := counts.made(); failed < 1 || cold <= coldBefore {
		t.Errorf("got %d failed restores and %d cold refills (%d before), want the refill after the failure cold", failed, cold, coldBefore)
	}
}

// warmProbe prints what a program could see of a warm-up before it: the
// files in /tmp, the names of its globals, its open descriptors, and
// any module loaded since the pool's imports that names a warm-up.
const warmProbe = `import os, sys
print(sorted(os.listdir("/tmp")))
print(sorted(globals()))
print(sorted(os.listdir("/proc/self/fd")))
print(sorted(m for m in sys.modules if "warm" in m))
`

// TestPoolOneShotRestoredWarmLeavesNoTrace checks that the warm-up of a
// restored one-shot pool sandbox (pool.py's _warm, which runs a program
// printing a line before the real one comes) shows nothing to the
// program: its output and what it sees of /tmp, its namespace and its
// descriptors are those of a restored sandbox not warmed. The probe's
// /tmp listing holds its own file (main.py), which shows it sees the
// files there.
func TestPoolOneShotRestoredWarmLeavesNoTrace(t *testing.T) {
	drivers, _ := shimDrivers(t, nil)
	var outs [2]string
	for i, warmed := range []bool{true, false} {
		e, counts := snapPoolEngineWarm(t, drivers, "gvisor", 1, t.TempDir(), warmed)
		for range 2 { // each served by a sandbox restored from the checkpoint
			waitReady(t, e, 1)
			res, err := e.Run(t.Context(), Request{Runtime: "python", Code: []byte(warmProbe)})
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != sandbox.StatusSucceeded || res.Stderr != "" {
				t.Fatalf("warmed %v: the probe ended %s, stderr %q", warmed, res.Status, res.Stderr)
			}
			outs[i] = res.Stdout
		}
		if restored, _, failed := counts.made(); restored < 1 || failed > 0 {
			t.Fatalf("warmed %v: got %d restored refills and %d failed restores, want the probe served by a restored sandbox", warmed, restored, failed)
		}
	}
	t.Logf("the probe saw:\n%s", outs[0])
	if !strings.HasPrefix(outs[0], "['main.py']\n") {
		t.Fatalf("the probe's /tmp listing is not its own file alone: %q", outs[0])
	}
	if outs[0] != outs[1] {
		t.Errorf("a warmed restored sandbox's program saw\n%s\nwhere an unwarmed one's saw\n%s", outs[0], outs[1])
	}
}
