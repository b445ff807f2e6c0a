package api_test

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/wire"
)

// gvisorSessions is an env whose sessions run on gVisor (the test
// kernel), their checkpoints in the returned directory; svc edits the
// service's options.
func gvisorSessions(t *testing.T, svc func(*capability.ServiceOptions)) (*env, string) {
	t.Helper()
	return gvisorSessionsOf(t, svc, "")
}

// gvisorSessionsOf is gvisorSessions whose driver runs runsc as binary
// (empty: the one on PATH).
func gvisorSessionsOf(t *testing.T, svc func(*capability.ServiceOptions), binary string) (*env, string) {
	t.Helper()
	testenv.RequiresBinary(t, "runsc")
	gv, err := gvisor.New(gvisor.Config{Binary: binary, StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	checkpoints := filepath.Join(t.TempDir(), "checkpoints")
	c := envConfig{sessions: true, policy: noApproval, credits: 1000, drivers: map[string]sandbox.Driver{"gvisor": gv}, defaultDriver: "gvisor"}
	c.svc.Sessions.CheckpointDir = checkpoints
	if svc != nil {
		svc(&c.svc)
	}
	return newEnv(t, backends[0], c), checkpoints
}

func (e *env) session(id string) wire.Session {
	e.t.Helper()
	var v wire.Session
	e.do("GET", "/v1/sessions/"+id, e.agent, nil).want(e.t, http.StatusOK).decode(e.t, &v)
	return v
}

// value is what the test kernel's `get k` answers in session id.
func (e *env) value(id string) string {
	e.t.Helper()
	c := e.cell(e.agent, id, "get k")
	if c.Status != "succeeded" || len(c.Outputs) != 1 {
		e.t.Fatalf("get k: got %+v", c)
	}
	return c.Outputs[0].Data
}

// TestSessionPauseResume pauses and resumes a gVisor session ten times,
// every other time by its next cell rather than by resume: each time the
// kernel keeps its value and /workspace its file, the checkpoint is a
// root-only directory counted in the workspace's usage while paused and
// gone once resumed, and the session runs in a new sandbox. Pausing a
// paused session and resuming an active one answer it as it is; an
// interrupt of a paused one resumes nothing; deleting a paused session
// deletes its checkpoint; a checkpoint that was tampered with is refused
// and its session ends failed.
func TestSessionPauseResume(t *testing.T) {
	e, checkpoints := gvisorSessions(t, nil)
	ss := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "python"})
	e.cell(e.agent, ss.ID, "set k kept-value")
	e.do("PUT", "/v1/sessions/"+ss.ID+"/files?path=notes.txt", e.agent, []byte("kept-file")).want(t, http.StatusCreated)
	dir := filepath.Join(checkpoints, ss.ID)
	for i := range 10 {
		var paused wire.Session
		e.do("POST", "/v1/sessions/"+ss.ID+"/pause", e.agent, nil).want(t, http.StatusOK).decode(t, &paused)
		if paused.State != "paused" || paused.CheckpointBytes <= 0 || paused.PausedAt == nil {
			t.Fatalf("cycle %d: pause: got %+v, want paused with its checkpoint's size", i, paused)
		}
		for _, d := range []string{checkpoints, dir} {
			if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
				t.Fatalf("cycle %d: %s: got %v, %v; want a directory of mode 0700", i, d, fi, err)
			}
		}
		var again wire.Session
		e.do("POST", "/v1/sessions/"+ss.ID+"/pause", e.agent, nil).want(t, http.StatusOK).decode(t, &again)
		if again.State != "paused" || again.CheckpointBytes != paused.CheckpointBytes {
			t.Fatalf("cycle %d: pausing the paused session: got %+v, want it as it is", i, again)
		}
		var ws wire.Workspace
		e.do("GET", "/v1/workspace", e.agent, nil).want(t, http.StatusOK).decode(t, &ws)
		if ws.Sessions.Paused != 1 || ws.Sessions.CheckpointBytes != paused.CheckpointBytes {
			t.Fatalf("cycle %d: the workspace's usage: got %+v, want 1 paused session of %d bytes", i, ws.Sessions, paused.CheckpointBytes)
		}
		if i == 0 {
			var r map[string]bool
			e.do("POST", "/v1/sessions/"+ss.ID+"/interrupt", e.agent, nil).want(t, http.StatusOK).decode(t, &r)
			if r["interrupted"] || e.session(ss.ID).State != "paused" {
				t.Fatalf("interrupting a paused session: got %v, state %s; want false, still paused", r, e.session(ss.ID).State)
			}
		}
		if i%2 == 0 {
			var resumed wire.Session
			e.do("POST", "/v1/sessions/"+ss.ID+"/resume", e.agent, nil).want(t, http.StatusOK).decode(t, &resumed)
			if resumed.State != "active" || resumed.CheckpointBytes != 0 {
				t.Fatalf("cycle %d: resume: got %+v, want active", i, resumed)
			}
			e.do("POST", "/v1/sessions/"+ss.ID+"/resume", e.agent, nil).want(t, http.StatusOK).decode(t, &resumed)
			if resumed.State != "active" {
				t.Fatalf("cycle %d: resuming the active session: got %+v", i, resumed)
			}
		}
		// A cell resumes a paused session by itself (odd cycles).
		if got := e.value(ss.ID); got != "kept-value" {
			t.Fatalf("cycle %d: the kernel's value: got %q, want kept-value", i, got)
		}
		if got := e.do("GET", "/v1/sessions/"+ss.ID+"/files?path=notes.txt", e.agent, nil).want(t, http.StatusOK); string(got.body) != "kept-file" {
			t.Fatalf("cycle %d: the workspace's file: got %q, want kept-file", i, got.body)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("cycle %d: the checkpoint after the resume: got %v, want it gone", i, err)
		}
	}
	if sandboxes := resumedSandboxes(t, e, ss.ID); len(sandboxes) != 10 {
		t.Errorf("sandboxes of 10 resumes: got %v, want a new one each time", sandboxes)
	}
	if got := len(eventData[map[string]any](t, e, "session.paused")); got != 10 {
		t.Errorf("session.paused events: got %d, want 10", got)
	}

	// Deleting a paused session deletes its checkpoint.
	e.do("POST", "/v1/sessions/"+ss.ID+"/pause", e.agent, nil).want(t, http.StatusOK)
	var ended wire.Session
	e.do("DELETE", "/v1/sessions/"+ss.ID, e.agent, nil).want(t, http.StatusOK).decode(t, &ended)
	if ended.State != "ended" || ended.EndReason != "closed" {
		t.Fatalf("deleting the paused session: got %+v, want ended closed", ended)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the checkpoint of the deleted session: got %v, want it gone", err)
	}
	e.do("POST", "/v1/sessions/"+ss.ID+"/resume", e.agent, nil).want(t, http.StatusGone)

	// A checkpoint whose record was changed is not the daemon's: the
	// resume is refused and the session ends failed, its checkpoint gone.
	bad := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "python"})
	e.do("POST", "/v1/sessions/"+bad.ID+"/pause", e.agent, nil).want(t, http.StatusOK)
	record := filepath.Join(checkpoints, bad.ID, "sandbox.json")
	b, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	rec["labels"] = map[string]string{"stockade.session": ss.ID} // another session's
	if b, err = json.Marshal(rec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(record, b, 0o600); err != nil {
		t.Fatal(err)
	}
	msg := e.do("POST", "/v1/sessions/"+bad.ID+"/exec", e.agent, capability.CellRequest{Code: "get k"}).wantError(t, http.StatusConflict, "failed_precondition")
	if !strings.Contains(msg, "cannot resume") || strings.Contains(msg, checkpoints) || strings.Contains(msg, "/tmp") {
		t.Errorf("the refused resume: got %q, want it to say the session cannot resume, and no host path", msg)
	}
	if v := e.session(bad.ID); v.State != "ended" || v.EndReason != "failed" {
		t.Errorf("the session of the refused checkpoint: got %+v, want ended failed", v)
	}
	if _, err := os.Stat(filepath.Join(checkpoints, bad.ID)); !os.IsNotExist(err) {
		t.Errorf("the refused checkpoint: got %v, want it gone", err)
	}
}

