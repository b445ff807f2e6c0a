package api_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/supervisor"
	"github.com/stockade-sh/stockade/wire"
)

// The sessions of the harness's daemons run the guest's test kernel
// (engine.WithTestKernel): `set K V`, `get K` (its value, text/plain),
// `print T`, `display M T`, `sleep S`, `fail T`; a `stockade serve` runs
// the runtimes' own (package kernel), as sessions_kernels_test.go does.

func (e *env) openSession(key string, req capability.CreateSessionRequest) wire.Session {
	e.t.Helper()
	var v wire.Session
	e.do("POST", "/v1/sessions", key, req).want(e.t, http.StatusCreated).decode(e.t, &v)
	e.t.Cleanup(func() { do(e.t, e.url, "DELETE", "/v1/sessions/"+v.ID, e.admin, nil) })
	return v
}

func (e *env) cell(key, id, code string, hdr ...string) wire.Cell {
	e.t.Helper()
	var v wire.Cell
	e.do("POST", "/v1/sessions/"+id+"/exec", key, capability.CellRequest{Code: code}, hdr...).want(e.t, http.StatusOK).decode(e.t, &v)
	return v
}

// eventData decodes the data of the workspace's events of typ.
func eventData[T any](t *testing.T, e *env, typ string) []T {
	t.Helper()
	var out []T
	for _, ev := range e.events(typ, "") {
		var v T
		if err := json.Unmarshal(ev.Data, &v); err != nil {
			t.Fatalf("event %s data %s: %v", typ, ev.Data, err)
		}
		out = append(out, v)
	}
	return out
}

type allowedData struct {
	SessionID        string `json:"session_id"`
	Cell             int    `json:"cell"`
	CoveredBy        string `json:"covered_by"`
	ApprovalRequired bool   `json:"approval_required"`
}

