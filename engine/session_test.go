package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// sessionEngines returns an engine over one real driver that can keep
// sessions, for each of runc and gVisor; their cells speak the guest's
// test kernel (WithTestKernel).
func sessionEngines(t *testing.T) map[string]*Engine {
	t.Helper()
	testenv.RequiresRoot(t)
	out := map[string]*Engine{}
	for _, name := range []string{"runc", "gvisor"} {
		bin := map[string]string{"runc": "runc", "gvisor": "runsc"}[name]
		testenv.RequiresBinary(t, bin)
		var (
			d   sandbox.Driver
			err error
		)
		if name == "runc" {
			d, err = runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
		} else {
			d, err = gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
		}
		if err != nil {
			t.Fatal(err)
		}
		e, err := New(map[string]sandbox.Driver{name: d}, name, image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling(), WithTestKernel())
		if err != nil {
			t.Fatal(err)
		}
		out[name] = e
	}
	return out
}

func openTestSession(t *testing.T, e *Engine, driver string, kernel []string) *Session {
	t.Helper()
	s, err := e.OpenSession(t.Context(), SessionSpec{Runtime: "shell", Driver: driver, Workspace: 8 << 20, Kernel: kernel,
		Labels: map[string]string{LabelOwner: "engine-test", LabelSession: "ses_test"}})
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
		// A session is destroyed at its end: nothing of its sandbox stays.
		if l, ok := e.Drivers()[driver].(sandbox.Leftovers); ok {
			if left := l.Leftovers(context.Background(), s.SandboxID()); len(left) > 0 {
				t.Errorf("after Close, sandbox %s left %v", s.SandboxID(), left)
			}
		}
	})
	return s
}

func cell(t *testing.T, s *Session, code string, timeout time.Duration) *CellResult {
	t.Helper()
	r, err := s.Cell(t.Context(), CellRequest{Code: code, Timeout: timeout})
	if err != nil {
		t.Fatalf("Cell(%q): %v", code, err)
	}
	return r
}

