package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/stockade-sh/stockade/internal/guestbin"
	"github.com/stockade-sh/stockade/internal/testenv"
)

// cli runs the CLI binary with args alone (the admin commands take no
// sandbox flags).
func cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return runCLI(t, nil, args...)
}

// mustCLI runs the CLI and fails t unless it exits 0.
func mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errOut := cli(t, args...)
	if code != 0 {
		t.Fatalf("stockade %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
	}
	return out
}

// auditDB is one database the verify tests run on: a URL for the CLI and a
// connection for tampering behind the store's back.
type auditDB struct {
	url  string
	exec func(t *testing.T, query string, args ...any)
}

func sqliteDB(t *testing.T) auditDB {
	path := filepath.Join(t.TempDir(), "stockade.db")
	return auditDB{url: "sqlite:" + path, exec: func(t *testing.T, query string, args ...any) {
		t.Helper()
		db, err := sql.Open("sqlite", path)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		res, err := db.ExecContext(t.Context(), strings.ReplaceAll(query, "$", "?"), args...)
		if err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			t.Fatalf("%s: changed %d rows, want 1", query, n)
		}
	}}
}

// postgresDB gives the test a schema of its own in the server that
// STOCKADE_TEST_POSTGRES names (scripts/pgtest.sh starts one), dropped when
// the test ends.
func postgresDB(t *testing.T) auditDB {
	dsn := os.Getenv("STOCKADE_TEST_POSTGRES")
	if dsn == "" {
		testenv.Missing(t, "STOCKADE_TEST_POSTGRES is not set; run: export STOCKADE_TEST_POSTGRES=$(scripts/pgtest.sh)")
	}
	var b [6]byte
	rand.Read(b[:])
	schema := "stockade_audit_" + hex.EncodeToString(b[:])
	pgExec := func(t *testing.T, dsn, query string, args ...any) int64 {
		t.Helper()
		ctx := context.WithoutCancel(t.Context())
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("connecting to STOCKADE_TEST_POSTGRES: %v", err)
		}
		defer conn.Close(ctx)
		tag, err := conn.Exec(ctx, query, args...)
		if err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		return tag.RowsAffected()
	}
	pgExec(t, dsn, "CREATE SCHEMA "+schema)
	t.Cleanup(func() { pgExec(t, dsn, "DROP SCHEMA "+schema+" CASCADE") })
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("parsing STOCKADE_TEST_POSTGRES: %v", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	withSchema := u.String()
	return auditDB{url: withSchema, exec: func(t *testing.T, query string, args ...any) {
		t.Helper()
		if n := pgExec(t, withSchema, query, args...); n != 1 {
			t.Fatalf("%s: changed %d rows, want 1", query, n)
		}
	}}
}

