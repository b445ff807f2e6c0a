package ocidriver_test

import (
	"context"
	"encoding/json"
	"errors"
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
	"github.com/stockade-sh/stockade/sandbox/profile"
)

func TestNewSnapshotsNeedsItsConstructor(t *testing.T) {
	cfg := ocidriver.Config{Name: "x", Binary: "runsc", StateDir: t.TempDir(), GuestPath: "/guest"}
	if _, err := ocidriver.NewSnapshotting(cfg); !errdefs.IsInvalidArgument(err) {
		t.Errorf("NewSnapshotting without Config.Snapshots: got %v, want ErrInvalidArgument", err)
	}
	cfg.Snapshots = true
	if _, err := ocidriver.New(cfg); !errdefs.IsInvalidArgument(err) {
		t.Errorf("New with Config.Snapshots: got %v, want ErrInvalidArgument", err)
	}
	if d, err := ocidriver.NewSnapshotting(cfg); err != nil || !d.Capabilities().Snapshots {
		t.Errorf("NewSnapshotting: got %v, %v; want a driver declaring Snapshots", d, err)
	}
	cfg.UserNamespace = true
	if _, err := ocidriver.NewSnapshotting(cfg); !errdefs.IsInvalidArgument(err) {
		t.Errorf("NewSnapshotting with user namespaces: got %v, want ErrInvalidArgument", err)
	}
}