// TestSessionCheckpointSwap copies one paused session's checkpoint over
// another's, as root could: the checkpoint is bound to the session and
// workspace it was saved for (its signed labels), so the second session's
// resume is refused (409, saying why, naming no host path) and it ends
// failed, while the first still resumes with its own state.
func TestSessionCheckpointSwap(t *testing.T) {
	e, checkpoints := gvisorSessions(t, nil)
	a := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "python"})
	b := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "python"})
	e.cell(e.agent, a.ID, "set k value-of-a")
	e.cell(e.agent, b.ID, "set k value-of-b")
	for _, id := range []string{a.ID, b.ID} {
		e.do("POST", "/v1/sessions/"+id+"/pause", e.agent, nil).want(t, http.StatusOK)
	}
	aDir, bDir := filepath.Join(checkpoints, a.ID), filepath.Join(checkpoints, b.ID)
	if err := os.RemoveAll(bDir); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", aDir, bDir).CombinedOutput(); err != nil {
		t.Fatalf("copying A's checkpoint over B's: %v: %s", err, out)
	}
	msg := e.do("POST", "/v1/sessions/"+b.ID+"/resume", e.agent, nil).wantError(t, http.StatusConflict, "failed_precondition")
	if !strings.Contains(msg, "cannot resume") || !strings.Contains(msg, "another session") {
		t.Errorf("the swapped checkpoint's resume: got %q, want it to say it was saved for another session", msg)
	}
	if strings.Contains(msg, checkpoints) || strings.Contains(msg, "/") {
		t.Errorf("the swapped checkpoint's resume: got %q, want no host path", msg)
	}
	if v := e.session(b.ID); v.State != "ended" || v.EndReason != "failed" {
		t.Errorf("session B after the refused resume: got %+v, want ended failed", v)
	}
	e.do("POST", "/v1/sessions/"+a.ID+"/resume", e.agent, nil).want(t, http.StatusOK)
	if got := e.value(a.ID); got != "value-of-a" {
		t.Errorf("session A's kernel after the swap was refused: got %q, want value-of-a", got)
	}
}

