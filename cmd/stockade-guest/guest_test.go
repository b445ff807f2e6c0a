package main

// These tests run the real, statically built guest as a subprocess outside a
// sandbox and drive it over pipes. Outside a PID namespace the guest is not
// PID 1 and kills only the program's process group (see killAll); the
// PID-namespace test, which needs root, exercises the PID 1 path. When the
// tests run as root the guest runs as nobody (65534), as in a sandbox.

import (
	"bufio"
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
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

	"github.com/stockade-sh/stockade/guest"
)

// guestBin is the guest binary built by TestMain.
var guestBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "stockade-guest-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The guest may run as nobody: its directory must be searchable.
	os.Chmod(dir, 0o755)
	guestBin = filepath.Join(dir, "stockade-guest")
	build := exec.Command("go", "build", "-o", guestBin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building stockade-guest: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const frameTimeout = 20 * time.Second

// lockedBuffer is the guest's stderr, written by os/exec's copier and read
// by the test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testGuest is a running guest driven by a test through guest.Client, or
// raw when the test speaks the protocol itself.
type testGuest struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	c      *guest.Client
	stderr lockedBuffer

	waitOnce sync.Once
	waitErr  error
}

// guestOption adjusts the guest's command before it starts.
type guestOption func(*exec.Cmd)

// inPIDNamespace runs the guest as PID 1 of a new PID namespace.
func inPIDNamespace(c *exec.Cmd) {
	c.SysProcAttr.Cloneflags |= syscall.CLONE_NEWPID
}

// startGuest starts a guest and connects a client to it.
func startGuest(t *testing.T, opts ...guestOption) *testGuest {
	t.Helper()
	g := startRaw(t, opts...)
	ctx, cancel := context.WithTimeout(t.Context(), frameTimeout)
	defer cancel()
	c, err := guest.Handshake(ctx, g.stdout, g.stdin)
	if err != nil {
		t.Fatalf("handshake: %v (guest stderr: %q)", err, g.stderr.String())
	}
	if c.Version() != guest.MaxVersion {
		t.Fatalf("got version %d, want %d", c.Version(), guest.MaxVersion)
	}
	g.c = c
	t.Cleanup(func() {
		if st := c.Stats(); st != (guest.Stats{}) {
			t.Errorf("the client dropped frames: %+v", st)
		}
	})
	return g
}

// startRaw starts a guest without reading its hello.
func startRaw(t *testing.T, opts ...guestOption) *testGuest {
	t.Helper()
	g := &testGuest{t: t}
	g.cmd = exec.Command(guestBin)
	// A marker the guest's programs must never see (TestEnvIsExact).
	g.cmd.Env = []string{"STOCKADE_GUEST_TEST_LEAK=1"}
	g.cmd.Stderr = &g.stderr
	g.cmd.SysProcAttr = &syscall.SysProcAttr{}
	if os.Geteuid() == 0 {
		g.cmd.SysProcAttr.Credential = &syscall.Credential{Uid: 65534, Gid: 65534}
	}
	for _, o := range opts {
		o(g.cmd)
	}
	var err error
	if g.stdin, err = g.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := g.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	g.stdout = bufio.NewReader(stdout)
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.stdin.Close()
		done := make(chan struct{})
		go func() { g.wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			g.cmd.Process.Kill()
			<-done
		}
		// Only set when the guest is built with -race (by hand: TestMain
		// builds it with cgo off).
		if strings.Contains(g.stderr.String(), "DATA RACE") {
			t.Errorf("guest stderr: %s", g.stderr.String())
		}
	})
	return g
}

func (g *testGuest) wait() error {
	g.waitOnce.Do(func() { g.waitErr = g.cmd.Wait() })
	return g.waitErr
}

// exitCode waits for the guest to exit and returns its exit code.
func (g *testGuest) exitCode() int {
	g.t.Helper()
	done := make(chan error, 1)
	go func() { done <- g.wait() }()
	select {
	case <-done:
	case <-time.After(frameTimeout):
		g.t.Fatal("guest did not exit")
	}
	return g.cmd.ProcessState.ExitCode()
}

func (g *testGuest) ctx() context.Context {
	ctx, cancel := context.WithTimeout(g.t.Context(), frameTimeout)
	g.t.Cleanup(cancel)
	return ctx
}

