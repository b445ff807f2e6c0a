package ocidriver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
	"github.com/stockade-sh/stockade/supervisor"
)

// detachedDriver builds an OCI driver with a shim over a state directory.
type detachedDriver struct {
	name, runtime string
	build         func(t testing.TB, state string) (*ocidriver.Driver, error)
}

// detachedDrivers are runc's and gVisor's.
var detachedDrivers = []detachedDriver{
	{"runc", "runc", func(t testing.TB, state string) (*ocidriver.Driver, error) {
		return runc.New(runc.Config{StateDir: state, GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	}},
	{"gvisor", "runsc", func(t testing.TB, state string) (*ocidriver.Driver, error) {
		d, err := gvisor.New(gvisor.Config{StateDir: state, GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
		if err != nil {
			return nil, err
		}
		return d.Driver, nil
	}},
}

// TestReattachProves checks that Reattach returns only the detached
// sandboxes it can prove are its own and destroys the others: one of
// another owner, one whose record was edited (its labels changed to the
// owner's), one whose record was signed under another key, one whose shim
// is gone; and that Reap leaves the re-attached one alone.
func TestReattachProves(t *testing.T) {
	testenv.RequiresRoot(t)
	for _, drv := range detachedDrivers {
		t.Run(drv.name, func(t *testing.T) {
			testenv.RequiresBinary(t, drv.runtime)
			state := t.TempDir()
			d, err := drv.build(t, state)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
			defer cancel()
			img := testenv.Image(t, "shell")
			mine := map[string]string{"owner": "me"}
			create := func(labels map[string]string) string {
				t.Helper()
				sb, err := d.Create(ctx, sandbox.Spec{Image: img, Detached: true, Labels: labels})
				if err != nil {
					t.Fatal(err)
				}
				return sb.ID()
			}
			ours := create(mine)
			other := create(map[string]string{"owner": "someone else"})
			edited := create(map[string]string{"owner": "someone else"})
			foreign := create(mine)
			orphan := create(mine)
			all := []string{ours, other, edited, foreign, orphan}
			t.Cleanup(func() {
				// Whatever the test left is destroyed by the reaper.
				_, _ = d.Reap(context.Background(), nil)
			})

			shims := filepath.Join(state, "shims")
			// edited: its labels rewritten to the owner's, MAC untouched.
			meta := filepath.Join(shims, edited, supervisor.MetaFile)
			b, err := os.ReadFile(meta)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			m["labels"] = map[string]string{"owner": "me"}
			b, _ = json.Marshal(m)
			if err := os.WriteFile(meta, b, 0o600); err != nil {
				t.Fatal(err)
			}
			// foreign: the same record, signed under another key.
			fm, err := supervisor.ReadMeta(filepath.Join(shims, foreign), mustKey(t, shims))
			if err != nil {
				t.Fatal(err)
			}
			if err := supervisor.WriteMeta(filepath.Join(shims, foreign), make([]byte, 32), fm); err != nil {
				t.Fatal(err)
			}
			// orphan: its shim killed.
			if err := supervisor.KillShim(ctx, filepath.Join(shims, orphan)); err != nil {
				t.Fatal(err)
			}

			restarted, err := drv.build(t, state)
			if err != nil {
				t.Fatal(err)
			}
			got, err := restarted.Reattach(ctx, mine)
			if err != nil {
				t.Fatalf("Reattach: %v", err)
			}
			var ids []string
			for _, sb := range got {
				ids = append(ids, sb.ID())
			}
			if !slices.Equal(ids, []string{ours}) {
				t.Fatalf("Reattach returned %v, want only %s", ids, ours)
			}
			for _, id := range all[1:] {
				if left := restarted.Leftovers(t.Context(), id); len(left) > 0 {
					t.Errorf("sandbox %s, not provably ours, left: %s", id, strings.Join(left, "; "))
				}
			}
			if reaped, err := restarted.Reap(ctx, mine); err != nil || len(reaped) != 0 {
				t.Errorf("Reap after Reattach: got %v, %v; want the re-attached sandbox left alone", reaped, err)
			}
			if res, err := sandbox.Run(ctx, got[0], sandbox.ExecRequest{File: sandbox.File{Name: "a.sh", Data: []byte("echo still here")}, Argv: []string{"/bin/sh", "{file}"}}); err != nil || string(res.Stdout) != "still here\n" {
				t.Errorf("the re-attached sandbox: got %+v, %v", res, err)
			}
			if err := got[0].Destroy(ctx); err != nil {
				t.Fatal(err)
			}
			if left := restarted.Leftovers(t.Context(), ours); len(left) > 0 {
				t.Errorf("after Destroy, %s left: %s", ours, strings.Join(left, "; "))
			}
		})
	}
}

func mustKey(t *testing.T, root string) []byte {
	t.Helper()
	key, err := supervisor.LoadKey(root)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// The environment of a daemon process that TestReattachAfterKill starts:
// the test binary itself, re-executed.
const (
	daemonEnv      = "STOCKADE_TEST_REATTACH_DAEMON" // the driver's name
	daemonStateEnv = "STOCKADE_TEST_REATTACH_STATE"
	daemonGuestEnv = "STOCKADE_TEST_REATTACH_GUEST"
	daemonShimEnv  = "STOCKADE_TEST_REATTACH_SHIM"
	daemonOwnerEnv = "STOCKADE_TEST_REATTACH_OWNER"
)

// daemonSandboxes is what the daemon process reports once its sandboxes
// are ready, on a line of its own after daemonReady.
type daemonSandboxes struct {
	Mine, Theirs, Dead string
}

const daemonReady = "REATTACH-DAEMON-READY "

// TestReattachAfterKill kills a daemon-like process with SIGKILL while its
// detached sandbox has a kernel holding a value and a program running:
// another process's driver re-attaches the sandbox, the kernel still holds
// the value, the dead daemon's program is cancelled and the next one runs;
// the dead daemon's other sandboxes, one of another owner and one whose
// shim is gone (its socket dead), are destroyed with nothing left (runtime
// state, cgroups, bundle, shim directory).
func TestReattachAfterKill(t *testing.T) {
	if name := os.Getenv(daemonEnv); name != "" {
		runDaemon(t, name)
		return
	}
	testenv.RequiresRoot(t)
	for _, drv := range detachedDrivers {
		t.Run(drv.name, func(t *testing.T) {
			testenv.RequiresBinary(t, drv.runtime)
			state := t.TempDir()
			owner := map[string]string{"owner": "daemon-" + drv.name + "-" + strconv.Itoa(os.Getpid())}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
			defer cancel()

			daemon := exec.Command(os.Args[0], "-test.run=^TestReattachAfterKill$", "-test.v")
			daemon.Env = append(os.Environ(), daemonEnv+"="+drv.name, daemonStateEnv+"="+state,
				daemonGuestEnv+"="+testenv.Guest(t), daemonShimEnv+"="+testenv.Shim(t)[0],
				daemonOwnerEnv+"="+owner["owner"])
			out, err := daemon.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr strings.Builder
			daemon.Stderr = &stderr
			if err := daemon.Start(); err != nil {
				t.Fatal(err)
			}
			killed := false
			defer func() {
				if !killed {
					_ = daemon.Process.Kill()
					_ = daemon.Wait()
				}
			}()
			ready := make(chan daemonSandboxes, 1)
			var lines strings.Builder
			go func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					if rest, ok := strings.CutPrefix(sc.Text(), daemonReady); ok {
						var ids daemonSandboxes
						if json.Unmarshal([]byte(rest), &ids) == nil {
							ready <- ids
						}
						continue
					}
					lines.WriteString(sc.Text() + "\n")
				}
				close(ready)
			}()
			var ids daemonSandboxes
			select {
			case v, ok := <-ready:
				if !ok {
					_ = daemon.Wait()
					killed = true
					t.Fatalf("the daemon process ended before its sandboxes were ready:\n%s%s", lines.String(), stderr.String())
				}
				ids = v
				t.Logf("daemon %d: sandboxes %+v", daemon.Process.Pid, ids)
			case <-ctx.Done():
				t.Fatalf("the daemon process did not get its sandboxes ready: %v", ctx.Err())
			}

			restarted, err := drv.build(t, state)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = restarted.Reap(context.Background(), nil) })
			if err := daemon.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = daemon.Wait()
			killed = true
			if err := supervisor.KillShim(ctx, filepath.Join(state, "shims", ids.Dead)); err != nil {
				t.Fatal(err)
			}

			got, err := restarted.Reattach(ctx, owner)
			if err != nil {
				t.Fatalf("Reattach: %v", err)
			}
			if len(got) != 1 || got[0].ID() != ids.Mine {
				for _, sb := range got {
					_ = sb.Destroy(context.WithoutCancel(ctx))
				}
				t.Fatalf("Reattach returned %d sandboxes, want only %s", len(got), ids.Mine)
			}
			sb := got[0]
			defer func() {
				if err := sb.Destroy(context.WithoutCancel(ctx)); err != nil {
					t.Error(err)
				}
				if left := restarted.Leftovers(t.Context(), ids.Mine); len(left) > 0 {
					t.Errorf("after Destroy, %s left: %s", ids.Mine, strings.Join(left, "; "))
				}
			}()
			for name, id := range map[string]string{"another owner's": ids.Theirs, "the dead shim's": ids.Dead} {
				if left := restarted.Leftovers(t.Context(), id); len(left) > 0 {
					t.Errorf("%s sandbox %s, which Reattach should have destroyed, left: %s", name, id, strings.Join(left, "; "))
				}
			}

			kernels, err := sb.(sandbox.Kernels).ListKernels(ctx)
			if err != nil || len(kernels) != 1 {
				t.Fatalf("the re-attached sandbox's kernels: got %v, %v; want the dead daemon's one", kernels, err)
			}
			res, err := kernels[0].Run(ctx, sandbox.Cell{Code: "get kept"})
			if err != nil || string(res.Stdout) != owner["owner"]+"\n" {
				t.Errorf("the kernel's value after the re-attach: got %+v, %v; want %q", res, err, owner["owner"])
			}
			// The dead daemon's program (sleep 1000) was cancelled: the
			// next one runs.
			run, err := sandbox.Run(ctx, sb, shScript("echo after"))
			if err != nil || string(run.Stdout) != "after\n" {
				t.Errorf("a program after the re-attach: got %+v, %v; want it to print after", run, err)
			}
		})
	}
}

// shScript is an ExecRequest that runs script with /bin/sh.
func shScript(script string) sandbox.ExecRequest {
	return sandbox.ExecRequest{File: sandbox.File{Name: "main.sh", Data: []byte(script)}, Argv: []string{"/bin/sh", "{file}"}}
}

// runDaemon is the daemon process of TestReattachAfterKill: it creates
// its detached sandboxes, starts a kernel holding a value and a program
// that runs on, reports the sandboxes' IDs and waits to be killed (at most
// five minutes).
func runDaemon(t *testing.T, name string) {
	state, guestPath, shim := os.Getenv(daemonStateEnv), os.Getenv(daemonGuestEnv), []string{os.Getenv(daemonShimEnv), "shim"}
	var d *ocidriver.Driver
	var err error
	switch name {
	case "runc":
		d, err = runc.New(runc.Config{StateDir: state, GuestPath: guestPath, Shim: shim})
	case "gvisor":
		var g *ocidriver.Snapshotting
		if g, err = gvisor.New(gvisor.Config{StateDir: state, GuestPath: guestPath, Shim: shim}); err == nil {
			d = g.Driver
		}
	default:
		t.Fatalf("no driver %q", name)
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	img := testenv.Image(t, "shell")
	owner := os.Getenv(daemonOwnerEnv)
	create := func(owner string) sandbox.Sandbox {
		sb, err := d.Create(ctx, sandbox.Spec{Image: img, Detached: true, Labels: map[string]string{"owner": owner}})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	mine, theirs, dead := create(owner), create("someone else"), create(owner)
	k, err := mine.(sandbox.Kernels).StartKernel(ctx, sandbox.KernelSpec{Argv: []string{profile.GuestPath, "stockade-kernel-test"}})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := k.Run(ctx, sandbox.Cell{Code: "set kept " + owner}); err != nil || res.Status != sandbox.CellOK {
		t.Fatalf("set: %+v, %v", res, err)
	}
	started := make(chan struct{})
	req := shScript("echo started; sleep 1000")
	var once sync.Once
	req.OnOutput = func(sandbox.Stream, []byte) { once.Do(func() { close(started) }) }
	if _, err := mine.Start(ctx, req); err != nil {
		t.Fatal(err)
	}
	<-started
	b, _ := json.Marshal(daemonSandboxes{Mine: mine.ID(), Theirs: theirs.ID(), Dead: dead.ID()})
	fmt.Printf("%s%s\n", daemonReady, b)
	time.Sleep(5 * time.Minute)
}

// TestBindDetached checks that a detached sandbox's binding is recorded
// in its shim's record: a new driver value re-attaches it by the
// binding's labels, and it stays bound (a second Bind is refused) and
// tightened (the bound output cap holds).
func TestBindDetached(t *testing.T) {
	testenv.RequiresRoot(t)
	for _, drv := range detachedDrivers {
		t.Run(drv.name, func(t *testing.T) {
			testenv.RequiresBinary(t, drv.runtime)
			state := t.TempDir()
			d, err := drv.build(t, state)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = d.Reap(context.Background(), nil) })
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			sb, err := d.CreateUnbound(ctx, sandbox.Spec{Image: testenv.Image(t, "shell"), Detached: true, Labels: map[string]string{"pool": "p"}})
			if err != nil {
				t.Fatal(err)
			}
			execution := map[string]string{"execution": "e-" + drv.name}
			if err := d.Bind(ctx, sb, sandbox.Binding{Labels: execution, Limits: sandbox.Limits{OutputCap: 10}}); err != nil {
				t.Fatal(err)
			}
			restarted, err := drv.build(t, state)
			if err != nil {
				t.Fatal(err)
			}
			got, err := restarted.Reattach(ctx, map[string]string{"pool": "p", "execution": "e-" + drv.name})
			if err != nil || len(got) != 1 || got[0].ID() != sb.ID() {
				t.Fatalf("Reattach by the binding's labels: got %v, %v; want %s", got, err, sb.ID())
			}
			defer got[0].Destroy(context.WithoutCancel(ctx))
			if err := restarted.Bind(ctx, got[0], sandbox.Binding{Labels: map[string]string{"again": "1"}}); !errdefs.IsFailedPrecondition(err) {
				t.Errorf("binding the re-attached bound sandbox: got %v, want ErrFailedPrecondition", err)
			}
			res, err := sandbox.Run(ctx, got[0], shScript("echo 0123456789abcdef"))
			if err != nil || len(res.Stdout) != 10 || !res.StdoutTruncated {
				t.Errorf("the bound output cap of 10 after the re-attach: got %+v, %v", res, err)
			}
		})
	}
}

// detachedRunc is a runc driver with a shim over a new state directory,
// reaped when the test ends, and a context for the test.
func detachedRunc(t *testing.T) (drv detachedDriver, state string, d *ocidriver.Driver, ctx context.Context) {
	t.Helper()
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	drv, state = detachedDrivers[0], t.TempDir()
	d, err := drv.build(t, state)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = d.Reap(context.Background(), nil) })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	t.Cleanup(cancel)
	return drv, state, d, ctx
}

