package conformance

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// snapshot checks a Snapshotter: a sandbox that runs a program or a cell
// is not saved (and its directory is not left); an idle one is saved into a
// root-only directory and is gone; it is not restored with a saved label
// changed; the sandbox restored from it has a new
// ID, the saved labels and the new ones, its kernel with the value it
// held, its /tmp, and serves programs.
func (s *suite) snapshot(t *testing.T) {
	if !s.caps.Snapshots {
		t.Logf("driver %s saves no sandboxes: %s", s.h.Driver.Name(), s.caps.Lacks["Snapshots"])
		return
	}
	snap := s.h.Driver.(sandbox.Snapshotter)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	b := s.start(t, sandbox.Limits{})
	value := randHex(8)
	k := b.startKernel(t)
	cell(t, k, "set kept "+value)
	b.sh(t, "echo saved > /tmp/saved")

	lines := make(chan string, 1)
	req := sh("echo started; sleep 100")
	req.OnOutput = linesOf(lines)
	busy, err := b.sb.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	await(t, lines)
	refused := filepath.Join(t.TempDir(), "busy")
	if err := snap.Checkpoint(ctx, b.sb, refused); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Checkpoint while a program runs: got %v, want ErrFailedPrecondition", err)
	}
	if _, err := os.Stat(refused); !os.IsNotExist(err) {
		t.Errorf("after a refused Checkpoint its directory: got %v, want none", err)
	}
	_ = busy.Cancel()
	if _, err := busy.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	// Nor while a cell runs.
	cellStarted := make(chan string, 1)
	cellDone := make(chan error, 1)
	go func() {
		_, err := k.Run(ctx, sandbox.Cell{Code: "print started\nsleep 2", OnOutput: linesOf(cellStarted)})
		cellDone <- err
	}()
	await(t, cellStarted)
	if err := snap.Checkpoint(ctx, b.sb, refused); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Checkpoint while a cell runs: got %v, want ErrFailedPrecondition", err)
	}
	if err := <-cellDone; err != nil {
		t.Errorf("the cell during the refused Checkpoint: %v", err)
	}

	dir := filepath.Join(t.TempDir(), "saved")
	start := time.Now()
	if err := snap.Checkpoint(ctx, b.sb, dir); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	saved := time.Since(start)
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the checkpoint's directory: got %v, %v; want mode 0700", fi.Mode(), err)
	}
	if left := s.leftovers(t.Context(), b.sb.ID()); len(left) > 0 {
		t.Errorf("after Checkpoint, the saved sandbox %s left: %s", b.sb.ID(), strings.Join(left, "; "))
	}
	if _, err := b.sb.Start(ctx, sh("true")); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Start on the saved sandbox: got %v, want ErrFailedPrecondition", err)
	}

	// The saved labels bind the checkpoint: restored as another's (a
	// label it was saved with, another value), it is refused.
	if sb, err := snap.Restore(ctx, dir, map[string]string{"stockade.test": "another"}); !errors.Is(err, sandbox.ErrForeignCheckpoint) || !errdefs.IsFailedPrecondition(err) {
		if sb != nil {
			_ = sb.Destroy(context.WithoutCancel(ctx))
		}
		t.Errorf("Restore with a label the checkpoint was saved with another value of: got %v, want ErrForeignCheckpoint, ErrFailedPrecondition", err)
	}
	tag := map[string]string{"restored": randHex(4)}
	start = time.Now()
	sb, err := snap.Restore(ctx, dir, tag)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	t.Logf("Checkpoint %v, Restore %v", saved.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	r := &box{s: s, sb: sb}
	t.Cleanup(func() { r.destroy(t) })
	if sb.ID() == b.sb.ID() {
		t.Errorf("the restored sandbox has the saved one's ID %s, want a new one", sb.ID())
	}
	kernels, err := sb.(sandbox.Kernels).ListKernels(ctx)
	if err != nil || len(kernels) != 1 {
		t.Fatalf("the restored sandbox's kernels: got %v, %v; want the saved one", kernels, err)
	}
	if got := cell(t, kernels[0], "get kept"); string(got.Stdout) != value+"\n" {
		t.Errorf("the restored kernel: got %q, want %q", got.Stdout, value)
	}
	if got := r.sh(t, "cat /tmp/saved; echo next"); got != "saved\nnext\n" {
		t.Errorf("the restored sandbox's /tmp and a program: got %q, want saved and next", got)
	}
	if rp, ok := s.h.Driver.(sandbox.Reaper); ok {
		// The labels: the saved sandbox's and Restore's.
		match := map[string]string{"stockade.test": "conformance", "restored": tag["restored"]}
		if reaped, err := rp.Reap(ctx, match); err != nil || !slices.Equal(reaped, []string{sb.ID()}) {
			t.Errorf("Reap by the saved and the new labels: got %v, %v; want %s", reaped, err, sb.ID())
		}
	}
}
