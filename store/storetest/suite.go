// Package storetest is the one conformance suite every store.Store
// implementation must pass, so that the embedded and the production
// databases behave alike. An implementation's test calls Run with a function
// that opens a fresh, empty store:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store {
//			st, err := sqlite.Open(t.Context(), sqlite.Config{Path: filepath.Join(t.TempDir(), "db")})
//			if err != nil { t.Fatal(err) }
//			t.Cleanup(func() { st.Close() })
//			return st
//		})
//	}
//
// The store must have its analytics outbox on (store.AnalyticsOutbox);
// CheckOutboxOff checks one with it off. The store must also implement
// Tamperer, through which the suite edits rows behind the store's back to
// prove that the audit chain catches it.
package storetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// Tamperer runs raw SQL on the store's database, bypassing its rules. The
// suite passes statements with literal values only (no parameters), written
// in SQL that SQLite and PostgreSQL both accept, against the column names the
// implementations share.
type Tamperer interface {
	UnsafeExec(ctx context.Context, query string, args ...any) error
}

// Run runs the suite. open must return a new, empty store for each call; the
// suite calls it once per subtest and never closes the store itself.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, st store.Store)
	}{
		{"Workspaces", testWorkspaces},
		{"APIKeys", testAPIKeys},
		{"Policy", testPolicy},
		{"Grant", testGrant},
		{"ReserveCommitRelease", testReserveCommitRelease},
		{"ReserveShortBalance", testReserveShortBalance},
		{"ConcurrentReservationsExact", testConcurrentReservations},
		{"ConcurrentAdmissionsNeverOverdraw", testConcurrentAdmissions},
		{"ConcurrentStepsOneWins", testConcurrentSteps},
		{"IdempotencyKey", testIdempotency},
		{"ConcurrentIdempotentRetries", testConcurrentIdempotency},
		{"ConcurrentMixedWorkload", testConcurrentMixed},
		{"ExecutionLifecycle", testExecutionLifecycle},
		{"LaunchFailedIsNotCharged", testLaunchFailed},
		{"CompareAndSet", testCompareAndSet},
		{"AdmissionValidation", testAdmissionValidation},
		{"StepValidation", testStepValidation},
		{"ListExecutionsAndToolCalls", testListings},
		{"InvalidTextLookups", testInvalidTextLookups},
		{"LiveExecutions", testLiveExecutions},
		{"OutboxEveryEnding", testOutboxEveryEnding},
		{"OutboxSameTransaction", testOutboxSameTransaction},
		{"OutboxBatches", testOutboxBatches},
		{"OutboxTrim", testOutboxTrim},
		{"ApprovalApprove", testApprovalApprove},
		{"ApprovalDeny", testApprovalDeny},
		{"ApprovalDecider", testApprovalDecider},
		{"ApprovalExpiry", testApprovalExpiry},
		{"ListApprovals", testListApprovals},
		{"CancelPending", testCancelPending},
		{"CancelQueued", testCancelQueued},
		{"AuditAppendAndList", testAuditAppend},
		{"AuditUnitOfWork", testAuditUnitOfWork},
		{"AuditBroadcast", testAuditBroadcast},
		{"AdminChangesAuditedWithThem", testAdminAudit},
		{"AuditConcurrentAppendsDoNotFork", testAuditConcurrent},
		{"AuditTamperUpdate", testTamperUpdate},
		{"AuditTamperUpdateRehashed", testTamperUpdateRehashed},
		{"AuditTamperDeleteMiddle", testTamperDeleteMiddle},
		{"AuditTamperDeleteTail", testTamperDeleteTail},
		{"AuditTamperTruncateWithHead", testTamperTruncateWithHead},
		{"AuditTamperInsert", testTamperInsert},
		{"AuditTamperAppendPastHead", testTamperAppendPastHead},
		{"AuditVerifyFromWitness", testVerifyChainFrom},
		{"SessionLifecycle", testSessionLifecycle},
		{"SessionScoping", testSessionScoping},
		{"SessionQuota", testSessionQuota},
		{"SessionIdempotency", testSessionIdempotency},
		{"SessionApprovalCover", testSessionApprovalCover},
		{"SessionValidation", testSessionValidation},
		{"SessionPause", testSessionPause},
		{"Snapshots", testSnapshots},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, open(t))
		})
	}
}

