package storetest

import (
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// testSnapshots records, lists, counts, expires and deletes a session's
// snapshots, and finds none of another workspace's.
func testSnapshots(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "snaps")
	other := newFixture(t, st, "snaps-other")
	ss := mustOpen(t, st, f.newSession("ses_snap"))
	ev := func(typ string) []model.NewEvent {
		return []model.NewEvent{{Type: typ, Code: "SES00XI", Actor: f.agent.ID}}
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	snap := func(id string, expires time.Time) store.NewSnapshot {
		return store.NewSnapshot{ID: id, WorkspaceID: f.ws.ID, SessionID: ss.ID, KeyID: f.agent.ID, Name: "n-" + id, Tool: "code.execute",
			Runtime: "python", Driver: "gvisor", Dir: "/var/lib/x/" + id, Bytes: 3 << 20, At: now, ExpiresAt: expires, Audit: ev("session.snapshotted")}
	}
	bad := snap("snp_bad", now.Add(time.Hour))
	bad.Bytes = -1
	if _, err := st.CreateSnapshot(ctx, bad); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a negative size: got %v, want ErrInvalidArgument", err)
	}
	foreign := snap("snp_foreign", now.Add(time.Hour))
	foreign.WorkspaceID, foreign.KeyID = other.ws.ID, other.agent.ID
	if _, err := st.CreateSnapshot(ctx, foreign); !errdefs.IsNotFound(err) {
		t.Fatalf("a snapshot of another workspace's session: got %v, want ErrNotFound", err)
	}
	a, err := st.CreateSnapshot(ctx, snap("snp_a", now.Add(time.Hour)))
	if err != nil || a.Bytes != 3<<20 || !a.CreatedAt.Equal(now) {
		t.Fatalf("CreateSnapshot: got %+v, %v", a, err)
	}
	if _, err := st.CreateSnapshot(ctx, snap("snp_old", now.Add(-time.Second))); err != nil {
		t.Fatal(err)
	}
	if got, err := st.GetSnapshot(ctx, f.ws.ID, "snp_a"); err != nil || got != a {
		t.Fatalf("GetSnapshot: got %+v, %v; want %+v", got, err, a)
	}
	if _, err := st.GetSnapshot(ctx, other.ws.ID, "snp_a"); !errdefs.IsNotFound(err) {
		t.Fatalf("GetSnapshot from another workspace: got %v, want ErrNotFound", err)
	}
	if l, err := st.ListSnapshots(ctx, f.ws.ID, ss.ID); err != nil || len(l) != 2 {
		t.Fatalf("ListSnapshots: got %d, %v; want 2", len(l), err)
	}
	if b, _, err := st.CheckpointBytes(ctx, f.ws.ID); err != nil || b != 6<<20 {
		t.Fatalf("CheckpointBytes with two snapshots: got %d, %v; want 6 MiB", b, err)
	}
	if due, err := st.ListExpiredSnapshots(ctx, now); err != nil || len(due) != 1 || due[0].ID != "snp_old" {
		t.Fatalf("ListExpiredSnapshots: got %+v, %v; want snp_old", due, err)
	}
	if _, err := st.DeleteSnapshot(ctx, other.ws.ID, "snp_a", nil); !errdefs.IsNotFound(err) {
		t.Fatalf("DeleteSnapshot from another workspace: got %v, want ErrNotFound", err)
	}
	if ok, err := st.HasSnapshot(ctx, "snp_a"); err != nil || !ok {
		t.Fatalf("HasSnapshot of a recorded one: got %v, %v", ok, err)
	}
	if got, err := st.DeleteSnapshot(ctx, f.ws.ID, "snp_a", ev("session.snapshot_deleted")); err != nil || got.ID != "snp_a" {
		t.Fatalf("DeleteSnapshot: got %+v, %v", got, err)
	}
	if _, err := st.GetSnapshot(ctx, f.ws.ID, "snp_a"); !errdefs.IsNotFound(err) {
		t.Fatalf("GetSnapshot after its deletion: got %v, want ErrNotFound", err)
	}
	if ok, err := st.HasSnapshot(ctx, "snp_a"); err != nil || ok {
		t.Fatalf("HasSnapshot of a deleted one: got %v, %v", ok, err)
	}
	if b, _, err := st.CheckpointBytes(ctx, f.ws.ID); err != nil || b != 3<<20 {
		t.Fatalf("CheckpointBytes after a deletion: got %d, %v; want 3 MiB", b, err)
	}
}