// result is the outcome of one exec: the host's view, or the guest's
// refusal.
type result struct {
	stdout, stderr []byte
	exit           *guest.ExitReport // nil if the guest refused the exec
	errMsg         string
	errCode        string
}

func (g *testGuest) start(req guest.ExecRequest, opts guest.ExecOptions) *guest.Exec {
	g.t.Helper()
	if opts.OutputCap == 0 {
		opts.OutputCap = max(req.OutputCap, 0)
	}
	ex, err := g.c.Exec(g.ctx(), req, opts)
	if err != nil {
		g.t.Fatal(err)
	}
	return ex
}

func (g *testGuest) wait1(ex *guest.Exec) result {
	g.t.Helper()
	res, err := ex.Wait(g.ctx())
	r := result{stdout: res.Stdout, stderr: res.Stderr, exit: res.Exit}
	var gerr *guest.Error
	switch {
	case errors.As(err, &gerr):
		if gerr.Message == "" {
			g.t.Fatal("empty error message")
		}
		r.errMsg, r.errCode = gerr.Message, gerr.Code
	case err != nil:
		g.t.Fatalf("exec: %v (guest stderr: %q)", err, g.stderr.String())
	}
	return r
}

func (g *testGuest) exec(req guest.ExecRequest) result {
	g.t.Helper()
	return g.wait1(g.start(req, guest.ExecOptions{}))
}

// mustExit runs req and fails unless the program ran to an exit report.
func (g *testGuest) mustExit(req guest.ExecRequest) result {
	g.t.Helper()
	r := g.exec(req)
	if r.exit == nil {
		g.t.Fatalf("got error %q, want an exit report", r.errMsg)
	}
	return r
}

// workDir returns a fresh directory under /tmp, where ValidatePath lets the
// guest write, writable by the guest's uid.
func workDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "stockade-guest-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// shell is a request that runs script with /bin/sh from a file in dir.
func shell(dir, script string) guest.ExecRequest {
	return guest.ExecRequest{
		File:      &guest.FileSpec{Path: dir + "/main.sh", Data: []byte(script)},
		Argv:      []string{"/bin/sh", "{file}"},
		OutputCap: 1 << 20,
	}
}

func TestExitCodeAndStreams(t *testing.T) {
	g := startGuest(t)
	dir := workDir(t)
	req := shell(dir, "echo out; echo err >&2; pwd >&2; exit 3")
	// Parent directories are created as needed.
	req.File.Path = dir + "/a/b/main.sh"
	r := g.mustExit(req)
	if got, want := string(r.stdout), "out\n"; got != want {
		t.Errorf("got stdout %q, want %q", got, want)
	}
	if got, want := string(r.stderr), "err\n"+dir+"/a/b\n"; got != want {
		t.Errorf("got stderr %q, want %q", got, want)
	}
	if r.exit.ExitCode != 3 || r.exit.Signal != 0 {
		t.Errorf("got exit %d signal %d, want 3 and 0", r.exit.ExitCode, r.exit.Signal)
	}
}

func TestKilledBySignal(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		signal int
	}{
		{"kill", "echo before; kill -KILL $$; echo after", 9},
		{"term", "kill -TERM $$", 15},
		{"usr1", "kill -USR1 $$", 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startGuest(t)
			r := g.mustExit(shell(workDir(t), tc.script))
			if r.exit.ExitCode != -1 || r.exit.Signal != tc.signal {
				t.Errorf("got exit %d signal %d, want -1 and %d", r.exit.ExitCode, r.exit.Signal, tc.signal)
			}
		})
	}
}

func TestOutputCap(t *testing.T) {
	const limit = 1_000_003 // not a multiple of guest.MaxChunk
	g := startGuest(t)
	req := shell(workDir(t), "head -c 5242880 /dev/zero; head -c 5242880 /dev/zero >&2; echo done")
	req.OutputCap = limit
	// The host keeps more than the guest's cap: what it gets is what the
	// guest forwarded.
	r := g.wait1(g.start(req, guest.ExecOptions{OutputCap: 2 * limit}))
	if len(r.stdout) != limit || len(r.stderr) != limit {
		t.Errorf("got %d stdout and %d stderr bytes, want %d each", len(r.stdout), len(r.stderr), limit)
	}
	if bytes.IndexFunc(r.stdout, func(c rune) bool { return c != 0 }) >= 0 {
		t.Error("stdout is not the program's zeros")
	}
	if r.exit.ExitCode != 0 {
		t.Errorf("got exit %d, want 0 (the program must not block on a full pipe)", r.exit.ExitCode)
	}
}

