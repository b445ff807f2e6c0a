package api_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/wire"
)

// pythonSessions is an env whose sessions run python's own kernel on
// gVisor, with room for a source and eight forks; its checkpoints (and
// snapshots) are in the returned directory.
func pythonSessions(t *testing.T, opts ...engine.Option) (*env, string) {
	t.Helper()
	return pythonSessionsWith(t, noApproval, opts...)
}

// pythonSessionsWith is pythonSessions under policy.
func pythonSessionsWith(t *testing.T, policy func(*model.Policy), opts ...engine.Option) (*env, string) {
	t.Helper()
	return pythonSessionsConf(t, func(c *envConfig) { c.policy = policy }, opts...)
}

// pythonSessionsConf is pythonSessions with its configuration changed by
// conf.
func pythonSessionsConf(t *testing.T, conf func(*envConfig), opts ...engine.Option) (*env, string) {
	t.Helper()
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runsc")
	gv, err := gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	checkpoints := filepath.Join(t.TempDir(), "checkpoints")
	c := envConfig{sessions: true, kernels: true, policy: noApproval, credits: 1000, drivers: map[string]sandbox.Driver{"gvisor": gv}, defaultDriver: "gvisor"}
	c.svc.Sessions.CheckpointDir = checkpoints
	c.svc.Sessions.MaxPerWorkspace = 8
	c.engine = opts
	conf(&c)
	return newEnv(t, backends[0], c), checkpoints
}

// py runs code in session id and answers its stdout, failing the test
// when the cell did not succeed.
func (e *env) py(id, code string) string {
	e.t.Helper()
	c := e.cell(e.agent, id, code)
	if c.Status != "succeeded" {
		e.t.Fatalf("cell %q in %s: got %s, stderr %q, error %+v", code, id, c.Status, c.Stderr, c.Error)
	}
	return strings.TrimSpace(c.Stdout)
}

// buildFrame builds df, a 100 MiB DataFrame, and /workspace/a.txt.
const buildFrame = `import numpy as np, pandas as pd
df = pd.DataFrame({"a": np.arange(13107200, dtype="int64")})
open("/workspace/a.txt", "w").write("from-the-source")
print(df.memory_usage(index=False).sum())`

// state is what a fork must share with its source at the fork.
const state = `print(len(df), int(df["a"].iloc[0]), open("/workspace/a.txt").read())`

