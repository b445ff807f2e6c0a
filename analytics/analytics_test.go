package analytics_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/analytics"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/store/sqlite"
)

// newStore opens a SQLite store with its outbox on.
func newStore(t *testing.T) *sqlite.Store {
	t.Helper()
	st, err := sqlite.Open(t.Context(), sqlite.Config{Path: filepath.Join(t.TempDir(), "stockade.db"), AnalyticsOutbox: true})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// workspace is a workspace with an agent and an approver key and credits.
type workspace struct {
	st              *sqlite.Store
	ws              model.Workspace
	agent, approver model.APIKey
}

func newWorkspace(t *testing.T, st *sqlite.Store, name string) workspace {
	t.Helper()
	ctx := t.Context()
	ws, err := st.CreateWorkspace(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := workspace{st: st, ws: ws}
	for _, k := range []struct {
		role model.Role
		dst  *model.APIKey
	}{{model.RoleAgent, &w.agent}, {model.RoleApprover, &w.approver}} {
		if *k.dst, err = st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: k.role, Hash: model.HashKey(name + string(k.role))}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.GrantCredits(ctx, ws.ID, 1_000_000, "test", nil); err != nil {
		t.Fatal(err)
	}
	return w
}

// create admits an execution of code, charged 2, awaiting approval when
// approval is set, as the capability layer does.
func (w workspace) create(t *testing.T, code string, approval bool) capability.Grant {
	t.Helper()
	now := time.Now()
	step, err := capability.Transition(capability.Grant{Kind: capability.OneShot}, capability.Admit{
		By:     capability.Principal{KeyID: w.agent.ID, WorkspaceID: w.ws.ID, Role: model.RoleAgent},
		Policy: policy.Decision{Allowed: true, ApprovalRequired: approval}, Price: 2,
		Card: []byte(`{}`), ExpiresAt: now.Add(time.Hour), At: now,
	})
	if err != nil {
		t.Fatalf("Transition: %v", err)
	}
	adm, err := w.st.Admit(t.Context(), store.NewExecution{WorkspaceID: w.ws.ID, KeyID: w.agent.ID, Runtime: "python",
		Tool: "code.execute", Request: []byte(`{}`), InputSHA256: strings.Repeat("a", 64)}, *step.Write)
	if err != nil {
		t.Fatalf("Admit: %v", err)
	}
	return capability.GrantOf(adm.Execution, adm.Approval)
}

// apply moves g by in, as the capability layer does, and returns it as it
// is after.
func (w workspace) apply(t *testing.T, g capability.Grant, in capability.Input) capability.Grant {
	t.Helper()
	step, err := capability.Transition(g, in)
	if err != nil {
		t.Fatalf("Transition: %v", err)
	}
	ex, err := w.st.Apply(t.Context(), g.ID, *step.Write)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return capability.GrantOf(ex, nil)
}

// run ends n executions that ran on runc, succeeded and were charged 2,
// each a little after the last, and returns their tool_invocations ids in
// that order.
func (w workspace) run(t *testing.T, n int) []string {
	t.Helper()
	var ids []string
	for range n {
		g := w.create(t, "print(1)", false)
		g = w.apply(t, g, capability.Start{Driver: "runc", At: time.Now()})
		w.apply(t, g, capability.Finish{Status: model.StatusSucceeded, Output: model.Output{ExitCode: new(0)}, At: time.Now()})
		ids = append(ids, w.newest(t).ID)
		time.Sleep(time.Millisecond) // the next one is enqueued later
	}
	return ids
}

// newest returns the workspace's newest tool_invocations row.
func (w workspace) newest(t *testing.T) model.ToolInvocation {
	t.Helper()
	p, err := w.st.ListToolInvocations(t.Context(), w.ws.ID, store.ToolCallFilter{PageRequest: store.PageRequest{Limit: 1}})
	if err != nil || len(p.Items) != 1 {
		t.Fatalf("the newest tool_invocations row: got %v, %v", p.Items, err)
	}
	return p.Items[0]
}

// outboxIDs lists the ids waiting in the outbox, oldest first.
func outboxIDs(t *testing.T, ob analytics.Outbox) []string {
	t.Helper()
	es, err := ob.ListOutbox(t.Context(), store.MaxOutboxBatch)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range es {
		ids = append(ids, e.Invocation.ID)
	}
	return ids
}

// fakeSink records what it is sent and fails while err is set.
type fakeSink struct {
	mu       sync.Mutex
	err      error
	prepares int
	batches  [][]string
}

func (f *fakeSink) Prepare(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.prepares++
	return nil
}

func (f *fakeSink) Insert(_ context.Context, rows []model.ToolInvocation) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	var ids []string
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	f.batches = append(f.batches, ids)
	return nil
}

func (f *fakeSink) setErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakeSink) shipped() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Concat(f.batches...)
}

// observer records what the shipper reports.
type observer struct {
	mu               sync.Mutex
	shipped          int
	dropped          int64
	failed           map[string]int
	backlog          int64
	lag              time.Duration
	backlogsReported int
}

