package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// newSession returns a valid NewSession of the fixture's agent.
func (f fixture) newSession(id string) store.NewSession {
	return store.NewSession{
		ID: id, WorkspaceID: f.ws.ID, KeyID: f.agent.ID, Tool: "code.execute", Runtime: "python", Driver: "runc",
		SandboxID: "sb-" + id, Approval: model.ApprovalNone, IdleTimeout: 10 * time.Minute, ExpiresAt: nowPlus(3600),
		WorkspaceBytes: 256 << 20, RequestSHA256: inputHash("session", id),
		Audit: []model.NewEvent{{Type: "session.created", Code: "SES001I", Actor: f.agent.ID}},
	}
}

func mustOpen(t *testing.T, st store.Store, n store.NewSession) model.Session {
	t.Helper()
	ss, replayed, err := st.OpenSession(t.Context(), n)
	if err != nil || replayed {
		t.Fatalf("OpenSession(%s): got replayed %v, err %v; want a new session", n.ID, replayed, err)
	}
	return ss
}

// cellOf returns a NewExecution of a cell of session id.
func (f fixture) cellOf(id, code string) store.NewExecution {
	e := f.newExec(code)
	e.SessionID = id
	return e
}

func testSessionLifecycle(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "sessions")
	mustGrant(t, st, f.ws.ID, 100)
	ss := mustOpen(t, st, f.newSession("ses_a"))
	if ss.State != model.SessionActive || ss.Cells != 0 || ss.LastActiveAt != ss.CreatedAt {
		t.Fatalf("opened: got %+v, want active, no cells, last active at creation", ss)
	}
	var cells []model.Execution
	for i := 1; i <= 3; i++ {
		adm := mustAdmit(t, st, f.cellOf(ss.ID, fmt.Sprint("x = ", i)), admission(2))
		if adm.Execution.SessionID != ss.ID || adm.Execution.Cell != i {
			t.Fatalf("cell %d: got session %q cell %d, want %q and %d", i, adm.Execution.SessionID, adm.Execution.Cell, ss.ID, i)
		}
		// One cell at a time: another admission while it is live is a
		// conflict, and writes nothing.
		if _, err := st.Admit(ctx, f.cellOf(ss.ID, "busy"), admission(2)); !errdefs.IsConflict(err) {
			t.Fatalf("a cell while cell %d is queued: got %v, want ErrConflict", i, err)
		}
		ex := run(t, st, adm.Execution, "runc", model.StatusSucceeded, true)
		if got, err := st.GetExecution(ctx, f.ws.ID, ex.ID); err != nil || got.SessionID != ss.ID || got.Cell != i {
			t.Fatalf("GetExecution(cell %d): got %q/%d, %v", i, got.SessionID, got.Cell, err)
		}
		cells = append(cells, ex)
	}
	wantCredits(t, st, f.ws.ID, 94, 0)
	got, err := st.GetSession(ctx, f.ws.ID, ss.ID)
	if err != nil || got.Cells != 3 || !got.LastActiveAt.Equal(cells[2].FinishedAt) {
		t.Fatalf("after 3 cells: got %+v, %v; want 3 cells, last active at the last end", got, err)
	}
	if n, err := st.CountActiveSessions(ctx, f.ws.ID); err != nil || n != 1 {
		t.Fatalf("CountActiveSessions: got %d, %v; want 1", n, err)
	}
	const detail = "the daemon restarted and driver kubernetes cannot re-attach a sandbox"
	ended, err := st.EndSession(ctx, ss.ID, store.SessionEnd{Reason: model.EndInterrupted, Detail: detail,
		Audit: []model.NewEvent{{Type: "session.ended", Code: "SES002I", Actor: f.agent.ID}}})
	if err != nil || ended.State != model.SessionEnded || ended.EndReason != model.EndInterrupted || ended.EndedAt.IsZero() {
		t.Fatalf("EndSession: got %+v, %v", ended, err)
	}
	if got, err := st.GetSession(ctx, f.ws.ID, ss.ID); err != nil || got.EndDetail != detail || ended.EndDetail != detail {
		t.Fatalf("the ended session's detail: got %q (read back %q, %v), want %q", ended.EndDetail, got.EndDetail, err, detail)
	}
	if _, err := st.EndSession(ctx, ss.ID, store.SessionEnd{Reason: model.EndTTL}); !errdefs.IsConflict(err) {
		t.Fatalf("ending an ended session: got %v, want ErrConflict", err)
	}
	if _, err := st.Admit(ctx, f.cellOf(ss.ID, "late"), admission(2)); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("a cell of an ended session: got %v, want ErrFailedPrecondition", err)
	}
	wantCredits(t, st, f.ws.ID, 94, 0)
	// The events of the session's opening and end are in its workspace's
	// chain.
	page, err := st.ListEvents(ctx, f.ws.ID, store.EventFilter{Types: []string{"session.created", "session.ended"}})
	if err != nil || len(page.Items) != 2 {
		t.Fatalf("session events: got %d, %v; want 2", len(page.Items), err)
	}
	if ok, _, err := st.VerifyChain(ctx, f.ws.ID); !ok || err != nil {
		t.Fatalf("VerifyChain: got %v, %v", ok, err)
	}
}