// TestAuditVerify makes audit events through the CLI, tampers with their
// rows in the database directly, and checks that `audit verify` names the
// first broken link, on SQLite and PostgreSQL.
func TestAuditVerify(t *testing.T) {
	for _, backend := range []struct {
		name string
		open func(t *testing.T) auditDB
	}{{"sqlite", sqliteDB}, {"postgres", postgresDB}} {
		t.Run(backend.name, func(t *testing.T) {
			for _, tc := range []struct {
				name   string
				tamper string // with the workspace id as $1
				seq    int
				reason string
			}{
				{"untouched", "", 0, ""},
				{"update", "UPDATE audit_events SET reason = 'nothing happened here' WHERE workspace_id = $1 AND seq = 3", 3, "hash mismatch"},
				{"delete", "DELETE FROM audit_events WHERE workspace_id = $1 AND seq = 4", 4, "missing"},
				// The last event removed and the head rewound to match: only
				// the head witnessed outside the database shows it.
				{"truncate", "DELETE FROM audit_events WHERE workspace_id = $1 AND seq = 6; " +
					"UPDATE audit_chain_heads SET seq = 5, hash = (SELECT hash FROM audit_events WHERE workspace_id = $1 AND seq = 5) WHERE workspace_id = $1",
					6, "before the head witnessed outside the database at seq 6"},
			} {
				t.Run(tc.name, func(t *testing.T) {
					db := backend.open(t)
					// Every admin change witnesses its chain here.
					wdir := t.TempDir()
					t.Setenv("STOCKADE_AUDIT_WITNESS", wdir)
					id := makeBooks(t, db)
					// Two events in "bystander".
					mustCLI(t, "workspace", "create", "bystander", "--db", db.url)
					mustCLI(t, "credits", "grant", "bystander", "5", "--db", db.url)
					for _, q := range strings.Split(tc.tamper, "; ") {
						if q != "" {
							db.exec(t, q, id)
						}
					}

					code, out, errOut := cli(t, "audit", "verify", "--db", db.url)
					t.Logf("audit verify: exit %d\n%s%s", code, out, errOut)
					books := lineFor(t, out, "workspace books ("+id+")")
					if by := lineFor(t, out, "workspace bystander"); !regexp.MustCompile(`: ok \(2 events, head [0-9a-f]{64}\), holds the head witnessed at seq 2$`).MatchString(by) {
						t.Errorf("bystander: got %q, want ok with 2 events and the head hash", by)
					}
					if un := lineFor(t, out, "unattributed events"); !strings.HasSuffix(un, ": ok (0 events)") {
						t.Errorf("unattributed chain: got %q, want ok (0 events)", un)
					}
					if tc.tamper == "" {
						if code != 0 || !regexp.MustCompile(`: ok \(6 events, head [0-9a-f]{64}\), holds the head witnessed at seq 6$`).MatchString(books) {
							t.Errorf("untouched: got exit %d and %q, want 0 and ok with 6 events", code, books)
						}
						return
					}
					want := fmt.Sprintf("BROKEN at seq %d", tc.seq)
					if code != 1 || !strings.Contains(books, want) || !strings.Contains(books, tc.reason) {
						t.Errorf("got exit %d and %q, want exit 1 and a line with %q and %q", code, books, want, tc.reason)
					}
					if !strings.Contains(errOut, "1 of 3 audit chains are broken") {
						t.Errorf("stderr: got %q, want the count of broken chains", errOut)
					}

					// One workspace alone.
					code, out, _ = cli(t, "audit", "verify", "--workspace", "books", "--db", db.url)
					if code != 1 || strings.Count(out, "\n") != 1 || !strings.Contains(out, want) {
						t.Errorf("--workspace books: got exit %d and %q, want exit 1 and one line with %q", code, out, want)
					}
					code, out, _ = cli(t, "audit", "verify", "--workspace", "bystander", "--db", db.url)
					if code != 0 || !strings.Contains(out, ": ok (2 events") {
						t.Errorf("--workspace bystander: got exit %d and %q, want exit 0 and ok", code, out)
					}

					// The witness named by the flag, as an operator whose
					// daemon has audit_witness in its configuration does.
					t.Setenv("STOCKADE_AUDIT_WITNESS", "")
					code, out, _ = cli(t, "audit", "verify", "--workspace", "books", "--db", db.url, "--audit-witness", wdir)
					if code != 1 || !strings.Contains(out, want) {
						t.Errorf("--audit-witness: got exit %d and %q, want exit 1 and %q", code, out, want)
					}
					if backend.name == "postgres" {
						_, _, errOut = cli(t, "audit", "verify", "--workspace", "books", "--db", db.url)
						if !strings.Contains(errOut, "no audit witness") {
							t.Errorf("verify of PostgreSQL without a witness: stderr %q, want a warning", errOut)
						}
					}
					// A witness directory that holds nothing (mistyped, or
					// not the daemon's) checks nothing either.
					_, _, errOut = cli(t, "audit", "verify", "--db", db.url, "--audit-witness", t.TempDir())
					if !strings.Contains(errOut, "holds no heads") {
						t.Errorf("verify with an empty witness: stderr %q, want a warning", errOut)
					}
				})
			}
		})
	}
}

// makeBooks makes workspace "books" on db through the CLI, with six audit
// events (created, a key, four grants), and returns its id.
func makeBooks(t *testing.T, db auditDB) string {
	t.Helper()
	id := strings.TrimSpace(mustCLI(t, "workspace", "create", "books", "--db", db.url))
	mustCLI(t, "key", "create", "--workspace", "books", "--role", "agent", "--db", db.url)
	for i := 1; i <= 4; i++ {
		mustCLI(t, "credits", "grant", "books", fmt.Sprint(10*i), "--db", db.url)
	}
	return id
}

