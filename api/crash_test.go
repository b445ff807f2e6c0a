package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/wire"
)

// daemon is a `stockade serve` process.
type daemon struct {
	t    *testing.T
	cmd  *exec.Cmd
	url  string
	mu   sync.Mutex
	logs bytes.Buffer
	done chan struct{} // closed when the process has exited
}

var listenLog = regexp.MustCompile(`msg="stockade serving" listen=(\S+)`)

// startDaemon runs `stockade serve` with args and waits until it answers
// /healthz. The process is killed when the test ends; its log is shown if
// the test failed.
func startDaemon(t *testing.T, bin string, args ...string) *daemon {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve"}, args...)...)
	cmd.Env = append(os.Environ(), "STOCKADE_DRIVER=runc")
	return startProcess(t, cmd)
}

// startProcess starts cmd, a daemon that logs "stockade serving" with its
// listen address on stderr as stockade serve does, and waits until it
// answers /healthz, as startDaemon.
func startProcess(t *testing.T, cmd *exec.Cmd) *daemon {
	t.Helper()
	d := &daemon{t: t, cmd: cmd, done: make(chan struct{})}
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("starting stockade serve: %v", err)
	}
	listening := make(chan string, 1)
	go func() {
		defer close(d.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			d.mu.Lock()
			d.logs.WriteString(line + "\n")
			d.mu.Unlock()
			if m := listenLog.FindStringSubmatch(line); m != nil {
				select {
				case listening <- m[1]:
				default:
				}
			}
		}
		_ = d.cmd.Wait()
	}()
	t.Cleanup(func() {
		d.kill()
		if t.Failed() {
			t.Logf("stockade serve log:\n%s", d.log())
		}
	})
	select {
	case addr := <-listening:
		d.url = "http://" + addr
	case <-d.done:
		t.Fatalf("stockade serve exited before listening:\n%s", d.log())
	case <-time.After(60 * time.Second):
		t.Fatalf("stockade serve did not listen within 60 s:\n%s", d.log())
	}
	do(t, d.url, "GET", "/healthz", "", nil).want(t, http.StatusOK)
	return d
}

func (d *daemon) log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.logs.String()
}

// kill sends SIGKILL and waits for the process to be gone.
func (d *daemon) kill() {
	if d.cmd.ProcessState == nil {
		_ = d.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-d.done
}

// stop asks the daemon to shut down and waits for it.
func (d *daemon) stop() {
	d.t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		if code := d.cmd.ProcessState.ExitCode(); code != 0 {
			d.t.Errorf("stockade serve exited with %d after SIGTERM", code)
		}
	case <-time.After(40 * time.Second):
		d.t.Errorf("stockade serve did not stop within 40 s of SIGTERM")
		d.kill()
	}
}

