package store_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/internal/witness"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/store/storetest"
)

// fixtureDir holds databases written by an earlier version of Stockade
// (its README says which, and what they hold).
const fixtureDir = "testdata/fixture"

// fixtureColumns are the chains of the fixture, as the columns of its
// README's table: two workspaces by name, and the unattributed chain.
var fixtureColumns = []string{"alpha", "beta", ""}

// counts maps "table key" (a row of the README's table) to its value per
// column of fixtureColumns.
type counts map[string][3]int64

// TestFixture opens the databases of testdata/fixture, which an earlier
// version wrote, through today's store (which migrates them), and checks
// that nothing was lost: every audit chain verifies and still holds the
// head witnessed when it was written, and every table holds the rows the
// README counts. The chains' hashes cover every event's data byte for
// byte, so an event whose data today's code would encode differently no
// longer verifies (subtest "re-encoded"); every event decodes into its
// struct in package audit, which encodes it back byte for byte (subtest
// "typed").
func TestFixture(t *testing.T) {
	want := readmeCounts(t, filepath.Join(fixtureDir, "README.md"))
	for _, b := range []struct {
		name    string
		open    func(t *testing.T) store.Store
		witness string
	}{
		{"sqlite", openSQLiteFixture, filepath.Join(fixtureDir, "sqlite", "stockade.db.witness")},
		{"postgres", openPostgresFixture, filepath.Join(fixtureDir, "postgres", "witness")},
	} {
		t.Run(b.name, func(t *testing.T) {
			st := b.open(t)
			ids := checkChains(t, st, witness.Dir(b.witness))
			got := fixtureCounts(t, st, ids)
			for _, k := range slices.Sorted(maps.Keys(mergeKeys(got, want))) {
				if got[k] != want[k] {
					t.Errorf("%s (alpha, beta, unattributed): got %v, want %v as the README says", k, got[k], want[k])
				}
			}
			for _, id := range ids[:2] {
				storetest.CheckLedger(t, st, id)
			}
			t.Run("re-encoded", func(t *testing.T) { checkReencoded(t, st, ids[0]) })
			t.Run("typed", func(t *testing.T) { checkTyped(t, st, ids) })
		})
	}
}

// mergeKeys returns the rows of a and b (their values do not matter).
func mergeKeys(a, b counts) counts {
	out := maps.Clone(a)
	maps.Copy(out, b)
	return out
}

// openSQLiteFixture opens a copy of the SQLite fixture: opening migrates.
func openSQLiteFixture(t *testing.T) store.Store {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtureDir, "sqlite", "stockade.db"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "stockade.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return openURL(t, "sqlite:"+path)
}