// resumedSandboxes are the sandboxes session id was resumed in, from its
// session.resumed events.
func resumedSandboxes(t *testing.T, e *env, id string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, ev := range eventData[struct {
		SessionID string `json:"session_id"`
		SandboxID string `json:"sandbox_id"`
	}](t, e, "session.resumed") {
		if ev.SessionID == id && ev.SandboxID != "" {
			out[ev.SandboxID] = true
		}
	}
	return out
}

// TestSessionPauseLifetimes checks that a paused session does not idle
// out but ends at its TTL, paused time counted, its checkpoint deleted;
// and that with pause_after_idle an idle session is paused instead of
// ended, and its next cell finds its kernel's state.
func TestSessionPauseLifetimes(t *testing.T) {
	e, checkpoints := gvisorSessions(t, func(o *capability.ServiceOptions) { o.Sessions.PauseAfterIdle = time.Second })
	ttl := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "python", IdleTimeoutMS: 1000, TTLMS: 8000})
	e.do("POST", "/v1/sessions/"+ttl.ID+"/pause", e.agent, nil).want(t, http.StatusOK)
	idle := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "python", IdleTimeoutMS: 1500})
	e.cell(e.agent, idle.ID, "set k slept")
	deadline := time.Now().Add(30 * time.Second)
	for e.session(idle.ID).State != "paused" {
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s: the idle session is %+v, want paused", e.session(idle.ID))
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Past both sessions' idle timeouts, neither ended.
	time.Sleep(2 * time.Second)
	if v := e.session(ttl.ID); v.State != "paused" {
		t.Fatalf("the paused session past its idle timeout: got %+v, want still paused", v)
	}
	if v := e.session(idle.ID); v.State != "paused" {
		t.Fatalf("the idle-paused session past its idle timeout: got %+v, want still paused", v)
	}
	if got := e.value(idle.ID); got != "slept" {
		t.Fatalf("the idle-paused session's value: got %q, want slept", got)
	}
	for e.session(ttl.ID).State != "ended" {
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s: the ttl session is %+v, want ended", e.session(ttl.ID))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if v := e.session(ttl.ID); v.EndReason != "ttl" || v.EndedAt.Before(ttl.ExpiresAt) {
		t.Errorf("the paused session: got %+v, want ended ttl at its expiry %s", v, ttl.ExpiresAt)
	}
	// The end is recorded first, then the checkpoint removed.
	for _, err := os.Stat(filepath.Join(checkpoints, ttl.ID)); !os.IsNotExist(err); _, err = os.Stat(filepath.Join(checkpoints, ttl.ID)) {
		if time.Now().After(deadline) {
			t.Fatalf("the checkpoint of the expired session: got %v after 30 s, want it gone", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSessionIdlePauseFails checks that a session whose pause after idle
// fails (here its checkpoint directory cannot be made) ends once its idle
// timeout has passed too, as it would without pause_after_idle, rather
// than keeping its sandbox to its TTL.
func TestSessionIdlePauseFails(t *testing.T) {
	e, _ := gvisorSessions(t, func(o *capability.ServiceOptions) {
		o.Sessions.PauseAfterIdle = time.Second
		o.Sessions.CheckpointDir = "/proc/stockade-test/checkpoints"
	})
	ss := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "python", IdleTimeoutMS: 2000})
	e.cell(e.agent, ss.ID, "set k idle")
	deadline := time.Now().Add(30 * time.Second)
	for e.session(ss.ID).State != "ended" {
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s: the session is %+v, want ended idle", e.session(ss.ID))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if v := e.session(ss.ID); v.EndReason != "idle_timeout" || v.EndedAt == nil || v.EndedAt.Before(ss.CreatedAt.Add(2*time.Second)) {
		t.Errorf("got %+v, want ended idle after its idle timeout", v)
	}
}

// TestSessionPauseRunc checks that a runc session cannot pause: 409 with
// the driver's reason, and the session serves on.
func TestSessionPauseRunc(t *testing.T) {
	c := envConfig{sessions: true, policy: noApproval, credits: 100}
	c.svc.Sessions.CheckpointDir = filepath.Join(t.TempDir(), "checkpoints")
	e := newEnv(t, backends[0], c)
	ss := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "shell"})
	e.cell(e.agent, ss.ID, "set k runc")
	msg := e.do("POST", "/v1/sessions/"+ss.ID+"/pause", e.agent, nil).wantError(t, http.StatusConflict, "failed_precondition")
	if !strings.Contains(msg, "CRIU") || !strings.Contains(msg, "cannot pause") {
		t.Errorf("pausing a runc session: got %q, want the reason (CRIU)", msg)
	}
	if got := e.value(ss.ID); got != "runc" {
		t.Errorf("the runc session after the refused pause: got %q, want its value", got)
	}
	if _, err := os.Stat(filepath.Join(c.svc.Sessions.CheckpointDir, ss.ID)); !os.IsNotExist(err) {
		t.Errorf("a checkpoint of the runc session: got %v, want none", err)
	}
}