// sh runs a shell command in the session's sandbox, outside its kernel.
func sh(t *testing.T, s *Session, cmd string) string {
	t.Helper()
	res, err := sandbox.Run(t.Context(), s.sb, sandbox.ExecRequest{File: sandbox.File{Name: "cmd.sh", Data: []byte(cmd)},
		Argv: []string{"/bin/sh", "/tmp/cmd.sh"}, Env: ProgramEnv(), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return string(res.Stdout) + string(res.Stderr)
}

// TestSessionKernelKeepsState runs cells in one session's kernel on runc
// and gVisor: state carries from cell to cell, values and displays come
// back as outputs, a raised error is status failed, and a cell that runs
// past its timeout is interrupted with the kernel and its state kept.
func TestSessionKernelKeepsState(t *testing.T) {
	for name, e := range sessionEngines(t) {
		t.Run(name, func(t *testing.T) {
			s := openTestSession(t, e, name, nil)
			if r := cell(t, s, "set x 42\nprint set", 0); r.Status != sandbox.StatusSucceeded || r.Stdout != "set\n" {
				t.Fatalf("cell 1: got %+v, want succeeded with stdout set", r)
			}
			r := cell(t, s, "display image/png PNGDATA\nget x", 0)
			want := []CellOutput{{MimeType: "image/png", Data: "UE5HREFUQQ=="}, {MimeType: "text/plain", Data: "42"}}
			if r.Status != sandbox.StatusSucceeded || len(r.Outputs) != 2 || r.Outputs[0] != want[0] || r.Outputs[1] != want[1] {
				t.Fatalf("cell 2: got %+v, want outputs %v", r, want)
			}
			if r := cell(t, s, "fail boom", 0); r.Status != sandbox.StatusFailed || r.Error == nil || r.Error.Name != "TestError" || r.Error.Value != "boom" {
				t.Fatalf("a raising cell: got %+v, want failed with TestError boom", r)
			}
			r = cell(t, s, "sleep 30", 300*time.Millisecond)
			if r.Status != sandbox.StatusTimedOut || r.KernelRestarted || r.Error == nil || r.Error.Name != "KeyboardInterrupt" {
				t.Fatalf("a cell past its timeout: got %+v, want timed_out by a KeyboardInterrupt, kernel kept", r)
			}
			if r := cell(t, s, "get x", 0); r.Stdout != "42\n" {
				t.Fatalf("after the interrupt: got %q, want the state kept (42)", r.Stdout)
			}
			// gVisor's Sentry lists no nodev (no device can be made in its
			// sandbox at all); runc's mount must say it.
			got := sh(t, s, "cd /workspace && pwd && stat -c %a /workspace && awk '$2==\"/workspace\"{print $4}' /proc/mounts")
			if !strings.Contains(got, "1777") || !strings.Contains(got, "nosuid") || !strings.Contains(got, "size=8192k") || name == "runc" && !strings.Contains(got, "nodev") {
				t.Fatalf("/workspace: got %q, want mode 1777, nosuid, nodev (runc), 8 MiB", got)
			}
		})
	}
}

// TestSessionKernelRestarts checks the two ways a cell loses its kernel,
// on runc and gVisor: a cell that does not stop when interrupted (its
// kernel ignores SIGINT) has its kernel restarted InterruptGrace later,
// and a kernel that dies in the cell is restarted; the session serves the
// next cell either way.
func TestSessionKernelRestarts(t *testing.T) {
	stuck := []string{"/bin/sh", "-c", `trap '' INT; echo '{"type":"ready"}' >&4; while read -r l <&3; do sleep 1000; done`}
	dies := []string{"/bin/sh", "-c", `echo '{"type":"ready"}' >&4; read -r l <&3; exit 3`}
	for name, e := range sessionEngines(t) {
		t.Run(name+"/stuck", func(t *testing.T) {
			s := openTestSession(t, e, name, stuck)
			start := time.Now()
			r := cell(t, s, "anything", 200*time.Millisecond)
			if r.Status != sandbox.StatusTimedOut || !r.KernelRestarted {
				t.Fatalf("got %+v, want timed_out with the kernel restarted", r)
			}
			if d := time.Since(start); d < InterruptGrace {
				t.Fatalf("the kernel was restarted %v after the timeout, before the grace of %v", d, InterruptGrace)
			}
			if k := s.currentKernel(); k == nil {
				t.Fatal("no kernel after the restart")
			}
		})
		t.Run(name+"/dies", func(t *testing.T) {
			s := openTestSession(t, e, name, dies)
			r := cell(t, s, "anything", 5*time.Second)
			if r.Status != sandbox.StatusFailed || !r.KernelRestarted || r.Error == nil || r.Error.Name != "KernelDied" || !strings.Contains(r.Error.Value, "exit code 3") {
				t.Fatalf("got %+v, want failed, KernelDied with exit code 3, kernel restarted", r)
			}
		})
		// A kernel that SIGKILLs itself was not OOM-killed: no cgroup
		// counted it. What it printed first is kept.
		t.Run(name+"/kills-itself", func(t *testing.T) {
			s := openTestSession(t, e, name, selfKill)
			r := cell(t, s, "anything", 5*time.Second)
			if r.Status != sandbox.StatusKilled || !r.KernelRestarted || r.Error == nil || r.Error.Name != "KernelKilled" || !strings.Contains(r.Error.Value, "signal 9") {
				t.Fatalf("got %+v, want killed, KernelKilled by signal 9, kernel restarted", r)
			}
			if r.Stdout != "going\n" {
				t.Errorf("the output before the kill: got %q, want %q", r.Stdout, "going\n")
			}
		})
	}
}

// selfKill is a test kernel whose first cell prints a line and SIGKILLs
// the kernel itself.
var selfKill = []string{"/bin/sh", "-c", `echo '{"type":"ready"}' >&4; read -r l <&3; echo going; sleep 0.5; kill -9 $$`}

// TestSessionOOMRestartsKernel checks that a kernel the memory cgroup
// kills in a cell ends it oom_killed, with what it printed first: on runc
// the kernel is restarted; on gVisor the host's OOM killer ends the
// Sentry, the whole sandbox, and Cell says so (SandboxLostError) with the
// cell's end.
func TestSessionOOMRestartsKernel(t *testing.T) {
	hog := []string{"/bin/sh", "-c", `echo '{"type":"ready"}' >&4; read -r l <&3; echo hogging; sleep 0.5; exec awk 'BEGIN { s = "x"; while (1) s = s s }'`}
	for name, e := range sessionEngines(t) {
		t.Run(name, func(t *testing.T) {
			s, err := e.OpenSession(t.Context(), SessionSpec{Runtime: "shell", Driver: name, Workspace: 1 << 20, Kernel: hog,
				Limits: sandbox.Limits{Memory: 64 << 20}, Labels: map[string]string{LabelOwner: "engine-test"}})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(context.Background())
			r, err := s.Cell(t.Context(), CellRequest{Code: "anything", Timeout: 20 * time.Second})
			var lost *SandboxLostError
			switch {
			case name == "gvisor" && errors.As(err, &lost):
				r = lost.Result
			case err != nil:
				t.Fatalf("Cell: %v", err)
			case !r.KernelRestarted:
				t.Errorf("got %+v, want the kernel restarted", r)
			}
			if r.Status != sandbox.StatusOOMKilled || r.Error == nil || r.Error.Name != "MemoryError" || r.Stdout != "hogging\n" {
				t.Fatalf("got %+v, want oom_killed, MemoryError, with stdout hogging", r)
			}
		})
	}
}

// TestSessionFiles moves files in and out of a session's /workspace on
// runc and gVisor, and refuses what is not below it: a path with "..",
// NUL or outside is invalid before anything is sent, a file over the
// bound is too large and leaves nothing, and a symlink planted in
// /workspace is never followed out of it.
func TestSessionFiles(t *testing.T) {
	for name, e := range sessionEngines(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			s := openTestSession(t, e, name, nil)
			data := bytes.Repeat([]byte("row,1\n"), 1000)
			n, sum, err := s.WriteFile(ctx, "data/a.csv", bytes.NewReader(data), 1<<20)
			if err != nil || n != int64(len(data)) || len(sum) != 64 {
				t.Fatalf("WriteFile: got %d, %q, %v", n, sum, err)
			}
			got, info, err := s.ReadFile(ctx, "/workspace/data/a.csv", 1<<20)
			if err != nil || !bytes.Equal(got, data) || info.Size != int64(len(data)) {
				t.Fatalf("ReadFile: got %d bytes, %+v, %v; want what was written", len(got), info, err)
			}
			if _, _, err := s.ReadFile(ctx, "data/a.csv", 10); !errdefs.IsTooLarge(err) {
				t.Fatalf("ReadFile past its bound: got %v, want ErrTooLarge", err)
			}
			list, _, err := s.ListDir(ctx, "data")
			if err != nil || len(list) != 1 || list[0].Name != "a.csv" || list[0].Type != sandbox.TypeFile {
				t.Fatalf("ListDir: got %+v, %v", list, err)
			}
			if _, _, err := s.WriteFile(ctx, "big", bytes.NewReader(make([]byte, 2048)), 1024); !errdefs.IsTooLarge(err) {
				t.Fatalf("a file over the bound: got %v, want ErrTooLarge", err)
			}
			if _, err := s.Stat(ctx, "big"); !errdefs.IsNotFound(err) {
				t.Fatalf("the refused file: got %v, want none left", err)
			}
			for _, p := range []string{"../etc/passwd", "/workspace/../etc/passwd", "/etc/passwd", "/tmp/x", "a\x00b", "", "/workspacex/a"} {
				if _, _, err := s.WriteFile(ctx, p, strings.NewReader("x"), 10); !errdefs.IsInvalidArgument(err) {
					t.Errorf("WriteFile(%q): got %v, want ErrInvalidArgument", p, err)
				}
			}
			if err := s.Remove(ctx, "/workspace"); !errdefs.IsInvalidArgument(err) {
				t.Errorf("removing /workspace: got %v, want ErrInvalidArgument", err)
			}
			sh(t, s, "ln -s /etc /workspace/etc && ln -s /etc/passwd /workspace/passwd")
			if _, _, err := s.ReadFile(ctx, "passwd", 1<<20); err == nil {
				t.Fatal("ReadFile followed a symlink out of /workspace")
			}
			if _, _, err := s.WriteFile(ctx, "etc/evil", strings.NewReader("x"), 10); err == nil {
				t.Fatal("WriteFile followed a symlinked directory out of /workspace")
			}
			if err := s.Remove(ctx, "passwd"); err != nil {
				t.Fatalf("removing the symlink itself: %v", err)
			}
			if out := sh(t, s, "ls /etc/passwd && ls /etc/evil 2>&1"); !strings.Contains(out, "/etc/passwd") || !strings.Contains(out, "No such file") {
				t.Fatalf("after the symlinks: got %q, want /etc/passwd there and no /etc/evil", out)
			}
			if err := s.Remove(ctx, "data/a.csv"); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Stat(ctx, "data/a.csv"); !errdefs.IsNotFound(err) {
				t.Fatalf("after Remove: got %v, want ErrNotFound", err)
			}
		})
	}
}

