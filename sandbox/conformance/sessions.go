package conformance

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// The checks of a sandbox that lives longer than one program: several
// Execs, each ended without ending the sandbox, kernels that keep their
// state and processes between them, and files moved in and out through
// the guest. They run the image's /bin/sh, not the probe.

// sh is an ExecRequest that runs script with /bin/sh.
func sh(script string) sandbox.ExecRequest {
	return sandbox.ExecRequest{File: sandbox.File{Name: "main.sh", Data: []byte(script)}, Argv: []string{"/bin/sh", "{file}"}}
}

// sh runs script to its end and returns its stdout; it fails t unless the
// script exits 0.
func (b *box) sh(t *testing.T, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	res, err := sandbox.Run(ctx, b.sb, sh(script))
	if err != nil {
		t.Fatalf("running %q: %v", script, err)
	}
	if res.Status != sandbox.StatusSucceeded {
		t.Fatalf("script %q: %s exit %d, stderr %q", script, res.Status, res.ExitCode, tail(res.Stderr))
	}
	return string(res.Stdout)
}

// linesOf returns an OnOutput that sends each line of stdout to lines
// (dropping what lines has no room for).
func linesOf(lines chan<- string) func(sandbox.Stream, []byte) {
	var mu sync.Mutex
	var buf []byte
	return func(s sandbox.Stream, p []byte) {
		if s != sandbox.Stdout {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		buf = append(buf, p...)
		for {
			line, rest, ok := bytes.Cut(buf, []byte("\n"))
			if !ok {
				return
			}
			buf = rest
			select {
			case lines <- string(line):
			default:
			}
		}
	}
}

// await waits for the next line of an exec.
func await(t *testing.T, lines <-chan string) string {
	t.Helper()
	select {
	case l := <-lines:
		return l
	case <-time.After(time.Minute):
		t.Fatal("no line from the exec within a minute")
	}
	return ""
}

// execs checks the Exec handle on a sandbox that serves several: Cancel
// ends one program and the next one runs, a second Start while one runs is
// refused, Signal reaches the program, an exit notice is reported before
// the program's processes are reaped but after they stopped, and streamed
// stdin reaches it whole.
func (s *suite) execs(t *testing.T) {
	if !s.caps.Sessions {
		t.Logf("driver %s does not report sessions: one Exec per sandbox", s.h.Driver.Name())
		return
	}
	b := s.start(t, sandbox.Limits{})
	ctx := t.Context()

	t.Run("CancelThenNext", func(t *testing.T) {
		lines := make(chan string, 1)
		req := sh("echo started; sleep 100; echo not reached")
		req.OnOutput = linesOf(lines)
		ex, err := b.sb.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		await(t, lines)
		if _, err := b.sb.Start(ctx, sh("true")); !errdefs.IsConflict(err) {
			t.Errorf("Start while an exec runs: got %v, want ErrConflict", err)
		}
		if err := ex.Cancel(); err != nil {
			t.Fatal(err)
		}
		res, err := ex.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != sandbox.StatusKilled || string(res.Stdout) != "started\n" {
			t.Errorf("cancelled: got %s with stdout %q, want %s with the output so far", res.Status, res.Stdout, sandbox.StatusKilled)
		}
		for i := range 3 {
			if got, want := b.sh(t, fmt.Sprintf("echo next %d", i)), fmt.Sprintf("next %d\n", i); got != want {
				t.Errorf("exec %d after the cancel: got %q, want %q", i, got, want)
			}
		}
	})

	t.Run("Signal", func(t *testing.T) {
		lines := make(chan string, 1)
		req := sh("trap 'echo got TERM; exit 7' TERM; echo ready; while :; do sleep 0.05; done")
		req.OnOutput = linesOf(lines)
		ex, err := b.sb.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		await(t, lines)
		if err := ex.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		res, err := ex.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 7 || !strings.Contains(string(res.Stdout), "got TERM") {
			t.Errorf("got exit %d and %q, want exit 7 from the trap", res.ExitCode, res.Stdout)
		}
	})

	t.Run("ExitNotice", func(t *testing.T) {
		if s.h.Remote {
			// Without the guest nothing reports the program's end
			// before its teardown: the driver runs it as if
			// ExitNotice were not set (sandbox.ExecRequest).
			t.Logf("a remote driver has no guest to give notice")
			return
		}
		// A child counts as fast as it can, each count to a file and then
		// to stdout (ignoring SIGPIPE, so that the end of its stdout does
		// not end it), while the program gives notice of its end and stops
		// itself. The guest reports before it reaps them: had the child
		// run on after its last output, the file would be ahead of it.
		req := sh(`(trap '' PIPE; i=0; while :; do i=$((i+1)); echo $i >>/tmp/notice-count; echo $i; done) &
sleep 0.1; echo 7 >&3; kill -STOP $$; echo not reached`)
		req.ExitNotice = true
		res, err := sandbox.Run(ctx, b.sb, req)
		if err != nil {
			t.Fatal(err)
		}
		out := strings.Fields(string(res.Stdout))
		if res.ExitCode != 7 || res.StdoutTruncated || len(out) == 0 || out[len(out)-1] == "reached" {
			t.Fatalf("got %s exit %d, %d lines (truncated %v), want exit 7 and the child's counts", res.Status, res.ExitCode, len(out), res.StdoutTruncated)
		}
		last, err := strconv.Atoi(out[len(out)-1])
		if err != nil {
			t.Fatalf("last line %q is not a count", out[len(out)-1])
		}
		after, err := strconv.Atoi(strings.TrimSpace(b.sh(t, "tail -n 1 /tmp/notice-count")))
		if err != nil {
			t.Fatal(err)
		}
		if after > last+1 {
			t.Errorf("the child counted to %d, its output to the report ends at %d: it ran after the report", after, last)
		}
		t.Logf("counted to %d before the report", last)
	})

	t.Run("StreamedStdin", func(t *testing.T) {
		req := sh("cat; echo end")
		req.StdinStream = true
		if s.h.Remote {
			// A provider's command takes its stdin whole, or none: the
			// driver refuses a stream rather than run without it.
			if _, err := b.sb.Start(ctx, req); !errdefs.IsInvalidArgument(err) {
				t.Errorf("a remote driver's Start with StdinStream: got %v, want ErrInvalidArgument", err)
			}
			return
		}
		ex, err := b.sb.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		in := bytes.Repeat([]byte("streamed\x00stdin\n"), 20_000)
		if _, err := ex.Stdin().Write(in); err != nil {
			t.Fatal(err)
		}
		if err := ex.Stdin().Close(); err != nil {
			t.Fatal(err)
		}
		res, err := ex.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(res.Stdout, append(in, "end\n"...)) {
			t.Errorf("got %d bytes back, want the %d fed and end", len(res.Stdout), len(in))
		}
	})
}

// testKernel is the kernel spec of the guest's test kernel (a mode of the
// guest binary, which every sandbox has: see cmd/stockade-guest).
var testKernel = sandbox.KernelSpec{Argv: []string{profile.GuestPath, "stockade-kernel-test"}}

// cell runs code in k and fails t unless it ends ok.
func cell(t *testing.T, k sandbox.Kernel, code string) *sandbox.CellResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	res, err := k.Run(ctx, sandbox.Cell{Code: code})
	if err != nil {
		t.Fatalf("cell %q: %v", code, err)
	}
	if res.Status != sandbox.CellOK {
		t.Fatalf("cell %q: %s %+v", code, res.Status, res.Error)
	}
	return res
}