func (o *observer) AnalyticsShipped(n int) { o.mu.Lock(); o.shipped += n; o.mu.Unlock() }
func (o *observer) AnalyticsDropped(n int64) {
	o.mu.Lock()
	o.dropped += n
	o.mu.Unlock()
}
func (o *observer) AnalyticsFailed(r string) {
	o.mu.Lock()
	if o.failed == nil {
		o.failed = map[string]int{}
	}
	o.failed[r]++
	o.mu.Unlock()
}
func (o *observer) AnalyticsBacklog(rows int64, lag time.Duration) {
	o.mu.Lock()
	o.backlog, o.lag = rows, lag
	o.backlogsReported++
	o.mu.Unlock()
}

// logBuffer is a logger writing to a buffer, for counting log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}
func (l *logBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), s)
}
func (l *logBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.buf.String() }
func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, nil))
}

func TestShipBatchesOldestFirst(t *testing.T) {
	st := newStore(t)
	ids := newWorkspace(t, st, "batches").run(t, 25)
	sink, obs := &fakeSink{}, &observer{}
	sh := analytics.NewShipper(st, sink, analytics.Options{BatchSize: 10, Observer: obs})
	if err := sh.Ship(t.Context()); err != nil {
		t.Fatalf("Ship: %v", err)
	}
	var sizes []int
	for _, b := range sink.batches {
		sizes = append(sizes, len(b))
	}
	if !slices.Equal(sizes, []int{10, 10, 5}) || !slices.Equal(sink.shipped(), ids) {
		t.Errorf("batches: got sizes %v of %v, want 10, 10 and 5 of %v in order", sizes, sink.shipped(), ids)
	}
	if left := outboxIDs(t, st); len(left) != 0 {
		t.Errorf("outbox after shipping: got %v, want empty", left)
	}
	if obs.shipped != 25 || obs.backlog != 0 || obs.lag != 0 || sink.prepares != 1 {
		t.Errorf("observer: got %d shipped, backlog %d, lag %v, %d prepares; want 25, 0, 0, 1", obs.shipped, obs.backlog, obs.lag, sink.prepares)
	}
}

// TestShipFailureKeepsRows fails the sink in each way it can and checks
// that the rows wait, that the failure is counted with its reason and
// logged once while it lasts, and that the rows go once the sink is back.
func TestShipFailureKeepsRows(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		reason string
	}{
		{"unreachable", fmt.Errorf("reaching ClickHouse: connection refused: %w", errdefs.ErrUnavailable), analytics.FailUnavailable},
		{"credentials refused", fmt.Errorf("ClickHouse refused the credentials: %w", errdefs.ErrPermissionDenied), analytics.FailPermissionDenied},
		{"statement refused", fmt.Errorf("ClickHouse answered 500: %w", errdefs.ErrFailedPrecondition), analytics.FailRejected},
		{"timeout", fmt.Errorf("reaching ClickHouse: %w", context.DeadlineExceeded), analytics.FailUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newStore(t)
			ids := newWorkspace(t, st, "down").run(t, 3)
			sink, obs, logs := &fakeSink{err: tc.err}, &observer{}, &logBuffer{}
			sh := analytics.NewShipper(st, sink, analytics.Options{Observer: obs, Logger: logs.logger()})
			for range 3 {
				if err := sh.Ship(t.Context()); !errors.Is(err, tc.err) {
					t.Fatalf("Ship with the sink failing: got %v, want %v", err, tc.err)
				}
			}
			if got := outboxIDs(t, st); !slices.Equal(got, ids) {
				t.Errorf("outbox while failing: got %v, want %v", got, ids)
			}
			if obs.failed[tc.reason] != 3 || len(obs.failed) != 1 || obs.backlog != 3 || obs.lag <= 0 {
				t.Errorf("observer while failing: got failures %v, backlog %d, lag %v; want 3 %s, 3 rows, a lag", obs.failed, obs.backlog, obs.lag, tc.reason)
			}
			if n := logs.count("shipping tool_invocations rows failed"); n != 1 || !strings.Contains(logs.String(), tc.err.Error()) {
				t.Errorf("log while failing: got %d failure lines, want 1 naming %q:\n%s", n, tc.err, logs)
			}
			sink.setErr(nil)
			if err := sh.Ship(t.Context()); err != nil {
				t.Fatalf("Ship with the sink back: %v", err)
			}
			if !slices.Equal(sink.shipped(), ids) || obs.backlog != 0 || logs.count("shipping tool_invocations rows resumed") != 1 {
				t.Errorf("after the sink is back: got %v shipped, backlog %d, log:\n%s\nwant %v, 0 and a line saying it resumed", sink.shipped(), obs.backlog, logs, ids)
			}
		})
	}
}

// failingDeletes is an outbox whose DeleteOutbox fails while fail is set,
// as a daemon that stops after the sink stored a batch.
type failingDeletes struct {
	analytics.Outbox
	fail bool
}

func (f *failingDeletes) DeleteOutbox(ctx context.Context, ids []string) (int64, error) {
	if f.fail {
		return 0, fmt.Errorf("database gone: %w", errdefs.ErrUnavailable)
	}
	return f.Outbox.DeleteOutbox(ctx, ids)
}