func testSessionScoping(t *testing.T, st store.Store) {
	ctx := t.Context()
	a, b := newFixture(t, st, "alpha"), newFixture(t, st, "beta")
	ss := mustOpen(t, st, a.newSession("ses_scoped"))
	if _, err := st.GetSession(ctx, b.ws.ID, ss.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("another workspace's GetSession: got %v, want ErrNotFound", err)
	}
	if _, err := st.Admit(ctx, b.cellOf(ss.ID, "x"), admission(0)); !errdefs.IsNotFound(err) {
		t.Fatalf("a cell of another workspace's session: got %v, want ErrNotFound", err)
	}
	if _, err := st.Admit(ctx, a.cellOf("ses_unknown", "x"), admission(0)); !errdefs.IsNotFound(err) {
		t.Fatalf("a cell of an unknown session: got %v, want ErrNotFound", err)
	}
	if p, err := st.ListSessions(ctx, b.ws.ID, store.SessionFilter{}); err != nil || len(p.Items) != 0 {
		t.Fatalf("another workspace's ListSessions: got %d, %v; want none", len(p.Items), err)
	}
	n := b.newSession("ses_wrongkey")
	n.KeyID = a.agent.ID
	if _, _, err := st.OpenSession(ctx, n); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("OpenSession with another workspace's key: got %v, want ErrInvalidArgument", err)
	}
}

func testSessionQuota(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "quota")
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		ok   int
		errs []error
	)
	// Six openings race for three places: exactly three win.
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := f.newSession(fmt.Sprint("ses_q", i))
			n.MaxLive = 3
			_, _, err := st.OpenSession(ctx, n)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				ok++
			} else if !errdefs.IsResourceExhausted(err) {
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	if ok != 3 || len(errs) > 0 {
		t.Fatalf("6 openings with a bound of 3: got %d opened, errors %v; want 3 and only ErrResourceExhausted", ok, errs)
	}
	p, err := st.ListSessions(ctx, f.ws.ID, store.SessionFilter{States: []model.SessionState{model.SessionActive}})
	if err != nil || len(p.Items) != 3 {
		t.Fatalf("active sessions: got %d, %v; want 3", len(p.Items), err)
	}
	if _, err := st.EndSession(ctx, p.Items[0].ID, store.SessionEnd{Reason: model.EndIdle}); err != nil {
		t.Fatal(err)
	}
	n := f.newSession("ses_after")
	n.MaxLive = 3
	mustOpen(t, st, n)
	// Paging and filtering by state.
	all, err := st.ListSessions(ctx, f.ws.ID, store.SessionFilter{PageRequest: store.PageRequest{Limit: 2}})
	if err != nil || len(all.Items) != 2 || all.Next == "" {
		t.Fatalf("first page of 2: got %d, next %q, %v", len(all.Items), all.Next, err)
	}
	rest, err := st.ListSessions(ctx, f.ws.ID, store.SessionFilter{PageRequest: store.PageRequest{Limit: 2, Cursor: all.Next}})
	if err != nil || len(rest.Items) != 2 || rest.Next != "" {
		t.Fatalf("second page: got %d, next %q, %v; want 2 and the end", len(rest.Items), rest.Next, err)
	}
	ended, err := st.ListSessions(ctx, f.ws.ID, store.SessionFilter{States: []model.SessionState{model.SessionEnded}})
	if err != nil || len(ended.Items) != 1 || ended.Items[0].EndReason != model.EndIdle {
		t.Fatalf("ended sessions: got %+v, %v", ended.Items, err)
	}
	live, err := st.ListActiveSessions(ctx)
	if err != nil || len(live) != 3 {
		t.Fatalf("ListActiveSessions: got %d, %v; want 3", len(live), err)
	}
}

