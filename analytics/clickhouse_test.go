package analytics_test

import (
	"errors"
	"net"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/analytics"
	"github.com/stockade-sh/stockade/analytics/clickhousetest"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

func newSink(t *testing.T, base, db string) *analytics.ClickHouse {
	t.Helper()
	sink, err := analytics.NewClickHouse(analytics.ClickHouseConfig{URL: base, Database: db})
	if err != nil {
		t.Fatalf("NewClickHouse: %v", err)
	}
	return sink
}

// TestClickHouseRowsArrive ships the rows of executions that ended in
// different ways and reads them back from a real ClickHouse.
func TestClickHouseRowsArrive(t *testing.T) {
	base := clickhousetest.URL(t)
	db := clickhousetest.Database(t, base)
	st := newStore(t)
	ctx := t.Context()
	w := newWorkspace(t, st, "fields")
	w.run(t, 2)
	w.apply(t, w.create(t, "launch", false), capability.LaunchFailed{At: time.Now()})
	timedOut := w.apply(t, w.create(t, "timeout", false), capability.Start{Driver: "gvisor", At: time.Now()})
	w.apply(t, timedOut, capability.Finish{Status: model.StatusTimedOut, At: time.Now()})
	approver := capability.Principal{KeyID: w.approver.ID, WorkspaceID: w.ws.ID, Role: model.RoleApprover}
	w.apply(t, w.create(t, "deny me", true), capability.Deny{By: approver, At: time.Now()})
	other := newWorkspace(t, st, "other")
	other.run(t, 1)

	sh := analytics.NewShipper(st, newSink(t, base, db), analytics.Options{})
	if err := sh.Ship(ctx); err != nil {
		t.Fatalf("Ship: %v", err)
	}
	var wantRows []analytics.Row
	for _, ws := range []workspace{w, other} {
		p, err := st.ListToolInvocations(ctx, ws.ws.ID, store.ToolCallFilter{PageRequest: store.PageRequest{Limit: 100}})
		if err != nil {
			t.Fatal(err)
		}
		for _, ti := range p.Items {
			wantRows = append(wantRows, clickhousetest.RowOf(ti))
		}
	}
	got := clickhousetest.Rows[analytics.Row](t, base, "SELECT * FROM "+db+".tool_invocations FINAL ORDER BY id")
	slices.SortFunc(wantRows, func(a, b analytics.Row) int { return strings.Compare(a.ID, b.ID) })
	if !slices.Equal(got, wantRows) {
		t.Errorf("ClickHouse rows:\ngot  %+v\nwant %+v", got, wantRows)
	}
	// The rows vary where the tests above made them vary.
	statuses := map[string]bool{}
	for _, r := range got {
		statuses[r.Status+"/"+r.Driver] = true
	}
	for _, s := range []string{"succeeded/runc", "launch_failed/", "timed_out/gvisor", "denied/"} {
		if !statuses[s] {
			t.Errorf("no row with status/driver %s in %v", s, statuses)
		}
	}
	if left := outboxIDs(t, st); len(left) != 0 {
		t.Errorf("outbox after shipping: got %v, want empty", left)
	}
}

// TestClickHouseResendCountsOnce sends a batch twice, as a daemon killed
// between the insert and the delete does, with the table's merges stopped
// so that both copies stay: the README's sample query and FINAL count each
// invocation once, and a merge leaves one row per invocation.
func TestClickHouseResendCountsOnce(t *testing.T) {
	base := clickhousetest.URL(t)
	db := clickhousetest.Database(t, base)
	ctx := t.Context()
	sink := newSink(t, base, db)
	if err := sink.Prepare(ctx); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	// Prepare is idempotent.
	if err := sink.Prepare(ctx); err != nil {
		t.Fatalf("Prepare again: %v", err)
	}
	table := db + ".tool_invocations"
	clickhousetest.Exec(t, base, "SYSTEM STOP MERGES "+table)
	day1 := time.Date(2026, 3, 1, 23, 59, 59, 0, time.UTC)
	rows := []model.ToolInvocation{
		{ID: "inv_a", ExecutionID: "ex_a", WorkspaceID: "ws_1", Tool: "code.execute", Runtime: "python", Status: model.StatusSucceeded, Driver: "runc", Credits: 2, CreatedAt: day1},
		{ID: "inv_b", ExecutionID: "ex_b", WorkspaceID: "ws_1", Tool: "code.execute", Runtime: "shell", Status: model.StatusFailed, Driver: "runc", Credits: 2, CreatedAt: day1.Add(2 * time.Second)},
		{ID: "inv_c", ExecutionID: "ex_c", WorkspaceID: "ws_2", Tool: "code.execute", Runtime: "node", Status: model.StatusLaunchFailed, CreatedAt: day1},
	}
	for range 2 {
		if err := sink.Insert(ctx, rows); err != nil {
			t.Fatalf("Insert: %v", err)
		}
	}
	if n := clickhousetest.Count(t, base, "SELECT count() FROM "+table); n != 6 {
		t.Fatalf("raw rows with merges stopped: got %d, want both copies, 6", n)
	}
	if n := clickhousetest.Count(t, base, "SELECT count() FROM "+table+" FINAL"); n != 3 {
		t.Errorf("rows with FINAL: got %d, want 3", n)
	}
	got := clickhousetest.Rows[clickhousetest.CreditsPerDay](t, base, clickhousetest.SampleQuery(t, db))
	wantDays := []clickhousetest.CreditsPerDay{
		{WorkspaceID: "ws_1", Day: "2026-03-01", Invocations: 1, Credits: 2},
		{WorkspaceID: "ws_2", Day: "2026-03-01", Invocations: 1, Credits: 0},
		{WorkspaceID: "ws_1", Day: "2026-03-02", Invocations: 1, Credits: 2},
	}
	if !slices.Equal(got, wantDays) {
		t.Errorf("the README's credits per workspace per day:\ngot  %+v\nwant %+v", got, wantDays)
	}
	clickhousetest.Exec(t, base, "SYSTEM START MERGES "+table)
	clickhousetest.Exec(t, base, "OPTIMIZE TABLE "+table+" FINAL")
	if n := clickhousetest.Count(t, base, "SELECT count() FROM "+table); n != 3 {
		t.Errorf("raw rows after a merge: got %d, want 3", n)
	}
}

// TestClickHouseSchemaInReadme: the README shows the table the sink
// creates.
func TestClickHouseSchemaInReadme(t *testing.T) {
	norm := func(s string) string {
		s = regexp.MustCompile(`--[^\n]*`).ReplaceAllString(s, "")
		return strings.Join(strings.Fields(strings.ReplaceAll(s, "`", "")), " ")
	}
	sink := newSink(t, "http://127.0.0.1:8123", "")
	if got, want := norm(clickhousetest.ReadmeSQL(t, "CREATE TABLE")), norm(sink.Schema()); got != want {
		t.Errorf("README schema:\n%s\nwant the sink's:\n%s", got, want)
	}
}

// TestClickHouseErrors checks how the sink reports a server it cannot use:
// one that refuses the credentials, and one that is not there.
func TestClickHouseErrors(t *testing.T) {
	base := clickhousetest.URL(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()
	for _, tc := range []struct {
		name   string
		url    string
		class  error
		reason string
		msg    string
	}{
		{"unknown user", strings.Replace(base, "http://", "http://nobody:secret@", 1), errdefs.ErrPermissionDenied, analytics.FailPermissionDenied, "refused the credentials"},
		{"wrong password", strings.Replace(base, "http://", "http://default:wrong@", 1), errdefs.ErrPermissionDenied, analytics.FailPermissionDenied, "Wrong password"},
		{"nothing listening", closed, errdefs.ErrUnavailable, analytics.FailUnavailable, "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newStore(t)
			ids := newWorkspace(t, st, "errors").run(t, 2)
			sink := newSink(t, tc.url, clickhousetest.Database(t, base))
			obs, logs := &observer{}, &logBuffer{}
			err := analytics.NewShipper(st, sink, analytics.Options{Observer: obs, Logger: logs.logger()}).Ship(t.Context())
			if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.msg) || obs.failed[tc.reason] != 1 {
				t.Errorf("Ship: got %v, failures %v; want %q saying %q, counted as %s", err, obs.failed, tc.class, tc.msg, tc.reason)
			}
			if strings.Contains(err.Error(), "secret") || strings.Contains(logs.String(), "secret") || !strings.Contains(logs.String(), tc.msg) {
				t.Errorf("log:\n%s\nwant a line saying %q, without the password", logs, tc.msg)
			}
			if got := outboxIDs(t, st); !slices.Equal(got, ids) {
				t.Errorf("outbox: got %v, want the rows still waiting, %v", got, ids)
			}
		})
	}
}