// fixture is a workspace with one key of each role.
type fixture struct {
	ws                   model.Workspace
	agent, approver, adm model.APIKey
}

func newFixture(t *testing.T, st store.Store, name string) fixture {
	t.Helper()
	ctx := t.Context()
	ws, err := st.CreateWorkspace(ctx, name, nil)
	if err != nil {
		t.Fatalf("CreateWorkspace(%q): %v", name, err)
	}
	f := fixture{ws: ws}
	for _, k := range []struct {
		role model.Role
		dst  *model.APIKey
	}{{model.RoleAgent, &f.agent}, {model.RoleApprover, &f.approver}, {model.RoleAdmin, &f.adm}} {
		key, err := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: k.role,
			Hash: model.HashKey(name + "/" + string(k.role)), Name: string(k.role)})
		if err != nil {
			t.Fatalf("CreateAPIKey(%s): %v", k.role, err)
		}
		*k.dst = key
	}
	return f
}

// newExec returns a valid NewExecution for the fixture's agent.
func (f fixture) newExec(code string) store.NewExecution {
	req, _ := json.Marshal(map[string]string{"runtime": "python", "code": code})
	return store.NewExecution{
		WorkspaceID: f.ws.ID, KeyID: f.agent.ID, Runtime: "python", Tool: "code.execute",
		Request: req, InputSHA256: inputHash("python", code),
	}
}

// admit admits code for the fixture's agent, queued, reserving credits.
func (f fixture) admit(t *testing.T, st store.Store, code string, credits int64) store.Admission {
	t.Helper()
	return mustAdmit(t, st, f.newExec(code), admission(credits))
}

func inputHash(runtime, code string) string {
	sum := sha256.Sum256([]byte(runtime + "\x00" + code))
	return hex.EncodeToString(sum[:])
}

func mustGrant(t *testing.T, st store.Store, ws string, n int64) {
	t.Helper()
	if _, err := st.GrantCredits(t.Context(), ws, n, "test grant", nil); err != nil {
		t.Fatalf("GrantCredits(%d): %v", n, err)
	}
}

func wantCredits(t *testing.T, st store.Store, ws string, avail, reserved int64) {
	t.Helper()
	c, err := st.GetCredits(t.Context(), ws)
	if err != nil {
		t.Fatalf("GetCredits: %v", err)
	}
	if c.Available != avail || c.Reserved != reserved {
		t.Fatalf("credits: got available %d reserved %d, want %d and %d", c.Available, c.Reserved, avail, reserved)
	}
	CheckLedger(t, st, ws)
}

// CheckLedger fails t unless the workspace's ledger adds up with its
// balance: sum(grant) - sum(commit) == available + reserved, and reserved ==
// sum(reserve) - sum(commit) - sum(release). Every amount is positive.
func CheckLedger(t *testing.T, st store.Store, ws string) {
	t.Helper()
	var sums = map[model.LedgerKind]int64{}
	cur := ""
	for {
		p, err := st.ListLedger(t.Context(), ws, store.PageRequest{Limit: store.MaxPageLimit, Cursor: cur})
		if err != nil {
			t.Fatalf("ListLedger: %v", err)
		}
		for _, e := range p.Items {
			if e.Amount <= 0 {
				t.Fatalf("ledger entry %s has amount %d", e.ID, e.Amount)
			}
			sums[e.Kind] += e.Amount
		}
		if cur = p.Next; cur == "" {
			break
		}
	}
	c, err := st.GetCredits(t.Context(), ws)
	if err != nil {
		t.Fatalf("GetCredits: %v", err)
	}
	if got, want := c.Available+c.Reserved, sums[model.LedgerGrant]-sums[model.LedgerCommit]; got != want {
		t.Fatalf("available+reserved = %d, want grants-commits = %d (ledger %v)", got, want, sums)
	}
	if got, want := c.Reserved, sums[model.LedgerReserve]-sums[model.LedgerCommit]-sums[model.LedgerRelease]; got != want {
		t.Fatalf("reserved = %d, want reserves-commits-releases = %d (ledger %v)", got, want, sums)
	}
}