func testSessionIdempotency(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "idem")
	n := f.newSession("ses_first")
	n.IdempotencyKey = "k1"
	first := mustOpen(t, st, n)
	retry := n
	retry.ID = "ses_second"
	got, replayed, err := st.OpenSession(ctx, retry)
	if err != nil || !replayed || got.ID != first.ID {
		t.Fatalf("a retry: got %s replayed %v, %v; want %s replayed", got.ID, replayed, err, first.ID)
	}
	if r, err := st.ReplaySession(ctx, f.agent.ID, "k1"); err != nil || r.ID != first.ID {
		t.Fatalf("ReplaySession: got %s, %v", r.ID, err)
	}
	// Idempotency keys are the API key's: the admin key of the workspace
	// reusing k1 (and the body) opens a session of its own.
	if _, err := st.ReplaySession(ctx, f.adm.ID, "k1"); !errdefs.IsNotFound(err) {
		t.Fatalf("ReplaySession of another key: got %v, want ErrNotFound", err)
	}
	byAdmin := n
	byAdmin.ID, byAdmin.KeyID = "ses_admin", f.adm.ID
	if got, replayed, err := st.OpenSession(ctx, byAdmin); err != nil || replayed || got.ID != "ses_admin" {
		t.Fatalf("another key's idempotency key: got %s replayed %v, %v; want ses_admin opened", got.ID, replayed, err)
	}
	other := retry
	other.RequestSHA256 = inputHash("session", "other")
	if _, _, err := st.OpenSession(ctx, other); !errdefs.IsConflict(err) {
		t.Fatalf("the key on another request: got %v, want ErrConflict", err)
	}
	if _, err := st.GetSession(ctx, f.ws.ID, "ses_second"); !errdefs.IsNotFound(err) {
		t.Fatalf("a replay wrote a session: %v", err)
	}
	// A cell's retry with its idempotency key is the first cell, also
	// while it runs (it is not "busy" with itself).
	c := f.cellOf(first.ID, "x")
	c.IdempotencyKey = "cell-1"
	adm := mustAdmit(t, st, c, admission(0))
	again, err := st.Admit(ctx, c, admission(0))
	if err != nil || !again.Replayed || again.Execution.ID != adm.Execution.ID {
		t.Fatalf("a cell's retry: got %s replayed %v, %v", again.Execution.ID, again.Replayed, err)
	}
}

func testSessionApprovalCover(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "cover")
	n := f.newSession("ses_cover")
	n.Approval = model.ApprovalPerSession
	ss := mustOpen(t, st, n)
	adm := mustAdmit(t, st, f.cellOf(ss.ID, "x"), waiting(0, `{"c":1}`, nowPlus(600)))
	step := decision(adm.Execution, true, f.approver.ID, "ok")
	step.CoverSession = true
	mustApply(t, st, adm.Execution, step)
	got, err := st.GetSession(ctx, f.ws.ID, ss.ID)
	if err != nil || got.ApprovalID != adm.Execution.ApprovalID || got.ApprovedBy != f.approver.ID {
		t.Fatalf("covered: got approval %q by %q, %v; want %q by %q", got.ApprovalID, got.ApprovedBy, err, adm.Execution.ApprovalID, f.approver.ID)
	}
	// A step that covers a session must approve, and only a cell's.
	one := mustAdmit(t, st, f.newExec("one-shot"), waiting(0, `{"c":2}`, nowPlus(600)))
	bad := decision(one.Execution, true, f.approver.ID, "ok")
	bad.CoverSession = true
	if _, err := st.Apply(ctx, one.Execution.ID, bad); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("covering with a one-shot execution: got %v, want ErrInvalidArgument", err)
	}
	deny := decision(one.Execution, false, f.approver.ID, "no")
	deny.CoverSession = true
	if _, err := st.Apply(ctx, one.Execution.ID, deny); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("covering with a denial: got %v, want ErrInvalidArgument", err)
	}
	// A new session covered from the start by the approval (a fork that
	// inherits its source's, docs/design.md §10) records it and its
	// decider; only an approved approval of its workspace under
	// per_session may cover one.
	fork := f.newSession("ses_cover_fork")
	fork.Approval, fork.ApprovalID = model.ApprovalPerSession, adm.Execution.ApprovalID
	fs := mustOpen(t, st, fork)
	got, err = st.GetSession(ctx, f.ws.ID, fs.ID)
	if err != nil || got.ApprovalID != adm.Execution.ApprovalID || got.ApprovedBy != f.approver.ID || fs.ApprovedBy != f.approver.ID {
		t.Fatalf("a session opened covered: got approval %q by %q (opened: by %q), %v; want %q by %q",
			got.ApprovalID, got.ApprovedBy, fs.ApprovedBy, err, adm.Execution.ApprovalID, f.approver.ID)
	}
	other := newFixture(t, st, "cover-other")
	for _, tc := range []struct {
		name string
		n    store.NewSession
	}{
		{"pending approval", func() store.NewSession {
			n := f.newSession("ses_cover_pending")
			n.Approval, n.ApprovalID = model.ApprovalPerSession, one.Execution.ApprovalID
			return n
		}()},
		{"unknown approval", func() store.NewSession {
			n := f.newSession("ses_cover_unknown")
			n.Approval, n.ApprovalID = model.ApprovalPerSession, "apr_none"
			return n
		}()},
		{"not per_session", func() store.NewSession {
			n := f.newSession("ses_cover_required")
			n.Approval, n.ApprovalID = model.ApprovalRequired, adm.Execution.ApprovalID
			return n
		}()},
		{"another workspace's approval", func() store.NewSession {
			n := other.newSession("ses_cover_other")
			n.Approval, n.ApprovalID = model.ApprovalPerSession, adm.Execution.ApprovalID
			return n
		}()},
	} {
		if _, _, err := st.OpenSession(ctx, tc.n); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("a session covered by %s: got %v, want ErrInvalidArgument", tc.name, err)
		}
	}
}