func TestNewClickHouse(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    analytics.ClickHouseConfig
		ok   bool
	}{
		{"defaults", analytics.ClickHouseConfig{URL: "http://127.0.0.1:8123"}, true},
		{"https with user", analytics.ClickHouseConfig{URL: "https://u:p@ch.example:8443", Database: "a_1", Table: "T"}, true},
		{"no url", analytics.ClickHouseConfig{}, false},
		{"other scheme", analytics.ClickHouseConfig{URL: "tcp://127.0.0.1:9000"}, false},
		{"no host", analytics.ClickHouseConfig{URL: "http:///x"}, false},
		{"query", analytics.ClickHouseConfig{URL: "http://127.0.0.1:8123/?database=x"}, false},
		{"database with a dot", analytics.ClickHouseConfig{URL: "http://h:8123", Database: "a.b"}, false},
		{"table with a backquote", analytics.ClickHouseConfig{URL: "http://h:8123", Table: "t`; DROP"}, false},
		{"table starting with a digit", analytics.ClickHouseConfig{URL: "http://h:8123", Table: "1t"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := analytics.NewClickHouse(tc.c)
			if (err == nil) != tc.ok || (err != nil && !errdefs.IsInvalidArgument(err)) {
				t.Errorf("NewClickHouse(%+v): got %v, want ok %v (or ErrInvalidArgument)", tc.c, err, tc.ok)
			}
		})
	}
	if _, err := analytics.NewClickHouse(analytics.ClickHouseConfig{URL: "ftp://u:secret@h"}); err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("the error of a bad URL: got %v, want one without the password", err)
	}
}