// TestSessionCells opens a session through the API on SQLite and
// PostgreSQL and runs cells in it: the kernel keeps its state, each cell
// is an execution charged as an invocation (2 credits, a tool_calls row,
// its decision and end in the audit chain), a retried cell (the same
// Idempotency-Key) is the first one, a cell streams its events, and a
// closed session answers 410 saying when and why.
func TestSessionCells(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		e := newEnv(t, b, envConfig{sessions: true, policy: noApproval, credits: 10})
		start := time.Now()
		ss := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "shell"})
		if !strings.HasPrefix(ss.ID, "ses_") || ss.Runtime != "shell" || ss.Tool != "code.execute" || ss.Tier != "container" || ss.Driver != "runc" ||
			ss.State != "active" || ss.Cells != 0 || ss.Approval != "none" || ss.Network != "deny" {
			t.Fatalf("created: got %+v", ss)
		}
		if d := ss.ExpiresAt.Sub(start); d < 59*time.Minute || d > 61*time.Minute {
			t.Errorf("expires_at: got %v after the creation, want 1h", d)
		}
		if d := ss.IdleExpiresAt.Sub(start); d < 9*time.Minute || d > 11*time.Minute {
			t.Errorf("idle_expires_at: got %v after the creation, want 10m", d)
		}
		c1 := e.cell(e.agent, ss.ID, "set x 41\nprint one")
		if c1.Status != "succeeded" || c1.Stdout != "one\n" || c1.Cell != 1 || c1.Credits != 2 || c1.KernelRestarted || c1.SessionID != ss.ID {
			t.Fatalf("cell 1: got %+v", c1)
		}
		c2 := e.cell(e.agent, ss.ID, "display image/png PNG\nget x", "Idempotency-Key", "cell-2")
		if c2.Status != "succeeded" || c2.Cell != 2 || len(c2.Outputs) != 2 || c2.Outputs[0].MimeType != "image/png" || c2.Outputs[0].Data != "UE5H" ||
			c2.Outputs[1].MimeType != "text/plain" || c2.Outputs[1].Data != "41" {
			t.Fatalf("cell 2: got %+v, want the PNG display (base64) and the value 41", c2)
		}
		again := e.cell(e.agent, ss.ID, "display image/png PNG\nget x", "Idempotency-Key", "cell-2")
		if again.ExecutionID != c2.ExecutionID || !again.Replayed {
			t.Fatalf("a retried cell: got %+v, want execution %s replayed", again, c2.ExecutionID)
		}
		c3 := e.cell(e.agent, ss.ID, "fail boom")
		if c3.Status != "failed" || c3.Error == nil || c3.Error.Name != "TestError" || c3.Error.Value != "boom" || c3.Credits != 2 {
			t.Fatalf("a raising cell: got %+v, want failed with its error, charged", c3)
		}
		st := postStreamTo(t, e.url, "/v1/sessions/"+ss.ID+"/exec", e.agent, capability.CellRequest{Code: "print streamed\ndisplay text/html <b>x</b>"})
		var names []string
		var last string
		for _, ev := range st.rest(60 * time.Second) {
			names = append(names, ev.name)
			last = ev.data
		}
		// The kernel's stdout and its displays travel apart: their order
		// between the start and the result is not fixed.
		if got := strings.Join(names, ","); got != "started,stdout,output,result" && got != "started,output,stdout,result" {
			t.Fatalf("a streamed cell's events: got %v, want started, stdout and output, result", names)
		}
		var c4 wire.Cell
		if err := json.Unmarshal([]byte(last), &c4); err != nil || c4.Cell != 4 || c4.Stdout != "streamed\n" || len(c4.Outputs) != 1 || c4.Outputs[0].Data != "<b>x</b>" {
			t.Fatalf("the stream's result: got %s (%v)", last, err)
		}
		e.wantCredits(2, 0)
		if calls := e.toolCalls(""); len(calls) != 4 {
			t.Fatalf("tool_calls rows: got %d, want one per cell (4)", len(calls))
		}
		ex := e.wait(c2.ExecutionID, 0)
		var doc capability.CellResultDoc
		if err := json.Unmarshal(ex.Result.JSON(), &doc); err != nil || ex.Status != "succeeded" || doc.SessionID != ss.ID || doc.Cell != 2 || doc.ExecutionID != ex.ID {
			t.Fatalf("a cell as an execution: got %+v, result %s", ex, ex.Result)
		}
		allowed := eventData[allowedData](t, e, "capability.invoke_allowed")
		if len(allowed) != 4 {
			t.Fatalf("decision events: got %d, want one per cell", len(allowed))
		}
		for _, a := range allowed {
			if a.SessionID != ss.ID || a.Cell < 1 || a.CoveredBy != "" || a.ApprovalRequired {
				t.Errorf("decision event: got %+v, want the session's cell without approval", a)
			}
		}
		if n := len(e.events("execution.finished", "")); n != 4 {
			t.Errorf("execution.finished events: got %d, want 4", n)
		}
		var got wire.Session
		e.do("GET", "/v1/sessions/"+ss.ID, e.agent, nil).want(t, http.StatusOK).decode(t, &got)
		if got.Cells != 4 || !got.IdleExpiresAt.After(ss.IdleExpiresAt) {
			t.Fatalf("after 4 cells: got %+v, want 4 cells and a later idle expiry", got)
		}
		var ended wire.Session
		e.do("DELETE", "/v1/sessions/"+ss.ID, e.agent, nil).want(t, http.StatusOK).decode(t, &ended)
		if ended.State != "ended" || ended.EndReason != "closed" || ended.EndedAt == nil {
			t.Fatalf("closed: got %+v", ended)
		}
		type endedData struct {
			EndReason string `json:"end_reason"`
			Cells     int    `json:"cells"`
		}
		if evs := eventData[endedData](t, e, "session.ended"); len(evs) != 1 || evs[0].EndReason != "closed" || evs[0].Cells != 4 {
			t.Fatalf("session.ended events: got %+v", evs)
		}
		if n := len(e.events("session.created", "")); n != 1 {
			t.Errorf("session.created events: got %d, want 1", n)
		}
		r := e.do("POST", "/v1/sessions/"+ss.ID+"/exec", e.agent, capability.CellRequest{Code: "get x"})
		var body struct{ Error wire.ErrorDetail }
		r.want(t, http.StatusGone).decode(t, &body)
		if body.Error.Code != "session_expired" || body.Error.EndReason != "closed" || body.Error.EndedAt == nil {
			t.Fatalf("a cell of a closed session: got %s, want session_expired with when and why", r.body)
		}
		e.wantCredits(2, 0)
		list := list[wire.Session](t, e.url, e.agent, "/v1/sessions", "state=ended")
		if len(list) != 1 || list[0].ID != ss.ID {
			t.Fatalf("GET /v1/sessions?state=ended: got %+v", list)
		}
		if bundles := dirEntries(t, filepath.Join(e.runcState, "bundles")); len(bundles) != 0 {
			t.Errorf("sandboxes left after the session ended: %v", bundles)
		}
		for series, want := range map[string]float64{
			"stockade_sessions_live": 0, `stockade_session_cells_total{status="succeeded"}`: 3,
			`stockade_session_cells_total{status="failed"}`: 1, `stockade_sessions_ended_total{reason="closed"}`: 1,
		} {
			if got := metricValue(t, e.url, series); got != want {
				t.Errorf("%s: got %v, want %v", series, got, want)
			}
		}
	})
}