func TestStdin(t *testing.T) {
	g := startGuest(t)
	dir := workDir(t)
	in := bytes.Repeat([]byte("stdin\x00line\n"), 30_000) // larger than a pipe buffer
	req := guest.ExecRequest{
		File:      &guest.FileSpec{Path: dir + "/unused"},
		Argv:      []string{"/bin/cat"},
		Stdin:     in,
		OutputCap: 1 << 20,
	}
	r := g.mustExit(req)
	if !bytes.Equal(r.stdout, in) {
		t.Errorf("got %d bytes back, want the %d bytes fed", len(r.stdout), len(in))
	}

	// A program that never reads its stdin still completes.
	req = shell(dir, "exit 0")
	req.Stdin = bytes.Repeat([]byte("x"), 1<<20)
	if r := g.mustExit(req); r.exit.ExitCode != 0 {
		t.Errorf("got exit %d, want 0", r.exit.ExitCode)
	}
}

func TestEnvIsExact(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"nil", nil, ""},
		{"given", []string{"A=1", "B=two words"}, "A=1\nB=two words\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startGuest(t)
			r := g.mustExit(guest.ExecRequest{
				File:      &guest.FileSpec{Path: workDir(t) + "/unused"},
				Argv:      []string{"/usr/bin/env"},
				Env:       tc.env,
				OutputCap: 1 << 20,
			})
			if got := string(r.stdout); got != tc.want {
				t.Errorf("got environment %q, want %q", got, tc.want)
			}
		})
	}
}

func TestSeveralExecs(t *testing.T) {
	g := startGuest(t)
	dir := workDir(t)
	for i, tc := range []struct {
		script string
		mode   uint32
		want   string
		code   int
	}{
		{"echo one; exit 1", 0, "one\n", 1},
		// The same path again: the old file is replaced.
		{"echo two", 0o600, "two\n", 0},
		{"echo three; sleep 100 & echo bg", 0o755, "three\nbg\n", 0},
	} {
		req := shell(dir, tc.script)
		req.File.Mode = tc.mode
		r := g.mustExit(req)
		if string(r.stdout) != tc.want || r.exit.ExitCode != tc.code {
			t.Errorf("exec %d: got %q exit %d, want %q exit %d", i, r.stdout, r.exit.ExitCode, tc.want, tc.code)
		}
		want := os.FileMode(tc.mode)
		if want == 0 {
			want = 0o644
		}
		if fi, err := os.Stat(req.File.Path); err != nil || fi.Mode().Perm() != want {
			t.Errorf("exec %d: file mode %v (%v), want %v", i, fi.Mode().Perm(), err, want)
		}
	}
}

func TestExecutableFile(t *testing.T) {
	g := startGuest(t)
	dir := workDir(t)
	req := guest.ExecRequest{
		File:      &guest.FileSpec{Path: dir + "/run", Data: []byte("#!/bin/sh\necho \"$0\" \"$1\"\n"), Mode: 0o700},
		Argv:      []string{"{file}", "--in={file}"},
		OutputCap: 1 << 20,
	}
	r := g.mustExit(req)
	if got, want := string(r.stdout), dir+"/run --in="+dir+"/run\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestPlantedSymlinks checks that code from an earlier exec cannot redirect
// the guest's write of a later exec's file.
func TestPlantedSymlinks(t *testing.T) {
	g := startGuest(t)
	dir := workDir(t)
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("victim"), 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(victim, 0o666) // writable, so only O_NOFOLLOW protects it
	os.Mkdir(dir+"/real", 0o777)
	os.Chmod(dir+"/real", 0o777)

	plant := fmt.Sprintf("ln -s %[1]s/victim %[1]s/code.sh && ln -s %[1]s/real %[1]s/link", dir)
	if r := g.mustExit(shell(dir, plant)); r.exit.ExitCode != 0 {
		t.Fatalf("planting symlinks: exit %d, %s", r.exit.ExitCode, r.stderr)
	}

	req := shell(dir, "echo replaced")
	req.File.Path = dir + "/code.sh"
	if r := g.mustExit(req); string(r.stdout) != "replaced\n" {
		t.Errorf("got %q, want %q", r.stdout, "replaced\n")
	}
	if b, _ := os.ReadFile(victim); string(b) != "victim" {
		t.Errorf("victim was overwritten with %q", b)
	}
	if fi, err := os.Lstat(dir + "/code.sh"); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("code.sh is not a regular file: %v", err)
	}

	req.File.Path = dir + "/link/code.sh"
	if r := g.exec(req); r.errCode != guest.ErrorSymlink {
		t.Errorf("got error %q, want a refused symlinked directory", r.errMsg)
	}
	if _, err := os.Lstat(dir + "/real/code.sh"); err == nil {
		t.Error("file written through a symlinked directory")
	}
}

