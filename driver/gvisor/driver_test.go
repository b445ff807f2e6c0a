package gvisor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/conformance"
)

func newDriver(t *testing.T) *ocidriver.Snapshotting {
	d, _ := newDriverIn(t)
	return d
}

// newDriverIn returns the driver and its state directory.
func newDriverIn(t *testing.T) (*ocidriver.Snapshotting, string) {
	t.Helper()
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runsc")
	dir := t.TempDir()
	return driverOver(t, dir), dir
}

// driverOver returns a driver over the state directory dir, with a shim
// for detached sandboxes.
func driverOver(t *testing.T, dir string) *ocidriver.Snapshotting {
	t.Helper()
	d, err := gvisor.New(gvisor.Config{StateDir: dir, GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestConformance(t *testing.T) {
	d, dir := newDriverIn(t)
	conformance.Run(t, conformance.Harness{
		Driver: d, Image: testenv.Image(t, "shell"),
		Restart: func() sandbox.Driver { return driverOver(t, dir) },
		Kernel: func(ctx context.Context, id string) (conformance.SandboxKernel, error) {
			return sentry(ctx, filepath.Join(dir, "state"), id)
		},
	})
}

// sentry reads the Sentry of sandbox id through runsc, with the driver's
// runsc root: its host pid (`runsc state`) and its tasks (`runsc ps`).
func sentry(ctx context.Context, root, id string) (conformance.SandboxKernel, error) {
	var k conformance.SandboxKernel
	out, err := exec.CommandContext(ctx, "runsc", "--root", root, "state", id).Output()
	if err != nil {
		return k, fmt.Errorf("runsc state %s: %w", id, err)
	}
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
		return k, fmt.Errorf("runsc state %s: got %q, want a running sandbox's pid (%v)", id, out, err)
	}
	out, err = exec.CommandContext(ctx, "runsc", "--root", root, "ps", "--format=json", id).Output()
	if err != nil {
		return k, fmt.Errorf("runsc ps %s: %w", id, err)
	}
	if err := json.Unmarshal(out, &k.Tasks); err != nil {
		return k, fmt.Errorf("runsc ps %s: decoding %q: %w", id, out, err)
	}
	k.HostPID = st.Pid
	return k, nil
}

// TestDestroyAfterRuntimeKilled kills `runsc run` with SIGKILL, as Destroy's
// last resort does: runsc's state files stay behind (its sandbox and gofer
// die with it), and Destroy must have runsc remove them. Killed while it
// wrote its .state file (runsc writes it in place), runsc leaves one that
// no longer reads, on which `runsc delete` fails: the "mid-write" case
// truncates the file after the kill, as such a kill leaves it, and Destroy
// must still leave nothing behind.
func TestDestroyAfterRuntimeKilled(t *testing.T) {
	for _, midWrite := range []bool{false, true} {
		t.Run(map[bool]string{false: "idle", true: "mid-write"}[midWrite], func(t *testing.T) {
			destroyAfterRuntimeKilled(t, midWrite)
		})
	}
}

func destroyAfterRuntimeKilled(t *testing.T, midWrite bool) {
	d := newDriver(t)
	ctx := context.Background()
	sb, err := d.Create(ctx, sandbox.Spec{Image: testenv.Image(t, "shell")})
	if err != nil {
		t.Fatal(err)
	}
	var run int
	for _, p := range sandboxkit.ProcessesMentioning(sb.ID()) {
		var pid int
		var cmd string
		if _, err := fmt.Sscanf(p, "process %d: %s", &pid, &cmd); err == nil && filepath.Base(cmd) == "runsc" && strings.Contains(p, " run --bundle ") {
			run = pid
		}
	}
	if run == 0 {
		t.Fatalf("no `runsc run` of %s among %v", sb.ID(), sandboxkit.ProcessesMentioning(sb.ID()))
	}
	if err := syscall.Kill(run, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if midWrite {
		states := 0
		for _, f := range d.Leftovers(t.Context(), sb.ID()) {
			if strings.HasSuffix(f, ".state") {
				if err := os.Truncate(f, 0); err != nil {
					t.Fatal(err)
				}
				states++
			}
		}
		if states == 0 {
			t.Fatalf("no runsc .state file among %v", d.Leftovers(t.Context(), sb.ID()))
		}
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	// runsc's sandbox and gofer die with `runsc run` (their parent-death
	// signal), shortly after it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		left := d.Leftovers(t.Context(), sb.ID())
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left behind: %v", left)
		}
	}
}