// TestSessionApproval runs cells under the approval modes required and
// per_session, on SQLite and PostgreSQL: required asks for every cell;
// per_session asks for the first, whose approval covers the later ones
// (their decision event names it), and the session records it.
func TestSessionApproval(t *testing.T) {
	forEachStore(t, func(t *testing.T, b backend) {
		for _, mode := range []model.ApprovalMode{model.ApprovalRequired, model.ApprovalPerSession} {
			t.Run(string(mode), func(t *testing.T) {
				e := newEnv(t, b, envConfig{sessions: true, credits: 20, policy: func(p *model.Policy) { p.Approval = mode }})
				ss := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "shell"})
				approve := func(code string) wire.Execution {
					t.Helper()
					v := e.do("POST", "/v1/sessions/"+ss.ID+"/exec", e.agent, capability.CellRequest{Code: code}).want(t, http.StatusAccepted).execution(t)
					if v.Status != "awaiting_approval" || v.ApprovalID == "" {
						t.Fatalf("a cell that needs approval: got %+v", v)
					}
					var card capability.ApprovalCard
					if err := json.Unmarshal(cardJSON(v.Approval), &card); err != nil || card.SessionID != ss.ID || card.CoversSession != (mode == model.ApprovalPerSession) {
						t.Fatalf("its card: got %+v, want the session, covering it: %v", v.Approval, mode == model.ApprovalPerSession)
					}
					e.do("POST", "/v1/approvals/"+v.ApprovalID+"/approve", e.approver, nil).want(t, http.StatusOK)
					if done := e.wait(v.ID, 30*time.Second); done.Status != "succeeded" {
						t.Fatalf("the approved cell: got %+v", done)
					}
					return v
				}
				first := approve("set x 1")
				var second string
				if mode == model.ApprovalRequired {
					second = approve("get x").ApprovalID
				} else {
					c := e.cell(e.agent, ss.ID, "get x")
					if c.Status != "succeeded" || c.Outputs[0].Data != "1" {
						t.Fatalf("a covered cell: got %+v", c)
					}
				}
				allowed := eventData[allowedData](t, e, "capability.invoke_allowed")
				if len(allowed) != 2 {
					t.Fatalf("decision events: got %d, want 2", len(allowed))
				}
				// Newest first.
				latest, firstEv := allowed[0], allowed[1]
				if !firstEv.ApprovalRequired || firstEv.CoveredBy != "" {
					t.Errorf("the first cell's decision: got %+v, want approval required", firstEv)
				}
				switch mode {
				case model.ApprovalRequired:
					if !latest.ApprovalRequired || latest.CoveredBy != "" || second == first.ApprovalID {
						t.Errorf("the second cell's decision under required: got %+v, want its own approval", latest)
					}
				case model.ApprovalPerSession:
					if latest.ApprovalRequired || latest.CoveredBy != first.ApprovalID {
						t.Errorf("the second cell's decision under per_session: got %+v, want covered by %s", latest, first.ApprovalID)
					}
					var got wire.Session
					e.do("GET", "/v1/sessions/"+ss.ID, e.agent, nil).want(t, http.StatusOK).decode(t, &got)
					if got.ApprovalID != first.ApprovalID {
						t.Errorf("the session's covering approval: got %q, want %q", got.ApprovalID, first.ApprovalID)
					}
				}
				wantApprovals := map[model.ApprovalMode]int{model.ApprovalRequired: 2, model.ApprovalPerSession: 1}[mode]
				if got := list[wire.Approval](t, e.url, e.approver, "/v1/approvals", ""); len(got) != wantApprovals {
					t.Errorf("approval rows: got %d, want %d", len(got), wantApprovals)
				}
				if got := len(e.events("approval.approved", "")); got != wantApprovals {
					t.Errorf("approval.approved events: got %d, want %d", got, wantApprovals)
				}
				e.wantCredits(16, 0)
			})
		}
	})
}