// TestRefusedRequests checks that requests the guest cannot run are answered
// with FrameError and leave the guest serving.
func TestRefusedRequests(t *testing.T) {
	g := startGuest(t)
	dir := workDir(t)
	for _, tc := range []struct {
		name   string
		modify func(*guest.ExecRequest)
		want   string
	}{
		{"path outside tmp", func(r *guest.ExecRequest) { r.File.Path = "/etc/passwd" }, "not under /tmp"},
		{"relative path", func(r *guest.ExecRequest) { r.File.Path = "tmp/x" }, "not clean and absolute"},
		{"unclean path", func(r *guest.ExecRequest) { r.File.Path = "/tmp/../etc/x" }, "not clean and absolute"},
		{"relative program", func(r *guest.ExecRequest) { r.Argv = []string{"sh", "{file}"} }, "not an absolute path"},
		{"zero output cap", func(r *guest.ExecRequest) { r.OutputCap = 0 }, "output cap"},
		{"negative output cap", func(r *guest.ExecRequest) { r.OutputCap = -1 }, "output cap"},
		{"setuid mode", func(r *guest.ExecRequest) { r.File.Mode = 0o4755 }, "bits outside 0777"},
		{"missing program", func(r *guest.ExecRequest) { r.Argv = []string{"/nonexistent/python3"} },
			"starting /nonexistent/python3: no such file or directory"},
		{"not executable", func(r *guest.ExecRequest) { r.Argv = []string{"{file}"} }, "permission denied"},
		{"nul in argv", func(r *guest.ExecRequest) { r.Argv = []string{"/bin/sh", "a\x00b"} }, "starting /bin/sh"},
		{"existing directory", func(r *guest.ExecRequest) { r.File.Path = dir }, "writing " + dir},
		{"cwd relative", func(r *guest.ExecRequest) { r.Cwd = "tmp" }, "not an absolute path"},
		{"stdin given and streamed", func(r *guest.ExecRequest) { r.Stdin, r.StdinStream = []byte("x"), true }, "stdin given and streamed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := shell(dir, "echo ran")
			tc.modify(&req)
			r := g.exec(req)
			if r.exit != nil {
				t.Fatalf("got exit report %+v, want an error", *r.exit)
			}
			if !strings.Contains(r.errMsg, tc.want) {
				t.Errorf("got error %q, want it to contain %q", r.errMsg, tc.want)
			}
		})
	}
	if r := g.mustExit(shell(dir, "echo still serving")); string(r.stdout) != "still serving\n" {
		t.Errorf("got %q after refused requests", r.stdout)
	}
}

// rawFrame is one v2 frame with a payload of any length.
func rawFrame(t guest.FrameType, id uint32, p string) []byte {
	return append(header(t, id, uint32(len(p))), p...)
}

func header(t guest.FrameType, id, n uint32) []byte {
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32([]byte{byte(t)}, id), n)
}

// rawAccept reads the guest's hello and answers it, leaving the stream to
// the test.
func (g *testGuest) rawAccept() {
	g.t.Helper()
	h, err := guest.ReadHello(g.stdout)
	if err != nil {
		g.t.Fatal(err)
	}
	if h.Min != guest.MinVersion || h.Max != guest.MaxVersion || h.Version != guest.MaxVersion {
		g.t.Fatalf("got hello %+v, want versions %d..%d", h, guest.MinVersion, guest.MaxVersion)
	}
	if _, err := g.stdin.Write(guest.AppendAccept(nil, guest.MaxVersion)); err != nil {
		g.t.Fatal(err)
	}
}