func testSessionValidation(t *testing.T, st store.Store) {
	f := newFixture(t, st, "valid")
	for _, tc := range []struct {
		name string
		edit func(*store.NewSession)
	}{
		{"no id", func(n *store.NewSession) { n.ID = "" }},
		{"no sandbox", func(n *store.NewSession) { n.SandboxID = "" }},
		{"no idle timeout", func(n *store.NewSession) { n.IdleTimeout = 0 }},
		{"no expiry", func(n *store.NewSession) { n.ExpiresAt = time.Time{} }},
		{"unknown approval", func(n *store.NewSession) { n.Approval = "sometimes" }},
		{"bad request hash", func(n *store.NewSession) { n.RequestSHA256 = "x" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := f.newSession("ses_v")
			tc.edit(&n)
			if _, _, err := st.OpenSession(t.Context(), n); !errdefs.IsInvalidArgument(err) {
				t.Fatalf("got %v, want ErrInvalidArgument", err)
			}
		})
	}
	if _, err := st.EndSession(t.Context(), "ses_none", store.SessionEnd{Reason: model.EndClosed}); !errdefs.IsNotFound(err) {
		t.Fatalf("ending an unknown session: got %v, want ErrNotFound", err)
	}
	if _, err := st.EndSession(t.Context(), "ses_none", store.SessionEnd{Reason: "bored"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("an unknown reason: got %v, want ErrInvalidArgument", err)
	}
	p := model.DefaultPolicy()
	p.Approval, p.MaxSessions = model.ApprovalPerSession, 7
	if _, err := st.SetPolicy(t.Context(), f.ws.ID, p, nil); err != nil {
		t.Fatalf("SetPolicy(per_session, 7 sessions): %v", err)
	}
	got, err := st.GetPolicy(t.Context(), f.ws.ID)
	if err != nil || got.Approval != model.ApprovalPerSession || got.MaxSessions != 7 {
		t.Fatalf("GetPolicy: got %s %d, %v; want per_session 7", got.Approval, got.MaxSessions, err)
	}
	p.MaxSessions = -1
	if _, err := st.SetPolicy(t.Context(), f.ws.ID, p, nil); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("SetPolicy(-1 sessions): got %v, want ErrInvalidArgument", err)
	}
}