// TestSessionEndCancelsPendingCell ends a session whose cell awaits its
// approval: the cell is cancelled with its request, its credits released,
// and approving it afterwards is refused.
func TestSessionEndCancelsPendingCell(t *testing.T) {
	e := newEnv(t, backends[0], envConfig{sessions: true, credits: 20, policy: func(p *model.Policy) { p.Approval = model.ApprovalRequired }})
	ss := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "shell"})
	v := e.do("POST", "/v1/sessions/"+ss.ID+"/exec", e.agent, capability.CellRequest{Code: "set x 1"}).want(t, http.StatusAccepted).execution(t)
	if v.Status != "awaiting_approval" {
		t.Fatalf("a cell that needs approval: got %+v", v)
	}
	e.wantCredits(18, 2)
	e.do("DELETE", "/v1/sessions/"+ss.ID, e.agent, nil).want(t, http.StatusOK)
	if got := e.wait(v.ID, 10*time.Second); got.Status != "cancelled" {
		t.Errorf("the pending cell after its session ended: got %s, want cancelled", got.Status)
	}
	for _, a := range list[wire.Approval](t, e.url, e.approver, "/v1/approvals", "") {
		if a.ID == v.ApprovalID && a.Status != "cancelled" {
			t.Errorf("its approval request: got %s, want cancelled", a.Status)
		}
	}
	e.do("POST", "/v1/approvals/"+v.ApprovalID+"/approve", e.approver, nil).want(t, http.StatusConflict)
	e.wantCredits(20, 0)
}