// TestSessionReattach re-attaches a session's sandbox as a restarted
// daemon does, on runc and gVisor: its kernel keeps its state, and a
// sandbox no session names is destroyed.
func TestSessionReattach(t *testing.T) {
	for name, e := range sessionEngines(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			s := openTestSession(t, e, name, nil)
			stray := openTestSession(t, e, name, nil)
			cell(t, s, "set y kept", 0)
			known := map[string]string{s.SandboxID(): "shell"}
			got, err := e.ReattachSessions(ctx, map[string]string{LabelOwner: "engine-test"}, func(id string) (SessionSpec, bool) {
				rt, ok := known[id]
				return SessionSpec{Runtime: rt}, ok
			})
			if err != nil || len(got) != 1 || got[0].SandboxID() != s.SandboxID() {
				t.Fatalf("ReattachSessions: got %d sessions, %v; want the one of %s", len(got), err, s.SandboxID())
			}
			if r := cell(t, got[0], "get y", 0); r.Stdout != "kept\n" {
				t.Fatalf("after the re-attach: got %q, want the kernel's state (kept)", r.Stdout)
			}
			if _, err := stray.Cell(ctx, CellRequest{Code: "get y"}); err == nil {
				t.Fatal("the stray sandbox still runs cells after the re-attach destroyed it")
			}
			if err := got[0].Close(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Cell(ctx, CellRequest{Code: "get y"}); err == nil || errors.Is(err, errdefs.ErrConflict) {
				t.Fatalf("after Close: got %v, want the sandbox gone", err)
			}
		})
	}
}

