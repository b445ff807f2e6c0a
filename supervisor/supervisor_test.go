package supervisor

// These tests run real shims (this test binary, re-executed in shim mode)
// with the real guest agent as their "runtime", started directly rather
// than in a sandbox: the guest then speaks over the shim's pipes exactly
// as it does as a sandbox's PID 1. The drivers' tests run shims with real
// runtimes.

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/internal/testenv"
)

// shimMode is the argument that makes this test binary a shim.
const shimMode = "supervisor-test-shim"

// restoredMode makes this test binary a stand-in for a restored guest: it
// greets nobody, takes an Accept in the v2 header and answers pings.
const restoredMode = "supervisor-test-restored-guest"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case shimMode:
			os.Exit(Main(context.Background(), os.Args[2:]))
		case restoredMode:
			restoredGuest()
			os.Exit(0)
		case aheadCreateMode, aheadSandboxMode, aheadStartMode, aheadDeleteMode:
			aheadFake(os.Args[1], os.Args[2])
			os.Exit(0)
		}
	}
	os.Exit(m.Run())
}

// restoredGuest serves pings, after an Accept in the v2 header, until its
// stdin ends.
func restoredGuest() {
	r := bufio.NewReader(os.Stdin)
	f, err := guest.ReadFrame(r, 0)
	if err != nil || f.Type != guest.FrameAccept || f.ID != 0 {
		os.Exit(3)
	}
	for {
		f, err := guest.ReadFrame(r, 0)
		if err != nil {
			return
		}
		if f.Type == guest.FramePing {
			_ = guest.WriteJSON(os.Stdout, guest.FrameResult, f.ID, guest.Pong{Version: guest.MaxVersion, Kernels: []uint32{7}})
		}
	}
}

// shimCommand is how the tests start a shim: this binary in shim mode.
func shimCommand(t *testing.T) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{exe, shimMode}
}

// testRoot is a shims' root with its key.
func testRoot(t *testing.T) (string, []byte) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "shims")
	key, err := LoadKey(root)
	if err != nil {
		t.Fatal(err)
	}
	return root, key
}

// launch writes m (its ID named by the test) and starts its shim; the
// shim is killed when the test ends.
func launch(t *testing.T, root string, key []byte, m Meta) string {
	t.Helper()
	dir := filepath.Join(root, m.ID)
	if err := WriteMeta(dir, key, m); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := Launch(ctx, shimCommand(t), dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = KillShim(context.Background(), dir)
	})
	return dir
}

// guestMeta is the record of a shim whose runtime is the guest agent.
func guestMeta(t *testing.T, id string) Meta {
	return Meta{ID: id, Driver: "test", Argv: []string{testenv.Guest(t)}, Created: time.Now().UTC()}
}