// startKernel starts the test kernel in b.
func (b *box) startKernel(t *testing.T) sandbox.Kernel {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	k, err := b.sb.(sandbox.Kernels).StartKernel(ctx, testKernel)
	if err != nil {
		t.Fatalf("starting the test kernel: %v", err)
	}
	return k
}

// alive reports, for each pid, whether it runs in b: "alive" or "gone".
func (b *box) alive(t *testing.T, pids ...int) string {
	t.Helper()
	var s strings.Builder
	for _, p := range pids {
		fmt.Fprintf(&s, "if kill -0 %d 2>/dev/null; then echo alive; else echo gone; fi\n", p)
	}
	return strings.Join(strings.Fields(b.sh(t, s.String())), " ")
}

// kernels checks that a kernel keeps its state between cells and across
// Execs, and that an Exec's daemon does not outlive the Exec while the
// kernel, and a daemon the kernel started, stay until the kernel stops.
func (s *suite) kernels(t *testing.T) {
	if !s.caps.Kernels {
		t.Logf("driver %s does not run kernels: %s", s.h.Driver.Name(), s.caps.Lacks["Kernels"])
		return
	}
	b := s.start(t, sandbox.Limits{})
	k := b.startKernel(t)
	cell(t, k, "set answer 42")
	b.sh(t, "true")
	res := cell(t, k, "print before\neprint to stderr\nget answer\ndisplay text/html <b>x</b>")
	if string(res.Stdout) != "before\n42\n" || string(res.Stderr) != "to stderr\n" {
		t.Errorf("got stdout %q stderr %q, want the cell's output", res.Stdout, res.Stderr)
	}
	if res.Value == nil || string(res.Value.Data) != "42" || len(res.Displays) != 1 || res.Displays[0].MimeType != "text/html" {
		t.Errorf("got value %+v displays %+v, want 42 and one text/html display", res.Value, res.Displays)
	}
	ctx := t.Context()
	if r, err := k.Run(ctx, sandbox.Cell{Code: "fail boom"}); err != nil || r.Status != sandbox.CellRaised || r.Error == nil || r.Error.Value != "boom" {
		t.Errorf("a failing cell: got %+v, %v; want it raised boom", r, err)
	}

	var kd int
	if _, err := fmt.Sscanf(string(cell(t, k, "spawn-daemon").Stdout), "daemon %d", &kd); err != nil {
		t.Fatalf("the kernel's daemon: %v", err)
	}
	out := b.sh(t, `sh -c 'setsid sh -c "sleep 1000 & echo \$! > /tmp/daemon.pid" &'
for i in $(seq 50); do [ -s /tmp/daemon.pid ] && break; sleep 0.1; done
d=$(cat /tmp/daemon.pid); kill -0 $d && echo $d`)
	ed, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("the exec's daemon: %q", out)
	}
	kernelPID := strings.TrimSpace(b.sh(t, "for f in /proc/[0-9]*/cmdline; do if tr '\\0' ' ' < $f 2>/dev/null | grep -q '^"+profile.GuestPath+" stockade-kernel-test'; then basename $(dirname $f); fi; done"))
	kp, err := strconv.Atoi(kernelPID)
	if err != nil {
		t.Fatalf("finding the kernel process: %q", kernelPID)
	}
	if got, want := b.alive(t, ed, kd, kp), "gone alive alive"; got != want {
		t.Errorf("after the exec: exec's daemon, kernel's daemon, kernel: got %q, want %q", got, want)
	}
	if got := cell(t, k, "get answer").Stdout; string(got) != "42\n" {
		t.Errorf("the kernel lost its state: got %q, want 42", got)
	}
	kernels, err := b.sb.(sandbox.Kernels).ListKernels(ctx)
	if err != nil || len(kernels) != 1 || kernels[0].ID() != k.ID() {
		t.Errorf("ListKernels: got %v, %v; want the one kernel %s", kernels, err, k.ID())
	}

	if err := k.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-k.Done():
	default:
		t.Error("Stop returned and the kernel is not done")
	}
	if got, want := b.alive(t, kd, kp), "gone gone"; got != want {
		t.Errorf("after Stop: kernel's daemon, kernel: got %q, want %q", got, want)
	}
	if _, err := k.Run(ctx, sandbox.Cell{Code: "get answer"}); err == nil {
		t.Error("a cell in a stopped kernel ran")
	}
}

