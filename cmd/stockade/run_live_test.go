package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// liveDrivers are the drivers `stockade run` is tested on with real
// sandboxes, and the binaries they need.
var liveDrivers = []struct{ name, binary string }{{"runc", "runc"}, {"gvisor", "runsc"}}

// startRun starts `stockade run` on driver with a private state directory,
// its stdout and stderr on one pipe (so that their order is the order the
// CLI wrote them in), and returns the process, a reader of that pipe and
// the state directory. It is killed at the end of the test if still there.
func startRun(t *testing.T, driver string, args ...string) (*exec.Cmd, *bufio.Reader, string) {
	t.Helper()
	state := filepath.Join(t.TempDir(), "state")
	full := append([]string{"run", "--state-dir", state, "--guest", testenv.Guest(t), "--data-dir", testenv.DataDir(), "--driver", driver}, args...)
	cmd := exec.Command(testenv.Build(t, "./cmd/stockade"), full...)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() {
		r.Close()
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd, bufio.NewReader(r), state
}

// waitLine reads the next line, failing t after 60 s.
func waitLine(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		l, _ := r.ReadString('\n')
		got <- l
	}()
	select {
	case l := <-got:
		return l
	case <-time.After(60 * time.Second):
		t.Fatal("no line within 60 s")
		return ""
	}
}

// exited reports whether cmd's process has ended (it is a zombie until
// Wait), without waiting.
func exited(t *testing.T, cmd *exec.Cmd) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	// The state follows the command name, which is in parentheses.
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z'
}

// sandboxIDs are the ids of the sandboxes whose bundles are in the state
// directory of driver.
func sandboxIDs(t *testing.T, state, driver string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(state, driver, "bundles"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range ents {
		ids = append(ids, e.Name())
	}
	return ids
}

// leftovers lists what the sandbox id left on the host: runtime state,
// bundle, cgroups and processes, as the driver's own tests check them.
func leftovers(t *testing.T, state, driver, id string) []string {
	t.Helper()
	var (
		d   sandbox.Leftovers
		err error
	)
	if driver == "runc" {
		d, err = runc.New(runc.Config{StateDir: filepath.Join(state, "runc"), GuestPath: testenv.Guest(t)})
	} else {
		d, err = gvisor.New(gvisor.Config{StateDir: filepath.Join(state, "gvisor"), GuestPath: testenv.Guest(t)})
	}
	if err != nil {
		t.Fatal(err)
	}
	return d.Leftovers(t.Context(), id)
}

// TestRunStreams checks that `stockade run` prints output as the program
// writes it, stdout and stderr in the order written: the first line
// arrives while the program still runs.
func TestRunStreams(t *testing.T) {
	testenv.RequiresRoot(t)
	for _, drv := range liveDrivers {
		t.Run(drv.name, func(t *testing.T) {
			testenv.RequiresBinary(t, drv.binary)
			cmd, out, _ := startRun(t, drv.name, "--runtime", "python", "-c", `import sys, time
print("first", flush=True)
time.sleep(2)
print("second", file=sys.stderr, flush=True)
time.sleep(1)
print("third")`)
			if l := waitLine(t, out); l != "first\n" {
				t.Fatalf("first line: got %q, want \"first\\n\"", l)
			}
			if exited(t, cmd) {
				t.Fatal("the first line arrived after the program ended: output is not streamed")
			}
			rest, _ := io.ReadAll(out)
			if err := cmd.Wait(); err != nil {
				t.Fatalf("exit: %v (output %q)", err, rest)
			}
			if string(rest) != "second\nthird\n" {
				t.Errorf("after the first line: got %q, want second (stderr) then third (stdout)", rest)
			}
		})
	}
}

// TestRunInterrupted sends SIGINT or SIGTERM to a real `stockade run`
// whose program runs: the CLI destroys the sandbox, has printed what came
// and exits 130, and the sandbox left nothing on the host.
func TestRunInterrupted(t *testing.T) {
	testenv.RequiresRoot(t)
	for _, drv := range liveDrivers {
		for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
			t.Run(drv.name+"/"+sig.String(), func(t *testing.T) {
				testenv.RequiresBinary(t, drv.binary)
				cmd, out, state := startRun(t, drv.name, "--runtime", "python", "-c", "import time\nprint('ready', flush=True)\ntime.sleep(120)")
				if l := waitLine(t, out); l != "ready\n" {
					t.Fatalf("got %q, want ready", l)
				}
				ids := sandboxIDs(t, state, drv.name)
				if len(ids) != 1 {
					t.Fatalf("sandboxes in the state directory: got %v, want one", ids)
				}
				if left := leftovers(t, state, drv.name, ids[0]); len(left) == 0 {
					t.Fatal("the running sandbox shows no state, cgroup or process: the leftovers check cannot see it")
				}
				start := time.Now()
				if err := cmd.Process.Signal(sig); err != nil {
					t.Fatal(err)
				}
				rest, _ := io.ReadAll(out)
				err := cmd.Wait()
				if code := cmd.ProcessState.ExitCode(); code != exitInterrupted {
					t.Fatalf("exit status: got %d (%v), want %d; output %q", code, err, exitInterrupted, rest)
				}
				if !strings.Contains(string(rest), "interrupted") || strings.Count(string(rest), "\n") != 1 {
					t.Errorf("after the signal: got %q, want one line saying it was interrupted", rest)
				}
				if d := time.Since(start); d > 30*time.Second {
					t.Errorf("the CLI took %s to end after the signal", d)
				}
				if left := leftovers(t, state, drv.name, ids[0]); len(left) > 0 {
					t.Errorf("left behind by the interrupted run: %v", left)
				}
				if left := listTree(t, state); len(left) > 0 {
					t.Errorf("left behind in the state directory: %v", left)
				}
			})
		}
	}
}