// TestSessionFork is the test on gVisor through the API: a session
// builds a 100 MiB frame and writes a file; a snapshot leaves it running
// (its stall reported); a fork of 4 answers 4 sessions in which the frame
// and the file are the source's; a change in one fork is absent in the
// source and the other forks; two forks draw different random numbers; a
// snapshot restored after its source was deleted still works and one
// tampered with is refused (409, the source untouched); the bad inputs
// (count 0 and over the ceiling: 400; over the workspace's bound: 429
// with Retry-After, nothing started); the audit chain verifies; cells
// in forks are charged and snapshots free.
func TestSessionFork(t *testing.T) {
	e, checkpoints := pythonSessions(t)
	src := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "python"})
	if got := e.py(src.ID, buildFrame); got != "104857600" {
		t.Fatalf("the frame's bytes: got %s, want 104857600", got)
	}
	want := e.py(src.ID, state)
	if want != "13107200 0 from-the-source" {
		t.Fatalf("the source's state: got %q", want)
	}

	before, _ := e.credits()
	var named wire.Snapshot
	t0 := time.Now()
	e.do("POST", "/v1/sessions/"+src.ID+"/snapshots", e.agent, wire.SnapshotRequest{Name: "frame"}).want(t, http.StatusCreated).decode(t, &named)
	took := time.Since(t0)
	t.Logf("snapshot of a session holding a 100 MiB frame: %d bytes, source stalled %d ms, the call took %v", named.Bytes, named.StallMS, took)
	if named.Bytes <= 100<<20 || named.Name != "frame" || named.SessionID != src.ID {
		t.Fatalf("the snapshot: got %+v, want one of the source larger than its frame", named)
	}
	if fi, err := os.Stat(filepath.Join(checkpoints, "snapshots", named.ID)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the snapshot's directory: got %v, %v; want mode 0700", fi, err)
	}
	if got := e.py(src.ID, state); got != want {
		t.Fatalf("the source after its snapshot: got %q, want %q", got, want)
	}
	var list wire.SnapshotList
	e.do("GET", "/v1/sessions/"+src.ID+"/snapshots", e.agent, nil).want(t, http.StatusOK).decode(t, &list)
	if len(list.Items) != 1 || list.Items[0].ID != named.ID {
		t.Fatalf("the source's snapshots: got %+v, want %s", list, named.ID)
	}
	var ws wire.Workspace
	e.do("GET", "/v1/workspace", e.agent, nil).want(t, http.StatusOK).decode(t, &ws)
	if ws.Sessions.CheckpointBytes != named.Bytes {
		t.Fatalf("the workspace's checkpoint bytes: got %d, want the snapshot's %d", ws.Sessions.CheckpointBytes, named.Bytes)
	}

	for _, count := range []int{0, 17} {
		e.do("POST", "/v1/sessions/"+src.ID+"/fork", e.agent, wire.ForkRequest{Count: count}).want(t, http.StatusBadRequest)
	}
	var fork wire.Fork
	e.do("POST", "/v1/sessions/"+src.ID+"/fork", e.agent, wire.ForkRequest{Count: 4}).want(t, http.StatusCreated).decode(t, &fork)
	t.Logf("fork of 4: source stalled %d ms", fork.StallMS)
	if len(fork.Sessions) != 4 || fork.SourceID != src.ID || fork.SnapshotID == "" {
		t.Fatalf("the fork: got %+v, want 4 sessions", fork)
	}
	ids := map[string]bool{src.ID: true}
	for _, f := range fork.Sessions {
		t.Cleanup(func() { do(t, e.url, "DELETE", "/v1/sessions/"+f.ID, e.admin, nil) })
		if ids[f.ID] || f.State != "active" {
			t.Fatalf("fork %+v: want a new active session", f)
		}
		ids[f.ID] = true
		if got := e.py(f.ID, state); got != want {
			t.Errorf("fork %s: got %q, want the source's %q", f.ID, got, want)
		}
	}
	if _, err := os.Stat(filepath.Join(checkpoints, "snapshots", fork.SnapshotID)); !os.IsNotExist(err) {
		t.Errorf("the fork's snapshot after its forks started: got %v, want it gone", err)
	}

	// A change in one fork reaches neither the source nor the others.
	e.py(fork.Sessions[0].ID, `df.loc[0, "a"] = -1; open("/workspace/a.txt", "w").write("changed")`)
	if got := e.py(fork.Sessions[0].ID, state); got != "13107200 -1 changed" {
		t.Fatalf("the changed fork: got %q", got)
	}
	for _, id := range []string{src.ID, fork.Sessions[1].ID, fork.Sessions[2].ID} {
		if got := e.py(id, state); got != want {
			t.Errorf("session %s after a fork's change: got %q, want %q", id, got, want)
		}
	}
	// Each fork draws its own random numbers.
	const draw = `import random, os; print(random.random(), os.urandom(16).hex())`
	a, b := e.py(fork.Sessions[1].ID, draw), e.py(fork.Sessions[2].ID, draw)
	if a == b || len(strings.Fields(a)) != 2 {
		t.Errorf("two forks' random draws: got %q and %q, want different", a, b)
	}
	af, bf := strings.Fields(a), strings.Fields(b)
	if af[0] == bf[0] || af[1] == bf[1] {
		t.Errorf("random.random() or os.urandom(16) drawn alike in two forks: %q, %q", a, b)
	}

	// The workspace holds 5 live sessions of its 8: a fork of 4 more is
	// refused whole.
	r := e.do("POST", "/v1/sessions/"+src.ID+"/fork", e.agent, wire.ForkRequest{Count: 4}).want(t, http.StatusTooManyRequests)
	if r.header.Get("Retry-After") == "" {
		t.Errorf("a fork over the bound: no Retry-After")
	}
	var page wire.Page[wire.Session]
	e.do("GET", "/v1/sessions?state=active", e.agent, nil).want(t, http.StatusOK).decode(t, &page)
	if len(page.Items) != 5 {
		t.Errorf("live sessions after a refused fork: got %d, want 5", len(page.Items))
	}

	// A second snapshot, tampered with, is refused; the source serves on.
	var spoiled wire.Snapshot
	e.do("POST", "/v1/sessions/"+src.ID+"/snapshots", e.agent, nil).want(t, http.StatusCreated).decode(t, &spoiled)
	tamper(t, filepath.Join(checkpoints, "snapshots", spoiled.ID))
	e.do("POST", "/v1/sessions", e.agent, capability.CreateSessionRequest{Snapshot: spoiled.ID}).want(t, http.StatusConflict)
	if got := e.py(src.ID, state); got != want {
		t.Errorf("the source after a tampered snapshot was refused: got %q, want %q", got, want)
	}
	e.do("DELETE", "/v1/snapshots/"+spoiled.ID, e.agent, nil).want(t, http.StatusNoContent)
	e.do("DELETE", "/v1/snapshots/"+spoiled.ID, e.agent, nil).want(t, http.StatusNotFound)

	// Another workspace cannot start a session from the snapshot.
	other := newWorkspace(t, e, "other", noApproval, 100)
	e.do("POST", "/v1/sessions", other, capability.CreateSessionRequest{Snapshot: named.ID}).want(t, http.StatusNotFound)

	// The named snapshot outlives its source.
	e.do("DELETE", "/v1/sessions/"+src.ID, e.agent, nil).want(t, http.StatusOK)
	late := e.openSession(e.agent, capability.CreateSessionRequest{Snapshot: named.ID})
	if got := e.py(late.ID, state); got != want {
		t.Errorf("a session from the snapshot of a deleted source: got %q, want %q", got, want)
	}

	// Credits: the cells since the first snapshot, in forks and in the
	// source, each at the price; the snapshots and forks nothing.
	cells := 4 + 2 + 3 + 2 + 1 + 1 // state in 4 forks, the change and its check, 3 checks, 2 draws, the source's check, late's
	cells += 1                     // the source's check after the first snapshot
	price := int64(2)
	after, _ := e.credits()
	if got := before - after; got != int64(cells)*price {
		t.Errorf("credits spent: got %d, want %d cells at %d", got, cells, price)
	}
	if n := len(e.events("session.snapshotted", "")); n != 2 {
		t.Errorf("session.snapshotted events: got %d, want 2 (the fork's snapshot is its forked events')", n)
	}
	if n := len(e.events("session.forked", "")); n != 5 {
		t.Errorf("session.forked events: got %d, want 5", n)
	}
	if ok, broken, err := e.st.VerifyChain(t.Context(), e.ws.ID); !ok || err != nil {
		t.Errorf("VerifyChain: ok %v broken %+v err %v", ok, broken, err)
	}
}