// TestSessionPausedAcrossDaemonKill pauses a python session on gVisor of
// a `stockade serve`, kills the daemon with SIGKILL and starts it again:
// the session is still paused, its checkpoint on disk, and its resume
// finds the kernel's variable and the workspace's file.
func TestSessionPausedAcrossDaemonKill(t *testing.T) {
	requireSandboxes(t)
	testenv.RequiresBinary(t, "runsc")
	bin := testenv.Build(t, "./cmd/stockade")
	dir := t.TempDir()
	state, checkpoints := filepath.Join(dir, "state"), filepath.Join(dir, "checkpoints")
	key, args := setUpDaemon(t, bin, dir, backends[0].url(t), state)
	args = append(args, "--driver", "gvisor", "--sessions-checkpoint-dir", checkpoints)
	d := startDaemon(t, bin, args...)
	var ss wire.Session
	do(t, d.url, "POST", "/v1/sessions", key, capability.CreateSessionRequest{Runtime: "python"}).want(t, http.StatusCreated).decode(t, &ss)
	do(t, d.url, "POST", "/v1/sessions/"+ss.ID+"/exec", key, capability.CellRequest{Code: "x = 41", TimeoutMS: 30_000}).want(t, http.StatusOK)
	do(t, d.url, "PUT", "/v1/sessions/"+ss.ID+"/files?path=out.csv", key, []byte("x,y\n")).want(t, http.StatusCreated)
	var paused wire.Session
	do(t, d.url, "POST", "/v1/sessions/"+ss.ID+"/pause", key, nil).want(t, http.StatusOK).decode(t, &paused)
	if paused.State != "paused" || paused.Driver != "gvisor" {
		t.Fatalf("pause: got %+v, want a paused gvisor session", paused)
	}
	d.kill()
	d = startDaemon(t, bin, args...)
	var after wire.Session
	do(t, d.url, "GET", "/v1/sessions/"+ss.ID, key, nil).want(t, http.StatusOK).decode(t, &after)
	if after.State != "paused" || after.CheckpointBytes != paused.CheckpointBytes {
		t.Fatalf("after the restart: got %+v, want it paused as before", after)
	}
	if _, err := os.Stat(filepath.Join(checkpoints, ss.ID, "sandbox.json")); err != nil {
		t.Fatalf("the checkpoint after the restart: %v", err)
	}
	do(t, d.url, "POST", "/v1/sessions/"+ss.ID+"/resume", key, nil).want(t, http.StatusOK)
	var c wire.Cell
	do(t, d.url, "POST", "/v1/sessions/"+ss.ID+"/exec", key, capability.CellRequest{Code: "x + 1", TimeoutMS: 30_000}).want(t, http.StatusOK).decode(t, &c)
	if c.Status != "succeeded" || len(c.Outputs) != 1 || c.Outputs[0].Data != "42" {
		t.Fatalf("the kernel after the restart and resume: got %+v, want 42", c)
	}
	if got := do(t, d.url, "GET", "/v1/sessions/"+ss.ID+"/files?path=out.csv", key, nil).want(t, http.StatusOK); string(got.body) != "x,y\n" {
		t.Fatalf("the workspace after the restart and resume: got %q", got.body)
	}
	do(t, d.url, "DELETE", "/v1/sessions/"+ss.ID, key, nil).want(t, http.StatusOK)
	if got := dirEntries(t, checkpoints); len(got) != 0 {
		t.Errorf("checkpoints left: %v", got)
	}
	d.stop()
}