func (g *testGuest) next() guest.Frame {
	g.t.Helper()
	got := make(chan guest.Frame, 1)
	fail := make(chan error, 1)
	go func() {
		f, err := guest.ReadFrame(g.stdout, 0)
		if err != nil {
			fail <- err
			return
		}
		got <- f
	}()
	select {
	case f := <-got:
		return f
	case err := <-fail:
		g.t.Fatalf("reading frame: %v (guest stderr: %q)", err, g.stderr.String())
	case <-time.After(frameTimeout):
		g.t.Fatal("no frame from guest")
	}
	panic("unreachable")
}

// TestMalformedFrame checks that a frame the guest cannot parse ends it
// with a FrameError of id 0 and exit code 1, while a request it can parse
// but not serve is answered with a FrameError and leaves it serving.
func TestMalformedFrame(t *testing.T) {
	for _, tc := range []struct {
		name  string
		raw   []byte
		close bool   // close stdin after raw
		code  string // the error reply's code; "" for a fatal error
	}{
		{"bad json", rawFrame(guest.FrameExec, 1, "{"), false, guest.ErrorInvalid},
		{"json of the wrong shape", rawFrame(guest.FrameExec, 1, "[]"), false, guest.ErrorInvalid},
		{"unknown field", rawFrame(guest.FrameExec, 1, `{"argv":["/bin/true"],"bogus":1}`), false, guest.ErrorInvalid},
		{"empty payload", rawFrame(guest.FrameExec, 1, ""), false, guest.ErrorInvalid},
		{"empty argv", rawFrame(guest.FrameExec, 1, `{"argv":[],"env":null,"output_cap":1}`), false, guest.ErrorInvalid},
		{"frame for the host", rawFrame(guest.FrameStdout, 1, "hi"), false, guest.ErrorUnsupported},
		{"unknown type", rawFrame('q', 1, ""), false, guest.ErrorUnsupported},
		{"oversize", header(guest.FrameExec, 1, guest.MaxPayload+1), false, ""},
		{"huge length", header(guest.FrameExec, 1, 0xffffffff), false, ""},
		{"truncated payload", append(header(guest.FrameExec, 1, 10), "abc"...), true, ""},
		{"truncated header", []byte{byte(guest.FrameExec), 0}, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startRaw(t)
			g.rawAccept()
			if _, err := g.stdin.Write(tc.raw); err != nil {
				t.Fatal(err)
			}
			if tc.close {
				g.stdin.Close()
			}
			f := g.next()
			var e guest.ErrorReply
			if f.Type != guest.FrameError || guest.DecodeStrict(f.Payload, &e) != nil || e.Message == "" {
				t.Fatalf("got frame %s %q, want an error reply", f.Type, f.Payload)
			}
			if tc.code == "" {
				if f.ID != 0 || e.Code != guest.ErrorProtocol {
					t.Errorf("got error %d %q, want id 0 and code %q", f.ID, e.Code, guest.ErrorProtocol)
				}
				if code := g.exitCode(); code != 1 {
					t.Errorf("got exit code %d, want 1", code)
				}
				return
			}
			if f.ID != 1 || e.Code != tc.code {
				t.Errorf("got error %d %q (%s), want id 1 and code %q", f.ID, e.Code, e.Message, tc.code)
			}
			// Still serving.
			if _, err := g.stdin.Write(rawFrame(guest.FramePing, 2, "")); err != nil {
				t.Fatal(err)
			}
			if f := g.next(); f.Type != guest.FrameResult || f.ID != 2 {
				t.Errorf("got %s frame for %d after the error, want the pong of 2", f.Type, f.ID)
			}
		})
	}
}

// TestHandshakeRefused checks that the guest ends on a first frame that is
// not an Accept it can speak.
func TestHandshakeRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		raw  []byte
	}{
		{"version 1", guest.AppendAccept(nil, 1)},
		{"version 3", guest.AppendAccept(nil, guest.MaxVersion+1)},
		{"an exec first", []byte{'X', 0, 0, 0, 2, '{', '}'}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startRaw(t)
			if _, err := guest.ReadHello(g.stdout); err != nil {
				t.Fatal(err)
			}
			g.stdin.Write(tc.raw)
			f := g.next()
			if f.Type != guest.FrameError || f.ID != 0 {
				t.Errorf("got %s frame %d, want the fatal error", f.Type, f.ID)
			}
			if code := g.exitCode(); code != 1 {
				t.Errorf("got exit code %d, want 1", code)
			}
		})
	}
}

