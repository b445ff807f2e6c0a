package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/wire"
)

// stockade runs the CLI binary with a private state directory and the test
// guest and images, and returns its exit status, stdout and stderr.
func stockade(t *testing.T, stateDir string, stdin []byte, args ...string) (int, string, string) {
	t.Helper()
	full := append([]string{args[0], "--state-dir", stateDir, "--guest", testenv.Guest(t), "--data-dir", testenv.DataDir()}, args[1:]...)
	return runCLI(t, stdin, full...)
}

// runCLI runs the CLI binary with args as given.
func runCLI(t *testing.T, stdin []byte, args ...string) (int, string, string) {
	t.Helper()
	return runCLIEnv(t, stdin, nil, args...)
}

// runWithEnv runs the CLI with the test's environment, less every
// STOCKADE_ variable, plus env.
func runWithEnv(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	return runCLIEnv(t, nil, append([]string{}, env...), args...)
}

// runCLIEnv runs the CLI binary with args and stdin; env, when not nil,
// replaces the test's STOCKADE_ variables (nil: the test's environment).
func runCLIEnv(t *testing.T, stdin []byte, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(testenv.Build(t, "./cmd/stockade"), args...)
	cmd.Stdin = bytes.NewReader(stdin)
	if env != nil {
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "STOCKADE_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, env...)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errb.String()
}

func TestRunBadInput(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.py")
	huge := filepath.Join(dir, "huge.py")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(huge, bytes.Repeat([]byte("#"), 1<<20+1), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string // in the one-line error
		code int    // the exit status
	}{
		{"unknown runtime", []string{"--runtime", "ruby", "-c", "1"}, `unknown runtime "ruby"`, exitUsage},
		{"unknown driver", []string{"--runtime", "python", "--driver", "kata", "-c", "1"}, `unknown driver "kata"`, exitUsage},
		{"no runtime", []string{"-c", "1"}, "--runtime is required", exitUsage},
		{"no code", []string{"--runtime", "python"}, "no code", exitUsage},
		{"empty code", []string{"--runtime", "python", empty}, "code is empty", exitUsage},
		{"code over 1 MiB", []string{"--runtime", "python", huge}, "more than the limit of 1 MiB", exitUsage},
		{"missing file", []string{"--runtime", "python", filepath.Join(dir, "nope.py")}, "no such file", exitUsage},
		{"zero timeout", []string{"--runtime", "python", "--timeout", "0s", "-c", "1"}, "--timeout must be positive", exitUsage},
		{"negative timeout", []string{"--runtime", "python", "--timeout", "-1s", "-c", "1"}, `duration "-1s" must not be negative`, exitUsage},
		{"timeout without a unit", []string{"--runtime", "python", "--timeout", "30", "-c", "1"}, `invalid duration "30": a number needs a unit`, exitUsage},
		{"timeout above ceiling", []string{"--runtime", "python", "--timeout", "11m", "-c", "1"}, "above the ceiling", exitUsage},
		{"memory below minimum", []string{"--runtime", "python", "--memory", "8MiB", "-c", "1"}, "below the minimum of 16MiB", exitUsage},
		{"memory above ceiling", []string{"--runtime", "python", "--memory", "100GiB", "-c", "1"}, "above the ceiling", exitUsage},
		{"memory not a size", []string{"--runtime", "python", "--memory", "lots", "-c", "1"}, "invalid size", exitUsage},
		{"unknown flag", []string{"--runtime", "python", "--timout", "1s", "-c", "1"}, "flag provided but not defined: -timout", exitUsage},
		{"code and stdin both from stdin", []string{"--runtime", "python", "--stdin", "-", "-"}, "cannot both be the standard input", exitUsage},
		{"missing stdin file", []string{"--runtime", "python", "--stdin", filepath.Join(dir, "nope.txt"), "-c", "1"}, "reading --stdin", exitUsage},
		// What the host lacks is no bad input: the code could not be run.
		{"missing image", []string{"--runtime", "python", "--data-dir", filepath.Join(dir, "no-images"), "-c", "1"}, `stockade image build python`, exitRunFailure},
		{"missing runc", []string{"--runtime", "python", "--driver", "runc", "--runc", "/nonexistent/runc", "-c", "1"}, "/nonexistent/runc not found", exitRunFailure},
		{"missing runsc", []string{"--runtime", "python", "--driver", "gvisor", "--runsc", "/nonexistent/runsc", "-c", "1"}, "/nonexistent/runsc not found", exitRunFailure},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			code, stdout, stderr := stockade(t, state, nil, append([]string{"run"}, tt.args...)...)
			if code != tt.code {
				t.Errorf("exit status: got %d, want %d (stderr %q)", code, tt.code, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout: got %q, want nothing", stdout)
			}
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], tt.want) {
				t.Errorf("stderr: got %q, want one line containing %q", stderr, tt.want)
			}
			// Nothing behind: the state directory holds every bundle and
			// the runtime state, and a sandbox's cgroup is created only
			// after its bundle; so an untouched state directory means no
			// bundle, no runtime state and no cgroup was made.
			if left := listTree(t, state); len(left) > 0 {
				t.Errorf("left behind in the state directory: %v", left)
			}
		})
	}
}