// tamper flips a byte of the largest file under dir.
func tamper(t *testing.T, dir string) {
	t.Helper()
	var big string
	var size int64
	_ = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && fi.Size() > size {
			big, size = p, fi.Size()
		}
		return nil
	})
	if big == "" {
		t.Fatalf("no file under %s to tamper with", dir)
	}
	f, err := os.OpenFile(big, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, size/2); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, size/2); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotOnRuncRefused: runc cannot save a sandbox, so a snapshot and
// a fork of a runc session are 409 with the reason, as a pause is, a
// fork over the workspace's bound too.
func TestSnapshotOnRuncRefused(t *testing.T) {
	e := newEnv(t, backends[0], envConfig{sessions: true, policy: noApproval, credits: 100,
		svc: capability.ServiceOptions{Sessions: capability.SessionOptions{CheckpointDir: t.TempDir()}}})
	ss := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "python"})
	for _, tc := range []struct {
		path string
		body any
	}{
		{"/v1/sessions/" + ss.ID + "/snapshots", nil},
		// Over the workspace's bound too: the reason comes before the quota.
		{"/v1/sessions/" + ss.ID + "/fork", wire.ForkRequest{Count: 16}},
	} {
		r := e.do("POST", tc.path, e.agent, tc.body).want(t, http.StatusConflict)
		if !strings.Contains(string(r.body), "cannot") {
			t.Errorf("%s: got %s, want the driver's reason", tc.path, r.body)
		}
	}
}