// cli runs an admin command of the stockade binary and returns its stdout.
func cli(t *testing.T, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("stockade %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.String()
}

// dirEntries lists a directory's entries; a missing directory has none.
func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// setUpDaemon creates workspace "crash" on db, with an agent key (returned),
// 10 credits and no approval, and returns the arguments of a `stockade
// serve` on db with state directory state, the runc driver and no egress.
func setUpDaemon(t *testing.T, bin, dir, db, state string) (key string, args []string) {
	t.Helper()
	cli(t, bin, "workspace", "create", "crash", "--db", db)
	key = strings.TrimSpace(cli(t, bin, "key", "create", "--workspace", "crash", "--role", "agent", "--db", db))
	cli(t, bin, "credits", "grant", "crash", "10", "--db", db)
	cli(t, bin, "policy", "set", "crash", "--approval=none", "--db", db)
	// The docker driver points nowhere, so that this daemon's start-up
	// reap never touches containers of another Stockade on the host. No
	// warm pool: the tests count the sandboxes of executions.
	cfg := filepath.Join(dir, "stockade.yaml")
	if err := os.WriteFile(cfg, []byte("driver: runc\npools: []\ndocker_host: unix://"+filepath.Join(dir, "no-docker.sock")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return key, []string{"--config", cfg, "--db", db, "--state-dir", state, "--guest", testenv.Guest(t),
		"--data-dir", testenv.DataDir(), "--listen", "127.0.0.1:0", "--egress=false"}
}

// startSleeper starts a python run that prints and sleeps 30 s, and returns
// its stream and execution id once its output shows it running.
func startSleeper(t *testing.T, base, key string) (*stream, string) {
	t.Helper()
	s := postStream(t, base, key, capability.InvokeRequest{Runtime: "python", Code: "import time\nprint('sleeping', flush=True)\ntime.sleep(30)\n"})
	started := s.next(60 * time.Second)
	if started.name != "started" {
		t.Fatalf("first event: got %q (%s), want started", started.name, started.data)
	}
	var st struct {
		ExecutionID string `json:"execution_id"`
		Driver      string `json:"driver"`
	}
	if err := json.Unmarshal([]byte(started.data), &st); err != nil || st.ExecutionID == "" || st.Driver != "runc" {
		t.Fatalf("started event: got %s, want an execution id on runc", started.data)
	}
	if ev := s.next(30 * time.Second); ev.name != "stdout" || !strings.Contains(ev.data, "sleeping") {
		t.Fatalf("second event: got %q %s, want the program's stdout", ev.name, ev.data)
	}
	if v := do(t, base, "GET", "/v1/executions/"+st.ExecutionID, key, nil).want(t, http.StatusOK).execution(t); string(v.Status) != string(model.StatusRunning) {
		t.Fatalf("got status %q, want running", v.Status)
	}
	return s, st.ExecutionID
}

// TestOneDaemonPerDatabase starts a second daemon while the first runs a
// sandbox, once on the same database (with its own state directory) and
// once in the same state directory (with its own database). Starting, it
// would fail the first one's execution or destroy its sandbox; it must
// refuse to start instead, naming what is shared, and leave the run alone.
func TestOneDaemonPerDatabase(t *testing.T) {
	requireSandboxes(t)
	bin := testenv.Build(t, "./cmd/stockade")
	forEachStore(t, func(t *testing.T, b backend) {
		dir := t.TempDir()
		state := filepath.Join(dir, "state")
		key, args := setUpDaemon(t, bin, dir, b.url(t), state)
		d := startDaemon(t, bin, args...)
		s, execID := startSleeper(t, d.url, key)
		_, otherDB := setUpDaemon(t, bin, t.TempDir(), b.url(t), state)
		for _, c := range []struct {
			name string
			args []string
			want string
		}{
			{"same database", append(slices.Clone(args), "--state-dir", filepath.Join(dir, "state2")), "another stockade daemon serves"},
			{"same state directory", otherDB, "another stockade daemon on this host uses the state directory " + state},
		} {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			cmd := exec.CommandContext(ctx, bin, append([]string{"serve"}, c.args...)...)
			cmd.Env = append(os.Environ(), "STOCKADE_DRIVER=runc")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			cancel()
			if err == nil || !strings.Contains(stderr.String(), c.want) {
				t.Errorf("%s: a second daemon: got %v, stderr:\n%s\nwant a failure saying %q", c.name, err, stderr.String(), c.want)
			}
		}
		if v := do(t, d.url, "GET", "/v1/executions/"+execID, key, nil).want(t, http.StatusOK).execution(t); string(v.Status) != string(model.StatusRunning) {
			t.Errorf("the first daemon's execution after the attempts: got %q (%s), want still running", v.Status, v.Result)
		}
		if bundles := dirEntries(t, filepath.Join(state, "runc", "bundles")); len(bundles) != 1 {
			t.Errorf("the first daemon's sandboxes after the attempts: got %v, want its one", bundles)
		}
		s.close()
		d.stop()
	})
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestCrashRecovery kills a daemon with SIGKILL while a sandbox runs and
// checks that the restarted daemon leaves no reservation open and no
// orphaned sandbox: the execution is failed, its credits are back, and the
// runc state, bundle, cgroup and processes of its sandbox are gone.
func TestCrashRecovery(t *testing.T) {
	requireSandboxes(t)
	bin := testenv.Build(t, "./cmd/stockade")
	forEachStore(t, func(t *testing.T, b backend) {
		dir := t.TempDir()
		state := filepath.Join(dir, "state")
		key, args := setUpDaemon(t, bin, dir, b.url(t), state)
		d := startDaemon(t, bin, args...)
		s, execID := startSleeper(t, d.url, key)
		bundles := filepath.Join(state, "runc", "bundles")
		runcState := filepath.Join(state, "runc", "state")
		ids := dirEntries(t, bundles)
		if len(ids) != 1 {
			t.Fatalf("bundles while running: got %v, want one", ids)
		}
		sbx := ids[0]
		if len(sandboxkit.ProcessesMentioning(sbx)) == 0 {
			t.Fatalf("no process of sandbox %s while it runs", sbx)
		}

		d.kill()
		// What the crash left behind; the restart must clean all of it.
		time.Sleep(500 * time.Millisecond)
		cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/stockade/" + sbx)
		cgroups = append(cgroups, "/sys/fs/cgroup/stockade/"+sbx)
		t.Logf("after SIGKILL: bundle %v, runc state %v, cgroup %v, processes %q",
			exists(filepath.Join(bundles, sbx)), exists(filepath.Join(runcState, sbx)), slices.ContainsFunc(cgroups, exists), sandboxkit.ProcessesMentioning(sbx))
		if !exists(filepath.Join(bundles, sbx)) {
			t.Fatalf("the killed daemon's sandbox %s left no bundle; the test no longer exercises the reap", sbx)
		}

		d = startDaemon(t, bin, args...)
		v := do(t, d.url, "GET", "/v1/executions/"+execID, key, nil).want(t, http.StatusOK).execution(t)
		if string(v.Status) != string(model.StatusFailed) || !strings.Contains(v.Result.String(), "interrupted") {
			t.Errorf("after the restart: got status %q result %s, want failed, interrupted", v.Status, v.Result)
		}
		var ws wire.Workspace
		do(t, d.url, "GET", "/v1/workspace", key, nil).want(t, http.StatusOK).decode(t, &ws)
		if ws.Credits.Available != 10 || ws.Credits.Reserved != 0 {
			t.Errorf("credits after the restart: got available %d reserved %d, want 10 and 0", ws.Credits.Available, ws.Credits.Reserved)
		}
		calls := list[wire.ToolCall](t, d.url, key, "/v1/tool-calls", "")
		if len(calls) != 1 || calls[0].Status != "failed" || calls[0].CreditsCharged != 0 {
			t.Errorf("tool_calls rows: got %+v, want one failed with 0 credits", calls)
		}
		if rec := list[wire.AuditEvent](t, d.url, key, "/v1/audit/events", "type=execution.recovered"); len(rec) != 1 || rec[0].ExecutionID != execID {
			t.Errorf("execution.recovered events: got %+v, want one for %s", rec, execID)
		}

		if got := dirEntries(t, runcState); len(got) != 0 {
			t.Errorf("runc containers left in %s: %v", runcState, got)
		}
		if out, err := exec.Command("runc", "--root", runcState, "list", "-q").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "" {
			t.Errorf("runc list: got %q (err %v), want nothing", out, err)
		}
		if got := dirEntries(t, bundles); len(got) != 0 {
			t.Errorf("bundles left in %s: %v", bundles, got)
		}
		for _, cg := range cgroups {
			if exists(cg) {
				t.Errorf("cgroup %s left behind", cg)
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for procs := sandboxkit.ProcessesMentioning(sbx); len(procs) > 0; procs = sandboxkit.ProcessesMentioning(sbx) {
			if time.Now().After(deadline) {
				t.Errorf("processes of sandbox %s left after the restart: %q", sbx, procs)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}

		// The restarted daemon works and charges as usual.
		after := do(t, d.url, "POST", "/v1/executions", key, capability.InvokeRequest{Runtime: "shell", Code: "echo alive"}).want(t, http.StatusOK).execution(t)
		if string(after.Status) != string(model.StatusSucceeded) {
			t.Errorf("a run after the restart: got %q, want succeeded", after.Status)
		}
		do(t, d.url, "GET", "/v1/workspace", key, nil).want(t, http.StatusOK).decode(t, &ws)
		if ws.Credits.Available != 8 || ws.Credits.Reserved != 0 {
			t.Errorf("credits after one more run: got available %d reserved %d, want 8 and 0", ws.Credits.Available, ws.Credits.Reserved)
		}
		s.close()
		d.stop()
	})
}

// TestCrashReapsPools kills a daemon with SIGKILL while its warm pool (the
// default one) holds sandboxes, and checks that the restarted daemon
// destroys them: they carry its owner label.
func TestCrashReapsPools(t *testing.T) {
	requireSandboxes(t)
	bin := testenv.Build(t, "./cmd/stockade")
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	_, args := setUpDaemon(t, bin, dir, "sqlite:"+filepath.Join(dir, "stockade.db"), state)
	pooled := filepath.Join(dir, "pooled.yaml")
	if err := os.WriteFile(pooled, []byte("driver: runc\npools: [{runtime: python, size: 2}]\ndocker_host: unix://"+filepath.Join(dir, "no-docker.sock")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, bin, append(slices.Clone(args), "--config", pooled)...)
	bundles := filepath.Join(state, "runc", "bundles")
	deadline := time.Now().Add(60 * time.Second)
	for len(dirEntries(t, bundles)) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the pool's sandboxes: got %v after 60s, want 2", dirEntries(t, bundles))
		}
		time.Sleep(50 * time.Millisecond)
	}
	ids := dirEntries(t, bundles)
	d.kill()
	d = startDaemon(t, bin, args...) // without pools
	for _, id := range ids {
		if exists(filepath.Join(bundles, id)) || len(sandboxkit.ProcessesMentioning(id)) > 0 {
			t.Errorf("pool sandbox %s of the killed daemon is left after the restart", id)
		}
	}
	if out, err := exec.Command("runc", "--root", filepath.Join(state, "runc", "state"), "list", "-q").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("runc list: got %q (err %v), want nothing", out, err)
	}
	d.stop()
}

// TestCrashReattachesPooledSession opens a python session from a `stockade
// serve`'s session pool, kills the daemon with SIGKILL between two cells,
// and checks that the restarted daemon (without pools) re-attaches the
// session with its kernel's value and its file, as a cold session's, and
// destroys the pool's unbound sandbox that the killed daemon had refilled:
// it carries the owner label.
func TestCrashReattachesPooledSession(t *testing.T) {
	requireSandboxes(t)
	bin := testenv.Build(t, "./cmd/stockade")
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	key, args := setUpDaemon(t, bin, dir, "sqlite:"+filepath.Join(dir, "stockade.db"), state)
	pooled := filepath.Join(dir, "pooled.yaml")
	if err := os.WriteFile(pooled, []byte("driver: runc\npools: [{runtime: python, size: 0, sessions: 1}]\ndocker_host: unix://"+filepath.Join(dir, "no-docker.sock")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, bin, append(slices.Clone(args), "--config", pooled)...)
	const ready = `stockade_pool_sandboxes{pool="code.execute/python/session"}`
	waitFor := func(series string, want float64) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for metricValue(t, d.url, series) != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: got %v after 60s, want %v", series, metricValue(t, d.url, series), want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor(ready, 1)
	var ss struct {
		ID string `json:"id"`
	}
	do(t, d.url, "POST", "/v1/sessions", key, capability.CreateSessionRequest{Runtime: "python"}).want(t, http.StatusCreated).decode(t, &ss)
	value := func(code string) string {
		t.Helper()
		var c struct {
			Status  string `json:"status"`
			Outputs []struct {
				Data string `json:"data"`
			} `json:"outputs"`
		}
		do(t, d.url, "POST", "/v1/sessions/"+ss.ID+"/exec", key, capability.CellRequest{Code: code}).want(t, http.StatusOK).decode(t, &c)
		if c.Status != "succeeded" || len(c.Outputs) != 1 {
			t.Fatalf("cell %q: got %+v, want one value", code, c)
		}
		return c.Outputs[0].Data
	}
	if got := value("import sys\nx = 41\n'pandas' in sys.modules"); got != "True" {
		t.Fatalf("the first cell: got %s, want pandas imported already (a pooled session)", got)
	}
	if got := metricValue(t, d.url, `stockade_pool_hits_total{pool="code.execute/python/session"}`); got != 1 {
		t.Errorf("pool hits: got %v, want 1", got)
	}
	do(t, d.url, "PUT", "/v1/sessions/"+ss.ID+"/files?path=kept.txt", key, []byte("kept")).want(t, http.StatusCreated)
	waitFor(ready, 1) // the refill: an unbound sandbox beside the session's
	bundles := filepath.Join(state, "runc", "bundles")
	if got := dirEntries(t, bundles); len(got) != 2 {
		t.Fatalf("sandboxes: got %v, want the session's and the pool's", got)
	}
	d.kill()
	d = startDaemon(t, bin, args...) // without pools
	if got := value("x + 1"); got != "42" {
		t.Errorf("after the kill: got %s, want the kernel's state (42)", got)
	}
	if got := do(t, d.url, "GET", "/v1/sessions/"+ss.ID+"/files?path=kept.txt", key, nil).want(t, http.StatusOK); string(got.body) != "kept" {
		t.Errorf("the workspace after the kill: got %q", got.body)
	}
	if got := dirEntries(t, bundles); len(got) != 1 {
		t.Errorf("sandboxes after the restart: got %v, want the session's only (the pool's reaped)", got)
	}
	do(t, d.url, "DELETE", "/v1/sessions/"+ss.ID, key, nil).want(t, http.StatusOK)
	d.stop()
	if got := dirEntries(t, bundles); len(got) != 0 {
		t.Errorf("bundles left: %v", got)
	}
}