// TestSessionBadInput tables the refusals of the session endpoints, each
// in the JSON error shape, leaving nothing behind: an unknown session
// 404, another workspace's key 404 on every session path, a busy session
// 409 session_busy, a path outside /workspace 400 invalid_path, a file
// over the cap 413, a workspace over its session quota 429 with
// Retry-After, a policy that forbids code 403, a bad lifetime 400.
func TestSessionBadInput(t *testing.T) {
	e := newEnv(t, backends[0], envConfig{sessions: true, policy: noApproval, credits: 100,
		svc: capability.ServiceOptions{Sessions: capability.SessionOptions{MaxPerWorkspace: 2, MaxFileSize: 1024}}})
	ss := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "shell"})
	// Another workspace's keys see nothing of it.
	other := newWorkspace(t, e, "other", noApproval, 10)
	id := ss.ID
	for _, r := range []struct{ method, path string }{
		{"GET", "/v1/sessions/" + id}, {"DELETE", "/v1/sessions/" + id}, {"POST", "/v1/sessions/" + id + "/exec"},
		{"POST", "/v1/sessions/" + id + "/interrupt"}, {"PUT", "/v1/sessions/" + id + "/files?path=a"},
		{"GET", "/v1/sessions/" + id + "/files?path=a"}, {"GET", "/v1/sessions/" + id + "/files?dir=/workspace"},
		{"DELETE", "/v1/sessions/" + id + "/files?path=a"},
	} {
		var body any
		if r.path == "/v1/sessions/"+id+"/exec" {
			body = capability.CellRequest{Code: "get x"}
		}
		t.Run("another workspace "+r.method+" "+r.path, func(t *testing.T) {
			e.do(r.method, r.path, other, body).wantError(t, http.StatusNotFound, "not_found")
		})
		t.Run("unknown "+r.method+" "+r.path, func(t *testing.T) {
			e.do(r.method, strings.Replace(r.path, id, "ses_unknown", 1), e.agent, body).wantError(t, http.StatusNotFound, "not_found")
		})
	}
	if got := list[wire.Session](t, e.url, other, "/v1/sessions", ""); len(got) != 0 {
		t.Errorf("another workspace's GET /v1/sessions: got %d sessions, want none", len(got))
	}
	// One cell at a time.
	st := postStreamTo(t, e.url, "/v1/sessions/"+id+"/exec", e.agent, capability.CellRequest{Code: "print sleeping\nsleep 30"})
	if ev := st.next(30 * time.Second); ev.name != "started" {
		t.Fatalf("first event: got %s %s, want started", ev.name, ev.data)
	}
	// The kernel prints before it sleeps: an interrupt sent once it did
	// reaches the sleep, not the time before the cell began.
	if ev := st.next(30 * time.Second); ev.name != "stdout" {
		t.Fatalf("second event: got %s %s, want stdout", ev.name, ev.data)
	}
	e.do("POST", "/v1/sessions/"+id+"/exec", e.agent, capability.CellRequest{Code: "get x"}).wantError(t, http.StatusConflict, "session_busy")
	var intr map[string]bool
	e.do("POST", "/v1/sessions/"+id+"/interrupt", e.agent, nil).want(t, http.StatusOK).decode(t, &intr)
	if !intr["interrupted"] {
		t.Fatalf("interrupt: got %v, want interrupted", intr)
	}
	evs := st.rest(30 * time.Second)
	var res wire.Cell
	if len(evs) == 0 || json.Unmarshal([]byte(evs[len(evs)-1].data), &res) != nil || res.Status != "failed" || res.Error == nil || res.Error.Name != "KeyboardInterrupt" {
		t.Fatalf("the interrupted cell: got %+v, want failed by a KeyboardInterrupt", evs)
	}
	e.do("POST", "/v1/sessions/"+id+"/interrupt", e.agent, nil).want(t, http.StatusOK).decode(t, &intr)
	if intr["interrupted"] {
		t.Fatalf("interrupting an idle session: got %v, want interrupted false", intr)
	}
	// Files.
	put := func(path, data string) reply {
		return e.do("PUT", "/v1/sessions/"+id+"/files?path="+url.QueryEscape(path), e.agent, []byte(data))
	}
	var f capability.FileInfo
	put("data/in.csv", "a,b\n1,2\n").want(t, http.StatusCreated).decode(t, &f)
	if f.Path != "/workspace/data/in.csv" || f.Size != 8 || len(f.SHA256) != 64 {
		t.Fatalf("PUT: got %+v", f)
	}
	got := e.do("GET", "/v1/sessions/"+id+"/files?path=/workspace/data/in.csv", e.agent, nil).want(t, http.StatusOK)
	if string(got.body) != "a,b\n1,2\n" || got.header.Get("Content-Type") != "application/octet-stream" || got.header.Get("Content-Length") != "8" {
		t.Fatalf("GET a file: got %q %v", got.body, got.header)
	}
	var listing struct {
		Entries   []wire.FileEntry `json:"entries"`
		Truncated bool             `json:"truncated"`
	}
	e.do("GET", "/v1/sessions/"+id+"/files?dir=data", e.agent, nil).want(t, http.StatusOK).decode(t, &listing)
	if len(listing.Entries) != 1 || listing.Entries[0].Name != "in.csv" || listing.Entries[0].Type != "file" || listing.Entries[0].Size != 8 || listing.Entries[0].Mode != 0o644 {
		t.Fatalf("GET ?dir=: got %+v", listing)
	}
	for _, p := range []string{"../etc/passwd", "/workspace/../etc/passwd", "/etc/passwd", "a\x00b", "/tmp/x"} {
		t.Run("path "+strconv.Quote(p), func(t *testing.T) {
			put(p, "x").wantError(t, http.StatusBadRequest, "invalid_path")
			e.do("GET", "/v1/sessions/"+id+"/files?path="+url.QueryEscape(p), e.agent, nil).wantError(t, http.StatusBadRequest, "invalid_path")
		})
	}
	e.do("GET", "/v1/sessions/"+id+"/files?dir=data", e.agent, nil)
	e.do("GET", "/v1/sessions/"+id+"/files?path=data", e.agent, nil).wantError(t, http.StatusBadRequest, "invalid_argument", "list a directory")
	e.do("GET", "/v1/sessions/"+id+"/files?path=nope", e.agent, nil).wantError(t, http.StatusNotFound, "not_found")
	put("big", strings.Repeat("x", 2048)).wantError(t, http.StatusRequestEntityTooLarge, "too_large")
	e.do("GET", "/v1/sessions/"+id+"/files?path=big", e.agent, nil).wantError(t, http.StatusNotFound, "not_found")
	e.do("DELETE", "/v1/sessions/"+id+"/files?path=data/in.csv", e.agent, nil).want(t, http.StatusNoContent)
	e.do("GET", "/v1/sessions/"+id+"/files?path=data/in.csv", e.agent, nil).wantError(t, http.StatusNotFound, "not_found")
	type transfer struct {
		Direction, Path, SHA256 string
		Size                    int64
	}
	if ts := eventData[transfer](t, e, "session.file_transferred"); len(ts) != 3 || ts[0].Direction != "removed" || ts[1].Direction != "out" ||
		ts[2].Direction != "in" || ts[2].SHA256 != f.SHA256 || ts[1].SHA256 != f.SHA256 || ts[2].Size != 8 {
		t.Fatalf("transfer events: got %+v, want in, out and removed with the file's sha256", ts)
	}
	// Lifetimes and quota.
	e.do("POST", "/v1/sessions", e.agent, capability.CreateSessionRequest{Runtime: "shell", TTLMS: (48 * time.Hour).Milliseconds()}).wantError(t, http.StatusBadRequest, "invalid_argument", "ceiling")
	e.do("POST", "/v1/sessions", e.agent, capability.CreateSessionRequest{Runtime: "cobol"}).wantError(t, http.StatusBadRequest, "invalid_argument")
	e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "shell"})
	r := e.do("POST", "/v1/sessions", e.agent, capability.CreateSessionRequest{Runtime: "shell"})
	r.wantError(t, http.StatusTooManyRequests, "session_quota")
	if after, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || after < 1 || after > 600 {
		t.Errorf("Retry-After: got %q, want seconds until a session is due to end", r.header.Get("Retry-After"))
	}
	if n := len(dirEntries(t, filepath.Join(e.runcState, "bundles"))); n != 2 {
		t.Errorf("sandboxes: got %d, want the 2 live sessions' (nothing left by the refusals)", n)
	}
	// A policy without code execution forbids sessions.
	off := newWorkspace(t, e, "off", func(p *model.Policy) { p.CodeExecution = false }, 10)
	e.do("POST", "/v1/sessions", off, capability.CreateSessionRequest{Runtime: "shell"}).wantError(t, http.StatusForbidden, "permission_denied")
	if n := len(e.events("capability.invoke_denied", "")); n != 1 {
		t.Errorf("the quota's denial events: got %d, want 1", n)
	}
}