// Upgrade checks a database of the schema before the last migration
// against the current one: old opens a store migrated up to that schema
// only, into which the suite writes a workspace, its key, policy and
// credits with plain SQL (today's code writes today's columns, so it cannot
// write an older schema); at is the SQL literal of a time in the backend's
// columns. current opens the same database with every migration. What the
// old schema held survives (the policy through SQLite's rebuild of its
// table too), the newest records work on it (the per_session approval
// mode, sessions and their cells), and foreign keys are still enforced.
// The migrations before are proved on real databases by TestFixture.
func Upgrade(t *testing.T, at string, old, current func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := old(t)
	tp := tamperer(t, st)
	for _, q := range []string{
		`INSERT INTO workspaces (id, name, created_at) VALUES ('ws_up', 'upgrade', ` + at + `)`,
		`INSERT INTO workspace_policies (workspace_id, code_execution, approval, network_allowed, max_timeout_ms, runtimes,
			tool_changes, updated_at) VALUES ('ws_up', true, 'none', false, 30000, '["python"]', 'flag', ` + at + `)`,
		`INSERT INTO api_keys (id, workspace_id, role, name, hash, created_at) VALUES ('key_up', 'ws_up', 'agent', 'agent', 'h_up', ` + at + `)`,
		`INSERT INTO credit_accounts (workspace_id, available, reserved) VALUES ('ws_up', 0, 0)`,
	} {
		if err := tp.UnsafeExec(ctx, q); err != nil {
			t.Fatalf("writing the old schema: %v\n%s", err, q)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st = current(t)
	p := must[model.Policy](t, "GetPolicy")(st.GetPolicy(ctx, "ws_up"))
	if p.Approval != model.ApprovalNone || !p.CodeExecution || p.MaxTimeout != 30*time.Second || len(p.Runtimes) != 1 || p.MaxSessions != 0 ||
		p.ForkApproval != model.ForkApprovalAnew {
		t.Fatalf("the policy after the upgrade: got %+v", p)
	}
	p.Approval, p.MaxSessions = model.ApprovalPerSession, 2
	must[model.Policy](t, "SetPolicy")(st.SetPolicy(ctx, "ws_up", p, nil))
	f := fixture{ws: model.Workspace{ID: "ws_up"}, agent: model.APIKey{ID: "key_up"}}
	mustGrant(t, st, "ws_up", 10)
	ss := mustOpen(t, st, f.newSession("ses_upgraded"))
	adm := mustAdmit(t, st, f.cellOf(ss.ID, "x"), admission(2))
	if adm.Execution.Cell != 1 {
		t.Fatalf("a cell after the upgrade: got cell %d, want 1", adm.Execution.Cell)
	}
	run(t, st, adm.Execution, "runc", model.StatusSucceeded, true)
	wantCredits(t, st, "ws_up", 8, 0)
	err := tamperer(t, st).UnsafeExec(ctx, `INSERT INTO executions (id, workspace_id, key_id, status, runtime, tool, request,
		input_sha256, driver, created_at, session_id, cell)
		SELECT 'ex_orphan', workspace_id, key_id, 'queued', runtime, tool, request, input_sha256, '', created_at, 'ses_missing', 9
		FROM executions LIMIT 1`)
	if err == nil {
		t.Fatal("a cell of a missing session was accepted: foreign keys are off after the upgrade")
	}
}

func testSessionPause(t *testing.T, st store.Store) {
	ctx := t.Context()
	f := newFixture(t, st, "pause")
	mustGrant(t, st, f.ws.ID, 100)
	ss := mustOpen(t, st, f.newSession("ses_p"))
	ev := func(typ string) []model.NewEvent {
		return []model.NewEvent{{Type: typ, Code: "SES00XI", Actor: "system"}}
	}

	// A cell that has not ended keeps the session from pausing.
	adm := mustAdmit(t, st, f.cellOf(ss.ID, "x = 1"), admission(2))
	if _, err := st.PauseSession(ctx, ss.ID, store.SessionPause{CheckpointBytes: 1, Audit: ev("session.paused")}); !errdefs.IsConflict(err) {
		t.Fatalf("pausing with a queued cell: got %v, want ErrConflict", err)
	}
	run(t, st, adm.Execution, "gvisor", model.StatusSucceeded, true)

	at := time.Now().Add(time.Second).UTC().Truncate(time.Millisecond)
	paused, err := st.PauseSession(ctx, ss.ID, store.SessionPause{CheckpointBytes: 5 << 20, At: at, Audit: ev("session.paused")})
	if err != nil || paused.State != model.SessionPaused || paused.CheckpointBytes != 5<<20 || !paused.PausedAt.Equal(at) {
		t.Fatalf("PauseSession: got %+v, %v; want paused at %s with 5 MiB", paused, err, at)
	}
	if got, err := st.GetSession(ctx, f.ws.ID, ss.ID); err != nil || got.State != model.SessionPaused || got.CheckpointBytes != 5<<20 {
		t.Fatalf("GetSession of the paused session: got %+v, %v", got, err)
	}
	if _, err := st.PauseSession(ctx, ss.ID, store.SessionPause{Audit: ev("session.paused")}); !errdefs.IsConflict(err) {
		t.Fatalf("pausing a paused session: got %v, want ErrConflict", err)
	}
	if _, err := st.Admit(ctx, f.cellOf(ss.ID, "paused"), admission(2)); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("a cell of a paused session: got %v, want ErrFailedPrecondition", err)
	}
	// A paused session holds its place: it is live, counted against the
	// workspace's bound, not active.
	if n, err := st.CountActiveSessions(ctx, f.ws.ID); err != nil || n != 1 {
		t.Fatalf("CountActiveSessions with a paused session: got %d, %v; want 1", n, err)
	}
	over := f.newSession("ses_over")
	over.MaxLive = 1
	if _, _, err := st.OpenSession(ctx, over); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("opening past the bound with a paused session: got %v, want ErrResourceExhausted", err)
	}
	if a, err := st.ListActiveSessions(ctx); err != nil || containsSession(a, ss.ID) {
		t.Fatalf("ListActiveSessions: got %d, %v; want no paused session", len(a), err)
	}
	if p, err := st.ListPausedSessions(ctx); err != nil || !containsSession(p, ss.ID) {
		t.Fatalf("ListPausedSessions: got %d, %v; want the paused session", len(p), err)
	}
	if b, n, err := st.CheckpointBytes(ctx, f.ws.ID); err != nil || b != 5<<20 || n != 1 {
		t.Fatalf("CheckpointBytes: got %d, %d, %v; want 5 MiB in 1", b, n, err)
	}

	if _, err := st.ResumeSession(ctx, ss.ID, store.SessionResume{}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("resuming without a sandbox: got %v, want ErrInvalidArgument", err)
	}
	later := at.Add(time.Minute)
	resumed, err := st.ResumeSession(ctx, ss.ID, store.SessionResume{SandboxID: "sb-restored", At: later, Audit: ev("session.resumed")})
	if err != nil || resumed.State != model.SessionActive || resumed.SandboxID != "sb-restored" || resumed.CheckpointBytes != 0 ||
		!resumed.PausedAt.IsZero() || !resumed.LastActiveAt.Equal(later) {
		t.Fatalf("ResumeSession: got %+v, %v; want active in sb-restored, no checkpoint, last active at %s", resumed, err, later)
	}
	if _, err := st.ResumeSession(ctx, ss.ID, store.SessionResume{SandboxID: "sb-again"}); !errdefs.IsConflict(err) {
		t.Fatalf("resuming an active session: got %v, want ErrConflict", err)
	}
	if b, n, err := st.CheckpointBytes(ctx, f.ws.ID); err != nil || b != 0 || n != 0 {
		t.Fatalf("CheckpointBytes after the resume: got %d, %d, %v; want none", b, n, err)
	}
	mustAdmit(t, st, f.cellOf(ss.ID, "x = 2"), admission(2))

	// A paused session ends; its checkpoint is no longer counted.
	other := mustOpen(t, st, f.newSession("ses_p2"))
	if _, err := st.PauseSession(ctx, other.ID, store.SessionPause{CheckpointBytes: 7, Audit: ev("session.paused")}); err != nil {
		t.Fatal(err)
	}
	ended, err := st.EndSession(ctx, other.ID, store.SessionEnd{Reason: model.EndTTL, Audit: ev("session.ended")})
	if err != nil || ended.State != model.SessionEnded || ended.EndReason != model.EndTTL || ended.CheckpointBytes != 0 {
		t.Fatalf("ending a paused session: got %+v, %v", ended, err)
	}
	if _, err := st.ResumeSession(ctx, other.ID, store.SessionResume{SandboxID: "sb-late"}); !errdefs.IsConflict(err) {
		t.Fatalf("resuming an ended session: got %v, want ErrConflict", err)
	}
	if _, err := st.PauseSession(ctx, "ses_unknown", store.SessionPause{}); !errdefs.IsNotFound(err) {
		t.Fatalf("pausing an unknown session: got %v, want ErrNotFound", err)
	}
	if b, _, err := st.CheckpointBytes(ctx, f.ws.ID); err != nil || b != 0 {
		t.Fatalf("CheckpointBytes after the end: got %d, %v; want 0", b, err)
	}
	if ok, _, err := st.VerifyChain(ctx, f.ws.ID); !ok || err != nil {
		t.Fatalf("VerifyChain: got %v, %v", ok, err)
	}
}

func containsSession(ss []model.Session, id string) bool {
	for _, s := range ss {
		if s.ID == id {
			return true
		}
	}
	return false
}