// TestSnapshotRefusalsAndReattach checks what Checkpoint and Restore
// refuse, and that a restored sandbox is detached like any other: a new
// driver value re-attaches it with its kernel, and it is saved and
// restored again.
func TestSnapshotRefusalsAndReattach(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runsc")
	state := t.TempDir()
	build := func() *ocidriver.Snapshotting {
		d, err := gvisor.New(gvisor.Config{StateDir: state, GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := build()
	t.Cleanup(func() { _, _ = d.Reap(context.Background(), nil) })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	img := testenv.Image(t, "shell")
	sb, err := d.Create(ctx, sandbox.Spec{Image: img, Labels: map[string]string{"owner": "snapshot-test"}})
	if err != nil {
		t.Fatal(err)
	}
	other, err := build().Create(ctx, sandbox.Spec{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Destroy(context.WithoutCancel(ctx))

	base := t.TempDir()
	exists := filepath.Join(base, "exists")
	if err := os.Mkdir(exists, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		sb   sandbox.Sandbox
		dir  string
		want func(error) bool
	}{
		{"a relative directory", sb, "relative", errdefs.IsInvalidArgument},
		{"a directory that exists", sb, exists, errdefs.IsConflict},
		{"another driver value's sandbox", other, filepath.Join(base, "other"), errdefs.IsInvalidArgument},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := d.Checkpoint(ctx, tt.sb, tt.dir); !tt.want(err) {
				t.Errorf("got %v, want refused", err)
			}
		})
	}
	if _, err := d.Restore(ctx, exists, nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Restore from a directory without a checkpoint: got %v, want ErrInvalidArgument", err)
	}

	k, err := sb.(sandbox.Kernels).StartKernel(ctx, sandbox.KernelSpec{Argv: []string{profile.GuestPath, "stockade-kernel-test"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Run(ctx, sandbox.Cell{Code: "set kept 1"}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "saved")
	if err := d.Checkpoint(ctx, sb, dir); err != nil {
		t.Fatal(err)
	}
	restored, err := d.Restore(ctx, dir, map[string]string{"restored": "yes"})
	if err != nil {
		t.Fatal(err)
	}
	d2 := build()
	got, err := d2.Reattach(ctx, map[string]string{"owner": "snapshot-test", "restored": "yes"})
	if err != nil || len(got) != 1 || got[0].ID() != restored.ID() {
		t.Fatalf("Reattach of the restored sandbox: got %v, %v; want %s", got, err, restored.ID())
	}
	defer got[0].Destroy(context.WithoutCancel(ctx))
	kernels, err := got[0].(sandbox.Kernels).ListKernels(ctx)
	if err != nil || len(kernels) != 1 {
		t.Fatalf("the re-attached restored sandbox's kernels: got %v, %v", kernels, err)
	}
	if res, err := kernels[0].Run(ctx, sandbox.Cell{Code: "get kept"}); err != nil || string(res.Stdout) != "1\n" {
		t.Errorf("the kernel: got %+v, %v; want 1", res, err)
	}
	if _, err := kernels[0].Run(ctx, sandbox.Cell{Code: "set kept 2"}); err != nil {
		t.Fatal(err)
	}

	// A restored sandbox, detached and re-attached, is saved and restored
	// again, its kernel's latest value with it.
	again := filepath.Join(base, "again")
	if err := d2.Checkpoint(ctx, got[0], again); err != nil {
		t.Fatalf("Checkpoint of the restored sandbox: %v", err)
	}
	third, err := d2.Restore(ctx, again, nil)
	if err != nil {
		t.Fatalf("Restore of the restored sandbox: %v", err)
	}
	defer third.Destroy(context.WithoutCancel(ctx))
	kernels, err = third.(sandbox.Kernels).ListKernels(ctx)
	if err != nil || len(kernels) != 1 {
		t.Fatalf("the twice restored sandbox's kernels: got %v, %v", kernels, err)
	}
	if res, err := kernels[0].Run(ctx, sandbox.Cell{Code: "get kept"}); err != nil || string(res.Stdout) != "2\n" {
		t.Errorf("the twice restored kernel: got %+v, %v; want 2", res, err)
	}
}

// TestCheckpointKeptWhenCleanupFails keeps the saved sandbox's cgroup busy
// with a host process: Checkpoint saves it and then fails to remove the
// cgroup, and says so; the checkpoint stays and restores, and a later
// Destroy finishes the clean-up.
func TestCheckpointKeptWhenCleanupFails(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runsc")
	d, err := gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = d.Reap(context.Background(), nil) })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb, err := d.Create(ctx, sandbox.Spec{Image: testenv.Image(t, "shell")})
	if err != nil {
		t.Fatal(err)
	}
	_, release := testenv.OccupyCgroup(t, d.Leftovers(t.Context(), sb.ID()))

	dir := filepath.Join(t.TempDir(), "saved")
	if err := d.Checkpoint(ctx, sb, dir); err == nil || !strings.Contains(err.Error(), "removing cgroup") {
		t.Fatalf("Checkpoint with a busy cgroup: got %v, want the clean-up's error", err)
	}
	restored, err := d.Restore(ctx, dir, nil)
	if err != nil {
		t.Fatalf("Restore from the checkpoint kept after the failed clean-up: %v", err)
	}
	if err := restored.Destroy(ctx); err != nil {
		t.Error(err)
	}
	release()
	if err := sb.Destroy(ctx); err != nil {
		t.Errorf("Destroy after the cgroup is free: %v", err)
	}
	if left := d.Leftovers(t.Context(), sb.ID()); len(left) > 0 {
		t.Errorf("after Destroy, %s left: %s", sb.ID(), strings.Join(left, "; "))
	}
}

// TestRestoreUnbound checks that a sandbox saved unbound (a warm pool's
// image) is restored unbound: Bind binds it once, its limits tightening.
func TestRestoreUnbound(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runsc")
	d, err := gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = d.Reap(context.Background(), nil) })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb, err := d.CreateUnbound(ctx, sandbox.Spec{Image: testenv.Image(t, "shell"), Labels: map[string]string{"pool": "warm"}})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "warm")
	if err := d.Checkpoint(ctx, sb, dir); err != nil {
		t.Fatal(err)
	}
	restored, err := d.Restore(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer restored.Destroy(context.WithoutCancel(ctx))
	if err := d.Bind(ctx, restored, sandbox.Binding{Labels: map[string]string{"execution": "e"}, Limits: sandbox.Limits{OutputCap: 10}}); err != nil {
		t.Fatalf("binding the sandbox restored unbound: %v", err)
	}
	if err := d.Bind(ctx, restored, sandbox.Binding{}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("binding it twice: got %v, want ErrFailedPrecondition", err)
	}
	res, err := sandbox.Run(ctx, restored, shScript("echo 0123456789abcdef"))
	if err != nil || len(res.Stdout) != 10 || !res.StdoutTruncated {
		t.Errorf("the bound output cap of 10: got %+v, %v", res, err)
	}
}

// TestRestoreRefusesAnUntrustedCheckpoint copies a real checkpoint and
// changes one thing in each copy: Restore refuses each, and starts
// nothing (no bundle, no shim, no hook of a spec planted in the copy).
// The untouched checkpoint then restores.
func TestRestoreRefusesAnUntrustedCheckpoint(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runsc")
	state := t.TempDir()
	d, err := gvisor.New(gvisor.Config{StateDir: state, GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = d.Reap(context.Background(), nil) })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb, err := d.Create(ctx, sandbox.Spec{Image: testenv.Image(t, "shell")})
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	saved := filepath.Join(base, "saved")
	if err := d.Checkpoint(ctx, sb, saved); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(base, "hook-ran")
	copyOf := func(t *testing.T, name string) string {
		dst := filepath.Join(base, name)
		if out, err := exec.Command("cp", "-a", saved, dst).CombinedOutput(); err != nil {
			t.Fatalf("copying the checkpoint: %v: %s", err, out)
		}
		return dst
	}
	editRecord := func(t *testing.T, dir string, edit func(map[string]any)) {
		p := filepath.Join(dir, "sandbox.json")
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var rec map[string]any
		if err := json.Unmarshal(b, &rec); err != nil {
			t.Fatal(err)
		}
		edit(rec)
		if b, err = json.Marshal(rec); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A spec whose prestart hook, run on the host, leaves the marker; and
	// with a mount of the host's /etc.
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process":    map[string]any{"args": []string{profile.GuestPath}, "cwd": "/"},
		"root":       map[string]any{"path": testenv.Image(t, "shell").Rootfs, "readonly": true},
		"mounts":     []map[string]any{{"destination": "/hostetc", "type": "bind", "source": "/etc", "options": []string{"rbind", "rw"}}},
		"hooks":      map[string]any{"prestart": []map[string]any{{"path": "/bin/sh", "args": []string{"sh", "-c", "touch " + marker}}}},
		"linux":      map[string]any{"namespaces": []map[string]any{{"type": "mount"}}},
	}
	for _, tt := range []struct {
		name   string
		tamper func(t *testing.T) string
	}{
		{"a record with raised limits", func(t *testing.T) string {
			dir := copyOf(t, "limits")
			editRecord(t, dir, func(rec map[string]any) {
				rec["limits"].(map[string]any)["memory"] = float64(8 << 30)
			})
			return dir
		}},
		{"a record naming another root", func(t *testing.T) string {
			dir := copyOf(t, "root")
			editRecord(t, dir, func(rec map[string]any) { rec["image"] = map[string]any{"Rootfs": "/"} })
			return dir
		}},
		{"a changed image", func(t *testing.T) string {
			dir := copyOf(t, "image")
			entries, err := os.ReadDir(filepath.Join(dir, "image"))
			if err != nil || len(entries) == 0 {
				t.Fatalf("the image: got %v, %v", entries, err)
			}
			f, err := os.OpenFile(filepath.Join(dir, "image", entries[0].Name()), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.Write([]byte{0}); err != nil {
				t.Fatal(err)
			}
			return dir
		}},
		{"a planted config.json with a hook and a mount", func(t *testing.T) string {
			dir := copyOf(t, "config")
			b, _ := json.Marshal(spec)
			if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
				t.Fatal(err)
			}
			return dir
		}},
		{"a directory of mode 0755", func(t *testing.T) string {
			dir := copyOf(t, "open")
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			return dir
		}},
		{"a directory owned by nobody", func(t *testing.T) string {
			dir := copyOf(t, "foreign")
			if err := os.Chown(dir, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			return dir
		}},
		{"a record owned by nobody", func(t *testing.T) string {
			dir := copyOf(t, "foreign-record")
			if err := os.Chown(filepath.Join(dir, "sandbox.json"), 65534, 65534); err != nil {
				t.Fatal(err)
			}
			return dir
		}},
		{"a symbolic link to a checkpoint", func(t *testing.T) string {
			dir := filepath.Join(base, "link")
			if err := os.Symlink(copyOf(t, "target"), dir); err != nil {
				t.Fatal(err)
			}
			return dir
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.tamper(t)
			before := leftEntries(t, state)
			restored, err := d.Restore(ctx, dir, nil)
			if err == nil {
				restored.Destroy(context.WithoutCancel(ctx))
				t.Fatalf("Restore: got a sandbox, want refused")
			}
			if after := leftEntries(t, state); after != before {
				t.Errorf("after the refusal, the state holds %s, want %s as before", after, before)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Errorf("the planted spec's hook ran on the host")
			}
		})
	}
	restored, err := d.Restore(ctx, saved, nil)
	if err != nil {
		t.Fatalf("Restore of the untouched checkpoint: %v", err)
	}
	if err := restored.Destroy(ctx); err != nil {
		t.Error(err)
	}
}

// leftEntries names the bundles and shim directories under state.
func leftEntries(t *testing.T, state string) string {
	t.Helper()
	var names []string
	for _, sub := range []string{"bundles", "shims"} {
		entries, _ := os.ReadDir(filepath.Join(state, sub))
		for _, e := range entries {
			if e.IsDir() {
				names = append(names, sub+"/"+e.Name())
			}
		}
	}
	return "[" + strings.Join(names, " ") + "]"
}

// TestRestoreKeepsWorkspace saves a session's sandbox, detached with a
// /workspace of its own, and restores it: the restored sandbox mounts
// the same /workspace (the runtime refuses a restore whose mounts
// differ), with the file written before, and its kernel keeps its value.
func TestRestoreKeepsWorkspace(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runsc")
	d, err := gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = d.Reap(context.Background(), nil) })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb, err := d.Create(ctx, sandbox.Spec{Image: testenv.Image(t, "shell"), Detached: true, Workspace: 16 << 20, Limits: sandbox.DefaultLimits()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.(sandbox.Files).WriteFile(ctx, "/workspace/kept.txt", 0, strings.NewReader("kept"), 16); err != nil {
		t.Fatal(err)
	}
	k, err := sb.(sandbox.Kernels).StartKernel(ctx, sandbox.KernelSpec{Argv: []string{profile.GuestPath, "stockade-kernel-test"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Run(ctx, sandbox.Cell{Code: "set kept 1"}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "saved")
	if err := d.Checkpoint(ctx, sb, dir); err != nil {
		t.Fatal(err)
	}
	restored, err := d.Restore(ctx, dir, nil)
	if err != nil {
		t.Fatalf("Restore of a sandbox with a /workspace: %v", err)
	}
	defer restored.Destroy(context.WithoutCancel(ctx))
	b, _, err := restored.(sandbox.Files).ReadFile(ctx, "/workspace/kept.txt", 16)
	if err != nil || string(b) != "kept" {
		t.Errorf("the restored /workspace: got %q, %v; want kept", b, err)
	}
	kernels, err := restored.(sandbox.Kernels).ListKernels(ctx)
	if err != nil || len(kernels) != 1 {
		t.Fatalf("the restored kernels: got %v, %v", kernels, err)
	}
	if res, err := kernels[0].Run(ctx, sandbox.Cell{Code: "get kept"}); err != nil || string(res.Stdout) != "1\n" {
		t.Errorf("the restored kernel: got %+v, %v; want 1", res, err)
	}
}

// TestSnapshotLeavesRunning saves a detached sandbox with Snapshot: it
// serves on with its kernel, and what was saved restores twice, as two
// new sandboxes of their own, with the unbound label given anew, while a
// bound label of another value is refused.
func TestSnapshotLeavesRunning(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runsc")
	state := t.TempDir()
	d, err := gvisor.New(gvisor.Config{StateDir: state, GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = d.Reap(context.Background(), nil) })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb, err := d.Create(ctx, sandbox.Spec{Image: testenv.Image(t, "shell"), Detached: true,
		Labels: map[string]string{"workspace": "w1", "session": "s1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.WithoutCancel(ctx))
	k, err := sb.(sandbox.Kernels).StartKernel(ctx, sandbox.KernelSpec{Argv: []string{profile.GuestPath, "stockade-kernel-test"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Run(ctx, sandbox.Cell{Code: "set kept 1"}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	thawed := false
	stall, err := d.Snapshot(ctx, sb, dir, sandbox.SnapshotOptions{Unbind: []string{"session"}, Thawed: func() { thawed = true }})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the source stalled %v", stall)
	if stall <= 0 || !thawed {
		t.Errorf("stall: got %v, thawed %v; want > 0, true", stall, thawed)
	}
	if _, err := k.Run(ctx, sandbox.Cell{Code: "set kept 2"}); err != nil {
		t.Fatalf("the source's kernel after Snapshot: %v", err)
	}
	if res, err := k.Run(ctx, sandbox.Cell{Code: "get kept"}); err != nil || string(res.Stdout) != "2\n" {
		t.Errorf("the source's kernel: got %+v, %v; want 2", res, err)
	}
	if _, err := d.Restore(ctx, dir, map[string]string{"workspace": "w2"}); !errors.Is(err, sandbox.ErrForeignCheckpoint) {
		t.Errorf("Restore for another workspace: got %v, want ErrForeignCheckpoint", err)
	}
	ids := map[string]bool{sb.ID(): true}
	for _, ses := range []string{"s2", "s3"} {
		r, err := d.Restore(ctx, dir, map[string]string{"workspace": "w1", "session": ses})
		if err != nil {
			t.Fatalf("Restore as session %s: %v", ses, err)
		}
		defer r.Destroy(context.WithoutCancel(ctx))
		if ids[r.ID()] {
			t.Errorf("restored sandbox id %s is not new", r.ID())
		}
		ids[r.ID()] = true
		ks, err := r.(sandbox.Kernels).ListKernels(ctx)
		if err != nil || len(ks) != 1 {
			t.Fatalf("the restored kernels: got %v, %v", ks, err)
		}
		if res, err := ks[0].Run(ctx, sandbox.Cell{Code: "get kept"}); err != nil || string(res.Stdout) != "1\n" {
			t.Errorf("restored as %s: got %+v, %v; want 1", ses, res, err)
		}
		if _, err := ks[0].Run(ctx, sandbox.Cell{Code: "set kept " + ses}); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := k.Run(ctx, sandbox.Cell{Code: "get kept"}); err != nil || string(res.Stdout) != "2\n" {
		t.Errorf("the source's kernel after the restores: got %+v, %v; want 2", res, err)
	}
}

// TestRestoreRefusesAnotherBuildsCheckpoint checkpoints a sandbox with
// the runtime behind a wrapper script, changes the script (another
// build: another digest), and restores: refused, ErrFailedPrecondition
// naming both builds, with nothing started. The script made as it was
// restores the checkpoint.
func TestRestoreRefusesAnotherBuildsCheckpoint(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runsc")
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(t.TempDir(), "runsc")
	script := "#!/bin/sh\nexec " + runsc + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	d, err := gvisor.New(gvisor.Config{Binary: wrapper, StateDir: state, GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = d.Reap(context.Background(), nil) })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	made, err := d.RuntimeBuild(ctx)
	if err != nil || !strings.Contains(made, "sha256:") {
		t.Fatalf("RuntimeBuild: got %q, %v, want a build with its digest", made, err)
	}
	sb, err := d.Create(ctx, sandbox.Spec{Image: testenv.Image(t, "shell")})
	if err != nil {
		t.Fatal(err)
	}
	saved := filepath.Join(t.TempDir(), "saved")
	if err := d.Checkpoint(ctx, sb, saved); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(saved, "sandbox.json"))
	if err != nil || !strings.Contains(string(b), made) {
		t.Fatalf("the record: got %s, %v, want it to name build %q", b, err, made)
	}

	if err := os.WriteFile(wrapper, []byte(script+"# another build\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	now, err := d.RuntimeBuild(ctx)
	if err != nil || now == made {
		t.Fatalf("RuntimeBuild after the runtime changed: got %q, %v, want other than %q", now, err, made)
	}
	before := leftEntries(t, state)
	restored, err := d.Restore(ctx, saved, nil)
	if err == nil {
		restored.Destroy(context.WithoutCancel(ctx))
		t.Fatal("Restore by another build: got a sandbox, want refused")
	}
	msg, public := errdefs.PublicMessage(err)
	if !errdefs.IsFailedPrecondition(err) || !public || !strings.Contains(msg, made) || !strings.Contains(msg, now) || strings.Contains(msg, saved) {
		t.Errorf("Restore by another build: got %v (public %q), want ErrFailedPrecondition whose public message names %q and %q and no path", err, msg, made, now)
	}
	if after := leftEntries(t, state); after != before {
		t.Errorf("after the refusal, the state holds %s, want %s as before", after, before)
	}

	if err := os.WriteFile(wrapper, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	restored, err = d.Restore(ctx, saved, nil)
	if err != nil {
		t.Fatalf("Restore by the build that made it: %v", err)
	}
	if err := restored.Destroy(ctx); err != nil {
		t.Error(err)
	}
}
