package docker_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/docker"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/conformance"
)

// engine returns a driver on the dockerd that STOCKADE_TEST_DOCKER_HOST
// names (scripts/dockerd.sh start DIR prints it), or skips t (fails it in
// CI) when there is none.
func engine(t testing.TB) *docker.Driver {
	t.Helper()
	host := os.Getenv("STOCKADE_TEST_DOCKER_HOST")
	if host == "" {
		testenv.Missing(t, "STOCKADE_TEST_DOCKER_HOST is not set; start a dockerd with `scripts/dockerd.sh start DIR` and set it to what that prints")
	}
	d, err := docker.New(docker.Config{Host: host, GuestPath: testenv.Guest(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Health(t.Context()); err != nil {
		t.Fatalf("Health: %v", err)
	}
	return d
}

func TestConformance(t *testing.T) {
	d := engine(t)
	img := testenv.Image(t, "shell")
	conformance.Run(t, conformance.Harness{Driver: d, Image: img})
}

func TestReap(t *testing.T) {
	d := engine(t)
	img := testenv.Image(t, "shell")
	ctx := t.Context()
	run := "reap-" + time.Now().Format("150405.000000")
	var ids []string
	for _, group := range []string{"a", "a", "b"} {
		sb, err := d.Create(ctx, sandbox.Spec{Image: img, Labels: map[string]string{"run": run, "group": group}})
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		// Not destroyed: Reap stands in for a crashed daemon's cleanup.
		ids = append(ids, sb.ID())
	}
	reaped, err := d.Reap(ctx, map[string]string{"run": run, "group": "a"})
	if err != nil {
		t.Fatalf("Reap: %v", err)
	}
	want := slices.Sorted(slices.Values(ids[:2]))
	if !slices.Equal(reaped, want) {
		t.Errorf("Reap group a: got %v, want %v", reaped, want)
	}
	if left := d.Leftovers(t.Context(), ids[2]); len(left) == 0 {
		t.Errorf("Reap group a removed sandbox %s of group b", ids[2])
	}
	reaped, err = d.Reap(ctx, map[string]string{"run": run})
	if err != nil {
		t.Fatalf("Reap: %v", err)
	}
	if !slices.Equal(reaped, ids[2:]) {
		t.Errorf("Reap run: got %v, want %v", reaped, ids[2:])
	}
	for _, id := range ids {
		if left := d.Leftovers(t.Context(), id); len(left) > 0 {
			t.Errorf("after Reap, sandbox %s left: %v", id, left)
		}
	}
}

func TestImportImage(t *testing.T) {
	d := engine(t)
	img := testenv.Image(t, "shell")
	ctx := t.Context()
	tag, err := d.ImportImage(ctx, img)
	if err != nil {
		t.Fatalf("ImportImage: %v", err)
	}
	// A second driver (a restarted daemon) finds the image in the engine
	// and imports nothing.
	d2, err := docker.New(docker.Config{Host: d.Host(), GuestPath: testenv.Guest(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	start := time.Now()
	tag2, err := d2.ImportImage(ctx, img)
	if err != nil {
		t.Fatalf("ImportImage again: %v", err)
	}
	if tag2 != tag {
		t.Errorf("got tag %s the second time, want %s", tag2, tag)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("ImportImage of an image the engine has took %v; want no import", el)
	}
}

func TestSessionAndPython(t *testing.T) {
	d := engine(t)
	img := testenv.Image(t, "python")
	ctx := t.Context()
	sb, err := d.Create(ctx, sandbox.Spec{Image: img})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	defer func() {
		if err := sb.Destroy(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("Destroy: %v", err)
		}
		if err := sb.Destroy(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("Destroy again: %v", err)
		}
		if left := d.Leftovers(t.Context(), sb.ID()); len(left) > 0 {
			t.Errorf("left after Destroy: %v", left)
		}
	}()
	for i, code := range []string{"print(6*7)", "import sys; print('err', file=sys.stderr); sys.exit(4)"} {
		res, err := sandbox.Run(ctx, sb, sandbox.ExecRequest{
			File: sandbox.File{Name: "main.py", Data: []byte(code)},
			Argv: []string{"/usr/bin/python3", "{file}"},
		})
		if err != nil {
			t.Fatalf("Exec %d: %v", i, err)
		}
		switch i {
		case 0:
			if res.Status != sandbox.StatusSucceeded || string(res.Stdout) != "42\n" {
				t.Errorf("print(6*7): got %s %q (stderr %q), want succeeded \"42\\n\"", res.Status, res.Stdout, res.Stderr)
			}
		case 1:
			if res.Status != sandbox.StatusFailed || res.ExitCode != 4 || string(res.Stderr) != "err\n" {
				t.Errorf("exit 4: got %s %d stderr %q, want failed 4 \"err\\n\"", res.Status, res.ExitCode, res.Stderr)
			}
		}
	}
}

// TestHealthGuest checks that an engine that answers is not enough: a
// guest agent that is not one (one byte) makes the driver unhealthy.
func TestHealthGuest(t *testing.T) {
	host := engine(t).Host()
	bad := filepath.Join(t.TempDir(), "guest")
	if err := os.WriteFile(bad, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := docker.New(docker.Config{Host: host, GuestPath: bad})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Health(t.Context()); !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "is not an ELF executable") {
		t.Errorf("Health: got %v, want ErrUnavailable for the guest", err)
	}
}

func TestUnreachableEngine(t *testing.T) {
	guest := testenv.Guest(t)
	d, err := docker.New(docker.Config{Host: "unix://" + t.TempDir() + "/no-docker.sock", GuestPath: guest})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Health(t.Context()); !errdefs.IsUnavailable(err) {
		t.Errorf("Health: got %v, want ErrUnavailable", err)
	}
	img := sandbox.Image{Name: "shell", Digest: "sha256:" + strings.Repeat("0", 64), Rootfs: t.TempDir()}
	if _, err := d.Create(t.Context(), sandbox.Spec{Image: img}); !errdefs.IsUnavailable(err) {
		t.Errorf("Create: got %v, want ErrUnavailable", err)
	}
	if _, err := d.Reap(t.Context(), nil); !errdefs.IsUnavailable(err) {
		t.Errorf("Reap: got %v, want ErrUnavailable", err)
	}
}

// TestDataMount mounts a directory with a writable tmpfs mounted inside
// it: the sandbox reads the directory, and can write neither to it nor
// below it (a recursive bind would carry the tmpfs along, writable).
func TestDataMount(t *testing.T) {
	testenv.RequiresRoot(t) // to mount the tmpfs
	d := engine(t)
	img := testenv.Image(t, "shell")
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/data.txt", []byte("tool data\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir+"/sub", 0o777); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir+"/sub", "tmpfs", 0, "size=1m,mode=1777"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(dir+"/sub", syscall.MNT_DETACH) })
	ctx := t.Context()
	sb, err := d.Create(ctx, sandbox.Spec{Image: img, Mounts: []sandbox.Mount{{Source: dir, Target: "/data"}}})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	defer sb.Destroy(context.WithoutCancel(ctx))
	res, err := sandbox.Run(ctx, sb, sandbox.ExecRequest{
		File: sandbox.File{Name: "main.sh", Data: []byte("/bin/busybox cat /data/data.txt; /bin/busybox touch /data/new 2>/dev/null && echo writable || echo read-only; " +
			"/bin/busybox touch /data/sub/new 2>/dev/null && echo sub writable || echo sub read-only")},
		Argv: []string{"/bin/busybox", "sh", "{file}"},
	})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	if got, want := string(res.Stdout), "tool data\nread-only\nsub read-only\n"; got != want {
		t.Errorf("got %q (stderr %q), want %q", got, res.Stderr, want)
	}
	for _, f := range []string{dir + "/new", dir + "/sub/new"} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("the sandbox created %s on the host", f)
		}
	}
}

// TestTimedOutRunIsMeasured checks that a run the wall clock cuts short
// reports the CPU time and memory it used, from the container's cgroup
// (the engine runs on this host), which its guest, killed with it, never
// reports.
func TestTimedOutRunIsMeasured(t *testing.T) {
	d := engine(t)
	sb, err := d.Create(t.Context(), sandbox.Spec{Image: testenv.Image(t, "shell")})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(t.Context())
	res, err := sandbox.Run(t.Context(), sb, sandbox.ExecRequest{File: sandbox.File{Name: "main.sh", Data: []byte("while :; do :; done")},
		Argv: []string{"/bin/busybox", "sh", "{file}"}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// The busy loop may use the sandbox's whole share, 0.5 CPU, for 2 s;
	// on a host loaded by other tests it gets less, but not under 50 ms
	// (a share of 2.5%), while an unmeasured run reports none.
	if res.Status != sandbox.StatusTimedOut || res.CPUTime < 50*time.Millisecond || res.PeakMemory <= 0 {
		t.Errorf("got %s with CPU %s and peak %d, want timed_out with at least 50 ms and some memory", res.Status, res.CPUTime, res.PeakMemory)
	}
}
