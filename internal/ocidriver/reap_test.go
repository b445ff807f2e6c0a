package ocidriver_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// TestReapCrashedCreates checks that Reap destroys the bundles a create
// left when its process died before it wrote the bundle's config (one with
// no config, one whose config was cut short), whatever labels Reap matches,
// and leaves alone a sandbox of other labels and one whose create is under
// way at that moment.
func TestReapCrashedCreates(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	state := t.TempDir()
	d, err := runc.New(runc.Config{StateDir: state, GuestPath: testenv.Guest(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	t.Cleanup(func() { _, _ = d.Reap(context.Background(), nil) })
	img := testenv.Image(t, "shell")
	mine := map[string]string{"owner": "me"}

	other, err := d.Create(ctx, sandbox.Spec{Image: img, Labels: map[string]string{"owner": "someone else"}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Destroy(context.Background())
	bundles := filepath.Join(state, "bundles")
	empty, torn := sandbox.NewID(), sandbox.NewID()
	for _, id := range []string{empty, torn} {
		if err := os.Mkdir(filepath.Join(bundles, id), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(bundles, torn, "config.json"), []byte(`{"ociVersion": "1.`), 0o600); err != nil {
		t.Fatal(err)
	}

	// A create under way has made its bundle's directory and written
	// nothing into it yet when Reap runs.
	var during []string
	ocidriver.OnBundleMade(t, func(id string) {
		reaped, err := d.Reap(ctx, mine)
		if err != nil {
			t.Errorf("Reap during a create: %v", err)
		}
		during = reaped
	})
	sb, err := d.Create(ctx, sandbox.Spec{Image: img, Labels: map[string]string{"owner": "someone else"}})
	if err != nil {
		t.Fatalf("the create Reap ran during: %v", err)
	}
	defer sb.Destroy(context.Background())
	slices.Sort(during)
	want := []string{empty, torn}
	slices.Sort(want)
	if !slices.Equal(during, want) {
		t.Errorf("Reap during a create: got %v, want the crashed creates' bundles %v", during, want)
	}
	for _, id := range want {
		if left := d.Leftovers(t.Context(), id); len(left) > 0 {
			t.Errorf("crashed create %s: left %v", id, left)
		}
	}
	for _, s := range []sandbox.Sandbox{other, sb} {
		if res, err := sandbox.Run(ctx, s, sandbox.ExecRequest{File: sandbox.File{Name: "ok.sh", Data: []byte("exit 0")}, Argv: []string{"/bin/sh", "{file}"}}); err != nil || res.ExitCode != 0 {
			t.Errorf("sandbox %s after Reap: got %+v, %v; want it alive", s.ID(), res, err)
		}
	}
}

// TestReapOrphans checks that a process's first create destroys the
// sandboxes of the state directory whose creator is gone (one whose guest
// still runs, one whose creator's pid was reused), and leaves alone a
// sandbox whose creator lives, a bundle without a creator record (another
// process's create under way) and one whose creator ran in another pid
// namespace.
func TestReapOrphans(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	state := t.TempDir()
	cfg := runc.Config{StateDir: state, GuestPath: testenv.Guest(t)}
	first, err := runc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	t.Cleanup(func() { _, _ = first.Reap(context.Background(), nil) })
	img := testenv.Image(t, "shell")
	var live []sandbox.Sandbox
	for range 3 {
		sb, err := first.Create(ctx, sandbox.Spec{Image: img})
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Destroy(context.Background())
		live = append(live, sb)
	}
	orphan, reused, alive := live[0], live[1], live[2]
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		t.Fatal(err)
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	bundles := filepath.Join(state, "bundles")
	record := func(id, rec string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(bundles, id, "creator"), []byte(rec), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The sandboxes of first stand for a killed process's: their records
	// are rewritten to name a process that ended, and this test's own pid
	// with another start time.
	record(orphan.ID(), fmt.Sprintf("%d 1 %s\n", gone.Process.Pid, ns))
	record(reused.ID(), fmt.Sprintf("%d 1 %s\n", os.Getpid(), ns))
	unrecorded, elsewhere := sandbox.NewID(), sandbox.NewID()
	for _, id := range []string{unrecorded, elsewhere} {
		if err := os.Mkdir(filepath.Join(bundles, id), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	record(elsewhere, fmt.Sprintf("%d 1 pid:[1]\n", gone.Process.Pid))

	second, err := runc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := second.Create(ctx, sandbox.Spec{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	for _, tc := range []struct {
		name  string
		id    string
		reaps bool
	}{
		{"creator ended", orphan.ID(), true},
		{"creator's pid reused", reused.ID(), true},
		{"creator alive", alive.ID(), false},
		{"no record", unrecorded, false},
		{"another pid namespace", elsewhere, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := os.Stat(filepath.Join(bundles, tc.id))
			if left := second.Leftovers(t.Context(), tc.id); tc.reaps && len(left) > 0 {
				t.Errorf("got %v left, want the sandbox destroyed", left)
			} else if !tc.reaps && err != nil {
				t.Errorf("bundle: %v, want it kept", err)
			}
		})
	}
	for _, s := range []sandbox.Sandbox{alive, sb} {
		if res, err := sandbox.Run(ctx, s, sandbox.ExecRequest{File: sandbox.File{Name: "ok.sh", Data: []byte("exit 0")}, Argv: []string{"/bin/sh", "{file}"}}); err != nil || res.ExitCode != 0 {
			t.Errorf("sandbox %s: got %+v, %v; want it alive", s.ID(), res, err)
		}
	}
}