// TestSessionIsolation runs two sessions at once on runc and gVisor and
// checks, from each, that nothing of the other is there: its kernel's
// state, its processes (a daemon its kernel left running), its /tmp and
// /workspace, its abstract unix sockets (bound while the other looks).
func TestSessionIsolation(t *testing.T) {
	testenv.Image(t, "python")
	for name, e := range sessionEngines(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			open := func() *Session {
				s, err := e.OpenSession(ctx, SessionSpec{Runtime: "python", Driver: name, Workspace: 8 << 20,
					Labels: map[string]string{LabelOwner: "engine-test"}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close(context.Background()) })
				return s
			}
			a, b := open(), open()
			if r := cell(t, a, "set secret a-only\nspawn-daemon", 0); !strings.HasPrefix(r.Stdout, "daemon ") {
				t.Fatalf("spawning a daemon in a: got %q", r.Stdout)
			}
			sh(t, a, "echo a > /tmp/a-marker && echo a > /workspace/a-marker")
			const procs = `for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < $f; echo; done | grep -c "stockade-test-daemo[n]" || true`
			if got := strings.TrimSpace(sh(t, a, procs)); got == "0" {
				t.Fatalf("a's own daemon is not seen in a (%q): the check cannot see processes", got)
			}
			// a binds an abstract socket and holds it while b looks.
			bind := `import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("\0stockade-isolation")
s.listen(1)
print("bound", flush=True)
time.sleep(20)
`
			bound := make(chan struct{})
			var once sync.Once
			ex, err := a.sb.Start(ctx, sandbox.ExecRequest{File: sandbox.File{Name: "bind.py", Data: []byte(bind)}, Argv: []string{"/usr/bin/python3", "/tmp/bind.py"},
				Env: ProgramEnv(), Timeout: 30 * time.Second, OnOutput: func(_ sandbox.Stream, p []byte) {
					if strings.Contains(string(p), "bound") {
						once.Do(func() { close(bound) })
					}
				}})
			if err != nil {
				t.Fatal(err)
			}
			defer ex.Cancel()
			select {
			case <-bound:
			case <-time.After(20 * time.Second):
				t.Fatal("a's socket was not bound within 20 s")
			}
			look := `import socket
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    c.connect("\0stockade-isolation")
    print("CONNECTED")
except OSError as e:
    print("refused", e.errno)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("\0stockade-isolation")
print("bound too")
`
			res, err := sandbox.Run(ctx, b.sb, sandbox.ExecRequest{File: sandbox.File{Name: "look.py", Data: []byte(look)}, Argv: []string{"/usr/bin/python3", "/tmp/look.py"},
				Env: ProgramEnv(), Timeout: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if out := string(res.Stdout) + string(res.Stderr); !strings.Contains(out, "refused") || !strings.Contains(out, "bound too") {
				t.Errorf("b and a's abstract socket: got %q, want it unreachable and the name free", out)
			}
			if got := strings.TrimSpace(sh(t, b, procs)); got != "0" {
				t.Errorf("b sees %s of a's daemons, want none", got)
			}
			if got := sh(t, b, "ls /tmp/a-marker /workspace/a-marker 2>&1; ls /workspace"); strings.Count(got, "No such file") != 2 {
				t.Errorf("b's /tmp and /workspace: got %q, want neither of a's files", got)
			}
			if r := cell(t, b, "get secret", 0); r.Stdout != "\n" {
				t.Errorf("b's kernel: got %q of a's state, want nothing", r.Stdout)
			}
		})
	}
}