// TestSnapshotOfPausedSession snapshots a paused session from its
// checkpoint: the session stays paused with its checkpoint, a session
// started from the snapshot has its state, and the source resumes with
// its own.
func TestSnapshotOfPausedSession(t *testing.T) {
	e, checkpoints := pythonSessions(t)
	src := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "python"})
	e.py(src.ID, `x = 41; open("/workspace/b.txt", "w").write("paused")`)
	e.do("POST", "/v1/sessions/"+src.ID+"/pause", e.agent, nil).want(t, http.StatusOK)
	var sn wire.Snapshot
	e.do("POST", "/v1/sessions/"+src.ID+"/snapshots", e.agent, nil).want(t, http.StatusCreated).decode(t, &sn)
	if sn.StallMS != 0 || sn.Bytes <= 0 {
		t.Errorf("the snapshot of a paused session: got %+v, want no stall and its size", sn)
	}
	if got := e.session(src.ID); got.State != "paused" {
		t.Fatalf("the source after its snapshot: got %s, want paused", got.State)
	}
	if _, err := os.Stat(filepath.Join(checkpoints, src.ID)); err != nil {
		t.Fatalf("the source's checkpoint after its snapshot: %v", err)
	}
	from := e.openSession(e.agent, capability.CreateSessionRequest{Snapshot: sn.ID})
	if got := e.py(from.ID, `print(x, open("/workspace/b.txt").read())`); got != "41 paused" {
		t.Errorf("a session from the paused session's snapshot: got %q, want 41 paused", got)
	}
	e.py(from.ID, "x = 0")
	if got := e.py(src.ID, "print(x)"); got != "41" {
		t.Errorf("the source, resumed by a cell: got %q, want 41", got)
	}
}

// TestForkOverMemoryBudget: a fork whose sessions the memory budget
// cannot hold is refused whole (429 with Retry-After) before anything is
// saved; one that fits starts.
func TestForkOverMemoryBudget(t *testing.T) {
	limit := sandbox.DefaultLimits().Memory
	e, checkpoints := pythonSessions(t, engine.WithMemoryBudget(3*limit))
	src := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "python"})
	e.py(src.ID, "x = 1")
	r := e.do("POST", "/v1/sessions/"+src.ID+"/fork", e.agent, wire.ForkRequest{Count: 3}).want(t, http.StatusTooManyRequests)
	if r.header.Get("Retry-After") == "" || !strings.Contains(string(r.body), "memory") {
		t.Errorf("a fork over the memory budget: got %s (Retry-After %q), want the budget named and a Retry-After", r.body, r.header.Get("Retry-After"))
	}
	if entries, _ := os.ReadDir(filepath.Join(checkpoints, "snapshots")); len(entries) != 0 {
		t.Errorf("a refused fork left %d snapshots", len(entries))
	}
	var f wire.Fork
	e.do("POST", "/v1/sessions/"+src.ID+"/fork", e.agent, wire.ForkRequest{Count: 2}).want(t, http.StatusCreated).decode(t, &f)
	for _, s := range f.Sessions {
		t.Cleanup(func() { do(t, e.url, "DELETE", "/v1/sessions/"+s.ID, e.admin, nil) })
		if got := e.py(s.ID, "print(x)"); got != "1" {
			t.Errorf("fork %s: got %q, want 1", s.ID, got)
		}
	}
}

