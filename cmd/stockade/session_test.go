package main

import (
	"bufio"
	"bytes"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stockade-sh/stockade/internal/daemontest"
	"github.com/stockade-sh/stockade/internal/testenv"
)

// TestSessionCommands drives `stockade session` against a daemon with
// real runc sandboxes, with the URL and key from the environment: a
// session opened, cells that share state, a figure written with --out,
// files in and out, a listing, and the exit statuses of a cell that
// raised, of bad input, and of an ended session.
func TestSessionCommands(t *testing.T) {
	d := daemontest.Start(t, daemontest.Options{})
	ws := d.Workspace(t, daemontest.NoApproval, 100)
	bin := testenv.Build(t, "./cmd/stockade")
	dir := t.TempDir()
	run := func(t *testing.T, stdin string, args ...string) (status int, stdout, stderr string) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"session"}, args...)...)
		cmd.Env = append(os.Environ(), "STOCKADE_URL="+d.URL, "STOCKADE_KEY="+ws.Agent)
		cmd.Dir = dir
		cmd.Stdin = strings.NewReader(stdin)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return exitOf(t, cmd), o.String(), e.String()
	}
	status, out, errOut := run(t, "", "create", "--runtime", "python")
	id := strings.TrimSpace(out)
	if status != 0 || !strings.HasPrefix(id, "ses_") {
		t.Fatalf("session create: got status %d, stdout %q, stderr %q; want a session id", status, out, errOut)
	}
	for _, tc := range []struct {
		name    string
		stdin   string
		args    []string
		status  int
		stdout  string
		stderrs []string
	}{
		{"set", "", []string{"exec", id, "--code", "x = 6*7\nprint('set')"}, 0, "set\n", nil},
		{"value", "", []string{"exec", id, "--code", "x"}, 0, "42\n", nil},
		{"code on stdin", "print(x + 1)\n", []string{"exec", id, "-"}, 0, "43\n", nil},
		{"a figure", "", []string{"exec", id, "--out", ".", "--code", "import matplotlib.pyplot as plt\nplt.figure(figsize=(2, 1.5), dpi=100)\nplt.plot([1, 2])"}, 0, "", []string{"wrote cell-4-1.png"}},
		{"raised", "", []string{"exec", id, "--code", "1/0"}, 1, "", []string{"ZeroDivisionError"}},
		{"put", "a,b\n1,2\n", []string{"put", id, "-", "data.csv"}, 0, "", []string{"wrote /workspace/data.csv (8 bytes"}},
		{"read it", "", []string{"exec", id, "--code", "len(open('/workspace/data.csv').read())"}, 0, "8\n", nil},
		// A kernel that kills itself is killed (128+9), not out of memory.
		{"kills its kernel", "", []string{"exec", id, "--code", "import os, signal\nprint('bye', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)"}, 137, "bye\n",
			[]string{"KernelKilled", "signal 9", "kernel was restarted"}},
		// The restarted kernel lost x, which the interrupt cases below read.
		{"set again", "", []string{"exec", id, "--code", "x = 6*7\nprint('set')"}, 0, "set\n", nil},
		{"ls", "", []string{"ls", id}, 0, "data.csv", nil},
		{"a path outside", "", []string{"get", id, "/etc/passwd", "-"}, 2, "", []string{"/workspace"}},
		{"no code", "", []string{"exec", id}, 2, "", []string{"no code"}},
		{"an unknown session", "", []string{"exec", "ses_nope", "--code", "1"}, 2, "", []string{"not found"}},
		{"pause on runc", "", []string{"pause", id}, 1, "", []string{"cannot pause", "CRIU"}},
		{"snapshot on runc", "", []string{"snapshot", id}, 1, "", []string{"cannot be snapshotted", "CRIU"}},
		{"fork on runc", "", []string{"fork", id, "--count", "2"}, 1, "", []string{"cannot be snapshotted or forked", "CRIU"}},
		{"fork of none", "", []string{"fork", id, "--count", "0"}, 2, "", []string{"out of range"}},
		{"resume an active one", "", []string{"resume", id}, 0, "", []string{"session " + id + " active"}},
		{"interrupt with no cell", "", []string{"interrupt", id}, 0, "", []string{"no cell was running"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, stdout, stderr := run(t, tc.stdin, tc.args...)
			if status != tc.status || !strings.Contains(stdout, tc.stdout) {
				t.Errorf("got status %d, stdout %q; want %d, %q (stderr %q)", status, stdout, tc.status, tc.stdout, stderr)
			}
			for _, s := range tc.stderrs {
				if !strings.Contains(stderr, s) {
					t.Errorf("stderr: got %q, want it to contain %q", stderr, s)
				}
			}
		})
	}
	// An interrupted exec interrupts its cell on the daemon, and session
	// interrupt does from elsewhere: the next cell runs at once (not 409
	// session_busy) in the same kernel, whose state is kept.
	for _, tc := range []struct {
		name   string
		stop   func(t *testing.T, cmd *exec.Cmd)
		status int
		stderr string
	}{
		{"SIGINT on exec", func(t *testing.T, cmd *exec.Cmd) { _ = cmd.Process.Signal(syscall.SIGINT) }, exitInterrupted, "interrupted the cell session " + id + " ran"},
		{"SIGTERM on exec", func(t *testing.T, cmd *exec.Cmd) { _ = cmd.Process.Signal(syscall.SIGTERM) }, exitInterrupted, "interrupted the cell session " + id + " ran"},
		{"session interrupt", func(t *testing.T, cmd *exec.Cmd) {
			if status, _, stderr := run(t, "", "interrupt", id); status != 0 || !strings.Contains(stderr, "interrupted its cell") {
				t.Errorf("session interrupt: got status %d, stderr %q; want 0, interrupted", status, stderr)
			}
		}, 1, "KeyboardInterrupt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, "session", "exec", id, "--code", "import time\nprint('sleeping', flush=True)\ntime.sleep(25)")
			cmd.Env = append(os.Environ(), "STOCKADE_URL="+d.URL, "STOCKADE_KEY="+ws.Agent)
			var errBuf bytes.Buffer
			cmd.Stderr = &errBuf
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			r := bufio.NewReader(stdout)
			if line := waitLine(t, r); line != "sleeping\n" {
				t.Fatalf("got %q, want the cell's first line", line)
			}
			tc.stop(t, cmd)
			_, _ = io.ReadAll(r)
			if status := exitOf(t, cmd); status != tc.status || !strings.Contains(errBuf.String(), tc.stderr) {
				t.Errorf("got status %d, stderr %q; want %d and %q", status, errBuf.String(), tc.status, tc.stderr)
			}
			if status, stdout, stderr := run(t, "", "exec", id, "--code", "x"); status != 0 || stdout != "42\n" {
				t.Errorf("the next cell: got status %d, stdout %q, stderr %q; want 0, 42: the cell stopped and the kernel kept", status, stdout, stderr)
			}
		})
	}
	f, err := os.Open(filepath.Join(dir, "cell-4-1.png"))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(f)
	f.Close()
	if err != nil || img.Bounds().Dx() != 200 || img.Bounds().Dy() != 150 {
		t.Errorf("the figure written by --out: got %v, %v; want a 200x150 PNG", img, err)
	}
	if status, _, stderr := run(t, "", "get", id, "data.csv", "copy.csv"); status != 0 {
		t.Errorf("session get: got status %d (stderr %q)", status, stderr)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "copy.csv")); err != nil || string(b) != "a,b\n1,2\n" {
		t.Errorf("the downloaded file: got %q, %v", b, err)
	}
	if status, stdout, _ := run(t, "", "list", "--state", "active"); status != 0 || !strings.Contains(stdout, id) {
		t.Errorf("session list: got status %d, stdout %q; want %s listed", status, stdout, id)
	}
	// A session deleted while its cell runs ends the cell killed, with
	// its output, and exec exits 137 saying why.
	_, out, _ = run(t, "", "create", "--runtime", "python")
	other := strings.TrimSpace(out)
	cell := exec.Command(bin, "session", "exec", other, "--code", "import time\nprint('started', flush=True)\ntime.sleep(60)")
	cell.Env = append(os.Environ(), "STOCKADE_URL="+d.URL, "STOCKADE_KEY="+ws.Agent)
	pipe, err := cell.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var cellErr bytes.Buffer
	cell.Stderr = &cellErr
	if err := cell.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(pipe).ReadString('\n')
	if line != "started\n" {
		t.Fatalf("the running cell's output: got %q, %v; want started", line, err)
	}
	if status, _, stderr := run(t, "", "delete", other); status != 0 {
		t.Errorf("session delete during a cell: got status %d, stderr %q", status, stderr)
	}
	if status := exitOf(t, cell); status != 137 || !strings.Contains(cellErr.String(), "ended by session ended") {
		t.Errorf("the cell of the deleted session: got status %d, stderr %q; want 137, ended by session ended", status, cellErr.String())
	}
	if status, _, stderr := run(t, "", "delete", id); status != 0 || !strings.Contains(stderr, "ended") {
		t.Errorf("session delete: got status %d, stderr %q", status, stderr)
	}
	if status, _, stderr := run(t, "", "exec", id, "--code", "x"); status != 1 || !strings.Contains(stderr, "closed") {
		t.Errorf("a cell of an ended session: got status %d, stderr %q; want 1 and why it ended", status, stderr)
	}
}