// TestSessionDriversNamed: a session refused for its driver names the
// drivers that keep sessions (those that cannot re-attach too), or says
// that none does (a server whose drivers all run at a provider without
// kernels).
func TestSessionDriversNamed(t *testing.T) {
	remote := &sandboxfake.Driver{ID: "vercel", Tier: sandbox.TierMicroVM}
	local := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor, Sessions: true}
	cluster := &sandboxfake.Driver{ID: "kubernetes", Tier: sandbox.TierGVisor, Sessions: true, NoReattach: true}
	for _, tt := range []struct {
		drivers map[string]sandbox.Driver
		want    string
	}{
		{map[string]sandbox.Driver{"vercel": remote}, "no driver of this server keeps sessions"},
		{map[string]sandbox.Driver{"vercel": remote, "gvisor": local}, "use a tool on the tier of a driver that keeps them (gvisor)"},
		{map[string]sandbox.Driver{"vercel": remote, "kubernetes": cluster}, "use a tool on the tier of a driver that keeps them (kubernetes)"},
	} {
		e := &Engine{drivers: tt.drivers}
		if got := e.sessionDrivers(); got != tt.want {
			t.Errorf("drivers %v: got %q, want %q", slices.Sorted(maps.Keys(tt.drivers)), got, tt.want)
		}
	}
}

