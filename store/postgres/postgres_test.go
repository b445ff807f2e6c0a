package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/store/postgres"
	"github.com/stockade-sh/stockade/store/storetest"
)

// dsnEnv names the PostgreSQL the tests use; scripts/pgtest.sh starts one and
// prints its DSN.
const dsnEnv = "STOCKADE_TEST_POSTGRES"

// testDSN returns the server's DSN, skipping the test when none is given,
// except in CI, where a missing database is a failure.
func testDSN(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv(dsnEnv)
	if dsn == "" {
		msg := dsnEnv + " is not set; run: export " + dsnEnv + "=$(scripts/pgtest.sh)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return dsn
}

// freshSchema creates an empty schema for one test, drops it when the test
// ends, and returns a DSN whose search_path selects it.
func freshSchema(t testing.TB, dsn string) string {
	t.Helper()
	ctx := t.Context()
	var b [6]byte
	rand.Read(b[:])
	schema := "stockade_test_" + hex.EncodeToString(b[:])
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connecting to %s: %v", dsnEnv, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("creating schema: %v", err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Errorf("connecting to drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	return withParam(t, dsn, "search_path", schema)
}

func withParam(t testing.TB, dsn, key, value string) string {
	t.Helper()
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return dsn + " " + key + "=" + value
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("parsing %s: %v", dsnEnv, err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// open opens a store with its analytics outbox on, as the suite needs.
func open(t *testing.T, dsn string) *postgres.Store {
	t.Helper()
	st, err := postgres.Open(t.Context(), postgres.Config{DSN: dsn, MaxConns: 16, AnalyticsOutbox: true})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestConformance(t *testing.T) {
	dsn := testDSN(t)
	storetest.Run(t, func(t *testing.T) store.Store {
		return open(t, freshSchema(t, dsn))
	})
}

func TestOutboxOff(t *testing.T) {
	st, err := postgres.Open(t.Context(), postgres.Config{DSN: freshSchema(t, testDSN(t))})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer st.Close()
	storetest.CheckOutboxOff(t, st)
}

// TestConcurrentOpenMigratesOnce opens several stores on one empty schema at
// once, as several daemons starting together would.
func TestConcurrentOpenMigratesOnce(t *testing.T) {
	dsn := freshSchema(t, testDSN(t))
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			st, err := postgres.Open(t.Context(), postgres.Config{DSN: dsn, MaxConns: 2})
			if err == nil {
				st.Close()
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent Open: %v", err)
		}
	}
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM schema_migrations").Scan(&n); err != nil {
		t.Fatal(err)
	}
	// One row per migration: each was applied once.
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	if n != len(files) {
		t.Fatalf("schema_migrations rows: got %d, want %d (one per migration)", n, len(files))
	}
}

func TestOpenUnreachable(t *testing.T) {
	_, err := postgres.Open(t.Context(), postgres.Config{DSN: "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2"})
	if err == nil {
		t.Fatal("Open of an unreachable server succeeded")
	}
}

func BenchmarkInvocation(b *testing.B) {
	dsn := os.Getenv(dsnEnv)
	if dsn == "" {
		b.Skip(dsnEnv + " is not set")
	}
	for _, parallel := range []bool{false, true} {
		for _, outbox := range []bool{false, true} {
			name := map[bool]string{false: "sequential", true: "parallel"}[parallel] + map[bool]string{false: "", true: "/outbox"}[outbox]
			b.Run(name, func(b *testing.B) {
				st, err := postgres.Open(b.Context(), postgres.Config{DSN: freshSchema(b, dsn), MaxConns: 16, AnalyticsOutbox: outbox})
				if err != nil {
					b.Fatal(err)
				}
				defer st.Close()
				storetest.Bench(b, st, parallel)
			})
		}
	}
}

// TestClaimDaemon checks the claim through two Stores on one schema, and
// that a store of another schema of the same database claims its own.
func TestClaimDaemon(t *testing.T) {
	dsn := testDSN(t)
	schema := freshSchema(t, dsn)
	storetest.ClaimDaemon(t, open(t, schema), open(t, schema))
	other := open(t, freshSchema(t, dsn))
	claim, err := other.ClaimDaemon(t.Context())
	if err != nil {
		t.Fatalf("claiming a store of another schema: %v", err)
	}
	claim.Release(t.Context())
}

// TestClaimLostAndTakenAgain ends the claim's connection, as a server
// restart or a proxy would: Check takes the claim again, and once another
// daemon took it meanwhile, Check says so.
func TestClaimLostAndTakenAgain(t *testing.T) {
	dsn := testDSN(t)
	schema := freshSchema(t, dsn)
	a, b := open(t, schema), open(t, schema)
	ctx := t.Context()
	claim, err := a.ClaimDaemon(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer claim.Release(t.Context())
	// A cancelled check says nothing of the claim: it is kept.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := claim.Check(cctx); err == nil {
		t.Fatal("Check with a cancelled context: got nil, want the context's error")
	}
	if _, err := b.ClaimDaemon(ctx); !errdefs.IsConflict(err) {
		t.Fatalf("a second claim after a cancelled check: got %v, want a conflict", err)
	}
	// Only this schema's lock: other tests' claims are left alone. The
	// termination waits (up to 5 s) for the backend to end, lock and all:
	// without a timeout it only signals it.
	terminate := func() {
		t.Helper()
		conn, err := pgx.Connect(ctx, schema)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(l.pid, 5000)) FROM pg_locks l
			WHERE l.locktype = 'advisory' AND l.granted
			AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended('stockade.daemon:' || current_schema(), 0)`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("terminating the claim's connection: %d ended, %v", n, err)
		}
	}
	terminate()
	if err := claim.Check(ctx); err != nil {
		t.Fatalf("Check after the connection ended: %v, want the claim taken again", err)
	}
	if _, err := b.ClaimDaemon(ctx); !errdefs.IsConflict(err) {
		t.Fatalf("a second claim once the first was taken again: got %v, want a conflict", err)
	}
	terminate()
	other, err := b.ClaimDaemon(ctx)
	if err != nil {
		t.Fatalf("a second claim while the first was lost: %v", err)
	}
	defer other.Release(t.Context())
	if err := claim.Check(ctx); !errdefs.IsConflict(err) {
		t.Fatalf("Check once another daemon holds the claim: got %v, want a conflict", err)
	}
}

// TestUpgrade opens a database made by the first schema with every
// migration (storetest.Upgrade).
func TestUpgrade(t *testing.T) {
	dsn := freshSchema(t, testDSN(t))
	storetest.Upgrade(t, "TIMESTAMPTZ '2025-12-01 00:00:00+00'", func(t *testing.T) store.Store {
		st, err := postgres.OpenAt(t.Context(), postgres.Config{DSN: dsn}, 4)
		if err != nil {
			t.Fatalf("OpenAt(4): %v", err)
		}
		return st // Upgrade closes it
	}, func(t *testing.T) store.Store { return open(t, dsn) })
}

// TestClaimReleasedOnReturn checks that the claim's lock is gone when
// Release returns, not some time after: a daemon restarted at once must
// not find its own previous claim still held (the lock lived until the
// server ended the closed connection's backend).
func TestClaimReleasedOnReturn(t *testing.T) {
	dsn := freshSchema(t, testDSN(t))
	st := open(t, dsn)
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	for i := range 50 {
		claim, err := st.ClaimDaemon(t.Context())
		if err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		if err := claim.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		// The claim's key, a bigint, is split into classid and objid.
		var held int
		if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks l,
			(SELECT hashtextextended('stockade.daemon:' || current_schema(), 0) AS k) s
			WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
			AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND l.classid::bigint = (s.k >> 32) & 4294967295 AND l.objid::bigint = s.k & 4294967295`).Scan(&held); err != nil {
			t.Fatal(err)
		}
		if held != 0 {
			t.Fatalf("advisory locks held right after release %d: got %d, want 0", i, held)
		}
	}
}
