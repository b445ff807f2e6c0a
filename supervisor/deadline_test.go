package supervisor

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// waitExit waits, at most within, for dir's runtime to have ended and its
// exit recorded.
func waitExit(t *testing.T, dir string, within time.Duration) Exit {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if x, ok := ReadExit(dir); ok {
			return x
		}
		if time.Now().After(deadline) {
			t.Fatalf("no exit recorded within %s; the shim's log:\n%s", within, Log(dir))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestDeadline checks that a shim ends its sandbox by itself at its
// deadline, the record's or one a client moved it to, whether or not a
// client is attached, and not before: a deadline moved later or cleared
// keeps the sandbox, which answers on.
func TestDeadline(t *testing.T) {
	soon := func() time.Time { return time.Now().Add(2 * time.Second) }
	later := func() time.Time { return time.Now().Add(time.Hour) }
	for _, tt := range []struct {
		name   string
		record func() time.Time
		// moveTo, when set, is sent with EndAt once attached.
		moveTo  func() time.Time
		detach  bool // the client goes before the deadline
		wantEnd bool
	}{
		{name: "the record's", record: soon, wantEnd: true},
		{name: "the record's, no client", record: soon, detach: true, wantEnd: true},
		{name: "moved earlier", record: later, moveTo: soon, wantEnd: true},
		{name: "moved earlier, no client", record: later, moveTo: soon, detach: true, wantEnd: true},
		{name: "moved later", record: soon, moveTo: later},
		{name: "cleared", record: soon, moveTo: func() time.Time { return time.Time{} }},
		{name: "none", record: func() time.Time { return time.Time{} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root, key := testRoot(t)
			m := guestMeta(t, "deadline")
			m.Deadline = tt.record()
			dir := launch(t, root, key, m)
			conn, c := attach(t, dir)
			if got := conn.Status().Deadline; !got.Equal(m.Deadline) {
				t.Errorf("status: got deadline %v, want the record's %v", got, m.Deadline)
			}
			want := m.Deadline
			if tt.moveTo != nil {
				want = tt.moveTo()
				if err := conn.EndAt(want); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := c.Ping(ctxOf(t)); err != nil {
				t.Fatalf("before the deadline: %v", err)
			}
			if tt.detach {
				conn.Close()
			}
			if !tt.wantEnd {
				time.Sleep(max(time.Until(m.Deadline), 0) + 3*watchEvery)
				if _, ok := ReadExit(dir); ok {
					t.Fatalf("the sandbox ended; the shim's log:\n%s", Log(dir))
				}
				if _, err := c.Ping(ctxOf(t)); err != nil {
					t.Fatalf("past the record's deadline: %v", err)
				}
				// The shim tells the next client the deadline it keeps.
				conn2, _ := attach(t, dir)
				if got := conn2.Status().Deadline; !got.Equal(want) {
					t.Errorf("the next status: got deadline %v, want %v", got, want)
				}
				return
			}
			x := waitExit(t, dir, time.Until(want)+30*time.Second)
			if x.Ended != EndedDeadline {
				t.Errorf("exit: got %+v, want ended %q", x, EndedDeadline)
			}
			if x.At.Before(want) {
				t.Errorf("exit at %v, before the deadline %v", x.At, want)
			}
			if x.ExitCode != 0 {
				t.Errorf("exit: got %+v, want the guest's own exit (code 0) at the close of its input", x)
			}
		})
	}
}

// TestDeadlineEndsAStubbornRuntime checks the steps after the close of
// the guest's input: a runtime that does not end then is ended by the
// record's kill command or, without one, killed; the record's delete
// command runs after it.
func TestDeadlineEndsAStubbornRuntime(t *testing.T) {
	for _, tt := range []struct {
		name     string
		withKill bool
	}{
		{"with the runtime's kill", true},
		{"killed by the shim", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root, key := testRoot(t)
			work := t.TempDir()
			pidFile, deleted := filepath.Join(work, "runtime.pid"), filepath.Join(work, "deleted")
			// The stand-in runtime never greets and never reads its input.
			m := Meta{ID: "stubborn", Driver: "test", Created: time.Now().UTC(), Deadline: time.Now().Add(time.Second),
				Argv:       []string{"/bin/sh", "-c", "echo $$ > " + pidFile + "; exec /bin/sleep 1000"},
				DeleteArgv: []string{"/bin/sh", "-c", "echo deleted > " + deleted}}
			if tt.withKill {
				m.KillArgv = []string{"/bin/sh", "-c", "read p < " + pidFile + "; kill -9 $p; echo killed > " + filepath.Join(work, "killed")}
			}
			dir := launch(t, root, key, m)
			x := waitExit(t, dir, 2*endGrace+30*time.Second)
			if x.Ended != EndedDeadline || x.Signal != int(syscall.SIGKILL) {
				t.Errorf("exit: got %+v, want ended %q by SIGKILL", x, EndedDeadline)
			}
			if _, err := os.Stat(filepath.Join(work, "killed")); (err == nil) != tt.withKill {
				t.Errorf("the record's kill command ran: got %v, want %v", err == nil, tt.withKill)
			}
			if _, err := os.Stat(deleted); err != nil {
				t.Errorf("the record's delete command did not run: %v; the shim's log:\n%s", err, Log(dir))
			}
		})
	}
}

// TestEndsUnreachable checks that a shim no client could reach any more
// (its socket gone from its directory's path) ends its sandbox once no
// client is attached, and keeps it while one is.
func TestEndsUnreachable(t *testing.T) {
	for _, tt := range []struct {
		name string
		cut  func(t *testing.T, dir string) (exitDir string)
	}{
		{"socket removed", func(t *testing.T, dir string) string {
			if err := os.Remove(filepath.Join(dir, SocketFile)); err != nil {
				t.Fatal(err)
			}
			return dir
		}},
		{"directory moved", func(t *testing.T, dir string) string {
			if err := os.Rename(dir, dir+".moved"); err != nil {
				t.Fatal(err)
			}
			return "" // the shim records its exit where its directory was
		}},
		{"directory deleted", func(t *testing.T, dir string) string {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			return ""
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root, key := testRoot(t)
			dir := launch(t, root, key, guestMeta(t, "unreachable"))
			pid, running := Running(dir)
			if !running {
				t.Fatal("the shim does not run")
			}
			conn, c := attach(t, dir)
			exitDir := tt.cut(t, dir)
			time.Sleep(3 * watchEvery)
			if _, err := c.Ping(ctxOf(t)); err != nil {
				t.Fatalf("with a client attached, the sandbox must go on: %v", err)
			}
			conn.Close()
			for deadline := time.Now().Add(30 * time.Second); alive(pid); time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the shim %d still runs 30 s after its last client went", pid)
				}
			}
			if exitDir != "" {
				if x, ok := ReadExit(exitDir); !ok || x.Ended != EndedUnreachable {
					t.Errorf("exit: got %+v (recorded %v), want ended %q", x, ok, EndedUnreachable)
				}
			}
		})
	}
}

// alive reports whether process pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	return err == nil && !strings.Contains(string(b), ") Z ")
}