// TestSessionWithoutReattach opens a session on a driver that keeps
// sessions but cannot re-attach a sandbox (the docker and kubernetes
// drivers): its sandbox is not detached, has its /workspace, and serves
// cells; NoReattach says why it ends with the daemon. A driver that
// re-attaches has no such reason. (That a driver without Reattach does
// not implement sandbox.Reattacher, so ReattachSessions never asks it,
// is the conformance suite's to check: sandbox/conformance abilities.)
func TestSessionWithoutReattach(t *testing.T) {
	drv := &sandboxfake.Driver{ID: "kubernetes", Tier: sandbox.TierGVisor, Sessions: true, NoReattach: true, Echo: true}
	e, err := New(map[string]sandbox.Driver{drv.ID: drv}, drv.ID, sandboxfake.Images{}, sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		t.Fatal(err)
	}
	s, err := e.OpenSession(t.Context(), SessionSpec{Runtime: "python", Workspace: 1 << 20, Labels: map[string]string{LabelOwner: "engine-test"}})
	if err != nil {
		t.Fatalf("a session on a driver without Reattach: %v", err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	specs := drv.Specs()
	if len(specs) != 1 || specs[0].Detached || specs[0].Workspace != 1<<20 {
		t.Fatalf("the sandboxes asked for: got %+v, want one not detached with a 1 MiB /workspace", specs)
	}
	r, err := s.Cell(t.Context(), CellRequest{Code: "x = 1"})
	if err != nil || r.Stdout != "x = 1" {
		t.Fatalf("a cell: got %+v, %v; want its code echoed", r, err)
	}
	if why := e.NoReattach(drv.ID); !strings.Contains(why, "keeps no sandbox beyond its creator") {
		t.Errorf("NoReattach: got %q, want the driver's Lacks[Reattach]", why)
	}
	local := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor, Sessions: true}
	e2, err := New(map[string]sandbox.Driver{local.ID: local}, local.ID, sandboxfake.Images{}, sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		t.Fatal(err)
	}
	if why := e2.NoReattach(local.ID); why != "" {
		t.Errorf("NoReattach of a driver that re-attaches: got %q, want none", why)
	}
}

// TestSessionPoolNeedsReattach: a session pool's sandboxes are detached,
// so a driver that keeps sessions but cannot re-attach a sandbox (the
// docker and kubernetes drivers) keeps no session pool, and the refusal
// says why; one that re-attaches does.
func TestSessionPoolNeedsReattach(t *testing.T) {
	e := &Engine{poolOpts: PoolOptions{SessionWorkspace: 1 << 20}}
	spec := PoolSpec{Tool: "python", Runtime: "python", Sessions: 1}
	for _, tt := range []struct {
		drv  *sandboxfake.Driver
		want string // "" for none
	}{
		{&sandboxfake.Driver{ID: "kubernetes", Tier: sandbox.TierGVisor, Sessions: true, NoReattach: true},
			"session pools need a driver that re-attaches a sandbox, and the kubernetes driver cannot (the fake driver keeps no sandbox beyond its creator)"},
		{&sandboxfake.Driver{ID: "vercel", Tier: sandbox.TierGVisor}, "the vercel driver cannot keep sessions"},
		{&sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor, Sessions: true}, ""},
	} {
		err := e.sessionKind(&pool{drv: tt.drv}, spec)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("driver %s: got %v, want a session pool", tt.drv.ID, err)
		case tt.want != "" && (!errors.Is(err, errNoBinder) || !strings.Contains(fmt.Sprint(err), tt.want)):
			t.Errorf("driver %s: got %v, want no pool on this tier saying %q", tt.drv.ID, err, tt.want)
		}
	}
}