// files checks the file operations: a round trip, the bounds, symlinks
// planted at and on the way to a path (never followed), paths outside the
// roots or with .. (refused before anything is sent), and a directory
// swapped for a symlink while the host reads and writes through it.
func (s *suite) files(t *testing.T) {
	if !s.caps.Files {
		t.Logf("driver %s moves no files: %s", s.h.Driver.Name(), s.caps.Lacks["Files"])
		return
	}
	b := s.start(t, sandbox.Limits{})
	fs := b.sb.(sandbox.Files)
	ctx := t.Context()

	t.Run("RoundTrip", func(t *testing.T) {
		p := "/tmp/f/a/b.txt"
		data := bytes.Repeat([]byte("0123456789"), 10_000)
		if n, err := fs.WriteFile(ctx, p, 0o640, bytes.NewReader(data), 1<<20); err != nil || n != int64(len(data)) {
			t.Fatalf("write: %d, %v", n, err)
		}
		got, info, err := fs.ReadFile(ctx, p, 1<<20)
		if err != nil || !bytes.Equal(got, data) || info.Size != int64(len(data)) || info.Mode != 0o640 {
			t.Fatalf("read: %d bytes, %+v, %v; want what was written, mode 0640", len(got), info, err)
		}
		if got := b.sh(t, "wc -c < "+p); strings.TrimSpace(got) != strconv.Itoa(len(data)) {
			t.Errorf("the program sees %s bytes, want %d", got, len(data))
		}
		if got, info, err := fs.ReadFile(ctx, p, 5); err != nil || string(got) != "01234" || info.Size != int64(len(data)) {
			t.Errorf("read of 5: got %q %+v, %v; want 01234 and the whole size", got, info, err)
		}
		if err := fs.Mkdir(ctx, "/tmp/f/a/c", 0o700); err != nil {
			t.Fatal(err)
		}
		entries, truncated, err := fs.ListDir(ctx, "/tmp/f/a")
		var names []string
		for _, e := range entries {
			names = append(names, e.Name+":"+string(e.Type))
		}
		if got := strings.Join(names, " "); err != nil || truncated || (got != "b.txt:file c:dir" && got != "c:dir b.txt:file") {
			t.Errorf("list: got %q, %v, %v; want b.txt and c", got, truncated, err)
		}
		if _, err := fs.WriteFile(ctx, "/tmp/f/a/big", 0, bytes.NewReader(data), 1000); !errdefs.IsTooLarge(err) {
			t.Errorf("write over its bound: got %v, want ErrTooLarge", err)
		}
		if _, err := fs.Stat(ctx, "/tmp/f/a/big"); !errdefs.IsNotFound(err) {
			t.Errorf("after the refused write: stat got %v, want ErrNotFound", err)
		}
		for _, q := range []string{p, "/tmp/f/a/c"} {
			if err := fs.Remove(ctx, q); err != nil {
				t.Errorf("remove %s: %v", q, err)
			}
		}
		if _, err := fs.Stat(ctx, p); !errdefs.IsNotFound(err) {
			t.Errorf("stat of a removed file: got %v, want ErrNotFound", err)
		}
	})

	t.Run("HostileSymlinks", func(t *testing.T) {
		b.sh(t, `mkdir -p /tmp/h/victimdir; echo secret > /tmp/h/victim; chmod 666 /tmp/h/victim; echo secret > /tmp/h/victimdir/f
ln -s /tmp/h/victim /tmp/h/link; ln -s /tmp/h/victimdir /tmp/h/dirlink; ln -s /etc /tmp/h/etc`)
		for _, p := range []string{"/tmp/h/link", "/tmp/h/dirlink/f", "/tmp/h/etc/passwd"} {
			if got, _, err := fs.ReadFile(ctx, p, 100); err == nil {
				t.Errorf("read %s through a symlink: got %q, want refused", p, got)
			}
		}
		for _, p := range []string{"/tmp/h/dirlink/new", "/tmp/h/etc/new"} {
			if _, err := fs.WriteFile(ctx, p, 0, strings.NewReader("x"), 10); err == nil {
				t.Errorf("write %s through a symlinked directory succeeded", p)
			}
			if err := fs.Mkdir(ctx, p, 0); err == nil {
				t.Errorf("mkdir %s through a symlinked directory succeeded", p)
			}
		}
		if _, _, err := fs.ListDir(ctx, "/tmp/h/dirlink"); err == nil {
			t.Error("list of a symlinked directory succeeded")
		}
		if info, err := fs.Stat(ctx, "/tmp/h/link"); err != nil || info.Type != sandbox.TypeSymlink {
			t.Errorf("stat of a symlink: got %+v, %v; want the symlink itself", info, err)
		}
		// A write at a symlink replaces the link, not its target; a
		// removal removes the link.
		if _, err := fs.WriteFile(ctx, "/tmp/h/link", 0, strings.NewReader("replaced"), 100); err != nil {
			t.Fatal(err)
		}
		if err := fs.Remove(ctx, "/tmp/h/dirlink"); err != nil {
			t.Fatal(err)
		}
		if got := b.sh(t, "cat /tmp/h/victim /tmp/h/victimdir/f /tmp/h/link; [ -L /tmp/h/link ] && echo still a link; true"); got != "secret\nsecret\nreplaced" {
			t.Errorf("after writing at the link and removing the other: got %q, want both victims intact and the link a file", got)
		}
	})

	t.Run("BadPaths", func(t *testing.T) {
		for _, p := range []string{"/etc/passwd", "/tmp/../etc/passwd", "/tmp/h/../../etc/passwd", "/tmp/a\x00b", "relative", "/tmp/" + strings.Repeat("n", 256)} {
			if _, _, err := fs.ReadFile(ctx, p, 10); !errdefs.IsInvalidArgument(err) {
				t.Errorf("read %.40q: got %v, want ErrInvalidArgument", p, err)
			}
			if _, err := fs.WriteFile(ctx, p, 0, strings.NewReader("x"), 10); !errdefs.IsInvalidArgument(err) {
				t.Errorf("write %.40q: got %v, want ErrInvalidArgument", p, err)
			}
		}
	})

	t.Run("SymlinkRace", func(t *testing.T) {
		b.sh(t, "mkdir -p /tmp/r/A /tmp/r/V; echo real > /tmp/r/A/f; echo secret > /tmp/r/V/f")
		lines := make(chan string, 1)
		req := sh("cd /tmp/r; echo swapping\nwhile :; do mv A A.real; ln -s V A; rm A; mv A.real A; done")
		req.OnOutput = linesOf(lines)
		swapper, err := b.sb.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		await(t, lines)
		const iterations = 200
		refused := 0
		for i := range iterations {
			got, _, err := fs.ReadFile(ctx, "/tmp/r/A/f", 100)
			switch {
			case err == nil && string(got) != "real\n":
				t.Fatalf("iteration %d: read %q through the swapped directory", i, got)
			case err != nil:
				refused++
			}
			_, _ = fs.WriteFile(ctx, fmt.Sprintf("/tmp/r/A/w%d", i), 0, strings.NewReader("w"), 10)
		}
		_ = swapper.Cancel()
		if _, err := swapper.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		entries, _, err := fs.ListDir(ctx, "/tmp/r/V")
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 {
			t.Errorf("the victim directory holds %d entries, want its one file: a write went through the symlink", len(entries))
		}
		t.Logf("%d iterations, %d refused while the directory was a symlink", iterations, refused)
	})

	t.Run("Gone", func(t *testing.T) {
		// After Destroy every operation says the sandbox is gone.
		b.destroy(t)
		if _, _, err := fs.ReadFile(ctx, "/tmp/x", 10); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("read after Destroy: got %v, want ErrFailedPrecondition", err)
		}
		if ks, ok := b.sb.(sandbox.Kernels); ok {
			if _, err := ks.StartKernel(ctx, testKernel); !errdefs.IsFailedPrecondition(err) {
				t.Errorf("kernel after Destroy: got %v, want ErrFailedPrecondition", err)
			}
		}
	})
}