// TestExecWhileExecRuns checks that a second exec is refused as busy while
// one runs, and that the first one is unharmed.
func TestExecWhileExecRuns(t *testing.T) {
	g := startGuest(t)
	dir := workDir(t)
	started := make(chan struct{})
	var once sync.Once
	first := g.start(shell(dir, "echo started; exec sleep 100"), guest.ExecOptions{OnOutput: func(guest.Stream, []byte) { once.Do(func() { close(started) }) }})
	<-started
	if r := g.exec(shell(dir, "echo second")); r.errCode != guest.ErrorBusy {
		t.Fatalf("second exec: got %+v, want busy", r)
	}
	first.Cancel()
	if r := g.wait1(first); r.exit == nil || !r.exit.Cancelled || r.exit.Signal != 9 {
		t.Errorf("first exec: got %+v, want cancelled by SIGKILL", r.exit)
	}
}

func TestEOFExits(t *testing.T) {
	g := startGuest(t)
	g.stdin.Close()
	if code := g.exitCode(); code != 0 {
		t.Errorf("got exit code %d, want 0", code)
	}
	if g.stderr.String() != "" {
		t.Errorf("got stderr %q, want none", g.stderr.String())
	}
}

func TestEOFDuringExecKillsProgram(t *testing.T) {
	g := startGuest(t)
	out := make(chan []byte, 1)
	g.start(shell(workDir(t), "echo $$; exec sleep 100"), guest.ExecOptions{OnOutput: func(_ guest.Stream, p []byte) { out <- append([]byte(nil), p...) }})
	pid, err := strconv.Atoi(strings.TrimSpace(string(<-out)))
	if err != nil {
		t.Fatal(err)
	}
	g.stdin.Close()
	if code := g.exitCode(); code != 0 {
		t.Errorf("got exit code %d, want 0", code)
	}
	// The guest reaped the program before exiting, so the pid is gone.
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("program %d still exists after the guest exited: %v", pid, err)
	}
}

func TestBackgroundProcessHoldingOutput(t *testing.T) {
	g := startGuest(t)
	// The background sleep holds stdout open; the guest must kill it for
	// the exit report to arrive.
	r := g.mustExit(shell(workDir(t), "sleep 100 & echo started; exit 4"))
	if string(r.stdout) != "started\n" || r.exit.ExitCode != 4 {
		t.Errorf("got %q exit %d, want %q exit 4", r.stdout, r.exit.ExitCode, "started\n")
	}
}

func TestResourceUsage(t *testing.T) {
	g := startGuest(t)
	r := g.mustExit(shell(workDir(t), `i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done`))
	if r.exit.CPUUserUs+r.exit.CPUSysUs <= 0 {
		t.Errorf("got CPU user %dus sys %dus, want some", r.exit.CPUUserUs, r.exit.CPUSysUs)
	}
	if r.exit.MaxRSSBytes <= 0 {
		t.Errorf("got max RSS %d, want some", r.exit.MaxRSSBytes)
	}
}

// TestSignalsToGuest checks that the program, which shares the guest's uid,
// can neither end nor stop the guest with any signal whose default action
// ends or stops a process (but the synchronous-fault ones, which crash it on
// purpose). The guest is not PID 1 here: nothing but its own dispositions
// protects it.
func TestSignalsToGuest(t *testing.T) {
	g := startGuest(t)
	dir := workDir(t)
	r := g.mustExit(shell(dir, `for s in TERM HUP INT QUIT ABRT USR1 USR2 PIPE ALRM XCPU XFSZ VTALRM IO PWR TSTP TTIN TTOU $(seq 32 64); do kill -$s $PPID || exit 1; done; sleep 0.2; echo sent`))
	if string(r.stdout) != "sent\n" || r.exit.ExitCode != 0 {
		t.Fatalf("got %q exit %d, %s", r.stdout, r.exit.ExitCode, r.stderr)
	}
	if r := g.mustExit(shell(dir, "echo alive")); string(r.stdout) != "alive\n" {
		t.Errorf("got %q, want %q", r.stdout, "alive\n")
	}
}

