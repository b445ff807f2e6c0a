package ocidriver_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// aheadFixture is a gVisor driver with a checkpoint of a shell sandbox
// whose /tmp/state holds "saved".
func aheadFixture(t *testing.T) (d *ocidriver.Snapshotting, state, dir string, ctx context.Context) {
	t.Helper()
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runsc")
	state = t.TempDir()
	d, err := gvisor.New(gvisor.Config{StateDir: state, GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = d.DropPrepared(context.Background())
		_, _ = d.Reap(context.Background(), nil)
	})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	t.Cleanup(cancel)
	sb, err := d.CreateUnbound(ctx, sandbox.Spec{Image: testenv.Image(t, "shell"), Labels: map[string]string{"pool": "warm"}})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := sandbox.Run(ctx, sb, shScript("echo saved > /tmp/state")); err != nil || res.ExitCode != 0 {
		t.Fatalf("writing the state: %+v, %v", res, err)
	}
	dir = filepath.Join(t.TempDir(), "warm")
	if err := d.Checkpoint(ctx, sb, dir); err != nil {
		t.Fatal(err)
	}
	return d, state, dir, ctx
}

// aheadIDs are the sandboxes of state's shims.
func aheadIDs(t *testing.T, state string) []string {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(state, "shims"))
	var ids []string
	for _, e := range entries {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// checkState runs `cat /tmp/state` in sb: the checkpoint's.
func checkState(t *testing.T, ctx context.Context, sb sandbox.Sandbox) {
	t.Helper()
	res, err := sandbox.Run(ctx, sb, shScript("cat /tmp/state"))
	if err != nil || strings.TrimSpace(string(res.Stdout)) != "saved" {
		t.Errorf("the restored state: got %+v, %v, want stdout saved", res, err)
	}
}

// TestRestoreAhead restores a checkpoint into a sandbox created ahead:
// the Restore takes the slot (its ID is the slot's), the sandbox has the
// checkpoint's state, and once destroyed nothing of it is left.
func TestRestoreAhead(t *testing.T) {
	d, state, dir, ctx := aheadFixture(t)
	if err := d.PrepareRestore(ctx, dir); err != nil {
		t.Fatal(err)
	}
	// A second call for the same checkpoint keeps the one slot.
	if err := d.PrepareRestore(ctx, dir); err != nil {
		t.Fatal(err)
	}
	ids := aheadIDs(t, state)
	if ready, _, _ := d.Prepared(); ready != 1 || len(ids) != 1 {
		t.Fatalf("prepared: %d ready, shims %v; want 1", ready, ids)
	}
	if left := d.Leftovers(ctx, ids[0]); len(left) == 0 {
		t.Fatalf("the slot %s is not seen on the host", ids[0])
	}
	// What a ready slot holds (BENCHMARKS.md, "Templates"): its memory
	// cgroup's usage (v2, or v1).
	for _, p := range []string{filepath.Join("/sys/fs/cgroup", ocidriver.CgroupParent, ids[0], "memory.current"),
		filepath.Join("/sys/fs/cgroup/memory", ocidriver.CgroupParent, ids[0], "memory.usage_in_bytes")} {
		if b, err := os.ReadFile(p); err == nil {
			t.Logf("a ready slot's memory cgroup: %s bytes", strings.TrimSpace(string(b)))
		}
	}
	sb, err := d.Restore(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ready, claimed, failed := d.Prepared(); ready != 0 || claimed != 1 || failed != 0 {
		t.Errorf("after the restore: %d ready, %d claimed, %d failed; want 0, 1, 0", ready, claimed, failed)
	}
	if sb.ID() != ids[0] {
		t.Errorf("restored into %s, not the slot %s", sb.ID(), ids[0])
	}
	checkState(t, ctx, sb)
	if err := d.Bind(ctx, sb, sandbox.Binding{Labels: map[string]string{"execution": "e"}}); err != nil {
		t.Errorf("binding the sandbox restored ahead: %v", err)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	if left := d.Leftovers(ctx, sb.ID()); len(left) != 0 {
		t.Errorf("left of the sandbox restored ahead: %v", left)
	}
}

// TestRestoreAheadFallsBack breaks a slot (its created sandbox deleted
// behind the shim's back): the Restore that takes it destroys it and
// restores the usual way, with the checkpoint's state.
func TestRestoreAheadFallsBack(t *testing.T) {
	d, state, dir, ctx := aheadFixture(t)
	if err := d.PrepareRestore(ctx, dir); err != nil {
		t.Fatal(err)
	}
	ids := aheadIDs(t, state)
	if len(ids) != 1 {
		t.Fatalf("shims %v, want the slot's", ids)
	}
	runsc, _ := exec.LookPath("runsc")
	if out, err := exec.CommandContext(ctx, runsc, "--root", filepath.Join(state, "state"), "delete", "--force", ids[0]).CombinedOutput(); err != nil {
		t.Fatalf("deleting the slot's sandbox: %v: %s", err, out)
	}
	sb, err := d.Restore(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.WithoutCancel(ctx))
	if err := d.AheadFailure(); err == nil {
		t.Error("AheadFailure: got nil, want why the slot did not start")
	} else if err := d.AheadFailure(); err != nil {
		t.Errorf("AheadFailure, asked again: got %v, want nil (it is returned once)", err)
	}
	if _, claimed, failed := d.Prepared(); claimed != 1 || failed != 1 {
		t.Errorf("%d claimed, %d failed; want 1, 1", claimed, failed)
	}
	if sb.ID() == ids[0] {
		t.Errorf("restored into the broken slot %s", ids[0])
	}
	checkState(t, ctx, sb)
	if left := d.Leftovers(ctx, ids[0]); len(left) != 0 {
		t.Errorf("left of the broken slot: %v", left)
	}
}

// TestRestoreAheadLeavesNothing ends slots both ways a daemon does: by
// DropPrepared at its shutdown, and, for a daemon that died, by the next
// one's Reattach. Neither leaves a bundle, shim, cgroup, runtime state or
// process of them.
func TestRestoreAheadLeavesNothing(t *testing.T) {
	d, state, dir, ctx := aheadFixture(t)
	if err := d.PrepareRestore(ctx, dir); err != nil {
		t.Fatal(err)
	}
	ids := aheadIDs(t, state)
	if len(ids) != 1 || len(d.Leftovers(ctx, ids[0])) == 0 {
		t.Fatalf("shims %v, want the slot's, seen on the host", ids)
	}
	// The daemon's own Reattach leaves its ready slot alone.
	if got, err := d.Reattach(ctx, nil); err != nil || len(got) != 0 {
		t.Errorf("Reattach beside a ready slot: got %d sandboxes, %v; want none", len(got), err)
	}
	if ready, _, _ := d.Prepared(); ready != 1 || len(d.Leftovers(ctx, ids[0])) == 0 {
		t.Fatalf("after the daemon's own Reattach: %d slots ready, want its slot kept", ready)
	}
	start := time.Now()
	if err := d.DropPrepared(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("DropPrepared took %v", time.Since(start))
	if left := d.Leftovers(ctx, ids[0]); len(left) != 0 {
		t.Errorf("left of a dropped slot: %v", left)
	}
	if left := leftEntries(t, state); left != "[]" {
		t.Errorf("left in the state directory after DropPrepared: %s", left)
	}

	if err := d.PrepareRestore(ctx, dir); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("PrepareRestore after DropPrepared: got %v, want ErrFailedPrecondition", err)
	}

	// A daemon that dies with a slot ready: the next one's Reattach ends it.
	dying, err := gvisor.New(gvisor.Config{StateDir: state, GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := dying.PrepareRestore(ctx, dir); err != nil {
		t.Fatal(err)
	}
	ids = aheadIDs(t, state)
	if len(ids) != 1 {
		t.Fatalf("shims %v, want the new slot's", ids)
	}
	next, err := gvisor.New(gvisor.Config{StateDir: state, GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	got, err := next.Reattach(ctx, nil)
	t.Logf("Reattach took %v", time.Since(start))
	if err != nil || len(got) != 0 {
		t.Errorf("Reattach of a slot: got %d sandboxes, %v; want none", len(got), err)
	}
	if left := d.Leftovers(ctx, ids[0]); len(left) != 0 {
		t.Errorf("left of a dead daemon's slot after Reattach: %v", left)
	}
}

// TestRestoreAheadIdleEnds checks that a slot nobody takes is ended once
// it has waited its idle time: a checkpoint idle that long costs no memory.
func TestRestoreAheadIdleEnds(t *testing.T) {
	d, state, dir, ctx := aheadFixture(t)
	ocidriver.SetAheadIdle(t, 2*time.Second)
	if err := d.PrepareRestore(ctx, dir); err != nil {
		t.Fatal(err)
	}
	ids := aheadIDs(t, state)
	if ready, _, _ := d.Prepared(); ready != 1 || len(ids) != 1 || len(d.Leftovers(ctx, ids[0])) == 0 {
		t.Fatalf("%d ready, shims %v; want the slot's, seen on the host", ready, ids)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready, _, _ := d.Prepared()
		if ready == 0 && len(d.Leftovers(ctx, ids[0])) == 0 && leftEntries(t, state) == "[]" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("an idle slot was not ended 30s after its idle time: %d ready, left %v, state %s", ready, d.Leftovers(ctx, ids[0]), leftEntries(t, state))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
