package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/internal/daemontest"
	"github.com/stockade-sh/stockade/internal/testenv"
)

// TestRunRemote runs `stockade run --url` against a daemon with real runc
// sandboxes: the output streamed, the exit statuses of a local run, the
// approval waited for, and the daemon's refusals.
func TestRunRemote(t *testing.T) {
	d := daemontest.Start(t, daemontest.Options{})
	open := d.Workspace(t, daemontest.NoApproval, 100)
	broke := d.Workspace(t, daemontest.NoApproval, 0)
	gated := d.Workspace(t, nil, 100)
	for _, tc := range []struct {
		name    string
		key     string
		args    []string
		stdin   string
		decide  func(c *client.Client, id string) error
		status  int
		stdout  string
		stderrs []string
	}{
		{"42", open.Agent, []string{"--runtime", "python", "-c", "print(6*7)"}, "", nil, 0, "42\n", nil},
		{"exit code and stderr", open.Agent, []string{"--runtime", "shell", "-c", "echo out; echo err >&2; exit 3"}, "", nil, 3, "out\n", []string{"err\n"}},
		{"stdin", open.Agent, []string{"--runtime", "python", "-c", "print(int(input())*2)"}, "5\n", nil, 0, "10\n", nil},
		{"timeout", open.Agent, []string{"--runtime", "shell", "--timeout", "1s", "-c", "sleep 10"}, "", nil, 124, "", []string{"timed out"}},
		{"approved", gated.Agent, []string{"--runtime", "node", "-c", "console.log(6*7)"}, "",
			func(c *client.Client, id string) error { _, err := c.Approve(t.Context(), id, ""); return err }, 0, "42\n", []string{"waiting for an approver to decide on apr_"}},
		{"denied", gated.Agent, []string{"--runtime", "python", "-c", "print(1)"}, "",
			func(c *client.Client, id string) error { _, err := c.Deny(t.Context(), id, ""); return err }, 1, "", []string{"denied", "did not run"}},
		{"no credits", broke.Agent, []string{"--runtime", "python", "-c", "print(1)"}, "", nil, 1, "", []string{"insufficient credits"}},
		{"a bad key", "sk_nope", []string{"--runtime", "python", "-c", "print(1)"}, "", nil, 2, "", []string{"invalid or revoked API key"}},
		{"an unknown runtime", open.Agent, []string{"--runtime", "ruby", "-c", "puts 1"}, "", nil, 2, "", []string{"ruby"}},
		{"a local flag", open.Agent, []string{"--runtime", "python", "--driver", "runc", "-c", "print(1)"}, "", nil, 2, "", []string{"--driver does not apply with --url"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(testenv.Build(t, "./cmd/stockade"), append([]string{"run", "--url", d.URL, "--key", tc.key}, tc.args...)...)
			cmd.Stdin = strings.NewReader(tc.stdin)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if tc.decide != nil {
				decideNext(t, d, gated.Approver, tc.decide)
			}
			status := exitOf(t, cmd)
			if status != tc.status || stdout.String() != tc.stdout {
				t.Errorf("got status %d, stdout %q; want %d, %q (stderr %q)", status, stdout.String(), tc.status, tc.stdout, stderr.String())
			}
			for _, s := range tc.stderrs {
				if !strings.Contains(stderr.String(), s) {
					t.Errorf("stderr: got %q, want it to contain %q", stderr.String(), s)
				}
			}
		})
	}
	// An interruption cancels the execution on the daemon, whether it
	// waits for its approval or runs.
	for _, tc := range []struct {
		name, key, code string
		stdout          bool // the line to wait for is the program's
		line            string
		want            client.ExecutionStatus
	}{
		{"interrupted awaiting approval", gated.Agent, "print(1)", false, "waiting for an approver", client.StatusCancelled},
		{"interrupted running", open.Agent, "import time\nprint('started', flush=True)\ntime.sleep(60)", true, "started", client.StatusKilled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(testenv.Build(t, "./cmd/stockade"), "run", "--url", d.URL, "--key", tc.key, "--runtime", "python", "-c", tc.code)
			var errBuf bytes.Buffer
			var watched io.Reader
			var err error
			if tc.stdout {
				watched, err = cmd.StdoutPipe()
				cmd.Stderr = &errBuf
			} else {
				watched, err = cmd.StderrPipe()
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			r := bufio.NewReader(watched)
			if line := waitLine(t, r); !strings.Contains(line, tc.line) {
				t.Fatalf("got %q, want a line with %q", line, tc.line)
			}
			cmd.Process.Signal(syscall.SIGINT)
			rest, _ := io.ReadAll(r)
			status := exitOf(t, cmd)
			stderr := errBuf.String() + string(rest)
			_, after, ok := strings.Cut(stderr, "cancelled execution ")
			id, _, _ := strings.Cut(after, ",")
			if status != exitInterrupted || !ok {
				t.Fatalf("got status %d, stderr %q; want %d, saying the execution was cancelled", status, stderr, exitInterrupted)
			}
			c, err := client.New(d.URL, tc.key)
			if err != nil {
				t.Fatal(err)
			}
			ex, err := c.GetExecution(t.Context(), id, 30*time.Second)
			if err != nil || ex.Status != tc.want {
				t.Errorf("execution %s on the daemon: got %+v, %v; want it %s", id, ex, err, tc.want)
			}
		})
	}
	// STOCKADE_URL is --url: the run is the daemon's, one more tool call
	// of the workspace.
	t.Run("STOCKADE_URL", func(t *testing.T) {
		c, err := client.New(d.URL, open.Agent)
		if err != nil {
			t.Fatal(err)
		}
		succeeded := func() int {
			calls, err := c.ListToolCalls(t.Context(), client.ToolCallFilter{Statuses: []client.ExecutionStatus{client.StatusSucceeded}})
			if err != nil {
				t.Fatal(err)
			}
			return len(calls.Items)
		}
		before := succeeded()
		cmd := exec.Command(testenv.Build(t, "./cmd/stockade"), "run", "--runtime", "python", "-c", "print(6*7)")
		cmd.Env = append(cmd.Environ(), "STOCKADE_URL="+d.URL, "STOCKADE_KEY="+open.Agent)
		out, err := cmd.Output()
		if err != nil || string(out) != "42\n" {
			t.Fatalf("got %q, %v; want 42", out, err)
		}
		if after := succeeded(); after != before+1 {
			t.Errorf("the workspace's succeeded tool calls: got %d, want %d: the run was not the daemon's", after, before+1)
		}
	})
	t.Run("json", func(t *testing.T) {
		cmd := exec.Command(testenv.Build(t, "./cmd/stockade"), "run", "--url", d.URL, "--json", "--runtime", "shell", "-c", "echo 42; exit 4")
		cmd.Env = append(cmd.Environ(), "STOCKADE_KEY="+open.Agent)
		out, _ := cmd.Output()
		var res struct {
			Status   string `json:"status"`
			ExitCode int    `json:"exit_code"`
			Stdout   string `json:"stdout"`
			Driver   string `json:"driver"`
		}
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("decoding %q: %v", out, err)
		}
		if res.Status != "failed" || res.ExitCode != 4 || res.Stdout != "42\n" || res.Driver != "runc" || cmd.ProcessState.ExitCode() != 4 {
			t.Errorf("got %+v, exit %d; want failed, 4, 42 on runc", res, cmd.ProcessState.ExitCode())
		}
	})
}

// decideNext decides the first pending approval request with decide.
func decideNext(t *testing.T, d *daemontest.Daemon, approverKey string, decide func(*client.Client, string) error) {
	t.Helper()
	c, err := client.New(d.URL, approverKey)
	if err != nil {
		t.Fatal(err)
	}
	for range 600 {
		p, err := c.ListApprovals(t.Context(), client.ApprovalFilter{Status: client.ApprovalPending})
		if err == nil && len(p.Items) > 0 {
			if err := decide(c, p.Items[0].ID); err != nil {
				t.Fatal(err)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("no approval request appeared")
}

// exitOf waits for cmd (at most a minute) and returns its exit status.
func exitOf(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode()
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatal("stockade run did not end within a minute")
		return 0
	}
}