// TestNotDumpable checks that the program cannot reach the guest's file
// descriptors through /proc, which would let it forge frames.
func TestNotDumpable(t *testing.T) {
	g := startGuest(t)
	script := `
ls /proc/$$/fd >/dev/null || exit 2   # a dumpable process of the same uid is reachable
if ls /proc/$PPID/fd >/dev/null 2>&1; then echo guest fds readable; exit 1; fi
if echo forged >/proc/$PPID/fd/1; then echo guest stdout writable; exit 1; fi
echo denied`
	r := g.mustExit(shell(workDir(t), script))
	if string(r.stdout) != "denied\n" || r.exit.ExitCode != 0 {
		t.Errorf("got %q exit %d, want %q exit 0", r.stdout, r.exit.ExitCode, "denied\n")
	}
}

// TestInheritedIgnoredSignals starts the guest with every signal that can
// be ignored ignored (SIGCHLD, SIGHUP and SIGINT among them): wait must
// still work, and the program must start with no signal ignored, whichever
// of them the Go runtime leaves at their inherited disposition.
func TestInheritedIgnoredSignals(t *testing.T) {
	perl, err := exec.LookPath("perl")
	if err != nil {
		requires(t, "perl to start the guest with signals ignored")
	}
	g := startGuest(t, func(c *exec.Cmd) {
		c.Path = perl
		// The C library refuses the signals it keeps for itself (32 and
		// 33); a failed sigaction leaves that signal at its default.
		c.Args = []string{"perl", "-MPOSIX", "-e", `POSIX::sigaction($_, POSIX::SigAction->new("IGNORE")) for grep { $_ != 9 && $_ != 19 } 1 .. 64; exec @ARGV or die`, guestBin}
	})
	r := g.mustExit(shell(workDir(t), "grep SigIgn /proc/self/status; exit 3"))
	if r.exit.ExitCode != 3 {
		t.Errorf("got exit %d, want 3", r.exit.ExitCode)
	}
	if got, want := strings.Join(strings.Fields(string(r.stdout)), " "), "SigIgn: 0000000000000000"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestAsPID1 runs the guest as PID 1 of a new PID namespace, as in a sandbox:
// processes that escaped the program's process group must be killed too, and
// nothing may survive into the next exec.
func TestAsPID1(t *testing.T) {
	if os.Geteuid() != 0 {
		requires(t, "root to create a PID namespace")
	}
	g := startGuest(t, inPIDNamespace)
	dir := workDir(t)
	script := `
sleep 1000 &
setsid sleep 1000 &
(trap '' TERM; exec sleep 1000) &
sh -c 'sleep 1000 & exit 0'          # an orphan, reparented to the guest
for s in 32 33 34 TERM; do kill -$s 1 || exit 1; done  # PID 1 survives
kill -0 -1 && echo alive
echo $PPID`
	r := g.mustExit(shell(dir, script))
	if got, want := string(r.stdout), "alive\n1\n"; got != want || r.exit.ExitCode != 0 {
		t.Fatalf("got %q exit %d, want %q exit 0 (%s)", got, r.exit.ExitCode, want, r.stderr)
	}
	r = g.mustExit(shell(dir, "if kill -0 -1 2>/dev/null; then echo leaked; else echo clean; fi"))
	if got := string(r.stdout); got != "clean\n" {
		t.Errorf("second exec saw %q, want %q", got, "clean\n")
	}
	g.start(shell(dir, "setsid sleep 1000 & exec sleep 1000"), guest.ExecOptions{})
	time.Sleep(100 * time.Millisecond)
	g.stdin.Close()
	if code := g.exitCode(); code != 0 {
		t.Errorf("got exit code %d, want 0", code)
	}
}

// requires skips the test for lack of what, or fails it in CI, where every
// prerequisite must be installed.
func requires(t *testing.T, what string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("requires %s", what)
	}
	t.Skipf("requires %s", what)
}

