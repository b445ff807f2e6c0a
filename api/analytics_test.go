package api_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/analytics"
	"github.com/stockade-sh/stockade/analytics/clickhousetest"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// The daemon's analytics, end to end: a real `stockade serve`, real runc
// sandboxes, the SQLite or PostgreSQL store and a real ClickHouse (the
// shared test server, or one of the test's own that it stops and starts).

// analyticsArgs are the flags that ship to ClickHouse at url, database db,
// in rounds 100 ms apart.
func analyticsArgs(url, db string, extra ...string) []string {
	return append([]string{"--analytics-clickhouse-url", url, "--analytics-clickhouse-database", db,
		"--analytics-interval", "100ms"}, extra...)
}

// setUpAnalytics is setUpDaemon on a fresh database of b, with credits
// more; it returns the database's URL too.
func setUpAnalytics(t *testing.T, bin string, b backend, credits int) (key, db string, args []string) {
	t.Helper()
	dir := t.TempDir()
	db = b.url(t)
	key, args = setUpDaemon(t, bin, dir, db, filepath.Join(dir, "state"))
	cli(t, bin, "credits", "grant", "crash", strconv.Itoa(credits), "--db", db)
	return key, db, args
}

// readStore opens db, as the admin commands do, for fn.
func readStore(t *testing.T, db string, fn func(st store.Store)) {
	t.Helper()
	st, err := storeopen.Open(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	fn(st)
}

// storeInvocations reads the tool_invocations rows of workspace "crash" from
// db directly, as ClickHouse rows, newest first.
func storeInvocations(t *testing.T, db string) []analytics.Row {
	t.Helper()
	var out []analytics.Row
	readStore(t, db, func(st store.Store) {
		ws, err := st.GetWorkspaceByName(t.Context(), "crash")
		if err != nil {
			t.Fatal(err)
		}
		req := store.PageRequest{Limit: store.MaxPageLimit}
		for {
			p, err := st.ListToolInvocations(t.Context(), ws.ID, store.ToolCallFilter{PageRequest: req})
			if err != nil {
				t.Fatal(err)
			}
			for _, ti := range p.Items {
				out = append(out, clickhousetest.RowOf(ti))
			}
			if req.Cursor = p.Next; req.Cursor == "" {
				return
			}
		}
	})
	return out
}

func byID(a, b analytics.Row) int { return strings.Compare(a.ID, b.ID) }

// outboxRows counts db's analytics outbox directly.
func outboxRows(t *testing.T, db string) (n int64) {
	t.Helper()
	readStore(t, db, func(st store.Store) {
		s, err := st.OutboxStats(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		n = s.Rows
	})
	return n
}

// waitOutboxEmpty polls db's analytics outbox until the daemon has shipped
// every entry. (The daemon's backlog gauge reads 0 before its first round,
// and between the end of an invocation and the next round.)
func waitOutboxEmpty(t *testing.T, db string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for n := outboxRows(t, db); n != 0; n = outboxRows(t, db) {
		if time.Now().After(deadline) {
			t.Fatalf("the analytics outbox still has %d entries after 60 s", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metricValue reads one sample of the daemon's /metrics; series is the
// name with its labels as printed, e.g. `x_total{reason="store"}`.
func metricValue(t *testing.T, base, series string) float64 {
	t.Helper()
	body := do(t, base, "GET", "/metrics", "", nil).want(t, http.StatusOK).body
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", series, err)
			}
			return f
		}
	}
	t.Fatalf("no metric %s in /metrics:\n%s", series, body)
	return 0
}

// waitMetric polls the daemon's metric until ok accepts it.
func waitMetric(t *testing.T, base, series string, ok func(float64) bool, what string) float64 {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		v := metricValue(t, base, series)
		if ok(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s is %v after 60 s", what, series, v)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func equals(want float64) func(float64) bool { return func(v float64) bool { return v == want } }

// invoke runs code on the daemon and checks that it ends with status.
func invoke(t *testing.T, base, key string, req capability.InvokeRequest, status model.ExecutionStatus) {
	t.Helper()
	if v := do(t, base, "POST", "/v1/executions", key, req).want(t, http.StatusOK).execution(t); string(v.Status) != string(status) {
		t.Fatalf("invocation %q: got %s (%s), want %s", req.Code, v.Status, v.Result, status)
	}
}

// readmeCredits runs the README's credits per workspace per day on db and
// returns the invocations and credits it counts in all.
func readmeCredits(t *testing.T, base, db string) (invocations, credits int64) {
	t.Helper()
	for _, r := range clickhousetest.Rows[clickhousetest.CreditsPerDay](t, base, clickhousetest.SampleQuery(t, db)) {
		invocations += r.Invocations
		credits += r.Credits
	}
	return invocations, credits
}

// chProxy stands between the daemon and ClickHouse on loopback. In mode
// "pass" it forwards every request; in "down" it answers INSERTs 503, as
// a ClickHouse that is failing; in "hold" it forwards an INSERT, and once
// ClickHouse has stored it, reports its body on held and never answers,
// so that the daemon can be killed after ClickHouse has the batch and
// before it deletes the batch's outbox entries.
type chProxy struct {
	target string
	held   chan []byte
	mu     sync.Mutex
	mode   string
	// inserts are the bodies of the INSERTs ClickHouse stored.
	inserts [][]byte
}

func (p *chProxy) setMode(m string) { p.mu.Lock(); p.mode = m; p.mu.Unlock() }

func (p *chProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	p.mu.Lock()
	mode := p.mode
	p.mu.Unlock()
	insert := strings.HasPrefix(r.URL.Query().Get("query"), "INSERT")
	if insert && mode == "down" {
		http.Error(w, "chProxy: down", http.StatusServiceUnavailable)
		return
	}
	resp, err := http.Post(p.target+"/?"+r.URL.RawQuery, "text/plain", bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if insert && resp.StatusCode == http.StatusOK {
		p.mu.Lock()
		p.inserts = append(p.inserts, body)
		p.mu.Unlock()
		if mode == "hold" {
			p.held <- body
			<-r.Context().Done()
			return
		}
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(answer)
}

// TestAnalyticsCrashMidBatch kills the daemon with SIGKILL after
// ClickHouse stored a batch and before the daemon deleted the batch's
// outbox entries. The restarted daemon sends the batch again; with the
// table's merges stopped both copies stay, and FINAL and the README's
// query still count every invocation once, with the store's fields.
func TestAnalyticsCrashMidBatch(t *testing.T) {
	requireSandboxes(t)
	base := clickhousetest.URL(t)
	bin := testenv.Build(t, "./cmd/stockade")
	forEachStore(t, func(t *testing.T, b backend) {
		key, dbURL, args := setUpAnalytics(t, bin, b, 100)
		chDB := clickhousetest.Database(t, base)
		table := chDB + ".tool_invocations"
		// The table exists before the daemon starts (which uses it as it
		// is), so that its merges can be stopped.
		sink, err := analytics.NewClickHouse(analytics.ClickHouseConfig{URL: base, Database: chDB})
		if err != nil {
			t.Fatal(err)
		}
		if err := sink.Prepare(t.Context()); err != nil {
			t.Fatal(err)
		}
		clickhousetest.Exec(t, base, "SYSTEM STOP MERGES "+table)
		p := &chProxy{target: base, mode: "down", held: make(chan []byte, 1)}
		proxy := httptest.NewServer(p)
		defer proxy.Close()
		args = append(args, analyticsArgs(proxy.URL, chDB)...)

		d := startDaemon(t, bin, args...)
		for _, r := range []struct {
			req    capability.InvokeRequest
			status model.ExecutionStatus
		}{
			{capability.InvokeRequest{Runtime: "shell", Code: "echo one"}, model.StatusSucceeded},
			{capability.InvokeRequest{Runtime: "shell", Code: "exit 3"}, model.StatusFailed},
			{capability.InvokeRequest{Runtime: "python", Code: "print(6*7)"}, model.StatusSucceeded},
			{capability.InvokeRequest{Runtime: "shell", Code: "sleep 5", TimeoutMS: 300}, model.StatusTimedOut},
			{capability.InvokeRequest{Runtime: "shell", Code: "echo five"}, model.StatusSucceeded},
		} {
			invoke(t, d.url, key, r.req, r.status)
		}
		waitMetric(t, d.url, "stockade_analytics_outbox_rows", equals(5), "the backlog while ClickHouse fails")
		if v := metricValue(t, d.url, `stockade_analytics_ship_failures_total{reason="unavailable"}`); v == 0 {
			t.Errorf("failures while ClickHouse answers 503: got %v, want some counted as unavailable", v)
		}

		p.setMode("hold")
		var batch []byte
		select {
		case batch = <-p.held:
		case <-time.After(60 * time.Second):
			t.Fatal("the daemon sent no batch within 60 s")
		}
		d.kill()
		if n := bytes.Count(batch, []byte("\n")); n != 5 {
			t.Fatalf("the held batch has %d rows, want all 5:\n%s", n, batch)
		}
		if n := clickhousetest.Count(t, base, "SELECT count() FROM "+table); n != 5 {
			t.Fatalf("rows in ClickHouse after the kill: got %d, want the batch's 5", n)
		}
		if n := outboxRows(t, dbURL); n != 5 {
			t.Fatalf("outbox entries after the kill: got %d, want the batch's 5, not deleted", n)
		}

		p.setMode("pass")
		d = startDaemon(t, bin, args...)
		waitOutboxEmpty(t, dbURL)
		if n := clickhousetest.Count(t, base, "SELECT count() FROM "+table); n != 10 {
			t.Errorf("raw rows after the restart, merges stopped: got %d, want 10 (the batch sent again)", n)
		}
		p.mu.Lock()
		resent := len(p.inserts) == 2 && bytes.Equal(p.inserts[0], p.inserts[1])
		p.mu.Unlock()
		if !resent {
			t.Errorf("ClickHouse stored %d inserts, want the same batch twice", len(p.inserts))
		}
		want := slices.SortedFunc(slices.Values(storeInvocations(t, dbURL)), byID)
		got := clickhousetest.Rows[analytics.Row](t, base, "SELECT * FROM "+table+" FINAL ORDER BY id")
		if len(want) != 5 || !slices.Equal(got, want) {
			t.Errorf("ClickHouse rows (FINAL):\ngot  %+v\nwant the store's %+v", got, want)
		}
		if n := clickhousetest.Count(t, base, "SELECT uniqExact(id) FROM "+table); n != 5 {
			t.Errorf("distinct invocation ids: got %d, want 5", n)
		}
		if inv, credits := readmeCredits(t, base, chDB); inv != 5 || credits != 10 {
			t.Errorf("the README's query: got %d invocations and %d credits, want 5 and 10", inv, credits)
		}

		// Merges, when they come, leave one row per invocation.
		invoke(t, d.url, key, capability.InvokeRequest{Runtime: "shell", Code: "echo after"}, model.StatusSucceeded)
		waitMetric(t, d.url, "stockade_analytics_rows_shipped_total", equals(6), "shipping after the restart")
		clickhousetest.Exec(t, base, "SYSTEM START MERGES "+table)
		clickhousetest.Exec(t, base, "OPTIMIZE TABLE "+table+" FINAL")
		if n := clickhousetest.Count(t, base, "SELECT count() FROM "+table); n != 6 {
			t.Errorf("raw rows after a merge: got %d, want 6", n)
		}
		d.stop()
	})
}

// TestAnalyticsClickHouseRestart stops ClickHouse during 100 invocations
// and starts it again: every invocation runs as usual, the rows wait, and
// all 100 arrive, each counted once.
func TestAnalyticsClickHouseRestart(t *testing.T) {
	requireSandboxes(t)
	bin := testenv.Build(t, "./cmd/stockade")
	forEachStore(t, func(t *testing.T, b backend) {
		ch := clickhousetest.Start(t)
		key, dbURL, args := setUpAnalytics(t, bin, b, 200)
		d := startDaemon(t, bin, append(args, analyticsArgs(ch.URL, "stockade")...)...)
		for i := range 100 {
			switch i {
			case 30:
				waitMetric(t, d.url, "stockade_analytics_rows_shipped_total", equals(30), "shipping before the stop")
				ch.Stop()
			case 70:
				waitMetric(t, d.url, "stockade_analytics_outbox_rows", equals(40), "the backlog with ClickHouse stopped")
				waitMetric(t, d.url, `stockade_analytics_ship_failures_total{reason="unavailable"}`,
					func(v float64) bool { return v > 0 }, "failures with ClickHouse stopped")
				if lag := metricValue(t, d.url, "stockade_analytics_outbox_lag_seconds"); lag <= 0 {
					t.Errorf("the lag with ClickHouse stopped: got %v, want the oldest row's wait", lag)
				}
				ch.Restart()
			}
			invoke(t, d.url, key, capability.InvokeRequest{Runtime: "shell", Code: "echo " + strconv.Itoa(i)}, model.StatusSucceeded)
		}
		waitOutboxEmpty(t, dbURL)
		waitMetric(t, d.url, "stockade_analytics_outbox_rows", equals(0), "the backlog after ClickHouse is back")
		if n := clickhousetest.Count(t, ch.URL, "SELECT count() FROM stockade.tool_invocations FINAL"); n != 100 {
			t.Errorf("rows in ClickHouse (FINAL): got %d, want 100", n)
		}
		if inv, credits := readmeCredits(t, ch.URL, "stockade"); inv != 100 || credits != 200 {
			t.Errorf("the README's query: got %d invocations and %d credits, want 100 and 200", inv, credits)
		}
		var ids, want []string
		for _, r := range clickhousetest.Rows[analytics.Row](t, ch.URL, "SELECT * FROM stockade.tool_invocations FINAL ORDER BY id") {
			ids = append(ids, r.ID)
		}
		for _, r := range slices.SortedFunc(slices.Values(storeInvocations(t, dbURL)), byID) {
			want = append(want, r.ID)
		}
		if !slices.Equal(ids, want) {
			t.Errorf("invocation ids in ClickHouse: got %d, want the store's %d", len(ids), len(want))
		}
		for _, line := range []string{"shipping tool_invocations rows failed", "shipping tool_invocations rows resumed"} {
			if !strings.Contains(d.log(), line) {
				t.Errorf("the daemon's log has no %q", line)
			}
		}
		d.stop()
	})
}

// TestAnalyticsOutboxBound runs invocations past the outbox's max rows
// with ClickHouse unreachable: they run as usual, the oldest rows are
// dropped and counted, and a daemon that can reach ClickHouse ships the
// rest, the newest.
func TestAnalyticsOutboxBound(t *testing.T) {
	requireSandboxes(t)
	base := clickhousetest.URL(t)
	bin := testenv.Build(t, "./cmd/stockade")
	forEachStore(t, func(t *testing.T, b backend) {
		key, dbURL, args := setUpAnalytics(t, bin, b, 100)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		closed := "http://" + ln.Addr().String()
		ln.Close()
		chDB := clickhousetest.Database(t, base)
		bound := []string{"--analytics-outbox-max-rows", "20"}
		d := startDaemon(t, bin, append(slices.Clone(args), analyticsArgs(closed, chDB, bound...)...)...)
		for i := range 30 {
			invoke(t, d.url, key, capability.InvokeRequest{Runtime: "shell", Code: "echo " + strconv.Itoa(i)}, model.StatusSucceeded)
		}
		waitMetric(t, d.url, "stockade_analytics_rows_dropped_total", equals(10), "rows dropped past max rows")
		if v := metricValue(t, d.url, "stockade_analytics_outbox_rows"); v != 20 {
			t.Errorf("the backlog at the bound: got %v, want 20", v)
		}
		if !strings.Contains(d.log(), "dropped its oldest rows") || !strings.Contains(d.log(), "connection refused") {
			t.Errorf("the daemon's log says neither that rows were dropped nor why they could not go:\n%s", d.log())
		}
		d.stop()

		d = startDaemon(t, bin, append(slices.Clone(args), analyticsArgs(base, chDB, bound...)...)...)
		waitOutboxEmpty(t, dbURL)
		// The store keeps all 30 rows; ClickHouse gets the newest 20.
		rows := storeInvocations(t, dbURL)
		got := clickhousetest.Rows[analytics.Row](t, base, "SELECT * FROM "+chDB+".tool_invocations FINAL ORDER BY id")
		if len(rows) != 30 || !slices.Equal(got, slices.SortedFunc(slices.Values(rows[:20]), byID)) {
			t.Errorf("got %d rows in the store and in ClickHouse %+v; want 30, and the newest 20 %+v", len(rows), got, rows[:min(len(rows), 20)])
		}
		d.stop()
	})
}
