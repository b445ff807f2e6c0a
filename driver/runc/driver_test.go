package runc_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/conformance"
)

func newDriver(t *testing.T) *ocidriver.Driver {
	t.Helper()
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	d, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t)})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestConformance(t *testing.T) {
	d := newDriver(t)
	conformance.Run(t, conformance.Harness{Driver: d, Image: testenv.Image(t, "shell"), Leftovers: d.Leftovers})
}

// TestDestroyRetries keeps a sandbox's cgroup busy with a host process: the
// first Destroy must say what it could not remove, and once the cgroup is
// free the next Destroy must finish the job.
func TestDestroyRetries(t *testing.T) {
	d := newDriver(t)
	ctx := context.Background()
	sb, err := d.Create(ctx, sandbox.Spec{Image: testenv.Image(t, "shell")})
	if err != nil {
		t.Fatal(err)
	}
	var dir string
	for _, p := range d.Leftovers(sb.ID()) {
		if strings.HasPrefix(p, "/sys/fs/cgroup/") {
			dir = p
			break
		}
	}
	if dir == "" {
		t.Fatalf("no cgroup among %v", d.Leftovers(sb.ID()))
	}
	squatter := exec.Command("sleep", "60")
	if err := squatter.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		squatter.Process.Kill()
		squatter.Wait()
	}()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(squatter.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	if err := sb.Destroy(ctx); err == nil || !strings.Contains(err.Error(), "removing cgroup "+dir) {
		t.Fatalf("Destroy with a busy cgroup: got %v, want an error naming %s", err, dir)
	}
	squatter.Process.Kill()
	squatter.Wait()
	if err := sb.Destroy(ctx); err != nil {
		t.Fatalf("second Destroy: %v", err)
	}
	if left := d.Leftovers(sb.ID()); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Errorf("Destroy after success: %v", err)
	}
}