// wantClass fails unless err wraps class.
func wantClass(t *testing.T, what string, err, class error) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Fatalf("%s: got error %v, want one wrapping %q", what, err, class)
	}
}

func tamperer(t *testing.T, st store.Store) Tamperer {
	t.Helper()
	tp, ok := st.(Tamperer)
	if !ok {
		t.Fatalf("%T does not implement storetest.Tamperer; every store under test must", st)
	}
	return tp
}

func tamper(t *testing.T, st store.Store, query string) {
	t.Helper()
	if err := tamperer(t, st).UnsafeExec(t.Context(), query); err != nil {
		t.Fatalf("tampering with %q: %v", query, err)
	}
}

// lit quotes a string as an SQL literal.
func lit(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// allPages collects every item of a paged list, checking that no item
// repeats across pages.
func allPages[T any](t *testing.T, limit int, id func(T) string, page func(store.PageRequest) (store.Page[T], error)) []T {
	t.Helper()
	var (
		out  []T
		seen = map[string]bool{}
		cur  string
	)
	for i := 0; ; i++ {
		if i > 1000 {
			t.Fatal("paging does not end")
		}
		p, err := page(store.PageRequest{Limit: limit, Cursor: cur})
		if err != nil {
			t.Fatalf("listing page %d: %v", i, err)
		}
		if len(p.Items) > limit {
			t.Fatalf("page %d has %d items, limit %d", i, len(p.Items), limit)
		}
		for _, it := range p.Items {
			if seen[id(it)] {
				t.Fatalf("item %s appears on two pages", id(it))
			}
			seen[id(it)] = true
			out = append(out, it)
		}
		if cur = p.Next; cur == "" {
			return out
		}
	}
}

func must[T any](t *testing.T, what string) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return v
	}
}

func ptr[T any](v T) *T { return &v }

func ids[T any](items []T, id func(T) string) string {
	s := make([]string, len(items))
	for i, it := range items {
		s[i] = id(it)
	}
	return fmt.Sprint(s)
}

// Bench measures the store's share of one invocation: admission with a
// reservation and an audit event, start, and end with its event, the three
// transactions the capability layer applies per call. parallel runs it
// under b.RunParallel, to show contention on the workspace's account and
// chain.
func Bench(b *testing.B, st store.Store, parallel bool) {
	ctx := b.Context()
	ws, err := st.CreateWorkspace(ctx, "bench", nil)
	if err != nil {
		b.Fatal(err)
	}
	key, err := st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: model.RoleAgent, Hash: model.HashKey("bench")})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := st.GrantCredits(ctx, ws.ID, 1<<40, "bench", nil); err != nil {
		b.Fatal(err)
	}
	one := func() error {
		adm, err := st.Admit(ctx, store.NewExecution{
			WorkspaceID: ws.ID, KeyID: key.ID, Runtime: "python", Tool: "code.execute",
			Request: []byte(`{"runtime":"python","code":"print(1)"}`), InputSHA256: inputHash("python", "print(1)"),
		}, admission(2, model.NewEvent{Type: "capability.invoke_allowed", Actor: key.ID}))
		if err != nil {
			return err
		}
		ex, err := st.Apply(ctx, adm.Execution.ID, start("runc"))
		if err != nil {
			return err
		}
		end := ending(ex, model.StatusSucceeded, true, model.NewEvent{Type: "execution.finished", Actor: "system"})
		end.Output = model.Output{ExitCode: ptr(0), Stdout: []byte("1\n")}
		_, err = st.Apply(ctx, ex.ID, end)
		return err
	}
	b.ResetTimer()
	if !parallel {
		for b.Loop() {
			if err := one(); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := one(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