// TestReattachKeepsWhatItCannotDisprove checks that Reattach destroys no
// sandbox of its own only because it could not reach it: with a
// cancelled ctx it keeps every one, and a sandbox whose shim lives but
// does not answer (stopped) is kept and named in the error while the
// others are re-attached; once the shim answers again, a later Reattach
// returns it.
func TestReattachKeepsWhatItCannotDisprove(t *testing.T) {
	drv, state, d, ctx := detachedRunc(t)
	mine := map[string]string{"owner": "me"}
	var ids []string
	for range 2 {
		sb, err := d.Create(ctx, sandbox.Spec{Image: testenv.Image(t, "shell"), Detached: true, Labels: mine})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID())
	}
	slices.Sort(ids)
	alive := func(t *testing.T, id string) {
		t.Helper()
		if _, running := supervisor.Running(filepath.Join(state, "shims", id)); !running {
			t.Errorf("sandbox %s: its shim is gone, want it kept", id)
		}
	}

	t.Run("a cancelled ctx", func(t *testing.T) {
		restarted, err := drv.build(t, state)
		if err != nil {
			t.Fatal(err)
		}
		cctx, ccancel := context.WithCancel(ctx)
		ccancel()
		got, err := restarted.Reattach(cctx, mine)
		if err == nil || len(got) != 0 {
			t.Errorf("Reattach: got %v, %v; want nothing and the ctx's error", got, err)
		}
		for _, id := range ids {
			alive(t, id)
		}
	})

	t.Run("a shim that does not answer", func(t *testing.T) {
		ocidriver.SetReattachTimeout(t, 2*time.Second)
		stuck := ids[0]
		pid, running := supervisor.Running(filepath.Join(state, "shims", stuck))
		if !running {
			t.Fatalf("the shim of %s is not running", stuck)
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		// The stop is the process's once each of its threads has taken
		// it; until then a thread that a new connection wakes may still
		// answer it (seen in CI on a host at load 15).
		awaitStopped(t, pid)
		restarted, err := drv.build(t, state)
		if err != nil {
			t.Fatal(err)
		}
		got, err := restarted.Reattach(ctx, mine)
		_ = syscall.Kill(pid, syscall.SIGCONT)
		if err == nil || !strings.Contains(err.Error(), stuck) {
			t.Errorf("Reattach's error: got %v, want one naming %s", err, stuck)
		}
		if len(got) != 1 || got[0].ID() != ids[1] {
			t.Fatalf("Reattach: got %v, want only %s", got, ids[1])
		}
		alive(t, stuck)
		again, err := drv.build(t, state)
		if err != nil {
			t.Fatal(err)
		}
		got, err = again.Reattach(ctx, mine)
		if err != nil || len(got) != 2 {
			t.Fatalf("Reattach once the shim answers: got %v, %v; want both", got, err)
		}
		for _, sb := range got {
			if err := sb.Destroy(ctx); err != nil {
				t.Error(err)
			}
		}
	})
}