// TestRunKilled SIGKILLs a real `stockade run` whose program runs, which
// cannot destroy its sandbox, and checks that the next run in the same
// state directory removes what it left (bundle, runtime state, cgroups,
// processes) before its own, and leaves nothing itself.
func TestRunKilled(t *testing.T) {
	testenv.RequiresRoot(t)
	for _, drv := range liveDrivers {
		t.Run(drv.name, func(t *testing.T) {
			testenv.RequiresBinary(t, drv.binary)
			cmd, out, state := startRun(t, drv.name, "--runtime", "python", "-c", "import time\nprint('ready', flush=True)\ntime.sleep(120)")
			if l := waitLine(t, out); l != "ready\n" {
				t.Fatalf("got %q, want ready", l)
			}
			ids := sandboxIDs(t, state, drv.name)
			if len(ids) != 1 {
				t.Fatalf("sandboxes in the state directory: got %v, want one", ids)
			}
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			if left := leftovers(t, state, drv.name, ids[0]); len(left) == 0 {
				t.Fatal("the killed run left nothing: the check cannot see what the next run should remove")
			}
			if code, stdout, stderr := stockade(t, state, nil, "run", "--driver", drv.name, "--runtime", "shell", "-c", "echo next"); code != 0 || stdout != "next\n" {
				t.Fatalf("the next run: got exit %d, stdout %q, stderr %q", code, stdout, stderr)
			}
			if left := leftovers(t, state, drv.name, ids[0]); len(left) > 0 {
				t.Errorf("left behind by the killed run after the next one: %v", left)
			}
			if left := listTree(t, state); len(left) > 0 {
				t.Errorf("left behind in the state directory: %v", left)
			}
		})
	}
}

