package capability

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
)

// TestSweepSnapshots: the sweep deletes a recorded snapshot past its
// expiry (its row and files, audited), an unrecorded snapshot directory
// older than a snapshot may take, and keeps a recorded live one, an
// unrecorded one being saved (recent) and what is not named as a
// snapshot.
func TestSweepSnapshots(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	env := newServiceEnv(t, nil, &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor, Sessions: true}, noApprovalPolicy(),
		ServiceOptions{Sessions: SessionOptions{CheckpointDir: dir}})
	ss, err := env.svc.CreateSession(ctx, env.agent, CreateSessionRequest{Runtime: "python"}, CreateSessionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	snaps := env.svc.snapshots
	mk := func(id string, age time.Duration) string {
		d := snaps.snapshotDir(id)
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-age)
		if err := os.Chtimes(d, old, old); err != nil {
			t.Fatal(err)
		}
		return d
	}
	record := func(id string, expires time.Time) {
		if _, err := env.st.CreateSnapshot(ctx, store.NewSnapshot{ID: id, WorkspaceID: env.ws.ID, SessionID: ss.Session.ID, KeyID: env.agent.KeyID,
			Tool: ss.Session.Tool, Runtime: "python", Driver: "gvisor", Dir: snaps.snapshotDir(id), ExpiresAt: expires}); err != nil {
			t.Fatal(err)
		}
	}
	expired, live := NewSnapshotID(), NewSnapshotID()
	orphan, fresh := NewSnapshotID(), NewSnapshotID()
	mk(expired, time.Hour)
	record(expired, time.Now().Add(-time.Second))
	mk(live, time.Hour)
	record(live, time.Now().Add(time.Hour))
	mk(orphan, time.Hour)
	mk(fresh, 0)
	other := filepath.Join(dir, "snapshots", "not-a-snapshot")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	snaps.sweepSnapshots(ctx)
	for id, want := range map[string]bool{expired: false, live: true, orphan: false, fresh: true} {
		if _, err := os.Stat(snaps.snapshotDir(id)); (err == nil) != want {
			t.Errorf("snapshot %s after the sweep: stat %v, want kept %v", id, err, want)
		}
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("a directory not named as a snapshot: %v, want it kept", err)
	}
	if ok, _ := env.st.HasSnapshot(ctx, expired); ok {
		t.Errorf("the expired snapshot's row is still there")
	}
	if n := len(env.events(t, "session.snapshot_deleted")); n != 1 {
		t.Errorf("session.snapshot_deleted events: got %d, want 1", n)
	}
}
