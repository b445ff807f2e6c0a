package vercel_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/internal/testenv"
)

// TestCheckCommand runs `stockade driver check vercel` against the fake
// (STOCKADE_VERCEL_API): every step passes with the fake's credentials,
// and a wrong token fails the first step and the command.
func TestCheckCommand(t *testing.T) {
	f, base := fakeAPI(t)
	bin := testenv.Build(t, "./cmd/stockade")
	run := func(tok string) (string, error) {
		cmd := exec.CommandContext(t.Context(), bin, "driver", "check", "vercel")
		cmd.Env = append(os.Environ(), "STOCKADE_VERCEL_API="+base, "VERCEL_TOKEN="+tok, "VERCEL_TEAM_ID="+team, "VERCEL_PROJECT_ID="+project)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run(token)
	t.Logf("stockade driver check vercel:\n%s", out)
	if err != nil {
		t.Fatalf("got %v, want success", err)
	}
	for _, s := range []string{"credentials", "create", "run", "environment", "read file", "timeout", "after timeout", "no network", "destroy"} {
		if !strings.Contains(out, "ok    "+s+"\n") {
			t.Errorf("step %q did not pass", s)
		}
	}
	if left := f.Running(); len(left) > 0 {
		t.Errorf("the check left sandboxes running: %v", left)
	}
	out, err = run("wrong")
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(out, "FAIL  credentials") {
		t.Errorf("with a wrong token: got %v and %q, want exit 1 and the credentials step failed", err, out)
	}
}

// TestRunCommand runs `stockade run --driver vercel` against the fake:
// the wiring builds the driver from the environment, and the engine's
// one-shot reaches the provider's API (python on python3.13).
func TestRunCommand(t *testing.T) {
	_, base := fakeAPI(t)
	bin := testenv.Build(t, "./cmd/stockade")
	cmd := exec.CommandContext(t.Context(), bin, "run", "--driver", "vercel", "--runtime", "python", "--data-dir", testenv.DataDir(),
		"--state-dir", t.TempDir(), "--json", "-c", "import sys, os; print(sys.stdin.read().upper(), sorted(os.environ)); sys.exit(4)")
	cmd.Env = append(os.Environ(), "STOCKADE_VERCEL_API="+base, "VERCEL_TOKEN="+token, "VERCEL_TEAM_ID="+team, "VERCEL_PROJECT_ID="+project)
	cmd.Stdin = strings.NewReader("from stdin")
	out, err := cmd.Output()
	t.Logf("stockade run --driver vercel: %s", out)
	var res struct {
		Status   string `json:"status"`
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
	}
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		t.Fatalf("%v: %v %s", err, jerr, out)
	}
	if res.ExitCode != 4 || !strings.HasPrefix(res.Stdout, "FROM STDIN") || strings.Contains(res.Stdout, "VERCEL") {
		t.Errorf("got %+v, want exit 4, the stdin upper-cased and no VERCEL_ variable", res)
	}
}