// lineFor returns the line of out that starts with prefix.
func lineFor(t *testing.T, out, prefix string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	t.Fatalf("no line starting with %q in:\n%s", prefix, out)
	return ""
}

func TestAuditBadInput(t *testing.T) {
	db := "sqlite:" + filepath.Join(t.TempDir(), "stockade.db")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no subcommand", []string{"audit"}, "usage: stockade audit"},
		{"unknown subcommand", []string{"audit", "bogus"}, `unknown audit command "bogus"`},
		{"blast-radius without --tool", []string{"audit", "blast-radius"}, "--tool is required"},
		{"blast-radius with an argument", []string{"audit", "blast-radius", "--tool", "code.execute", "extra"}, "takes no arguments"},
		{"verify unknown workspace", []string{"audit", "verify", "--workspace", "nope", "--db", db}, "nope"},
		{"verify with an argument", []string{"audit", "verify", "extra", "--db", db}, "takes no arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := cli(t, tc.args...)
			if code != exitUsage || out != "" || !strings.Contains(errOut, tc.want) {
				t.Errorf("got exit %d, stdout %q, stderr %q; want exit %d, no stdout, stderr containing %q", code, out, errOut, exitUsage, tc.want)
			}
		})
	}
}

// TestAuditBlastRadius runs `stockade audit blast-radius` on the default
// tool end to end, with the probe embedded in the binary, on the default
// driver (gvisor) and on runc.
func TestAuditBlastRadius(t *testing.T) {
	testenv.RequiresRoot(t)
	if _, err := guestbin.Probe(); err != nil {
		testenv.Missing(t, "the probe is not embedded (run `make build`, which builds "+
			"internal/guestbin/payload/stockade-probe): "+err.Error())
	}
	for _, d := range []struct{ driver, binary string }{{"gvisor", "runsc"}, {"runc", "runc"}} {
		t.Run(d.driver, func(t *testing.T) {
			testenv.RequiresBinary(t, d.binary)
			t.Setenv("STOCKADE_DRIVER", d.driver)
			state := filepath.Join(t.TempDir(), "state")
			// The stockade helper puts its flags after the first word,
			// which is not the subcommand here.
			blast := func(args ...string) (int, string, string) {
				return cli(t, append([]string{"audit", "blast-radius", "--state-dir", state, "--guest", testenv.Guest(t), "--data-dir", testenv.DataDir()}, args...)...)
			}
			code, out, errOut := blast("--tool", "code.execute")
			if code != 0 || !strings.HasSuffix(out, "\ndeviations: 0\n") {
				t.Fatalf("got exit %d, stderr %q, report:\n%s\nwant exit 0 and no deviation", code, errOut, out)
			}
			code, out, errOut = blast("--tool", "code.execute", "--json")
			var r struct {
				Tool       string            `json:"tool"`
				Driver     string            `json:"driver"`
				Sections   []json.RawMessage `json:"sections"`
				Deviations []json.RawMessage `json:"deviations"`
			}
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatalf("--json: decoding %q: %v (stderr %q)", out, err, errOut)
			}
			if code != 0 || r.Tool != "code.execute" || r.Driver != d.driver || len(r.Sections) == 0 || len(r.Deviations) != 0 {
				t.Errorf("--json: got exit %d, tool %q, driver %q, %d sections, deviations %s; want 0, code.execute, %s, sections, none",
					code, r.Tool, r.Driver, len(r.Sections), r.Deviations, d.driver)
			}
			if left := listTree(t, state); len(left) > 0 {
				t.Errorf("left behind in the state directory: %v", left)
			}
			code, _, errOut = blast("--tool", "no.such.tool")
			if code != exitUsage || !strings.Contains(errOut, `unknown tool "no.such.tool"`) {
				t.Errorf("unknown tool: got exit %d, stderr %q; want %d and the tool named", code, errOut, exitUsage)
			}
		})
	}
}