// newWorkspace creates another workspace of e's store with an agent key
// (returned), policy edits and credits.
func newWorkspace(t *testing.T, e *env, name string, policy func(*model.Policy), credits int64) string {
	t.Helper()
	ctx := t.Context()
	ws, err := e.st.CreateWorkspace(ctx, name, nil)
	if err != nil {
		t.Fatal(err)
	}
	key := "sk_test_" + name + "_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := e.st.CreateAPIKey(ctx, store.NewAPIKey{WorkspaceID: ws.ID, Role: model.RoleAgent, Hash: model.HashKey(key), Name: "agent"}); err != nil {
		t.Fatal(err)
	}
	p, err := e.st.GetPolicy(ctx, ws.ID)
	if err != nil {
		t.Fatal(err)
	}
	policy(&p)
	if _, err := e.st.SetPolicy(ctx, ws.ID, p, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.GrantCredits(ctx, ws.ID, credits, "test", nil); err != nil {
		t.Fatal(err)
	}
	return key
}

// TestSessionIsolationAPI runs two sessions at once, in one workspace and
// in two, on runc and gVisor: neither sees the other's kernel state or
// files, and a new session sees nothing of an ended one. (The processes,
// /tmp and abstract sockets of two sessions' sandboxes are tested below
// the API: engine's TestSessionIsolation.)
func TestSessionIsolationAPI(t *testing.T) {
	for _, tier := range []string{"runc", "gvisor"} {
		t.Run(tier, func(t *testing.T) {
			c := envConfig{sessions: true, policy: noApproval, credits: 100}
			if tier == "gvisor" {
				testenv.RequiresBinary(t, "runsc")
				gv, err := gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
				if err != nil {
					t.Fatal(err)
				}
				c.drivers, c.defaultDriver = map[string]sandbox.Driver{"gvisor": gv}, "gvisor"
			}
			e := newEnv(t, backends[0], c)
			other := newWorkspace(t, e, "other", noApproval, 100)
			a := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "shell"})
			if a.Driver != tier {
				t.Fatalf("driver: got %s, want %s", a.Driver, tier)
			}
			same := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "shell"})
			var diff wire.Session
			e.do("POST", "/v1/sessions", other, capability.CreateSessionRequest{Runtime: "shell"}).want(t, http.StatusCreated).decode(t, &diff)
			defer e.do("DELETE", "/v1/sessions/"+diff.ID, other, nil)
			e.cell(e.agent, a.ID, "set secret a-only")
			e.do("PUT", "/v1/sessions/"+a.ID+"/files?path=secret.txt", e.agent, []byte("a-only")).want(t, http.StatusCreated)
			for _, s := range []struct {
				name, id, key string
			}{{"same workspace", same.ID, e.agent}, {"another workspace", diff.ID, other}} {
				var c wire.Cell
				e.do("POST", "/v1/sessions/"+s.id+"/exec", s.key, capability.CellRequest{Code: "get secret"}).want(t, http.StatusOK).decode(t, &c)
				if c.Stdout != "\n" {
					t.Errorf("%s: the other session's kernel state: got %q, want nothing", s.name, c.Stdout)
				}
				e.do("GET", "/v1/sessions/"+s.id+"/files?path=secret.txt", s.key, nil).wantError(t, http.StatusNotFound, "not_found")
			}
			e.do("DELETE", "/v1/sessions/"+a.ID, e.agent, nil).want(t, http.StatusOK)
			next := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "shell"})
			if c := e.cell(e.agent, next.ID, "get secret"); c.Stdout != "\n" {
				t.Errorf("a new session: the ended one's kernel state: got %q, want nothing", c.Stdout)
			}
			e.do("GET", "/v1/sessions/"+next.ID+"/files?path=secret.txt", e.agent, nil).wantError(t, http.StatusNotFound, "not_found")
		})
	}
}