// TestForkApprovedAnew: under per_session, the source's approval covers
// its own later cells but not its fork's: the fork's first cell waits for
// an approval of its own, which then covers the fork's later cells.
func TestForkApprovedAnew(t *testing.T) {
	e, _ := pythonSessionsWith(t, func(p *model.Policy) { p.Approval = model.ApprovalPerSession })
	approved := func(id, code string) wire.Execution {
		t.Helper()
		v := e.do("POST", "/v1/sessions/"+id+"/exec", e.agent, capability.CellRequest{Code: code}).want(t, http.StatusAccepted).execution(t)
		if v.Status != "awaiting_approval" || v.ApprovalID == "" {
			t.Fatalf("a first cell under per_session: got %+v, want awaiting approval", v)
		}
		e.do("POST", "/v1/approvals/"+v.ApprovalID+"/approve", e.approver, nil).want(t, http.StatusOK)
		if done := e.wait(v.ID, 30*time.Second); done.Status != "succeeded" {
			t.Fatalf("the approved cell: got %+v", done)
		}
		return v
	}
	src := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "python"})
	first := approved(src.ID, "x = 7")
	if got := e.py(src.ID, "print(x)"); got != "7" {
		t.Fatalf("a covered cell of the source: got %q", got)
	}
	var f wire.Fork
	e.do("POST", "/v1/sessions/"+src.ID+"/fork", e.agent, wire.ForkRequest{Count: 1}).want(t, http.StatusCreated).decode(t, &f)
	fork := f.Sessions[0]
	t.Cleanup(func() { do(t, e.url, "DELETE", "/v1/sessions/"+fork.ID, e.admin, nil) })
	if fork.ApprovalID != "" || fork.Approval != "per_session" {
		t.Fatalf("the fork: got approval %q covered by %q, want per_session, uncovered", fork.Approval, fork.ApprovalID)
	}
	again := approved(fork.ID, "print(x)")
	if again.ApprovalID == first.ApprovalID {
		t.Fatalf("the fork's first cell reused the source's approval %s", first.ApprovalID)
	}
	if got := e.py(fork.ID, "print(x + 1)"); got != "8" {
		t.Errorf("a covered cell of the fork: got %q, want 8", got)
	}
}

