package engine

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/supervisor"
)

// TestSessionDeadlines checks that a session's sandbox carries the
// session's deadline (SessionSpec.Deadline) on every path that makes or
// finds one, as its shim's record says: a session pool's sandbox has one
// of its own until a session takes it, a pooled and a cold session have
// theirs, and a re-attach gives the session's to its sandbox.
func TestSessionDeadlines(t *testing.T) {
	drivers, states := shimDrivers(t, nil)
	key, err := supervisor.LoadKey(filepath.Join(states["runc"], "shims"))
	if err != nil {
		t.Fatal(err)
	}
	deadlineOf := func(id string) time.Time {
		t.Helper()
		m, err := supervisor.ReadMeta(filepath.Join(states["runc"], "shims", id), key)
		if err != nil {
			t.Fatal(err)
		}
		return m.Deadline
	}
	open := func(e *Engine, name string, deadline time.Time) *Session {
		t.Helper()
		s, err := e.OpenSession(t.Context(), SessionSpec{Runtime: "python", Driver: "runc", Workspace: poolWorkspace, Deadline: deadline,
			Labels: map[string]string{LabelOwner: poolOwner, LabelSession: "ses_" + name}})
		if err != nil {
			t.Fatalf("OpenSession: %v", err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
	e, counts := sessionPoolEngine(t, drivers, "runc", 1)
	waitReady(t, e, 1)
	e.pools[0].mu.Lock()
	unbound := e.pools[0].ready[0]
	e.pools[0].mu.Unlock()
	if got, want := deadlineOf(unbound.sb.ID()), unbound.born.Add(e.pools[0].maxAge+time.Minute); got.Sub(want).Abs() > 5*time.Second {
		t.Errorf("the pool's unbound sandbox: got deadline %v, want about %v (its retirement and a minute)", got, want)
	}

	pooledAt := time.Now().Add(time.Hour).Truncate(time.Second)
	pooled := open(e, "pooled", pooledAt)
	if h, _ := counts.get(); h != 1 || pooled.SandboxID() != unbound.sb.ID() {
		t.Fatalf("got %d pool hits, sandbox %s; want the pool's %s", h, pooled.SandboxID(), unbound.sb.ID())
	}
	if got := deadlineOf(pooled.SandboxID()); !got.Equal(pooledAt) {
		t.Errorf("a pooled session: got deadline %v, want the session's %v", got, pooledAt)
	}
	waitReady(t, e, 1) // the refill, which the next session would take
	cold, err := New(drivers, "runc", image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		t.Fatal(err)
	}
	coldAt := pooledAt.Add(time.Minute)
	s := open(cold, "cold", coldAt)
	if got := deadlineOf(s.SandboxID()); !got.Equal(coldAt) {
		t.Errorf("a cold session: got deadline %v, want the session's %v", got, coldAt)
	}

	// A restarted daemon gives each session it serves again the session's
	// deadline.
	again, _ := shimDrivers(t, states)
	restarted, err := New(again, "runc", image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		t.Fatal(err)
	}
	adoptAt := coldAt.Add(time.Minute)
	got, err := restarted.ReattachSessions(t.Context(), map[string]string{LabelOwner: poolOwner}, func(id string) (SessionSpec, bool) {
		return SessionSpec{Runtime: "python", Deadline: adoptAt}, id == s.SandboxID()
	})
	if err != nil || len(got) != 1 {
		t.Fatalf("ReattachSessions: got %d sessions, %v; want %s", len(got), err, s.SandboxID())
	}
	defer got[0].Close(context.Background())
	if d := deadlineOf(s.SandboxID()); !d.Equal(adoptAt) {
		t.Errorf("a re-attached session: got deadline %v, want the session's %v", d, adoptAt)
	}
}
