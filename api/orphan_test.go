package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/supervisor"
	"github.com/stockade-sh/stockade/wire"
)

// The tests of a daemon that stops and never comes back: its sessions'
// sandboxes must not run on without it.

// sandboxRuntime is what the host holds of one sandbox of a daemon's
// driver, under the daemon's state directory.
type sandboxRuntime struct {
	state, driver, id string
}

// shimDir is the sandbox's shim's directory.
func (r sandboxRuntime) shimDir() string { return filepath.Join(r.state, r.driver, "shims", r.id) }

// live says what of the sandbox runs or is kept by its runtime: its shim,
// and the runtime's state of its container (runc's directory, runsc's
// files); nothing when it is gone.
func (r sandboxRuntime) live(t *testing.T) []string {
	t.Helper()
	var out []string
	if pid, ok := supervisor.Running(r.shimDir()); ok {
		out = append(out, "shim pid "+strconv.Itoa(pid))
	}
	for _, pattern := range []string{r.id, r.id + "_sandbox:*", "runsc-" + r.id + ".sock"} {
		m, err := filepath.Glob(filepath.Join(r.state, r.driver, "state", pattern))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m...)
	}
	return out
}

// signal sends sig to the daemon and waits, at most 60 s, for it to exit,
// which it must do with status 0.
func (d *daemon) signal(sig syscall.Signal) {
	d.t.Helper()
	_ = d.cmd.Process.Signal(sig)
	select {
	case <-d.done:
		if code := d.cmd.ProcessState.ExitCode(); code != 0 {
			d.t.Errorf("stockade serve exited with %d after %v", code, sig)
		}
	case <-time.After(60 * time.Second):
		d.t.Errorf("stockade serve did not stop within 60 s of %v", sig)
		d.kill()
	}
}

// openSession opens a session of key's workspace on d with a TTL of ttl,
// runs a cell in it and returns it.
func openSession(t *testing.T, d *daemon, key string, ttl time.Duration) wire.Session {
	t.Helper()
	var ss wire.Session
	do(t, d.url, "POST", "/v1/sessions", key, capability.CreateSessionRequest{Runtime: "python", TTLMS: ttl.Milliseconds()}).
		want(t, http.StatusCreated).decode(t, &ss)
	var c struct {
		Status string `json:"status"`
	}
	do(t, d.url, "POST", "/v1/sessions/"+ss.ID+"/exec", key, capability.CellRequest{Code: "x = 41\nx + 1"}).want(t, http.StatusOK).decode(t, &c)
	if c.Status != "succeeded" {
		t.Fatalf("the first cell: got %q, want succeeded", c.Status)
	}
	return ss
}