// TestSessionSurvivesDaemonKill kills a `stockade serve` process with
// SIGKILL between two cells of a session: the restarted daemon re-attaches
// the session's sandbox through its shim, and the kernel still holds what
// the first cell set, the workspace its file; a session of the killed
// daemon whose sandbox is gone ends interrupted.
func TestSessionSurvivesDaemonKill(t *testing.T) {
	requireSandboxes(t)
	bin := testenv.Build(t, "./cmd/stockade")
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	key, args := setUpDaemon(t, bin, dir, backends[0].url(t), state)
	d := startDaemon(t, bin, args...)
	var kept, lost wire.Session
	do(t, d.url, "POST", "/v1/sessions", key, capability.CreateSessionRequest{Runtime: "shell"}).want(t, http.StatusCreated).decode(t, &kept)
	do(t, d.url, "POST", "/v1/sessions", key, capability.CreateSessionRequest{Runtime: "shell"}).want(t, http.StatusCreated).decode(t, &lost)
	do(t, d.url, "POST", "/v1/sessions/"+kept.ID+"/exec", key, capability.CellRequest{Code: "df=a-dataframe"}).want(t, http.StatusOK)
	do(t, d.url, "PUT", "/v1/sessions/"+kept.ID+"/files?path=out.csv", key, []byte("x,y\n")).want(t, http.StatusCreated)
	d.kill()
	// The second session's sandbox dies with its shim while no daemon
	// serves it.
	shims := filepath.Join(state, "runc", "shims")
	if err := killShimOf(t, shims, lost.ID); err != nil {
		t.Fatal(err)
	}
	d = startDaemon(t, bin, args...)
	var c wire.Cell
	do(t, d.url, "POST", "/v1/sessions/"+kept.ID+"/exec", key, capability.CellRequest{Code: "echo $df"}).want(t, http.StatusOK).decode(t, &c)
	if c.Stdout != "a-dataframe\n" || c.Cell != 2 {
		t.Fatalf("after the kill: got %+v, want the kernel's state (a-dataframe) in cell 2", c)
	}
	if got := do(t, d.url, "GET", "/v1/sessions/"+kept.ID+"/files?path=out.csv", key, nil).want(t, http.StatusOK); string(got.body) != "x,y\n" {
		t.Fatalf("the workspace after the kill: got %q", got.body)
	}
	var gone wire.Session
	do(t, d.url, "GET", "/v1/sessions/"+lost.ID, key, nil).want(t, http.StatusOK).decode(t, &gone)
	if gone.State != "ended" || gone.EndReason != "interrupted" {
		t.Fatalf("the session whose sandbox died: got %+v, want ended interrupted", gone)
	}
	do(t, d.url, "DELETE", "/v1/sessions/"+kept.ID, key, nil).want(t, http.StatusOK)
	if got := dirEntries(t, filepath.Join(state, "runc", "bundles")); len(got) != 0 {
		t.Errorf("bundles left: %v", got)
	}
	d.stop()
}

// killShimOf kills the shim (and so the sandbox) of the session whose
// label names id, as a crash of the host's processes would.
func killShimOf(t *testing.T, shims, session string) error {
	t.Helper()
	for _, dir := range dirEntries(t, shims) {
		meta, err := os.ReadFile(filepath.Join(shims, dir, "meta.json"))
		if err != nil || !strings.Contains(string(meta), session) {
			continue
		}
		return supervisor.KillShim(t.Context(), filepath.Join(shims, dir))
	}
	t.Fatalf("no shim in %s names session %s", shims, session)
	return nil
}

