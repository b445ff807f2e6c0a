package runc_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/conformance"
)

func newDriver(t *testing.T) *ocidriver.Driver {
	t.Helper()
	return newDriverIn(t, t.TempDir())
}

// newDriverIn returns a driver over the state directory dir, with a shim
// for detached sandboxes.
func newDriverIn(t *testing.T, dir string) *ocidriver.Driver {
	t.Helper()
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	d, err := runc.New(runc.Config{StateDir: dir, GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestConformance(t *testing.T) {
	dir := t.TempDir()
	conformance.Run(t, conformance.Harness{
		Driver:  newDriverIn(t, dir),
		Image:   testenv.Image(t, "shell"),
		Restart: func() sandbox.Driver { return newDriverIn(t, dir) },
	})
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
	dir, release := testenv.OccupyCgroup(t, d.Leftovers(t.Context(), sb.ID()))
	if err := sb.Destroy(ctx); err == nil || !strings.Contains(err.Error(), "removing cgroup "+dir) {
		t.Fatalf("Destroy with a busy cgroup: got %v, want an error naming %s", err, dir)
	}
	release()
	if err := sb.Destroy(ctx); err != nil {
		t.Fatalf("second Destroy: %v", err)
	}
	if left := d.Leftovers(t.Context(), sb.ID()); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Errorf("Destroy after success: %v", err)
	}
}

// TestUserNamespace checks that each sandbox has a user namespace mapping
// its user (and root) to host ids of its own: neither the host's root nor
// its nobody, and not another sandbox's.
func TestUserNamespace(t *testing.T) {
	d := newDriver(t)
	ctx := context.Background()
	hostIDs := map[string]bool{}
	for range 2 {
		sb, err := d.Create(ctx, sandbox.Spec{Image: testenv.Image(t, "shell")})
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Destroy(ctx)
		res, err := sandbox.Run(ctx, sb, sandbox.ExecRequest{File: sandbox.File{Name: "main.sh", Data: []byte("id -u; cat /proc/self/uid_map /proc/self/gid_map")},
			Argv: []string{"/bin/busybox", "sh", "{file}"}, Env: []string{"PATH=/bin"}, Timeout: 10 * time.Second})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec: %v %+v", err, res)
		}
		lines := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
		if len(lines) != 5 || lines[0] != "65534" {
			t.Fatalf("got %q, want uid 65534 and two mappings each for uids and gids", res.Stdout)
		}
		for i, l := range lines[1:] {
			f := strings.Fields(l) // inside, host, count
			if len(f) != 3 || f[2] != "1" || (f[0] != "0" && f[0] != "65534") {
				t.Fatalf("mapping %q: want 0 or 65534 mapped alone", l)
			}
			host, _ := strconv.Atoi(f[1])
			if host == 0 || host == 65534 {
				t.Errorf("mapping %q: the sandbox shares the host's id %d", l, host)
			}
			if i < 2 { // uid_map
				if hostIDs[f[1]] {
					t.Errorf("host uid %s is used by two sandboxes", f[1])
				}
				hostIDs[f[1]] = true
			}
		}
	}
}
