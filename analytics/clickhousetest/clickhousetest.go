// Package clickhousetest gives tests a real ClickHouse: the shared test
// server that scripts/test.sh starts (STOCKADE_TEST_CLICKHOUSE), or a server
// of a test's own that it can stop and start, and queries on either.
//
//	url := clickhousetest.URL(t)
//	db := clickhousetest.Database(t, url)
//	n := clickhousetest.Count(t, url, "SELECT count() FROM "+db+".tool_invocations FINAL")
package clickhousetest

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/analytics"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
)

// Env names the shared test server's URL; scripts/clickhousetest.sh starts
// one and prints it.
const Env = "STOCKADE_TEST_CLICKHOUSE"

// URL returns the shared test server's URL, skipping t when none is set
// (failing it in CI).
func URL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(Env)
	if u == "" {
		testenv.Missing(t, Env+" is not set; run: export "+Env+"=$(scripts/clickhousetest.sh)")
	}
	return u
}

// Server is a ClickHouse server of one test's own, started by
// scripts/clickhousetest.sh in a directory of the test's.
type Server struct {
	t   testing.TB
	dir string
	// URL is the server's HTTP interface; it stays the same across Stop
	// and Start.
	URL string
}

// Start starts a server of t's own, stopped when t ends. It needs what the
// shared server needs (Env set, so that the test environment is one that
// runs ClickHouse).
func Start(t testing.TB) *Server {
	t.Helper()
	URL(t)
	s := &Server{t: t, dir: t.TempDir()}
	t.Cleanup(func() { s.script("stop") })
	s.URL = s.script("start")
	return s
}

// Stop stops the server; its data stays.
func (s *Server) Stop() { s.t.Helper(); s.script("stop") }

// Restart starts the stopped server again, on the same port with the same
// data.
func (s *Server) Restart() { s.t.Helper(); s.script("start") }

func (s *Server) script(verb string) string {
	s.t.Helper()
	cmd := exec.Command(filepath.Join(testenv.ModuleRoot(), "scripts", "clickhousetest.sh"), verb, s.dir)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		s.t.Fatalf("scripts/clickhousetest.sh %s %s: %v\n%s", verb, s.dir, err, errb.String())
	}
	return strings.TrimSpace(out.String())
}

// Database returns the name of a new database on the server at base,
// dropped when t ends. The daemon creates it; Exec may too.
func Database(t testing.TB, base string) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	db := "stockade_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		if _, err := query(base, "DROP DATABASE IF EXISTS "+db); err != nil {
			t.Errorf("dropping ClickHouse database %s: %v", db, err)
		}
	})
	return db
}

// Exec runs a statement on the server at base.
func Exec(t testing.TB, base, q string) {
	t.Helper()
	if _, err := query(base, q); err != nil {
		t.Fatalf("ClickHouse %q: %v", q, err)
	}
}

// RowOf is the row a tool_invocations row must arrive as, built apart
// from the sink's own encoding.
func RowOf(ti model.ToolInvocation) analytics.Row {
	return analytics.Row{ID: ti.ID, ExecutionID: ti.ExecutionID, WorkspaceID: ti.WorkspaceID, Tool: ti.Tool, Runtime: ti.Runtime,
		Status: string(ti.Status), Driver: ti.Driver, QueuedUS: ti.Queued.Microseconds(), RanUS: ti.Ran.Microseconds(),
		Credits: ti.Credits, EndedAt: ti.CreatedAt.UTC().Format(time.DateTime)}
}

// CreditsPerDay is a row of the README's sample query.
type CreditsPerDay struct {
	WorkspaceID string `json:"workspace_id"`
	Day         string `json:"day"`
	Invocations int64  `json:"invocations"`
	Credits     int64  `json:"credits"`
}

// SampleQuery returns the README's credits per workspace per day, on the
// table of database db instead of stockade's.
func SampleQuery(t testing.TB, db string) string {
	t.Helper()
	return strings.ReplaceAll(ReadmeSQL(t, "sum(credits)"), "stockade.tool_invocations", db+".tool_invocations")
}

// ReadmeSQL returns the first SQL block of the README that contains
// marker, trimmed.
func ReadmeSQL(t testing.TB, marker string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.ModuleRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range sqlBlock.FindAllStringSubmatch(string(b), -1) {
		if strings.Contains(m[1], marker) {
			return strings.TrimSpace(m[1])
		}
	}
	t.Fatalf("README.md has no sql block containing %q", marker)
	return ""
}

var sqlBlock = regexp.MustCompile("(?s)```sql\n(.*?)```")

// Rows runs a SELECT on the server at base and decodes each row of its
// answer (FORMAT JSONEachRow, 64-bit integers as numbers) into a T.
func Rows[T any](t testing.TB, base, q string) []T {
	t.Helper()
	b, err := query(base, q+" FORMAT JSONEachRow")
	if err != nil {
		t.Fatalf("ClickHouse %q: %v", q, err)
	}
	var out []T
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("decoding a row of %q: %v: %s", q, err, sc.Bytes())
		}
		out = append(out, v)
	}
	return out
}

// Count runs a query whose answer is one number, such as SELECT count().
func Count(t testing.TB, base, q string) int64 {
	t.Helper()
	b, err := query(base, q)
	if err != nil {
		t.Fatalf("ClickHouse %q: %v", q, err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("ClickHouse %q: got %q, want a number", q, b)
	}
	return n
}

func query(base, q string) ([]byte, error) {
	resp, err := http.Post(base+"/?"+url.Values{"output_format_json_quote_64bit_integers": {"0"}}.Encode(),
		"text/plain", strings.NewReader(q))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return b, nil
}