// TestOpenAPISessions checks that openapi.json documents every field of
// the sessions' answers and requests.
func TestOpenAPISessions(t *testing.T) {
	svc, st, _ := newBareService(t)
	srv := httptest.NewServer(api.New(svc, st, api.Options{Metrics: api.NewMetrics()}))
	defer srv.Close()
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	do(t, srv.URL, "GET", "/openapi.json", "", nil).want(t, http.StatusOK).decode(t, &doc)
	for schema, typ := range map[string]reflect.Type{
		"Session": reflect.TypeFor[wire.Session](), "Cell": reflect.TypeFor[wire.Cell](),
		"CreateSessionRequest": reflect.TypeFor[capability.CreateSessionRequest](), "CellRequest": reflect.TypeFor[capability.CellRequest](),
		"FileInfo": reflect.TypeFor[capability.FileInfo](),
	} {
		for _, f := range reflect.VisibleFields(typ) {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if f.Anonymous || name == "-" {
				continue // an embedded struct's fields are visible; "-" is not sent
			}
			if _, ok := doc.Components.Schemas[schema].Properties[name]; !ok {
				t.Errorf("/openapi.json's %s lacks %q", schema, name)
			}
		}
	}
}

// TestSessionLifetimes checks that the daemon ends a session no cell ran
// in for its idle timeout (idle_timeout), one past its hard lifetime
// whatever it does (ttl), each with its sandbox destroyed and its
// session.ended event, and that a cell keeps a session from idling out.
func TestSessionLifetimes(t *testing.T) {
	e := newEnv(t, backends[0], envConfig{sessions: true, policy: noApproval, credits: 100})
	idle := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "shell", IdleTimeoutMS: 1500})
	ttl := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "shell", TTLMS: 4000})
	busy := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "shell", IdleTimeoutMS: 1500})
	// A cell that runs past the idle timeout: the session is not idle.
	st := postStreamTo(t, e.url, "/v1/sessions/"+busy.ID+"/exec", e.agent, capability.CellRequest{Code: "sleep 3"})
	ended := func(id string) wire.Session {
		var v wire.Session
		e.do("GET", "/v1/sessions/"+id, e.agent, nil).want(t, http.StatusOK).decode(t, &v)
		return v
	}
	deadline := time.Now().Add(20 * time.Second)
	for ended(idle.ID).State != "ended" || ended(ttl.ID).State != "ended" {
		if time.Now().After(deadline) {
			t.Fatalf("after 20 s: idle %+v, ttl %+v; want both ended", ended(idle.ID), ended(ttl.ID))
		}
		// Cells keep the ttl session busy: it ends anyway. A cell sent
		// as it ends is refused as ended (410), not run.
		if r := e.do("POST", "/v1/sessions/"+ttl.ID+"/exec", e.agent, capability.CellRequest{Code: "print alive"}); r.code != http.StatusOK && r.code != http.StatusGone {
			t.Fatalf("a cell of the ttl session: got %d (%s), want 200, or 410 once it ended", r.code, r.body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if v := ended(idle.ID); v.EndReason != "idle_timeout" {
		t.Errorf("the idle session: got %+v, want ended idle_timeout", v)
	}
	if v := ended(ttl.ID); v.EndReason != "ttl" {
		t.Errorf("the ttl session: got %+v, want ended ttl", v)
	}
	// Had the sweep found the busy session idle, its sandbox would have
	// been destroyed under the cell.
	evs := st.rest(30 * time.Second)
	var res wire.Cell
	if len(evs) == 0 || json.Unmarshal([]byte(evs[len(evs)-1].data), &res) != nil || res.Status != "succeeded" {
		t.Errorf("the cell that ran past its session's idle timeout: got %+v, want succeeded", evs)
	}
	e.do("POST", "/v1/sessions/"+idle.ID+"/exec", e.agent, capability.CellRequest{Code: "get x"}).want(t, http.StatusGone)
	// The sweep records a session's end, then destroys its sandbox.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n := len(dirEntries(t, filepath.Join(e.runcState, "bundles")))
		if n <= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("sandboxes 10 s after the sessions ended: got %d, want at most the busy session's", n)
			break
		}
	}
}