// TestReattachInterruptsAnOrphanedCell leaves a cell running in a detached
// sandbox's kernel when its client goes (another driver value re-attaches
// the sandbox, which replaces the connection): Reattach interrupts the
// cell, and the adopted kernel runs the next one.
func TestReattachInterruptsAnOrphanedCell(t *testing.T) {
	drv, state, d, ctx := detachedRunc(t)
	mine := map[string]string{"owner": "me"}
	sb, err := d.Create(ctx, sandbox.Spec{Image: testenv.Image(t, "shell"), Detached: true, Labels: mine})
	if err != nil {
		t.Fatal(err)
	}
	k, err := sb.(sandbox.Kernels).StartKernel(ctx, sandbox.KernelSpec{Argv: []string{profile.GuestPath, "stockade-kernel-test"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Run(ctx, sandbox.Cell{Code: "set kept 1"}); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	var once sync.Once
	go func() {
		_, _ = k.Run(ctx, sandbox.Cell{Code: "print started\nsleep 1000", OnOutput: func(sandbox.Stream, []byte) {
			once.Do(func() { close(started) })
		}})
	}()
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the cell did not start")
	}
	restarted, err := drv.build(t, state)
	if err != nil {
		t.Fatal(err)
	}
	got, err := restarted.Reattach(ctx, mine)
	if err != nil || len(got) != 1 {
		t.Fatalf("Reattach: got %v, %v; want the sandbox", got, err)
	}
	defer got[0].Destroy(context.WithoutCancel(ctx))
	kernels, err := got[0].(sandbox.Kernels).ListKernels(ctx)
	if err != nil || len(kernels) != 1 {
		t.Fatalf("the re-attached sandbox's kernels: got %v, %v; want one", kernels, err)
	}
	if res, err := kernels[0].Run(ctx, sandbox.Cell{Code: "get kept"}); err != nil || string(res.Stdout) != "1\n" {
		t.Errorf("a cell of the adopted kernel: got %+v, %v; want 1", res, err)
	}
}

// TestDetachedNeedsAShim checks the refusal of a detached sandbox by a
// driver built without a shim: ErrInvalidArgument, as sandbox.Spec.Detached
// says, and nothing is created.
func TestDetachedNeedsAShim(t *testing.T) {
	testenv.RequiresBinary(t, "runc")
	state := t.TempDir()
	d, err := runc.New(runc.Config{StateDir: state, GuestPath: "/nonexistent/guest"})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := d.Create(t.Context(), sandbox.Spec{Image: sandbox.Image{Rootfs: "/nonexistent"}, Detached: true})
	if !errdefs.IsInvalidArgument(err) {
		if sb != nil {
			_ = sb.Destroy(context.WithoutCancel(t.Context()))
		}
		t.Errorf("Create of a detached sandbox without a shim: got %v, want ErrInvalidArgument", err)
	}
}

// awaitStopped waits until every thread of process pid is stopped (state
// T in /proc), for at most 10 s.
func awaitStopped(t *testing.T, pid int) {
	t.Helper()
	tasks := fmt.Sprintf("/proc/%d/task", pid)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		entries, err := os.ReadDir(tasks)
		if err != nil {
			t.Fatal(err)
		}
		stopped := len(entries) > 0
		for _, e := range entries {
			b, err := os.ReadFile(filepath.Join(tasks, e.Name(), "stat"))
			// The state follows the command's closing parenthesis.
			if i := bytes.LastIndexByte(b, ')'); err == nil && i >= 0 && i+2 < len(b) && b[i+2] != 'T' {
				stopped = false
			}
		}
		if stopped {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d has threads not stopped 10 s after SIGSTOP", pid)
		}
	}
}
