package sqlite

import (
	"bytes"
	"path/filepath"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/store/internal/sqlstore"
)

// inTime fails the test, with every goroutine's stack, when fn has not
// returned within 30 s: the writer's single connection turns a mistake in
// inTx into a hang, and the hang should say where it is.
func inTime(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		var buf bytes.Buffer
		pprof.Lookup("goroutine").WriteTo(&buf, 2)
		t.Fatalf("%s did not finish within 30s (deadlock on the writer connection?):\n%s", what, buf.Bytes())
	}
}

func openTest(t *testing.T) *Store {
	t.Helper()
	st, err := Open(t.Context(), Config{Path: filepath.Join(t.TempDir(), "stockade.db")})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestStatementFirstSeenInTx runs a statement the cache has not seen inside a
// write transaction, twice. Preparing it on the writer's pool while the
// transaction holds the pool's one connection waited for that connection
// forever; the first Open of every new database did so (Migrate).
func TestStatementFirstSeenInTx(t *testing.T) {
	ctx := t.Context()
	st := openTest(t)
	stmts := newStmtCache(st.writer)
	defer stmts.close()
	for i := range 2 {
		inTime(t, "a transaction with a new statement", func() {
			err := inTx(ctx, st.writer, stmts, nil, func(q sqlstore.Querier) error {
				_, err := q.Exec(ctx, `INSERT INTO workspaces (id, name, created_at) VALUES ($1, $2, $3)`,
					"ws_tx"+string(rune('a'+i)), "tx"+string(rune('a'+i)), time.Now().UnixMicro())
				return err
			})
			if err != nil {
				t.Errorf("transaction %d: %v", i, err)
			}
		})
	}
	if stmts.cached("INSERT INTO workspaces (id, name, created_at) VALUES ($1, $2, $3)", []any{1}) == nil {
		t.Error("a statement first seen in a transaction was not prepared after it")
	}
}

// TestPanicInTxReleasesWriter checks that a transaction whose function
// panics gives the writer's connection back. Before, the deferred statement
// preparation waited for the connection the panicking transaction still
// held, so the panic never surfaced and the goroutine hung; and had a caller
// recovered it, every later write would have waited forever.
func TestPanicInTxReleasesWriter(t *testing.T) {
	ctx := t.Context()
	st := openTest(t)
	inTime(t, "a panicking transaction", func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the transaction's panic", p)
			}
		}()
		inTx(ctx, st.writer, newStmtCache(st.writer), nil, func(q sqlstore.Querier) error {
			if _, err := q.Exec(ctx, `INSERT INTO workspaces (id, name, created_at) VALUES ($1, $2, $3)`,
				"ws_panic", "panic", time.Now().UnixMicro()); err != nil {
				t.Error(err)
			}
			panic("boom")
		})
	})
	inTime(t, "a write after the panic", func() {
		if _, err := st.CreateWorkspace(ctx, "after-panic", nil); err != nil {
			t.Errorf("CreateWorkspace after a panicking transaction: %v", err)
		}
	})
	if _, err := st.GetWorkspace(ctx, "ws_panic"); err == nil {
		t.Error("the panicking transaction's write was committed")
	}
}