// openPostgresFixture restores the PostgreSQL fixture's dump with psql into
// a database of its own in the server STOCKADE_TEST_POSTGRES names, dropped
// when the test ends, and opens it.
func openPostgresFixture(t *testing.T) store.Store {
	t.Helper()
	dsn := os.Getenv("STOCKADE_TEST_POSTGRES")
	if dsn == "" {
		testenv.Missing(t, "STOCKADE_TEST_POSTGRES is not set; run: export STOCKADE_TEST_POSTGRES=$(scripts/pgtest.sh)")
	}
	psql := testenv.RequiresBinary(t, "psql")
	name := fmt.Sprintf("stockade_fixture_%d", time.Now().UnixNano())
	admin := func(q string) {
		ctx := context.WithoutCancel(t.Context())
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("connecting to STOCKADE_TEST_POSTGRES: %v", err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	admin("CREATE DATABASE " + name)
	t.Cleanup(func() { admin("DROP DATABASE " + name + " WITH (FORCE)") })
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("parsing STOCKADE_TEST_POSTGRES: %v", err)
	}
	u.Path = "/" + name
	restore := exec.Command(psql, "--no-psqlrc", "--quiet", "--set", "ON_ERROR_STOP=1",
		"--file", filepath.Join(fixtureDir, "postgres", "stockade.sql"), u.String())
	if out, err := restore.CombinedOutput(); err != nil {
		t.Fatalf("restoring the dump with psql: %v\n%s", err, out)
	}
	return openURL(t, u.String())
}

func openURL(t *testing.T, url string) store.Store {
	t.Helper()
	st, err := storeopen.Open(t.Context(), url)
	if err != nil {
		t.Fatalf("opening the fixture: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// checkChains verifies every chain against its witnessed head, which must
// also be the chain's head now, and returns the chains' workspace ids in
// the order of fixtureColumns.
func checkChains(t *testing.T, st store.Store, w witness.Dir) []string {
	t.Helper()
	ctx := t.Context()
	wss, err := st.ListWorkspaces(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(fixtureColumns))
	for i, name := range fixtureColumns[:2] {
		j := slices.IndexFunc(wss, func(ws model.Workspace) bool { return ws.Name == name })
		if j < 0 {
			t.Fatalf("workspaces: got %+v, want %q among them", wss, name)
		}
		ids[i] = wss[j].ID
	}
	if len(wss) != 2 {
		t.Errorf("workspaces: got %d, want 2", len(wss))
	}
	witnessed, err := w.Chains()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(slices.Sorted(slices.Values(witnessed)), slices.Sorted(slices.Values(ids))) {
		t.Errorf("witnessed chains: got %q, want %q", witnessed, ids)
	}
	for i, id := range ids {
		h, ok, err := w.Read(id)
		if err != nil || !ok {
			t.Fatalf("witness of chain %q: ok %v, err %v", fixtureColumns[i], ok, err)
		}
		if head, err := st.ChainHead(ctx, id); err != nil || head != h {
			t.Errorf("head of chain %q: got %+v (%v), want the witnessed %+v", fixtureColumns[i], head, err, h)
		}
		if ok, broken, err := st.VerifyChain(ctx, id, h); !ok || err != nil {
			t.Errorf("VerifyChain(%q): got ok %v, broken %+v, err %v; want ok", fixtureColumns[i], ok, broken, err)
		}
	}
	return ids
}

// fixtureCounts counts the rows of each chain's workspace, through the
// store's own queries.
func fixtureCounts(t *testing.T, st store.Store, ids []string) counts {
	t.Helper()
	ctx := t.Context()
	got := counts{}
	add := func(col int, table, key string, n int64) {
		c := got[table+" "+key]
		c[col] += n
		got[table+" "+key] = c
	}
	for col, id := range ids {
		for _, e := range all(t, func(p store.PageRequest) (store.Page[model.Event], error) {
			return st.ListEvents(ctx, id, store.EventFilter{PageRequest: p})
		}) {
			add(col, "audit_events", e.Type, 1)
		}
		if id == "" {
			continue
		}
		keys, err := st.ListAPIKeys(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			add(col, "api_keys", string(k.Role), 1)
		}
		for _, e := range all(t, func(p store.PageRequest) (store.Page[model.Execution], error) {
			return st.ListExecutions(ctx, id, store.ExecutionFilter{PageRequest: p})
		}) {
			add(col, "executions", string(e.Status), 1)
		}
		for _, c := range all(t, func(p store.PageRequest) (store.Page[model.ToolCall], error) {
			return st.ListToolCalls(ctx, id, store.ToolCallFilter{PageRequest: p})
		}) {
			add(col, "tool_calls", string(c.Status), 1)
		}
		for _, c := range all(t, func(p store.PageRequest) (store.Page[model.ToolInvocation], error) {
			return st.ListToolInvocations(ctx, id, store.ToolCallFilter{PageRequest: p})
		}) {
			add(col, "tool_invocations", string(c.Status), 1)
		}
		for _, a := range all(t, func(p store.PageRequest) (store.Page[model.Approval], error) {
			return st.ListApprovals(ctx, id, store.ApprovalFilter{PageRequest: p})
		}) {
			add(col, "approval_requests", string(a.Status), 1)
		}
		for _, l := range all(t, func(p store.PageRequest) (store.Page[model.LedgerEntry], error) {
			return st.ListLedger(ctx, id, p)
		}) {
			add(col, "credit_ledger", string(l.Kind), 1)
		}
		c, err := st.GetCredits(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		add(col, "credit_accounts", "available", c.Available)
		add(col, "credit_accounts", "reserved", c.Reserved)
	}
	return got
}

// all pages through a list.
func all[T any](t *testing.T, list func(store.PageRequest) (store.Page[T], error)) []T {
	t.Helper()
	var out []T
	p := store.PageRequest{Limit: store.MaxPageLimit}
	for {
		page, err := list(p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, page.Items...)
		if p.Cursor = page.Next; p.Cursor == "" {
			return out
		}
	}
}

// readmeCounts reads the table of the fixture's README: the rows
// "| table | key | alpha | beta | unattributed |" whose table is a
// database table's name; an empty cell is zero.
func readmeCounts(t *testing.T, path string) counts {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := counts{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		cells := strings.Split(strings.Trim(strings.TrimSpace(sc.Text()), "|"), "|")
		if len(cells) != 5 {
			continue
		}
		for i := range cells {
			cells[i] = strings.Trim(strings.TrimSpace(cells[i]), "`")
		}
		switch cells[0] {
		case "api_keys", "executions", "tool_calls", "tool_invocations", "approval_requests", "credit_ledger", "credit_accounts", "audit_events":
		default:
			continue
		}
		var c [3]int64
		for i, cell := range cells[2:] {
			if cell == "" {
				continue
			}
			if c[i], err = strconv.ParseInt(cell, 10, 64); err != nil {
				t.Fatalf("%s: row %q: %v", path, sc.Text(), err)
			}
		}
		want[cells[0]+" "+cells[1]] = c
	}
	if len(want) == 0 {
		t.Fatalf("%s has no table of counts", path)
	}
	return want
}

// checkReencoded shows that the chain holds an event's data byte for
// byte: the data of one event, encoded another way (the same JSON value),
// breaks the chain at that event.
func checkReencoded(t *testing.T, st store.Store, ws string) {
	ctx := t.Context()
	if ok, broken, err := st.VerifyChain(ctx, ws); !ok || err != nil {
		t.Fatalf("the chain does not verify before any change: broken %+v, err %v", broken, err)
	}
	unsafe, ok := st.(interface {
		UnsafeExec(ctx context.Context, query string, args ...any) error
	})
	if !ok {
		t.Fatalf("%T cannot change rows behind the store's back", st)
	}
	events := all(t, func(p store.PageRequest) (store.Page[model.Event], error) {
		return st.ListEvents(ctx, ws, store.EventFilter{PageRequest: p, Types: []string{"egress.denied"}})
	})
	i := slices.IndexFunc(events, func(e model.Event) bool { return bytes.Contains(e.Data, []byte(`"addr"`)) })
	if i < 0 {
		t.Fatal("no egress.denied event with an address in the fixture")
	}
	ev := events[i]
	for _, tc := range []struct {
		name   string
		encode func(json.RawMessage) []byte
	}{
		{"indented", func(d json.RawMessage) []byte {
			var b bytes.Buffer
			_ = json.Indent(&b, d, "", "  ")
			return b.Bytes()
		}},
		{"keys in another order", func(d json.RawMessage) []byte {
			var m map[string]json.RawMessage
			_ = json.Unmarshal(d, &m)
			keys := slices.Sorted(maps.Keys(m))
			slices.Reverse(keys)
			b := []byte("{")
			for j, k := range keys {
				if j > 0 {
					b = append(b, ',')
				}
				b = fmt.Appendf(b, "%q:%s", k, m[k])
			}
			return append(b, '}')
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := tc.encode(ev.Data)
			var before, after any
			if json.Unmarshal(ev.Data, &before) != nil || json.Unmarshal(data, &after) != nil || !reflect.DeepEqual(before, after) || bytes.Equal(data, ev.Data) {
				t.Fatalf("%s is not another encoding of %s", data, ev.Data)
			}
			set := func(d []byte) {
				t.Helper()
				if err := unsafe.UnsafeExec(context.WithoutCancel(ctx), "UPDATE audit_events SET data = $1 WHERE id = $2", string(d), ev.ID); err != nil {
					t.Fatal(err)
				}
			}
			set(data)
			defer set(ev.Data)
			ok, broken, err := st.VerifyChain(ctx, ws)
			if ok || err != nil || broken == nil || broken.Seq != ev.Seq || !strings.Contains(broken.Reason, "hash mismatch") {
				t.Errorf("VerifyChain with event %d's data %s: got ok %v, broken %+v, err %v; want a hash mismatch at seq %d", ev.Seq, data, ok, broken, err, ev.Seq)
			}
		})
	}
	if ok, broken, err := st.VerifyChain(ctx, ws); !ok || err != nil {
		t.Errorf("VerifyChain with the data restored: got ok %v, broken %+v, err %v; want ok", ok, broken, err)
	}
}

// olderShapes are the event types whose data main has changed on purpose
// since the fixture was written, each with the struct of the shape the
// fixture holds: the invocation's network is a boolean, not "allow" or
// "deny", in the request of the decisions, and the policy's is
// "network_allowed", a boolean, in policy.updated. Every event of these
// types in the fixture is of the older shape.
var olderShapes = map[string]func() any{
	audit.InvokeAllowed: func() any { return new(invokeAllowedV1) },
	audit.InvokeDenied:  func() any { return new(invokeDeniedV1) },
	audit.PolicyUpdated: func() any { return new(policyUpdatedV1) },
}

type invocationV1 struct {
	Capability  string `json:"capability"`
	InputSHA256 string `json:"input_sha256"`
	Network     bool   `json:"network"`
	Runtime     string `json:"runtime"`
	StdinSHA256 string `json:"stdin_sha256"`
	TimeoutMS   int64  `json:"timeout_ms"`
}

type invokeAllowedV1 struct {
	ApprovalRequired bool         `json:"approval_required"`
	Request          invocationV1 `json:"request"`
}

type invokeDeniedV1 struct {
	Decision string       `json:"decision"`
	Request  invocationV1 `json:"request"`
}

type policyV1 struct {
	CodeExecution  bool     `json:"code_execution"`
	Approval       string   `json:"approval"`
	NetworkAllowed bool     `json:"network_allowed"`
	MaxTimeoutMS   int64    `json:"max_timeout_ms"`
	Runtimes       []string `json:"runtimes"`
	ToolChanges    string   `json:"tool_changes"`
}

type policyUpdatedV1 struct {
	After  policyV1 `json:"after"`
	Before policyV1 `json:"before"`
}

// checkTyped decodes every event of the chains into its type's struct in
// package audit and encodes it again, as the code that writes events
// does (audit.NewEvent): type, code, metadata and data must come back byte
// for byte, so that today's structs write what the version that wrote the
// fixture wrote. The events of olderShapes are of a shape main changed
// since: today's struct must not reproduce them (else the entry hides
// nothing and must go), and the older shape's struct must.
func checkTyped(t *testing.T, st store.Store, ids []string) {
	ctx := t.Context()
	checked, older := 0, map[string]int{}
	for _, id := range ids {
		for _, e := range all(t, func(p store.PageRequest) (store.Page[model.Event], error) {
			return st.ListEvents(ctx, id, store.EventFilter{PageRequest: p})
		}) {
			checked++
			ev, derr := audit.Decode(e)
			if errors.Is(derr, audit.ErrUnknownType) {
				t.Errorf("event %d of chain %q: type %s has no struct in package audit", e.Seq, id, e.Type)
				continue
			}
			var again model.NewEvent
			if derr == nil {
				again = audit.NewEvent(ev)
				if again.Type != e.Type || again.Code != e.Code || again.WorkspaceID != e.WorkspaceID || again.Actor != e.Actor ||
					again.Reason != e.Reason || again.ExecutionID != e.ExecutionID || !again.Time.Equal(e.Time) {
					t.Errorf("event %d of chain %q: encoded again as %+v, want the columns of %+v", e.Seq, id, again, e)
				}
			}
			oldShape, ok := olderShapes[e.Type]
			if !ok {
				if derr != nil || !bytes.Equal(again.Data, e.Data) {
					t.Errorf("%s event %d of chain %q: decoded (%v) and encoded again:\n got %s\nwant %s", e.Type, e.Seq, id, derr, again.Data, e.Data)
				}
				continue
			}
			older[e.Type]++
			if derr == nil && bytes.Equal(again.Data, e.Data) {
				t.Errorf("%s event %d of chain %q is of today's shape, not the older one olderShapes says: %s", e.Type, e.Seq, id, e.Data)
			}
			v := oldShape()
			dec := json.NewDecoder(bytes.NewReader(e.Data))
			dec.DisallowUnknownFields()
			if err := dec.Decode(v); err != nil {
				t.Errorf("%s event %d of chain %q: decoding its older shape: %v", e.Type, e.Seq, id, err)
				continue
			}
			if b, err := json.Marshal(v); err != nil || !bytes.Equal(b, e.Data) {
				t.Errorf("%s event %d of chain %q in its older shape, encoded again:\n got %s (%v)\nwant %s", e.Type, e.Seq, id, b, err, e.Data)
			}
		}
	}
	// The README's counts: 136 + 29 + 9 events; 15 + 6 decisions and 3
	// policy changes of the older shape.
	if checked != 174 {
		t.Errorf("checked %d events, want the fixture's 174", checked)
	}
	if want := map[string]int{audit.InvokeAllowed: 15, audit.InvokeDenied: 6, audit.PolicyUpdated: 3}; !maps.Equal(older, want) {
		t.Errorf("events of an older shape: got %v, want %v", older, want)
	}
}