// TestRunOutputClosed checks that a reader of the output that goes away
// (`stockade run ... | head -1`) ends the run with 141, and the sandbox
// with it, rather than the CLI dying of SIGPIPE with the sandbox left.
func TestRunOutputClosed(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	state := filepath.Join(t.TempDir(), "state")
	cmd := exec.Command(testenv.Build(t, "./cmd/stockade"), "run", "--state-dir", state, "--guest", testenv.Guest(t),
		"--data-dir", testenv.DataDir(), "--driver", "runc", "--runtime", "python", "-c",
		"import time\nwhile True:\n    print('line', flush=True)\n    time.sleep(0.05)")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if l := waitLine(t, bufio.NewReader(stdout)); l != "line\n" {
		t.Fatalf("got %q, want line", l)
	}
	ids := sandboxIDs(t, state, "runc")
	stdout.Close()
	cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != exitOutputClosed {
		t.Fatalf("exit status: got %d (%v), want %d; stderr %q", code, cmd.ProcessState, exitOutputClosed, stderr.String())
	}
	if len(ids) != 1 {
		t.Fatalf("sandboxes: got %v, want one", ids)
	}
	if left := leftovers(t, state, "runc", ids[0]); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestRunStdin checks what reaches the program's standard input: a pipe
// into the CLI, a --stdin FILE, nothing when the code itself comes from
// stdin.
func TestRunStdin(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	input := filepath.Join(t.TempDir(), "input.txt")
	if err := os.WriteFile(input, []byte("7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	double := "print(int(input())*2)"
	state := filepath.Join(t.TempDir(), "state")
	for _, tc := range []struct {
		name  string
		stdin []byte
		args  []string
		want  string
	}{
		{"piped", []byte("5\n"), []string{"-c", double}, "10\n"},
		{"--stdin FILE", nil, []string{"--stdin", input, "-c", double}, "14\n"},
		{"--stdin FILE over a pipe", []byte("5\n"), []string{"--stdin", input, "-c", double}, "14\n"},
		{"--stdin -", []byte("6\n"), []string{"--stdin", "-", "-c", double}, "12\n"},
		{"code from stdin, input from FILE", []byte(double), []string{"--stdin", input, "-"}, "14\n"},
		{"code from stdin, no input", []byte("import sys; print(repr(sys.stdin.read()))"), []string{"-"}, "''\n"},
		{"empty pipe", []byte{}, []string{"-c", "import sys; print(repr(sys.stdin.read()))"}, "''\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := stockade(t, state, tc.stdin, append([]string{"run", "--driver", "runc", "--runtime", "python"}, tc.args...)...)
			if code != 0 || stdout != tc.want {
				t.Errorf("got exit %d, stdout %q (stderr %q); want exit 0, stdout %q", code, stdout, stderr, tc.want)
			}
		})
	}
}

// TestRunExitStatus runs programs that end every way there is, and checks
// the exit status in plain mode and that --json exits the same, with the
// result object or the error object on stdout.
func TestRunExitStatus(t *testing.T) {
	testenv.RequiresRoot(t)
	tools := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(tools, []byte(`tools:
  - name: py.only
    input_trust: trusted
    tier: container
    runtimes: [python]
    egress: none
    credentials: none
`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, drv := range liveDrivers {
		t.Run(drv.name, func(t *testing.T) {
			testenv.RequiresBinary(t, drv.binary)
			state := filepath.Join(t.TempDir(), "state")
			for _, tc := range []struct {
				name   string
				args   []string
				want   int
				status string // of the result; empty: an error, with this code
				code   string
			}{
				{"succeeded", []string{"--runtime", "shell", "-c", "exit 0"}, 0, "succeeded", ""},
				{"failed", []string{"--runtime", "shell", "-c", "exit 3"}, 3, "failed", ""},
				{"timed out", []string{"--runtime", "shell", "--timeout", "1s", "-c", "sleep 30"}, 124, "timed_out", ""},
				{"out of memory", []string{"--runtime", "python", "--memory", "32MiB", "-c", "b = []\nwhile True: b.append(bytearray(1 << 20))"}, 137, "oom_killed", ""},
				{"killed by a signal", []string{"--runtime", "shell", "-c", "kill -TERM $$"}, 128 + 15, "killed", ""},
				{"bad input", []string{"--runtime", "ruby", "-c", "1"}, exitUsage, "", "invalid_argument"},
				{"runtime the tool does not allow", []string{"--tools", tools, "--tool", "py.only", "--runtime", "shell", "-c", "true"}, exitUsage, "", "permission_denied"},
				{"missing image", []string{"--data-dir", t.TempDir(), "--runtime", "shell", "-c", "true"}, exitRunFailure, "", "not_found"},
			} {
				t.Run(tc.name, func(t *testing.T) {
					base := append([]string{"run", "--driver", drv.name}, tc.args...)
					code, _, stderr := stockade(t, state, nil, base...)
					if code != tc.want {
						t.Errorf("plain: exit %d, want %d (stderr %q)", code, tc.want, stderr)
					}
					code, stdout, stderr := stockade(t, state, nil, append(base, "--json")...)
					if code != tc.want {
						t.Errorf("--json: exit %d, want %d (stderr %q)", code, tc.want, stderr)
					}
					var got struct {
						Status string `json:"status"`
						Error  *struct {
							Code    string `json:"code"`
							Message string `json:"message"`
						} `json:"error"`
					}
					if err := json.Unmarshal([]byte(stdout), &got); err != nil {
						t.Fatalf("--json: stdout %q is not JSON: %v", stdout, err)
					}
					switch {
					case tc.status != "" && got.Status != tc.status:
						t.Errorf("--json: status %q, want %q", got.Status, tc.status)
					case tc.status == "" && (got.Error == nil || got.Error.Code != tc.code || got.Error.Message == ""):
						t.Errorf("--json: got %s, want {\"error\":{\"code\":%q,\"message\":...}}", stdout, tc.code)
					case tc.status == "" && stderr != "":
						t.Errorf("--json: stderr %q, want the error on stdout alone", stderr)
					}
				})
			}
			if left := listTree(t, state); len(left) > 0 {
				t.Errorf("left behind in the state directory: %v", left)
			}
		})
	}
}