// sandboxOf returns session ss's sandbox, read from the daemon's
// database (the API does not show sandbox ids).
func sandboxOf(t *testing.T, db, state string, ss wire.Session) sandboxRuntime {
	t.Helper()
	st, err := storeopen.Open(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got, err := st.GetSession(t.Context(), workspaceOf(t, st), ss.ID)
	if err != nil {
		t.Fatal(err)
	}
	return sandboxRuntime{state: state, driver: got.Driver, id: got.SandboxID}
}

// workspaceOf is the id of workspace "crash" (setUpDaemon's).
func workspaceOf(t *testing.T, st store.Store) string {
	t.Helper()
	wss, err := st.ListWorkspaces(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, ws := range wss {
		if ws.Name == "crash" {
			return ws.ID
		}
	}
	t.Fatal("no workspace crash")
	return ""
}

// TestStoppedDaemonsSandboxEndsAtTTL stops a daemon that holds a live
// session, the default way (SIGTERM keeps sessions for the next start),
// and never starts it again: the session's sandbox, kept running after
// the stop, is gone once the session's TTL has passed (and the grace in
// which a daemon that runs would have ended it), on runc and on gVisor.
func TestStoppedDaemonsSandboxEndsAtTTL(t *testing.T) {
	requireSandboxes(t)
	bin := testenv.Build(t, "./cmd/stockade")
	for _, driver := range []string{"runc", "gvisor"} {
		t.Run(driver, func(t *testing.T) {
			if driver == "gvisor" {
				testenv.RequiresBinary(t, "runsc")
			}
			dir := t.TempDir()
			state, db := filepath.Join(dir, "state"), "sqlite:"+filepath.Join(dir, "stockade.db")
			key, args := setUpDaemon(t, bin, dir, db, state)
			cfg := filepath.Join(dir, driver+".yaml")
			if err := os.WriteFile(cfg, []byte("driver: "+driver+"\npools: []\ndocker_host: unix://"+filepath.Join(dir, "no-docker.sock")+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			d := startDaemon(t, bin, append(slices.Clone(args), "--config", cfg, "--driver", driver)...)
			const ttl = 5 * time.Second
			ss := openSession(t, d, key, ttl)
			if ss.Driver != driver {
				t.Fatalf("the session runs on %q, want %q", ss.Driver, driver)
			}
			d.signal(syscall.SIGTERM)
			sb := sandboxOf(t, db, state, ss)
			t.Cleanup(func() {
				// Whatever is left is ended, as a daemon would at its start.
				_ = supervisor.KillShim(context.Background(), sb.shimDir())
			})
			// The stop keeps the sandbox, as a restart needs it.
			if live := sb.live(t); len(live) < 2 && time.Now().Before(ss.ExpiresAt) {
				t.Fatalf("after the stop, before the TTL: got %v, want the shim and the runtime's state", live)
			}
			end := ss.ExpiresAt.Add(capability.SandboxGrace)
			for bound := end.Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
				live := sb.live(t)
				if len(live) == 0 {
					break
				}
				if time.Now().After(bound) {
					t.Fatalf("60 s after the session's TTL and grace (%v): still %v; the shim's log:\n%s", end, live, supervisor.Log(sb.shimDir()))
				}
			}
			x, ok := supervisor.ReadExit(sb.shimDir())
			if !ok || x.Ended != supervisor.EndedDeadline || x.At.Before(end) {
				t.Errorf("the shim's exit: got %+v (recorded %v), want ended %q after %v", x, ok, supervisor.EndedDeadline, end)
			}
		})
	}
}

// TestServeEndsSessionsForGood stops a daemon for good, by SIGTERM with
// --sessions-on-shutdown=end and by SIGUSR2, while a cell of its session
// runs: before it exits, the session ends (interrupted, audited as the
// system's), its cell ends killed by the daemon's shutdown (ended_by
// daemon_shutdown), charged as launched, with its output, and its
// sandbox is gone.
func TestServeEndsSessionsForGood(t *testing.T) {
	requireSandboxes(t)
	bin := testenv.Build(t, "./cmd/stockade")
	for _, tt := range []struct {
		name  string
		flags []string
		sig   syscall.Signal
	}{
		{"SIGTERM with on_shutdown end", []string{"--sessions-on-shutdown=end"}, syscall.SIGTERM},
		{"SIGUSR2", nil, syscall.SIGUSR2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			state, db := filepath.Join(dir, "state"), "sqlite:"+filepath.Join(dir, "stockade.db")
			key, args := setUpDaemon(t, bin, dir, db, state)
			d := startDaemon(t, bin, append(args, tt.flags...)...)
			ss := openSession(t, d, key, time.Hour)
			sb := sandboxOf(t, db, state, ss)
			s := postStreamTo(t, d.url, "/v1/sessions/"+ss.ID+"/exec", key,
				capability.CellRequest{Code: "import time\nprint('running', flush=True)\ntime.sleep(120)\n"})
			var cellID string
			for ev := s.next(60 * time.Second); ; ev = s.next(60 * time.Second) {
				if ev.name == "started" {
					var st struct {
						ExecutionID string `json:"execution_id"`
					}
					if err := json.Unmarshal([]byte(ev.data), &st); err != nil {
						t.Fatalf("started event %s: %v", ev.data, err)
					}
					cellID = st.ExecutionID
				}
				if ev.name == "stdout" && strings.Contains(ev.data, "running") {
					break
				}
				if ev.name == "" || ev.name == "result" || ev.name == "error" {
					t.Fatalf("the cell's stream: got %q %s before its output", ev.name, ev.data)
				}
			}
			if cellID == "" {
				t.Fatal("the cell's stream named no execution")
			}
			if live := sb.live(t); len(live) < 2 {
				t.Fatalf("while the cell runs: got %v, want the shim and the runtime's state", live)
			}
			d.signal(tt.sig)
			if !strings.Contains(d.log(), `msg="ended the sessions at shutdown" ended=1`) {
				t.Errorf("the daemon's log says nothing of ending one session:\n%s", d.log())
			}
			// Nothing of the sandbox is left once the daemon has exited.
			if live := sb.live(t); len(live) > 0 {
				t.Errorf("after the daemon exited: still %v", live)
			}
			if left := dirEntries(t, filepath.Join(state, "runc", "bundles")); len(left) > 0 {
				t.Errorf("bundles left: %v", left)
			}

			st, err := storeopen.Open(t.Context(), db)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			ws := workspaceOf(t, st)
			got, err := st.GetSession(t.Context(), ws, ss.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got.State != model.SessionEnded || got.EndReason != model.EndInterrupted {
				t.Errorf("the session: got %s (%s), want ended interrupted", got.State, got.EndReason)
			}
			cell, err := st.GetExecution(t.Context(), ws, cellID)
			if err != nil {
				t.Fatal(err)
			}
			// The daemon's shutdown cut it short: killed, ended_by
			// daemon_shutdown, charged as launched, its output kept.
			var res struct {
				EndedBy string `json:"ended_by"`
				Stdout  string `json:"stdout"`
			}
			if err := json.Unmarshal(cell.Result, &res); err != nil {
				t.Fatalf("the cell's result %s: %v", cell.Result, err)
			}
			if cell.Status != model.StatusKilled || res.EndedBy != engine.EndedByShutdown {
				t.Errorf("the running cell: got %s, ended_by %q, want killed, %q (result %s)", cell.Status, res.EndedBy, engine.EndedByShutdown, cell.Result)
			}
			if !strings.Contains(res.Stdout, "running") {
				t.Errorf("the cell's stdout: got %q, want the output printed before the shutdown (running)", res.Stdout)
			}
			if tc, err := st.GetToolCall(t.Context(), ws, cellID); err != nil || tc.Status != model.StatusKilled || tc.CreditsCharged != 2 {
				t.Errorf("the cell's tool_calls row: got %s charged %d (%v), want killed charged 2", tc.Status, tc.CreditsCharged, err)
			}
			cancels, err := st.ListEvents(t.Context(), ws, store.EventFilter{Types: []string{"execution.cancelled"}, PageRequest: store.PageRequest{Limit: 10}})
			if err != nil {
				t.Fatal(err)
			}
			if len(cancels.Items) != 0 {
				t.Errorf("execution.cancelled events: got %+v, want none (no one cancelled)", cancels.Items)
			}
			evs, err := st.ListEvents(t.Context(), ws, store.EventFilter{Types: []string{"session.ended"}, PageRequest: store.PageRequest{Limit: 10}})
			if err != nil {
				t.Fatal(err)
			}
			if len(evs.Items) != 1 || evs.Items[0].Actor != "system" || !strings.Contains(string(evs.Items[0].Data), `"end_reason":"interrupted"`) {
				t.Errorf("session.ended events: got %+v, want one by the system, interrupted", evs.Items)
			}
		})
	}
}

// TestMovedStateEndsSandbox stops a daemon that holds a live session,
// keeping its sessions, and moves its state directory away, as an
// operator retiring it might: no daemon could reach the session's
// sandbox any more, so its shim ends it at once, long before its TTL:
// the shim, the runtime and the container's processes are gone.
func TestMovedStateEndsSandbox(t *testing.T) {
	requireSandboxes(t)
	bin := testenv.Build(t, "./cmd/stockade")
	dir := t.TempDir()
	state, db := filepath.Join(dir, "state"), "sqlite:"+filepath.Join(dir, "stockade.db")
	key, args := setUpDaemon(t, bin, dir, db, state)
	d := startDaemon(t, bin, args...)
	ss := openSession(t, d, key, time.Hour)
	d.signal(syscall.SIGTERM)
	sb := sandboxOf(t, db, state, ss)
	shim, ok := supervisor.Running(sb.shimDir())
	if !ok {
		t.Fatalf("after the stop: the session's shim does not run; its log:\n%s", supervisor.Log(sb.shimDir()))
	}
	procs := processTree(t, shim)
	// The shim, the runtime, and the container's init (the guest) at least.
	if len(procs) < 3 {
		t.Fatalf("the shim's processes: got %v, want the runtime and the container under it", procs)
	}
	t.Cleanup(func() {
		// What is left is ended through its shim, whose command line names
		// its directory where it was.
		if err := os.Rename(state+".moved", state); err == nil {
			_ = supervisor.KillShim(context.Background(), sb.shimDir())
		}
	})
	if err := os.Rename(state, state+".moved"); err != nil {
		t.Fatal(err)
	}
	for bound := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var alive []int
		for _, pid := range procs {
			if processAlive(pid) {
				alive = append(alive, pid)
			}
		}
		if len(alive) == 0 {
			break
		}
		if time.Now().After(bound) {
			t.Fatalf("30 s after the state directory moved: processes %v of the sandbox's %v still run; the shim's log:\n%s",
				alive, procs, supervisor.Log(filepath.Join(state+".moved", sb.driver, "shims", sb.id)))
		}
	}
}

// processTree returns pid and every process descended from it.
func processTree(t *testing.T, pid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			children[ppid] = append(children[ppid], p)
		}
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// processAlive reports whether pid runs (a zombie does not).
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	return err == nil && !strings.Contains(string(b), ") Z ")
}
