package supervisor

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/guest"
)

// The stand-ins of a runtime that creates a sandbox ahead (runsc create,
// restore, delete), this test binary in these modes with a directory of
// their own: create starts the "sandbox" (a detached process holding the
// channel, its pid in DIR/pid) and exits; the sandbox waits for DIR/go
// and then serves as a restored guest; start writes DIR/go and waits for
// the sandbox to end; delete kills the sandbox and writes DIR/deleted.
const (
	aheadCreateMode  = "supervisor-test-ahead-create"
	aheadSandboxMode = "supervisor-test-ahead-sandbox"
	aheadStartMode   = "supervisor-test-ahead-start"
	aheadDeleteMode  = "supervisor-test-ahead-delete"
)

func aheadFake(mode, dir string) {
	pid := func() int {
		b, _ := os.ReadFile(filepath.Join(dir, "pid"))
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return n
	}
	switch mode {
	case aheadCreateMode:
		exe, _ := os.Executable()
		cmd := exec.Command(exe, aheadSandboxMode, dir)
		cmd.Stdin, cmd.Stdout = os.Stdin, os.Stdout
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			os.Exit(2)
		}
		_ = os.WriteFile(filepath.Join(dir, "pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600)
	case aheadSandboxMode:
		for {
			if _, err := os.Stat(filepath.Join(dir, "go")); err == nil {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		restoredGuest()
	case aheadStartMode:
		_ = os.WriteFile(filepath.Join(dir, "go"), nil, 0o600)
		for p := pid(); p > 0 && syscall.Kill(p, 0) == nil; {
			time.Sleep(5 * time.Millisecond)
		}
	case aheadDeleteMode:
		if p := pid(); p > 0 {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		_ = os.WriteFile(filepath.Join(dir, "deleted"), nil, 0o600)
	}
}

// aheadMeta is the record of a shim whose sandbox the fakes create ahead
// in dir; the fake sandbox is killed when the test ends.
func aheadMeta(t *testing.T, id, dir string) Meta {
	exe, _ := os.Executable()
	t.Cleanup(func() {
		b, _ := os.ReadFile(filepath.Join(dir, "pid"))
		if p, _ := strconv.Atoi(strings.TrimSpace(string(b))); p > 0 {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	})
	return Meta{ID: id, Driver: "test", Created: time.Now().UTC(),
		CreateArgv: []string{exe, aheadCreateMode, dir}, DeleteArgv: []string{exe, aheadDeleteMode, dir}}
}

// TestCreatedAhead creates a sandbox ahead, which waits (no frame reaches
// it); the creator rewrites the record with the start and the restored
// guest's hello, and its FrameStart starts it: the hello comes, the ids
// go on above the record's LastID, and the guest answers.
func TestCreatedAhead(t *testing.T) {
	root, key := testRoot(t)
	fakes := t.TempDir()
	m := aheadMeta(t, "ahead", fakes)
	dir := launch(t, root, key, m)
	conn, err := Dial(ctxOf(t), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if st := conn.Status(); !st.Waiting || st.Greeted {
		t.Fatalf("got status %+v, want waiting, not greeted", st)
	}
	if _, err := os.Stat(filepath.Join(fakes, "go")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the sandbox was started before its FrameStart: %v", err)
	}
	exe, _ := os.Executable()
	m.Argv = []string{exe, aheadStartMode, fakes}
	m.Hello, m.LastID = &guest.Hello{Version: 2, Min: 2, Max: 2}, 9
	if err := WriteMeta(dir, key, m); err != nil {
		t.Fatal(err)
	}
	if err := conn.Start(); err != nil {
		t.Fatal(err)
	}
	c, err := guest.Handshake(ctxOf(t), conn, conn)
	if err != nil {
		t.Fatalf("the hello after the start: %v", err)
	}
	c.ReserveIDs(m.LastID)
	p, err := c.Ping(ctxOf(t))
	if err != nil || len(p.Kernels) != 1 || p.Kernels[0] != 7 {
		t.Fatalf("got %+v, %v; want the restored guest's pong", p, err)
	}
	// A later client is told the start: restored, greeted, not waiting.
	conn2, err := Dial(ctxOf(t), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	if st := conn2.Status(); st.Waiting || !st.Greeted || !st.Restored || st.LastID < 9 {
		t.Errorf("got status %+v after the start, want restored, greeted, last id >= 9", st)
	}
}

// TestCreatedAheadUnused ends a sandbox created ahead before its start:
// the shim runs DeleteArgv (the fake sandbox is gone), records the exit
// as unused and exits.
func TestCreatedAheadUnused(t *testing.T) {
	root, key := testRoot(t)
	fakes := t.TempDir()
	dir := launch(t, root, key, aheadMeta(t, "unused", fakes))
	conn, err := Dial(ctxOf(t), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	b, _ := os.ReadFile(filepath.Join(fakes, "pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		t.Fatalf("the fake sandbox (pid %q) does not run", b)
	}
	if err := conn.CloseGuestStdin(); err != nil {
		t.Fatal(err)
	}
	waitEndedUnused(t, conn, dir, fakes)
	for deadline := time.Now().Add(5 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the fake sandbox outlived the shim's delete")
		}
	}
}

// waitEndedUnused waits for the shim of dir (conn's) to end and checks
// that it ended its sandbox created ahead unused, running DeleteArgv
// (which leaves a mark in fakes).
func waitEndedUnused(t *testing.T, conn *Conn, dir, fakes string) {
	t.Helper()
	if err := conn.Wait(ctxOf(t)); err != nil {
		t.Fatal(err)
	}
	x, ok := ReadExit(dir)
	if !ok || x.Ended != EndedUnused {
		t.Errorf("got exit %+v (%v), want ended unused", x, ok)
	}
	if _, err := os.Stat(filepath.Join(fakes, "deleted")); err != nil {
		t.Errorf("the shim did not run DeleteArgv: %v", err)
	}
}

// TestCreatedAheadDeadline checks that a sandbox created ahead that no
// client starts ends unused once its record's deadline has passed, even
// with a client attached: a daemon that died leaves none waiting for
// ever.
func TestCreatedAheadDeadline(t *testing.T) {
	root, key := testRoot(t)
	fakes := t.TempDir()
	m := aheadMeta(t, "expires", fakes)
	m.Deadline = time.Now().Add(2 * time.Second)
	dir := launch(t, root, key, m)
	conn, err := Dial(ctxOf(t), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if st := conn.Status(); !st.Waiting {
		t.Fatalf("got status %+v, want waiting", st)
	}
	waitEndedUnused(t, conn, dir, fakes)
}

// TestCreatedAheadWithHelloRefused checks that a shim refuses a record
// of a sandbox created ahead that carries a hello: it would greet
// clients and pass their frames to the sandbox before its start.
func TestCreatedAheadWithHelloRefused(t *testing.T) {
	root, key := testRoot(t)
	m := aheadMeta(t, "hello", t.TempDir())
	m.Hello = &guest.Hello{Version: 2, Min: 2, Max: 2}
	dir := filepath.Join(root, m.ID)
	if err := WriteMeta(dir, key, m); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err := Launch(ctx, shimCommand(t), dir)
	if err == nil {
		_ = KillShim(context.Background(), dir)
		t.Fatal("Launch of a created-ahead record with a hello: got nil, want refused")
	}
	if !strings.Contains(err.Error(), "carries a hello") {
		t.Errorf("got %v, want the hello named", err)
	}
}