// TestAcceptAgain checks that a host that re-attached (through a relay)
// may accept again, in the v2 header with id 0: the same version is
// taken silently, another is answered with an error, and the guest serves
// on.
func TestAcceptAgain(t *testing.T) {
	g := startRaw(t)
	g.rawAccept()
	for _, v := range []int{guest.MaxVersion, guest.MaxVersion + 1} {
		if _, err := g.stdin.Write(rawFrame(guest.FrameAccept, 0, fmt.Sprintf(`{"version":%d}`, v))); err != nil {
			t.Fatal(err)
		}
		if _, err := g.stdin.Write(rawFrame(guest.FramePing, uint32(v), "")); err != nil {
			t.Fatal(err)
		}
		f := g.next()
		if v != guest.MaxVersion {
			if f.Type != guest.FrameError || f.ID != 0 {
				t.Fatalf("accept of version %d: got %s frame %d, want an error", v, f.Type, f.ID)
			}
			f = g.next()
		}
		if f.Type != guest.FrameResult || f.ID != uint32(v) {
			t.Errorf("after an accept of version %d: got %s frame %d, want the pong", v, f.Type, f.ID)
		}
	}
}

// TestMappingsNotNamed checks that the guest is built not to name its
// anonymous mappings (main.go's go:debug line): a system call per mapping
// at every start, which the host kernel here ignores but gVisor serves.
func TestMappingsNotNamed(t *testing.T) {
	info, err := buildinfo.ReadFile(guestBin)
	if err != nil {
		t.Fatal(err)
	}
	var godebug string
	for _, s := range info.Settings {
		if s.Key == "DefaultGODEBUG" {
			godebug = s.Value
		}
	}
	if !slices.Contains(strings.Split(godebug, ","), "decoratemappings=0") {
		t.Errorf("got DefaultGODEBUG %q, want it to hold decoratemappings=0", godebug)
	}
}

// TestChannelFDs runs the guest with its channel on descriptors 3 and 4
// (guest.ChannelEnv), as runc's sandboxes do: it speaks the protocol
// there, writes nothing to its stdout, exits when that channel ends, and
// its programs do not inherit the channel. The program lists what its
// descriptors are, so the check sees the pipes it does have (its stdio).
func TestChannelFDs(t *testing.T) {
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	var channel []string
	for _, f := range []*os.File{inR, outW} {
		fi, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		channel = append(channel, fmt.Sprintf("pipe:[%d]", fi.Sys().(*syscall.Stat_t).Ino))
	}
	g := startRaw(t, func(c *exec.Cmd) {
		c.Env = append(c.Env, guest.ChannelEnv+"="+guest.ChannelFDs)
		c.ExtraFiles = []*os.File{inR, outW}
	})
	inR.Close()
	outW.Close()
	stdout := g.stdout
	g.stdin = inW
	c, err := guest.Handshake(g.ctx(), bufio.NewReader(outR), inW)
	if err != nil {
		t.Fatalf("handshake on descriptors 3 and 4: %v (guest stderr: %q)", err, g.stderr.String())
	}
	g.c = c
	r := g.mustExit(guest.ExecRequest{Argv: []string{"/bin/sh", "-c", `for f in /proc/$$/fd/*; do readlink "$f"; done`}, OutputCap: 1 << 20})
	links := strings.Fields(string(r.stdout))
	if !slices.ContainsFunc(links, func(l string) bool { return strings.HasPrefix(l, "pipe:[") }) {
		t.Fatalf("the program's descriptors %q show no pipe: the listing cannot see its stdio", links)
	}
	for _, p := range channel {
		if slices.Contains(links, p) {
			t.Errorf("the program holds the guest's channel %s (its descriptors: %q)", p, links)
		}
	}
	inW.Close()
	if b, err := io.ReadAll(stdout); err != nil || len(b) != 0 {
		t.Errorf("the guest wrote %q (%v) to its stdout, want nothing", b, err)
	}
	if code := g.exitCode(); code != 0 {
		t.Errorf("got exit code %d after the channel ended, want 0 (stderr %q)", code, g.stderr.String())
	}
}

// TestChannelFDsMissing starts the guest told to use descriptors 3 and 4
// without them: it fails at once, saying why.
func TestChannelFDsMissing(t *testing.T) {
	g := startRaw(t, func(c *exec.Cmd) { c.Env = append(c.Env, guest.ChannelEnv+"="+guest.ChannelFDs) })
	if code := g.exitCode(); code != 1 {
		t.Errorf("got exit code %d, want 1", code)
	}
	if !strings.Contains(g.stderr.String(), "channel descriptor 3") {
		t.Errorf("got stderr %q, want it to name descriptor 3", g.stderr.String())
	}
}