// TestForkApprovalInherited is TestForkApprovedAnew under a policy with
// fork_approval inherit: a fork of a covered source is covered by the
// source's approval from the start (its first cell runs at once), audited
// in its session.forked; a start from a snapshot taken before the source
// was covered is approved anew, as is a fork under the default policy
// (TestForkApprovedAnew).
func TestForkApprovalInherited(t *testing.T) {
	e, _ := pythonSessionsWith(t, func(p *model.Policy) {
		p.Approval, p.ForkApproval = model.ApprovalPerSession, model.ForkApprovalInherit
	})
	src := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "python"})
	var early wire.Snapshot
	e.do("POST", "/v1/sessions/"+src.ID+"/snapshots", e.agent, wire.SnapshotRequest{Name: "early"}).want(t, http.StatusCreated).decode(t, &early)
	first := e.do("POST", "/v1/sessions/"+src.ID+"/exec", e.agent, capability.CellRequest{Code: "x = 7"}).want(t, http.StatusAccepted).execution(t)
	if first.Status != "awaiting_approval" || first.ApprovalID == "" {
		t.Fatalf("the source's first cell under per_session: got %+v, want awaiting approval", first)
	}
	e.do("POST", "/v1/approvals/"+first.ApprovalID+"/approve", e.approver, nil).want(t, http.StatusOK)
	if done := e.wait(first.ID, 30*time.Second); done.Status != "succeeded" {
		t.Fatalf("the approved cell: got %+v", done)
	}

	var f wire.Fork
	e.do("POST", "/v1/sessions/"+src.ID+"/fork", e.agent, wire.ForkRequest{Count: 2}).want(t, http.StatusCreated).decode(t, &f)
	for _, fork := range f.Sessions {
		t.Cleanup(func() { do(t, e.url, "DELETE", "/v1/sessions/"+fork.ID, e.admin, nil) })
		if fork.ApprovalID != first.ApprovalID || fork.Approval != "per_session" {
			t.Fatalf("a fork: got approval %q covered by %q, want per_session covered by the source's %s", fork.Approval, fork.ApprovalID, first.ApprovalID)
		}
		// e.py fails the test unless the cell succeeds: one awaiting an
		// approval does not.
		if got := e.py(fork.ID, "print(x + 1)"); got != "8" {
			t.Errorf("the first cell of a covered fork: got %q, want 8", got)
		}
	}
	forked := map[string]wire.AuditEvent{}
	for _, ev := range e.events("session.forked", "") {
		var d struct {
			SessionID  string `json:"session_id"`
			ApprovalID string `json:"approval_id"`
		}
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			t.Fatal(err)
		}
		forked[d.SessionID] = ev
		if d.SessionID == f.Sessions[0].ID && (d.ApprovalID != first.ApprovalID || !strings.Contains(ev.Reason, "inherited from session "+src.ID)) {
			t.Errorf("the fork's session.forked: got approval %q, reason %q; want %s inherited from %s", d.ApprovalID, ev.Reason, first.ApprovalID, src.ID)
		}
	}
	if _, ok := forked[f.Sessions[1].ID]; !ok {
		t.Fatalf("no session.forked of the fork %s among %d", f.Sessions[1].ID, len(forked))
	}
	covered := 0
	for _, ev := range e.events("capability.invoke_allowed", "") {
		var d struct {
			SessionID string `json:"session_id"`
			Cell      int    `json:"cell"`
			CoveredBy string `json:"covered_by"`
		}
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			t.Fatal(err)
		}
		if d.SessionID == f.Sessions[0].ID || d.SessionID == f.Sessions[1].ID {
			if d.Cell != 1 || d.CoveredBy != first.ApprovalID {
				t.Errorf("a fork's cell's capability.invoke_allowed: got %s, want cell 1 covered by %s", ev.Data, first.ApprovalID)
			}
			covered++
		}
	}
	if covered != 2 {
		t.Errorf("the forks' cells' capability.invoke_allowed: got %d, want 2", covered)
	}

	// The source was covered only after the early snapshot: a session
	// started from it has its first cell approved anew.
	late := e.openSession(e.agent, capability.CreateSessionRequest{Snapshot: early.ID})
	t.Cleanup(func() { do(t, e.url, "DELETE", "/v1/sessions/"+late.ID, e.admin, nil) })
	if late.ApprovalID != "" {
		t.Fatalf("a start from a snapshot taken before the source was covered: got covered by %q, want uncovered", late.ApprovalID)
	}
	c := e.do("POST", "/v1/sessions/"+late.ID+"/exec", e.agent, capability.CellRequest{Code: "print(1)"}).want(t, http.StatusAccepted).execution(t)
	if c.Status != "awaiting_approval" || c.ApprovalID == "" || c.ApprovalID == first.ApprovalID {
		t.Fatalf("its first cell: got %+v, want awaiting an approval of its own", c)
	}
	e.do("POST", "/v1/approvals/"+c.ApprovalID+"/deny", e.approver, nil).want(t, http.StatusOK)
}