// attach dials dir and returns a guest client over the connection, its ids
// above those the shim says were used.
func attach(t *testing.T, dir string) (*Conn, *guest.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := Dial(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c, err := guest.Handshake(ctx, conn, conn)
	if err != nil {
		t.Fatal(err)
	}
	c.ReserveIDs(conn.Status().LastID)
	return conn, c
}

func ctxOf(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func sh(script string) guest.ExecRequest {
	return guest.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, OutputCap: 10<<20 + 1}
}

// TestReattach runs a kernel through one client, loses that client in the
// middle of a frame, and reaches the same guest and kernel through the
// next: the hello is replayed, the ids go on above the old ones, and the
// guest did not block while no client read it.
func TestReattach(t *testing.T) {
	root, key := testRoot(t)
	dir := launch(t, root, key, guestMeta(t, "reattach"))
	conn, c := attach(t, dir)
	if st := conn.Status(); st.ID != "reattach" || st.Clients != 0 || st.LastID != 0 {
		t.Errorf("first status: got %+v, want sandbox reattach, no clients before, no ids", st)
	}
	ctx := ctxOf(t)
	k, err := c.StartKernel(ctx, guest.KernelRequest{Argv: []string{testenv.Guest(t), "stockade-kernel-test"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Run(ctx, "set x 42", guest.CellOptions{}); err != nil {
		t.Fatal(err)
	}
	// An exec that writes far more than the pipes hold goes on while no
	// client reads it; the client dies in the middle of a frame it sends.
	if _, err := c.Exec(ctx, sh("head -c 50000000 /dev/zero; echo done"), guest.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	// The ping's answer says that the exec reached the guest.
	if _, err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	used := c.LastID()
	ping, _ := guest.AppendFrame(nil, guest.FramePing, used+1, nil)
	if _, err := conn.Write(append(ping, byte(guest.FrameStat), 0, 0)); err != nil {
		t.Fatal(err)
	}
	// The client drops the answer to the ping it did not send; then the
	// ping has reached the guest.
	for i := 0; c.Stats().UnknownIDs == 0; i++ {
		if i == 500 {
			t.Fatal("the raw ping was not answered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	conn.Close()
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the client did not see its connection end")
	}

	// The guest writes on while no client is attached: the shim drains
	// it, or the exec could not end.
	time.Sleep(3 * time.Second)
	conn2, c2 := attach(t, dir)
	st := conn2.Status()
	if st.Clients != 1 || !st.Greeted || st.LastID != used+1 {
		t.Errorf("second status: got %+v, want one client before, greeted, last id %d; the shim's log:\n%s", st, used+1, Log(dir))
	}
	if c2.Hello().Max != guest.MaxVersion {
		t.Errorf("replayed hello: got %+v", c2.Hello())
	}
	p, err := c2.Ping(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.Exec != 0 || len(p.Kernels) != 1 || p.Kernels[0] != k.ID() {
		t.Fatalf("after the re-attach: got %+v, want the exec ended (its output drained) and kernel %d", p, k.ID())
	}
	k2, err := c2.AdoptKernel(k.ID())
	if err != nil {
		t.Fatal(err)
	}
	out, err := k2.Run(ctx, "get x", guest.CellOptions{OutputCap: 100})
	if err != nil || string(out.Stdout) != "42\n" {
		t.Fatalf("the kernel after the re-attach: got %+v, %v; want 42", out, err)
	}

	// A third client replaces the second.
	_, c3 := attach(t, dir)
	select {
	case <-c2.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the replaced client's connection did not end")
	}
	if _, err := c3.Ping(ctx); err != nil {
		t.Errorf("the third client: %v", err)
	}
}

// TestControls checks the shim's own frames: closing the guest's stdin
// ends the guest, its runtime, and the shim, which records the exit;
// killing the runtime does the same with the runtime's signal. Wait sees
// the end whether a guest client reads the connection (which then sees
// the end too) or nothing does.
func TestControls(t *testing.T) {
	for _, tt := range []struct {
		name       string
		send       func(*Conn) error
		noClient   bool
		wantCode   int
		wantSignal int
	}{
		{"close stdin", (*Conn).CloseGuestStdin, false, 0, 0},
		{"kill", (*Conn).Kill, false, -1, int(syscall.SIGKILL)},
		{"kill without a client", (*Conn).Kill, true, -1, int(syscall.SIGKILL)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root, key := testRoot(t)
			dir := launch(t, root, key, guestMeta(t, "controls"))
			conn, c := attach(t, dir)
			if _, err := c.Ping(ctxOf(t)); err != nil {
				t.Fatal(err)
			}
			if tt.noClient {
				// A connection that nothing reads, once the guest has
				// greeted (a guest ended before its hello is a broken one).
				conn.Close()
				var err error
				if conn, err = Dial(ctxOf(t), dir); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { conn.Close() })
				c = nil
			}
			if err := tt.send(conn); err != nil {
				t.Fatal(err)
			}
			if err := conn.Wait(ctxOf(t)); err != nil {
				t.Fatalf("the shim did not end: %v", err)
			}
			if c != nil {
				select {
				case <-c.Done():
				case <-time.After(10 * time.Second):
					t.Fatal("the guest client reading the connection did not see it end")
				}
			}
			x, ok := ReadExit(dir)
			if !ok || x.ExitCode != tt.wantCode || x.Signal != tt.wantSignal {
				t.Errorf("got exit %+v (recorded %v), want code %d signal %d; the shim's log:\n%s", x, ok, tt.wantCode, tt.wantSignal, Log(dir))
			}
			for i := 0; ; i++ {
				if _, running := Running(dir); !running {
					break
				}
				if i == 100 {
					t.Fatal("the shim still runs")
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// TestLongDirectory checks that a shim whose directory is too deep for a
// unix socket address (a long state directory) is served and reached.
func TestLongDirectory(t *testing.T) {
	root := filepath.Join(t.TempDir(), strings.Repeat("d", 100), "shims")
	key, err := LoadKey(root)
	if err != nil {
		t.Fatal(err)
	}
	dir := launch(t, root, key, guestMeta(t, "long"))
	if n := len(filepath.Join(dir, SocketFile)); n <= maxSocketName {
		t.Fatalf("the socket's path is %d bytes: the test needs one longer than %d", n, maxSocketName)
	}
	_, c := attach(t, dir)
	if _, err := c.Ping(ctxOf(t)); err != nil {
		t.Fatalf("ping through a shim of a long directory: %v", err)
	}
}

// TestShimKilled checks that a shim killed with SIGKILL takes its guest
// with it: the guest's stdin closes and it exits.
func TestShimKilled(t *testing.T) {
	root, key := testRoot(t)
	dir := launch(t, root, key, guestMeta(t, "killed"))
	_, c := attach(t, dir)
	printed := make(chan string, 1)
	_, err := c.Exec(ctxOf(t), sh("echo $$; sleep 100"), guest.ExecOptions{OutputCap: 100, OnOutput: func(_ guest.Stream, p []byte) {
		printed <- strings.TrimSpace(string(p))
	}})
	if err != nil {
		t.Fatal(err)
	}
	var pid string
	select {
	case pid = <-printed:
	case <-time.After(10 * time.Second):
		t.Fatal("the exec printed nothing")
	}
	if _, err := os.Stat("/proc/" + pid); err != nil {
		t.Fatalf("the exec's shell %q: %v", pid, err)
	}
	if err := KillShim(ctxOf(t), dir); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		if _, err := os.Stat("/proc/" + pid); errors.Is(err, os.ErrNotExist) {
			break
		}
		if b, _ := os.ReadFile("/proc/" + pid + "/stat"); strings.Contains(string(b), ") Z ") {
			break
		}
		if i == 250 {
			t.Fatalf("the exec's shell %s outlived the shim", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRestoredGuest checks the restore mode: a record with the hello of a
// guest that greeted before makes the shim replay it and pass the Accept
// on in the v2 header, and report the ids used before.
func TestRestoredGuest(t *testing.T) {
	root, key := testRoot(t)
	exe, _ := os.Executable()
	m := Meta{ID: "restored", Argv: []string{exe, restoredMode}, Hello: &guest.Hello{Version: 2, Min: 2, Max: 2}, LastID: 9}
	dir := launch(t, root, key, m)
	conn, c := attach(t, dir)
	if st := conn.Status(); !st.Restored || st.LastID != 9 || !st.Greeted {
		t.Errorf("got status %+v, want restored, last id 9, greeted", st)
	}
	p, err := c.Ping(ctxOf(t))
	if err != nil || len(p.Kernels) != 1 || p.Kernels[0] != 7 {
		t.Fatalf("got %+v, %v; want the restored guest's pong", p, err)
	}
	if id := c.LastID(); id != 10 {
		t.Errorf("the ping went out as id %d, want 10", id)
	}
}

// TestNotOurs checks that a record the key's holder did not write, or
// that names another sandbox, is refused by ReadMeta and by the shim, and
// that Dial refuses a socket that its shim does not serve.
func TestNotOurs(t *testing.T) {
	root, key := testRoot(t)
	m := guestMeta(t, "forged")
	dir := filepath.Join(root, m.ID)
	if err := WriteMeta(dir, key, m); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadMeta(dir, key); err != nil {
		t.Fatalf("the genuine record: %v", err)
	}
	other := make([]byte, 32)
	if _, err := ReadMeta(dir, other); !errors.Is(err, ErrNotOurs) {
		t.Errorf("under another key: got %v, want ErrNotOurs", err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, MetaFile))
	forged := strings.Replace(string(b), `"driver": "test"`, `"driver": "runc"`, 1)
	if err := os.WriteFile(filepath.Join(dir, MetaFile), []byte(forged), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadMeta(dir, key); !errors.Is(err, ErrNotOurs) {
		t.Errorf("an edited record: got %v, want ErrNotOurs", err)
	}
	if err := Launch(ctxOf(t), shimCommand(t), dir); err == nil || !strings.Contains(err.Error(), ErrNotOurs.Error()) {
		t.Errorf("a shim of an edited record: got %v, want it refused as not ours", err)
	}
	// A record moved to another sandbox's directory.
	if err := WriteMeta(dir, key, m); err != nil {
		t.Fatal(err)
	}
	moved := filepath.Join(root, "elsewhere")
	if err := os.Rename(dir, moved); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadMeta(moved, key); !errors.Is(err, ErrNotOurs) {
		t.Errorf("a moved record: got %v, want ErrNotOurs", err)
	}

	// A socket served by this process, not by the shim the pid file names.
	live := launch(t, root, key, guestMeta(t, "impostor"))
	pidFile := filepath.Join(live, PIDFile)
	pid, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	// The pid file names the shim again before launch's clean-up, which
	// finds the shim to kill by it.
	t.Cleanup(func() { _ = os.WriteFile(pidFile, pid, 0o600) })
	if err := os.WriteFile(pidFile, []byte("1"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Dial(ctxOf(t), live); !errors.Is(err, ErrNotOurs) {
		t.Errorf("a socket its shim does not serve: got %v, want ErrNotOurs", err)
	}
}

// TestLaunchFails checks that a shim that cannot start its runtime says
// why.
func TestLaunchFails(t *testing.T) {
	root, key := testRoot(t)
	m := Meta{ID: "broken", Argv: []string{"/nonexistent/runtime"}}
	dir := filepath.Join(root, m.ID)
	if err := WriteMeta(dir, key, m); err != nil {
		t.Fatal(err)
	}
	err := Launch(ctxOf(t), shimCommand(t), dir)
	if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "/nonexistent/runtime") {
		t.Errorf("got %v, want ErrUnavailable naming the runtime", err)
	}
}

// TestLoadKey checks that the key is made once, root-only, and read back.
func TestLoadKey(t *testing.T) {
	root := filepath.Join(t.TempDir(), "shims")
	k1, err := LoadKey(root)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := LoadKey(root)
	if err != nil || string(k1) != string(k2) || len(k1) != 32 {
		t.Fatalf("got %x then %x, %v; want the same 32 bytes", k1, k2, err)
	}
	for _, p := range []string{root, filepath.Join(root, KeyFile)} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s: got mode %v, %v; want root-only", p, fi.Mode(), err)
		}
	}
}

// TestLoadKeyConcurrently makes the key from several goroutines at once,
// as a daemon's pool refill and its first session do: each must get the
// same whole key, none a key half written.
func TestLoadKeyConcurrently(t *testing.T) {
	for round := range 50 {
		root := filepath.Join(t.TempDir(), "shims")
		keys := make([][]byte, 8)
		errs := make([]error, len(keys))
		var wg sync.WaitGroup
		for i := range keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				keys[i], errs[i] = LoadKey(root)
			}()
		}
		wg.Wait()
		for i := range keys {
			if errs[i] != nil || len(keys[i]) != 32 || string(keys[i]) != string(keys[0]) {
				t.Fatalf("round %d, caller %d: got key %x, %v; want the 32 bytes of caller 0, %x", round, i, keys[i], errs[i], keys[0])
			}
		}
	}
}

// TestShimNeedsAbsoluteDir checks the command line.
func TestShimNeedsAbsoluteDir(t *testing.T) {
	exe, _ := os.Executable()
	out, err := exec.Command(exe, shimMode, "relative").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "absolute") {
		t.Errorf("got %q, %v; want a refusal", out, err)
	}
}

// TestPrivateState checks that a shims' root, key, shim directory or
// record that another user made, could change, or reaches through a
// symbolic link is refused by LoadKey, ReadMeta, WriteMeta and the shim
// itself (Serve, through Launch).
func TestPrivateState(t *testing.T) {
	testenv.RequiresRoot(t)
	const nobody = 65534
	// setup returns a good root with a key and one shim's record.
	setup := func(t *testing.T) (root, dir string, key []byte) {
		root, key = testRoot(t)
		dir = filepath.Join(root, "sbx")
		if err := WriteMeta(dir, key, guestMeta(t, "sbx")); err != nil {
			t.Fatal(err)
		}
		return root, dir, key
	}
	chmod := func(mode os.FileMode) func(string) error { return func(p string) error { return os.Chmod(p, mode) } }
	chown := func(p string) error { return os.Lchown(p, nobody, nobody) }
	// symlink moves p aside and links p to it.
	symlink := func(p string) error {
		if err := os.Rename(p, p+".real"); err != nil {
			return err
		}
		return os.Symlink(p+".real", p)
	}
	for _, tt := range []struct {
		name   string
		target func(root, dir string) string
		change func(string) error
		check  string // "key": LoadKey; "meta": ReadMeta and WriteMeta; "shim": Launch
	}{
		{"a root of mode 0777", func(root, _ string) string { return root }, chmod(0o777), "key"},
		{"a root owned by nobody", func(root, _ string) string { return root }, chown, "key"},
		{"a root that is a symbolic link", func(root, _ string) string { return root }, symlink, "key"},
		{"a key of mode 0666", func(root, _ string) string { return filepath.Join(root, KeyFile) }, chmod(0o666), "key"},
		{"a key owned by nobody", func(root, _ string) string { return filepath.Join(root, KeyFile) }, chown, "key"},
		{"a key that is a symbolic link", func(root, _ string) string { return filepath.Join(root, KeyFile) }, symlink, "key"},
		{"a shim directory of mode 0755", func(_, dir string) string { return dir }, chmod(0o755), "meta"},
		{"a shim directory owned by nobody", func(_, dir string) string { return dir }, chown, "meta"},
		{"a shim directory that is a symbolic link", func(_, dir string) string { return dir }, symlink, "meta"},
		{"a record owned by nobody", func(_, dir string) string { return filepath.Join(dir, MetaFile) }, chown, "meta"},
		{"a record of mode 0644", func(_, dir string) string { return filepath.Join(dir, MetaFile) }, chmod(0o644), "meta"},
		{"a shim under a root of mode 0777", func(root, _ string) string { return root }, chmod(0o777), "shim"},
		{"a shim with a key owned by nobody", func(root, _ string) string { return filepath.Join(root, KeyFile) }, chown, "shim"},
		{"a shim of a directory of mode 0755", func(_, dir string) string { return dir }, chmod(0o755), "shim"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root, dir, key := setup(t)
			if err := tt.change(tt.target(root, dir)); err != nil {
				t.Fatal(err)
			}
			switch tt.check {
			case "key":
				if k, err := LoadKey(root); !errdefs.IsFailedPrecondition(err) {
					t.Errorf("LoadKey: got %x, %v; want ErrFailedPrecondition", k, err)
				}
			case "meta":
				if m, err := ReadMeta(dir, key); !errors.Is(err, ErrNotOurs) {
					t.Errorf("ReadMeta: got %+v, %v; want ErrNotOurs", m, err)
				}
				if err := WriteMeta(dir, key, guestMeta(t, "sbx")); err == nil && !strings.Contains(tt.name, "record") {
					t.Errorf("WriteMeta: got nil, want refused")
				}
			case "shim":
				err := Launch(ctxOf(t), shimCommand(t), dir)
				if err == nil {
					_ = KillShim(context.Background(), dir)
					t.Fatalf("Launch: got a shim, want refused")
				}
				if _, running := Running(dir); running {
					t.Errorf("a shim runs after the refusal")
				}
			}
		})
	}
}

// TestReadyPipe checks that the runtime does not inherit the shim's ready
// pipe, and that a shim run by hand with fd 3 open on something that is
// not a pipe neither writes to it nor closes it.
func TestReadyPipe(t *testing.T) {
	t.Run("the runtime does not inherit it", func(t *testing.T) {
		root, key := testRoot(t)
		out := filepath.Join(t.TempDir(), "fd3")
		m := Meta{ID: "ready", Driver: "test", Created: time.Now().UTC(), Argv: []string{"/bin/sh", "-c",
			`if [ -e /proc/$$/fd/3 ]; then echo inherited > ` + out + `; else echo closed > ` + out + `; fi; exec /bin/sleep 30`}}
		launch(t, root, key, m)
		deadline := time.Now().Add(10 * time.Second)
		for {
			b, err := os.ReadFile(out)
			if err == nil && len(b) > 0 {
				if got := strings.TrimSpace(string(b)); got != "closed" {
					t.Errorf("the runtime's fd 3: got %s, want closed", got)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the runtime wrote nothing to %s", out)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	t.Run("a shim run by hand leaves another fd 3 alone", func(t *testing.T) {
		f, err := os.Create(filepath.Join(t.TempDir(), "unrelated"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		exe, _ := os.Executable()
		cmd := exec.Command(exe, shimMode, "relative")
		cmd.ExtraFiles = []*os.File{f}
		if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "absolute") {
			t.Fatalf("got %q, %v; want a refusal", out, err)
		}
		fi, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() != 0 {
			t.Errorf("the file on fd 3: got %d bytes, want it untouched", fi.Size())
		}
	})
}

// TestRunningMatchesTheWholeDir checks that a pid file naming the shim of
// another directory, whose name begins with this one's, is not this
// directory's shim: KillShim leaves that shim alone.
func TestRunningMatchesTheWholeDir(t *testing.T) {
	root, key := testRoot(t)
	other := launch(t, root, key, guestMeta(t, "sbx-abc"))
	pid, ok := Running(other)
	if !ok {
		t.Fatalf("the shim of %s: got not running, want running", other)
	}
	dir := filepath.Join(root, "sbx-ab")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, PIDFile), []byte(strconv.Itoa(pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok := Running(dir); ok {
		t.Errorf("Running(%s) with the pid of %s's shim: got true, want false", dir, other)
	}
	if err := KillShim(ctxOf(t), dir); err != nil {
		t.Fatal(err)
	}
	if _, ok := Running(other); !ok {
		t.Errorf("after KillShim(%s), the shim of %s: got gone, want running", dir, other)
	}
}

// TestExitWithStderrHeld checks that the shim records its runtime's exit
// while a process the runtime left holds the runtime's stderr.
func TestExitWithStderrHeld(t *testing.T) {
	root, key := testRoot(t)
	bg := filepath.Join(t.TempDir(), "bg")
	m := Meta{ID: "held", Driver: "test", Created: time.Now().UTC(), Argv: []string{"/bin/sh", "-c",
		`/bin/sleep 60 & echo $! > ` + bg + `; exec /bin/sleep 1`}}
	dir := launch(t, root, key, m)
	t.Cleanup(func() {
		if b, err := os.ReadFile(bg); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	// The runtime exits after 1 s; the process holding its stderr lives
	// for 60.
	deadline := time.Now().Add(15 * time.Second)
	for {
		if x, ok := ReadExit(dir); ok {
			if x.ExitCode != 0 {
				t.Errorf("the runtime's exit: got %+v, want code 0", x)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s 15 s after a runtime that exits after 1 s", ExitFile)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
