package e2b_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stockade-sh/stockade/e2b"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// pgEnv names the PostgreSQL of the tests (scripts/pgtest.sh).
const pgEnv = "STOCKADE_TEST_POSTGRES"

// TestStoreE2BSandboxes checks migration 0009 and the E2B rows on both
// stores: put, get (an unknown id is not found), the end moved, the
// workspace's list, and the due rows skipping ended sessions.
func TestStoreE2BSandboxes(t *testing.T) {
	for _, b := range []struct {
		name string
		url  func(t *testing.T) string
	}{
		{"sqlite", func(t *testing.T) string { return "sqlite:" + filepath.Join(t.TempDir(), "stockade.db") }},
		{"postgres", freshSchema},
	} {
		t.Run(b.name, func(t *testing.T) {
			ctx := t.Context()
			st, err := storeopen.Open(ctx, b.url(t))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			es, ok := st.(e2b.Store)
			if !ok {
				t.Fatalf("the %s store keeps no E2B sandboxes", b.name)
			}
			ws, err := st.CreateWorkspace(ctx, "w", nil)
			if err != nil {
				t.Fatal(err)
			}
			key, err := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: model.RoleAgent, Hash: model.HashKey("k" + rand.Text()), Name: "a"})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now().UTC().Truncate(time.Second)
			var ids []string
			for i := range 2 {
				id := "ses_" + rand.Text()
				ss, _, err := st.OpenSession(ctx, store.NewSession{ID: id, WorkspaceID: ws.ID, KeyID: key.ID, Tool: "code.execute", Runtime: "python",
					Driver: "runc", SandboxID: "sb" + id, Approval: model.ApprovalNone, IdleTimeout: time.Hour, ExpiresAt: now.Add(time.Hour),
					WorkspaceBytes: 1 << 20, RequestSHA256: hex.EncodeToString(make([]byte, 32)), At: now})
				if err != nil {
					t.Fatalf("OpenSession: %v", err)
				}
				ids = append(ids, ss.ID)
				rec := store.E2BSandbox{SessionID: ss.ID, WorkspaceID: ws.ID, KeyID: key.ID, Role: "agent", Template: "base",
					Metadata: map[string]string{"i": string(rune('0' + i))}, Envs: map[string]string{"A": "1"}, OnTimeout: "pause", EndAt: now.Add(time.Duration(i) * time.Hour), CreatedAt: now.Add(time.Duration(i) * time.Second)}
				if err := es.PutE2BSandbox(ctx, rec); err != nil {
					t.Fatalf("PutE2BSandbox: %v", err)
				}
			}
			got, err := es.GetE2BSandbox(ctx, ids[0])
			if err != nil || got.Metadata["i"] != "0" || got.Envs["A"] != "1" || got.OnTimeout != "pause" || !got.EndAt.Equal(now) || got.KeyID != key.ID {
				t.Errorf("GetE2BSandbox: %+v, %v", got, err)
			}
			if _, err := es.GetE2BSandbox(ctx, "ses_nope"); !errdefs.IsNotFound(err) {
				t.Errorf("GetE2BSandbox of an unknown id: %v, want not found", err)
			}
			if err := es.SetE2BEndAt(ctx, "other-ws", ids[0], now); !errdefs.IsNotFound(err) {
				t.Errorf("SetE2BEndAt in another workspace: %v, want not found", err)
			}
			l, err := es.ListE2BSandboxes(ctx, ws.ID, 0)
			if err != nil || len(l) != 2 || l[0].SessionID != ids[1] {
				t.Errorf("ListE2BSandboxes: %d rows, %v, want 2, newest first", len(l), err)
			}
			due, err := es.DueE2BSandboxes(ctx, now.Add(time.Minute), 0)
			if err != nil || len(due) != 1 || due[0].SessionID != ids[0] {
				t.Errorf("DueE2BSandboxes: %+v, %v, want the first only", due, err)
			}
			if err := es.SetE2BEndAt(ctx, ws.ID, ids[1], now); err != nil {
				t.Fatal(err)
			}
			if due, err = es.DueE2BSandboxes(ctx, now.Add(time.Minute), 0); err != nil || len(due) != 2 {
				t.Errorf("DueE2BSandboxes after moving the second's end: %d rows, %v, want 2", len(due), err)
			}
		})
	}
}

// freshSchema returns the URL of an empty PostgreSQL schema dropped
// when the test ends (skipped without STOCKADE_TEST_POSTGRES, failed in
// CI).
func freshSchema(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv(pgEnv)
	if dsn == "" {
		testenv.Missing(t, pgEnv+" is not set; run: export "+pgEnv+"=$(scripts/pgtest.sh)")
	}
	schema := "stockade_e2b_" + hex.EncodeToString([]byte(rand.Text())[:6])
	exec := func(ctx context.Context, q string) error {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, q)
		return err
	}
	if err := exec(t.Context(), "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