// TestSessionResumeByAnotherBuild pauses a session, then changes the
// runtime (runsc behind a wrapper script, rewritten: another build, which
// cannot restore the checkpoint): the resume answers 409 saying so and
// naming no host path, and the session stays paused with its
// checkpoint; once the build that saved it is back, it resumes with its
// value.
func TestSessionResumeByAnotherBuild(t *testing.T) {
	testenv.RequiresBinary(t, "runsc")
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(t.TempDir(), "runsc")
	script := "#!/bin/sh\nexec " + runsc + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	e, checkpoints := gvisorSessionsOf(t, nil, wrapper)
	ss := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "python"})
	e.cell(e.agent, ss.ID, "set k kept-value")
	e.do("POST", "/v1/sessions/"+ss.ID+"/pause", e.agent, nil).want(t, http.StatusOK)
	if err := os.WriteFile(wrapper, []byte(script+"# another build\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	msg := e.do("POST", "/v1/sessions/"+ss.ID+"/resume", e.agent, nil).wantError(t, http.StatusConflict, "failed_precondition")
	if !strings.Contains(msg, "runtime build") || !strings.Contains(msg, "sha256:") || strings.Contains(msg, checkpoints) || strings.Contains(msg, "/tmp") {
		t.Errorf("the resume by another build: got %q, want it to name the builds, and no host path", msg)
	}
	if v := e.session(ss.ID); v.State != "paused" {
		t.Fatalf("the session after the refusal: got %+v, want still paused", v)
	}
	if _, err := os.Stat(filepath.Join(checkpoints, ss.ID)); err != nil {
		t.Fatalf("the checkpoint after the refusal: %v, want it kept", err)
	}
	if err := os.WriteFile(wrapper, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	e.do("POST", "/v1/sessions/"+ss.ID+"/resume", e.agent, nil).want(t, http.StatusOK)
	if v := e.value(ss.ID); v != "kept-value" {
		t.Errorf("resumed by the build that saved it: got %q, want kept-value", v)
	}
}