// listTree lists the files below dir. Every bundle holds a config.json and
// every runtime state directory a state file, so no files means nothing left.
func listTree(t *testing.T, dir string) []string {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if os.IsNotExist(err) {
			return nil
		}
		if err == nil && !d.IsDir() {
			out = append(out, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestRunPrograms(t *testing.T) {
	testenv.RequiresRoot(t)
	for _, driver := range []string{"runc", "gvisor"} {
		t.Run(driver, func(t *testing.T) {
			testenv.RequiresBinary(t, map[string]string{"runc": "runc", "gvisor": "runsc"}[driver])
			state := filepath.Join(t.TempDir(), "state")
			tests := []struct {
				name, runtime, code string
				stdin               []byte
				wantCode            int
				wantOut             string
			}{
				{"python pandas", "python", "import pandas, numpy, requests; print(pandas.__version__ > '2')", nil, 0, "True\n"},
				{"python exit code", "python", "import sys; print('bye'); sys.exit(7)", nil, 7, "bye\n"},
				{"node", "node", "console.log(6*7)", nil, 0, "42\n"},
				{"shell", "shell", "echo $((6*7)); exit 3", nil, 3, "42\n"},
				{"code from stdin", "python", "", []byte("print('from stdin')"), 0, "from stdin\n"},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					args := []string{"run", "--driver", driver, "--runtime", tt.runtime}
					if tt.stdin != nil {
						args = append(args, "-")
					} else {
						args = append(args, "-c", tt.code)
					}
					code, stdout, stderr := stockade(t, state, tt.stdin, args...)
					if code != tt.wantCode || stdout != tt.wantOut {
						t.Errorf("got exit %d stdout %q (stderr %q), want exit %d stdout %q", code, stdout, stderr, tt.wantCode, tt.wantOut)
					}
				})
			}
			t.Run("json", func(t *testing.T) {
				code, stdout, stderr := stockade(t, state, nil, "run", "--driver", driver, "--runtime", "python", "--json", "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(4)")
				if code != 4 {
					t.Fatalf("exit status %d, want the program's 4 (stderr %q)", code, stderr)
				}
				var res map[string]any
				if err := json.Unmarshal([]byte(stdout), &res); err != nil {
					t.Fatalf("decoding %q: %v", stdout, err)
				}
				want := map[string]any{"status": "failed", "exit_code": 4.0, "stdout": "out\n", "stderr": "err\n", "driver": driver, "runtime": "python", "stdout_truncated": false, "network": "none"}
				for k, v := range want {
					if res[k] != v {
						t.Errorf("%s: got %v, want %v", k, res[k], v)
					}
				}
				for _, k := range []string{"signal", "stderr_truncated", "duration_ms", "cpu_ms", "peak_memory_bytes"} {
					if _, ok := res[k]; !ok {
						t.Errorf("field %s missing from %s", k, stdout)
					}
				}
			})
			t.Run("no network", func(t *testing.T) {
				code, _, stderr := stockade(t, state, nil, "run", "--driver", driver, "--runtime", "python", "-c", "import socket; socket.getaddrinfo('example.com', 443)")
				if want := "stockade: this run had no network (network \"none\")"; code != 1 || !strings.Contains(stderr, want) {
					t.Errorf("got exit %d, stderr %q; want 1 and %q", code, stderr, want)
				}
			})
			if left := listTree(t, state); len(left) > 0 {
				t.Errorf("left behind in the state directory: %v", left)
			}
		})
	}
}

// TestRunNotRoot checks that a local run by a user other than root that
// meets a permission error keeps the system's words and says what to do:
// run as root, or on a daemon.
func TestRunNotRoot(t *testing.T) {
	testenv.RequiresRoot(t) // to run the CLI as another user
	// The binary, in a directory the other user may enter.
	bin, err := os.MkdirTemp("", "stockade-notroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bin) })
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(testenv.Build(t, "./cmd/stockade"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "stockade"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	rootOnly := filepath.Join(t.TempDir(), "root-only")
	if err := os.Mkdir(rootOnly, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"root-only images or a state directory it cannot make", []string{"--state-dir", filepath.Join(rootOnly, "state"), "--driver", "gvisor"}},
		{"a data directory it cannot read", []string{"--data-dir", filepath.Join(rootOnly, "data"), "--state-dir", filepath.Join(rootOnly, "state")}},
	} {
		for _, asJSON := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s json=%t", tc.name, asJSON), func(t *testing.T) {
				args := append([]string{"run", "--runtime", "python", "-c", "print(1)"}, tc.args...)
				if asJSON {
					args = append(args, "--json")
				}
				cmd := exec.Command(filepath.Join(bin, "stockade"), args...)
				cmd.Dir = "/"
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
				var out, errb bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &errb
				if err := cmd.Run(); cmd.ProcessState == nil {
					t.Fatal(err)
				}
				msg := out.String() + errb.String()
				if code := cmd.ProcessState.ExitCode(); code != exitRunFailure || !strings.Contains(msg, "permission denied") ||
					!strings.Contains(msg, "as root") {
					t.Errorf("got exit %d, %q; want %d, permission denied and the hint to run as root", code, msg, exitRunFailure)
				}
			})
		}
	}
}

// TestResultStatus tables run's exit status per ending: a run Stockade
// ended (no signal of the program's own) is 137, not 128.
func TestResultStatus(t *testing.T) {
	for _, tc := range []struct {
		name string
		res  engine.Result
		want int
	}{
		{"succeeded", engine.Result{Status: sandbox.StatusSucceeded}, 0},
		{"failed", engine.Result{Status: sandbox.StatusFailed, Run: wire.Run{ExitCode: 3}}, 3},
		{"timed out", engine.Result{Status: sandbox.StatusTimedOut, Run: wire.Run{Signal: 9}}, 124},
		{"oom", engine.Result{Status: sandbox.StatusOOMKilled, Run: wire.Run{Signal: 9}}, 137},
		{"signal", engine.Result{Status: sandbox.StatusKilled, Run: wire.Run{Signal: 15}}, 143},
		{"ended by a cancel", engine.Result{Status: sandbox.StatusKilled, Run: wire.Run{EndedBy: engine.EndedByCancel}}, 137},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := resultStatus(&tc.res); got != tc.want {
				t.Errorf("got %d, want %d", got, tc.want)
			}
		})
	}
}