// TestSnapshotBoundToKey: a snapshot is the key's that took it, as its
// session is: another agent key of the workspace does not see it in the
// source's list and is refused a start from it, its deletion and a fork
// of the source, even one over the workspace's bound (403);
// an admin key sees it and starts a session from it.
func TestSnapshotBoundToKey(t *testing.T) {
	e, _ := pythonSessions(t)
	other := "sk_test_agent2_" + t.Name()
	if _, err := e.st.CreateAPIKey(t.Context(), store.NewAPIKey{WorkspaceID: e.ws.ID, Role: model.RoleAgent, Hash: model.HashKey(other)}); err != nil {
		t.Fatal(err)
	}
	src := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "python"})
	e.py(src.ID, "secret = 7")
	var sn wire.Snapshot
	e.do("POST", "/v1/sessions/"+src.ID+"/snapshots", e.agent, nil).want(t, http.StatusCreated).decode(t, &sn)
	seen := func(key string) int {
		var list wire.SnapshotList
		e.do("GET", "/v1/sessions/"+src.ID+"/snapshots", key, nil).want(t, http.StatusOK).decode(t, &list)
		return len(list.Items)
	}
	if n := seen(e.agent); n != 1 {
		t.Fatalf("the snapshots its key sees: got %d, want 1", n)
	}
	if n := seen(other); n != 0 {
		t.Errorf("the snapshots another key sees: got %d, want 0", n)
	}
	e.do("POST", "/v1/sessions", other, capability.CreateSessionRequest{Snapshot: sn.ID}).wantError(t, http.StatusForbidden, "permission_denied", "key that took")
	e.do("DELETE", "/v1/snapshots/"+sn.ID, other, nil).wantError(t, http.StatusForbidden, "permission_denied", "key that took")
	// A fork of another key's session is refused as such, before its
	// size is weighed against the workspace's bound.
	e.do("POST", "/v1/sessions/"+src.ID+"/fork", other, wire.ForkRequest{Count: 16}).wantError(t, http.StatusForbidden, "permission_denied")
	if n := seen(e.admin); n != 1 {
		t.Errorf("the snapshots an admin key sees: got %d, want 1", n)
	}
	from := e.openSession(e.admin, capability.CreateSessionRequest{Snapshot: sn.ID})
	t.Cleanup(func() { do(t, e.url, "DELETE", "/v1/sessions/"+from.ID, e.admin, nil) })
	if c := e.cell(e.admin, from.ID, "print(secret)"); c.Status != "succeeded" || strings.TrimSpace(c.Stdout) != "7" {
		t.Errorf("an admin's session from the snapshot: got %s %q", c.Status, c.Stdout)
	}
}

// TestSnapshotDiskBound: a workspace whose checkpoints hold
// sessions.max_checkpoint_bytes is refused another snapshot and a fork
// (429 with Retry-After, the bound named, nothing saved) until a
// snapshot is deleted.
func TestSnapshotDiskBound(t *testing.T) {
	e, checkpoints := pythonSessionsConf(t, func(c *envConfig) { c.svc.Snapshots.MaxCheckpointBytes = 1 })
	src := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "python"})
	e.py(src.ID, "x = 1")
	var sn wire.Snapshot
	e.do("POST", "/v1/sessions/"+src.ID+"/snapshots", e.agent, nil).want(t, http.StatusCreated).decode(t, &sn)
	for _, tc := range []struct {
		path string
		body any
	}{
		{"/v1/sessions/" + src.ID + "/snapshots", nil},
		{"/v1/sessions/" + src.ID + "/fork", wire.ForkRequest{Count: 1}},
	} {
		r := e.do("POST", tc.path, e.agent, tc.body)
		r.wantError(t, http.StatusTooManyRequests, "resource_exhausted", "max_checkpoint_bytes")
		if r.header.Get("Retry-After") == "" {
			t.Errorf("%s over the bound: no Retry-After", tc.path)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(checkpoints, "snapshots")); len(entries) != 1 {
		t.Errorf("snapshots on disk after the refusals: got %d, want 1", len(entries))
	}
	e.do("DELETE", "/v1/snapshots/"+sn.ID, e.agent, nil).want(t, http.StatusNoContent)
	e.do("POST", "/v1/sessions/"+src.ID+"/snapshots", e.agent, nil).want(t, http.StatusCreated)
}