// TestShipResendsUndeletedBatch: a batch stored whose entries could not be
// deleted is sent again (at least once), never lost.
func TestShipResendsUndeletedBatch(t *testing.T) {
	st := newStore(t)
	ids := newWorkspace(t, st, "resend").run(t, 4)
	ob, sink, obs := &failingDeletes{Outbox: st, fail: true}, &fakeSink{}, &observer{}
	sh := analytics.NewShipper(ob, sink, analytics.Options{Observer: obs})
	if err := sh.Ship(t.Context()); err == nil || obs.failed[analytics.FailStore] != 1 {
		t.Fatalf("Ship with deletes failing: got %v, failures %v; want an error counted as %s", err, obs.failed, analytics.FailStore)
	}
	ob.fail = false
	if err := sh.Ship(t.Context()); err != nil {
		t.Fatalf("Ship: %v", err)
	}
	if want := slices.Concat(ids, ids); !slices.Equal(sink.shipped(), want) {
		t.Errorf("sent: got %v, want the batch twice, %v", sink.shipped(), want)
	}
	if left := outboxIDs(t, st); len(left) != 0 {
		t.Errorf("outbox: got %v, want empty", left)
	}
}

// TestShipPreparesAgain: a sink whose table went missing is prepared again
// before the next batch.
func TestShipPreparesAgain(t *testing.T) {
	st := newStore(t)
	newWorkspace(t, st, "prepare").run(t, 1)
	sink := &fakeSink{err: fmt.Errorf("table gone: %w", errdefs.ErrNotFound)}
	sh := analytics.NewShipper(st, sink, analytics.Options{})
	_ = sh.Ship(t.Context())
	sink.setErr(nil)
	if err := sh.Ship(t.Context()); err != nil {
		t.Fatal(err)
	}
	if sink.prepares != 2 || len(sink.shipped()) != 1 {
		t.Errorf("got %d prepares and %v shipped, want 2 and the row", sink.prepares, sink.shipped())
	}
}

// TestShipBound fills the outbox past its bounds with the sink down: the
// oldest rows are dropped, counted and logged, and the rest still go.
func TestShipBound(t *testing.T) {
	st := newStore(t)
	w := newWorkspace(t, st, "bound")
	ids := w.run(t, 30)
	sink, obs, logs := &fakeSink{err: fmt.Errorf("down: %w", errdefs.ErrUnavailable)}, &observer{}, &logBuffer{}
	now := time.Now()
	sh := analytics.NewShipper(st, sink, analytics.Options{MaxRows: 20, MaxAge: time.Hour, Observer: obs, Logger: logs.logger(),
		Now: func() time.Time { return now }})
	_ = sh.Ship(t.Context())
	if got := outboxIDs(t, st); !slices.Equal(got, ids[10:]) || obs.dropped != 10 || obs.backlog != 20 {
		t.Errorf("past max rows: got %v left, %d dropped, backlog %d; want the newest 20 %v, 10, 20", got, obs.dropped, obs.backlog, ids[10:])
	}
	if !strings.Contains(logs.String(), "dropped its oldest rows") || !strings.Contains(logs.String(), "dropped=10") {
		t.Errorf("log: got\n%s\nwant a line saying 10 rows were dropped", logs)
	}
	sink.setErr(nil)
	if err := sh.Ship(t.Context()); err != nil || !slices.Equal(sink.shipped(), ids[10:]) {
		t.Errorf("with the sink back: got %v shipped (%v), want %v", sink.shipped(), err, ids[10:])
	}
	// The tool_invocations rows themselves stay.
	if p, err := st.ListToolInvocations(t.Context(), w.ws.ID, store.ToolCallFilter{PageRequest: store.PageRequest{Limit: 100}}); err != nil || len(p.Items) != 30 {
		t.Errorf("tool_invocations rows: got %d (%v), want 30", len(p.Items), err)
	}

	// Past max age, the clock an hour on.
	aged := w.run(t, 2)
	sink.setErr(fmt.Errorf("down: %w", errdefs.ErrUnavailable))
	now = now.Add(time.Hour + time.Minute)
	_ = sh.Ship(t.Context())
	if got := outboxIDs(t, st); len(got) != 0 || obs.dropped != 12 {
		t.Errorf("past max age: got %v left (of %v), %d dropped in all; want none left, 12", got, aged, obs.dropped)
	}
}

// TestRunShipsUntilCancelled runs the loop: rows that arrive while it runs
// are shipped within a few intervals, and it returns when ctx ends.
func TestRunShipsUntilCancelled(t *testing.T) {
	st := newStore(t)
	w := newWorkspace(t, st, "run")
	sink := &fakeSink{}
	sh := analytics.NewShipper(st, sink, analytics.Options{Interval: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); sh.Run(ctx) }()
	ids := w.run(t, 3)
	deadline := time.Now().Add(10 * time.Second)
	for len(sink.shipped()) < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if !slices.Equal(sink.shipped(), ids) {
		t.Errorf("shipped by Run: got %v, want %v", sink.shipped(), ids)
	}
}
