package e2b

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/wire"
)

// fakeCells stands in for the capability layer: each admitted cell gets
// the events and outcome its test scripts through run.
type fakeCells struct {
	Cells // the methods the interpreter does not use panic

	mu          sync.Mutex
	admitErr    error
	busy        int // admissions refused as the session's before one is admitted
	awaiting    bool
	codes       []string
	subs        map[string]chan capability.StreamEvent
	status      map[string]model.Execution
	interrupted int
	cancelled   []string
	// run, if set, plays cell id (in its own goroutine) with emit and
	// end.
	run func(f *fakeCells, id string)
	// onSubscribe, if set, is called as cell id is subscribed to.
	onSubscribe func(id string)
}

func newFakeCells() *fakeCells {
	return &fakeCells{subs: map[string]chan capability.StreamEvent{}, status: map[string]model.Execution{}}
}

func (f *fakeCells) Subscribe(id string) (<-chan capability.StreamEvent, func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan capability.StreamEvent, 64)
	f.subs[id] = ch
	if f.onSubscribe != nil {
		f.onSubscribe(id)
	}
	return ch, func() {}
}

func (f *fakeCells) ExecCell(_ context.Context, _ capability.Principal, _ string, req capability.CellRequest, o capability.InvokeOptions) (*capability.Invocation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.admitErr != nil {
		return nil, f.admitErr
	}
	if f.busy != 0 {
		f.busy--
		return nil, errdefs.Public(&capability.SessionBusyError{SessionID: "ses_1"})
	}
	f.codes = append(f.codes, req.Code)
	e := model.Execution{ID: o.ExecutionID, Status: model.StatusQueued, Cell: len(f.codes), SessionID: "ses_1"}
	inv := &capability.Invocation{Execution: e}
	if f.awaiting {
		e.Status, e.ApprovalID = model.StatusAwaitingApproval, "ap_1"
		inv.Execution, inv.Approval = e, &model.Approval{ID: "ap_1"}
	}
	f.status[e.ID] = e
	if f.run != nil {
		go f.run(f, e.ID)
	}
	return inv, nil
}

func (f *fakeCells) Wait(_ context.Context, _ capability.Principal, id string, _ time.Duration) (model.Execution, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status[id], nil
}

func (f *fakeCells) InterruptCell(context.Context, capability.Principal, string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.interrupted++
	return true, nil
}

func (f *fakeCells) Cancel(_ context.Context, _ capability.Principal, id, _ string) (model.Execution, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cancelled = append(f.cancelled, id)
	return f.status[id], nil
}

// emit publishes an event of cell id.
func (f *fakeCells) emit(id, typ string, data any) {
	b, _ := json.Marshal(data)
	f.mu.Lock()
	ch := f.subs[id]
	if typ == "started" {
		e := f.status[id]
		e.Status = model.StatusRunning
		f.status[id] = e
	}
	f.mu.Unlock()
	ch <- capability.StreamEvent{Type: typ, Data: b}
}

// end ends cell id with status and result r, and closes its events.
func (f *fakeCells) end(id string, status model.ExecutionStatus, r *engine.CellResult) {
	f.mu.Lock()
	e := f.status[id]
	e.Status = status
	if r != nil {
		e.Result, _ = json.Marshal(capability.CellResultDoc{ExecutionID: id, SessionID: "ses_1", Cell: e.Cell, CellResult: *r})
	}
	f.status[id] = e
	ch := f.subs[id]
	f.mu.Unlock()
	close(ch)
}

// serve serves in (with the Target of a python session) for t.
func serve(t *testing.T, h http.Handler, runtime string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(WithTarget(r.Context(), Target{SandboxID: "sb1", SessionID: "ses_1", Runtime: runtime})))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// execute posts body to /execute and returns the response.
func execute(t *testing.T, ctx context.Context, srv *httptest.Server, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/execute", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// lines reads an NDJSON body to its end.
func lines(t *testing.T, r io.Reader) []map[string]any {
	t.Helper()
	out, _ := linesErr(t, r)
	return out
}

// linesErr reads an NDJSON body to its end, and says how it ended: nil
// for a whole body, the read's error for one cut short.
func linesErr(t *testing.T, r io.Reader) ([]map[string]any, error) {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("a line that is not JSON: %q", sc.Text())
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// types lists the types of msgs, keepalives left out.
func types(msgs []map[string]any) []string {
	var out []string
	for _, m := range msgs {
		if m["type"] != "keepalive" {
			out = append(out, m["type"].(string))
		}
	}
	return out
}

func TestExecuteStream(t *testing.T) {
	f := newFakeCells()
	f.run = func(f *fakeCells, id string) {
		f.emit(id, "started", wire.Started{ExecutionID: id})
		f.emit(id, "stdout", map[string]string{"data": "hi\n"})
		f.emit(id, "stderr", map[string]string{"data": "warn\n"})
		png := wire.CellOutput{MimeType: "image/png", Data: "iVBORw0KGgo="}
		f.emit(id, "output", png)
		f.end(id, model.StatusSucceeded, &engine.CellResult{Status: sandbox.StatusSucceeded, CellEnd: wire.CellEnd{
			Stdout: "hi\n", Outputs: []wire.CellOutput{png, {MimeType: "application/json", Data: `{"a":1}`}, {MimeType: "text/plain", Data: "2"}}}})
	}
	srv := serve(t, NewInterpreter(f, nil), "python")
	res := execute(t, t.Context(), srv, `{"code":"x + 1","context_id":null,"language":null}`)
	defer res.Body.Close()
	if ct := res.Header.Get("Content-Type"); res.StatusCode != 200 || ct != "application/x-ndjson" {
		t.Fatalf("got %d %s", res.StatusCode, ct)
	}
	msgs := lines(t, res.Body)
	want := []string{"stdout", "stderr", "result", "result", "result", "number_of_executions", "end_of_execution"}
	if got := types(msgs); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("got %v, want %v", got, want)
	}
	if msgs[0]["text"] != "hi\n" || msgs[1]["text"] != "warn\n" {
		t.Errorf("got stdout %v stderr %v", msgs[0], msgs[1])
	}
	if msgs[2]["png"] != "iVBORw0KGgo=" || msgs[2]["is_main_result"] != false {
		t.Errorf("got figure %v", msgs[2])
	}
	if j, ok := msgs[3]["json"].(map[string]any); !ok || j["a"] != float64(1) || msgs[3]["is_main_result"] != false {
		t.Errorf("got json result %v", msgs[3])
	}
	if msgs[4]["text"] != "2" || msgs[4]["is_main_result"] != true {
		t.Errorf("got main result %v", msgs[4])
	}
	if msgs[5]["execution_count"] != float64(1) {
		t.Errorf("got %v", msgs[5])
	}
	if f.codes[0] != "x + 1" {
		t.Errorf("the default context's cell was sent as %q, want the code as written", f.codes[0])
	}
}

// TestExecuteDoubleSlash: a sandbox URL with a trailing slash (the SDK
// then asks for //execute) is served, not redirected.
func TestExecuteDoubleSlash(t *testing.T) {
	f := newFakeCells()
	f.run = func(f *fakeCells, id string) {
		f.end(id, model.StatusSucceeded, &engine.CellResult{Status: sandbox.StatusSucceeded, CellEnd: wire.CellEnd{Outputs: []wire.CellOutput{}}})
	}
	srv := serve(t, NewInterpreter(f, nil), "python")
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"//execute", strings.NewReader(`{"code":"1"}`))
	res, err := srv.Client().Transport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	msgs := lines(t, res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || len(f.codes) != 1 || len(msgs) == 0 {
		t.Errorf("got %d, cells %q", res.StatusCode, f.codes)
	}
}

func TestExecuteError(t *testing.T) {
	f := newFakeCells()
	f.run = func(f *fakeCells, id string) {
		f.emit(id, "started", nil)
		f.end(id, model.StatusFailed, &engine.CellResult{Status: sandbox.StatusFailed, CellEnd: wire.CellEnd{Outputs: []wire.CellOutput{},
			Error: &wire.CellError{Name: "ZeroDivisionError", Value: "division by zero", Traceback: "Traceback...\nZeroDivisionError: division by zero"}}})
	}
	srv := serve(t, NewInterpreter(f, nil), "python")
	res := execute(t, t.Context(), srv, `{"code":"1/0"}`)
	defer res.Body.Close()
	msgs := lines(t, res.Body)
	var e map[string]any
	for _, m := range msgs {
		if m["type"] == "error" {
			e = m
		}
	}
	if e == nil || e["name"] != "ZeroDivisionError" || e["value"] != "division by zero" || !strings.Contains(e["traceback"].(string), "Traceback") {
		t.Fatalf("got %v, want the cell's exception", msgs)
	}
}

// TestExecuteHeadersFirst: the headers arrive while the cell runs, and
// keepalives follow while it is silent.
func TestExecuteHeadersFirst(t *testing.T) {
	f := newFakeCells()
	release := make(chan struct{})
	f.run = func(f *fakeCells, id string) {
		f.emit(id, "started", nil)
		<-release
		f.end(id, model.StatusSucceeded, &engine.CellResult{Status: sandbox.StatusSucceeded, CellEnd: wire.CellEnd{Outputs: []wire.CellOutput{}}})
	}
	srv := serve(t, NewInterpreterWith(f, nil, InterpreterOptions{KeepAlive: 20 * time.Millisecond}), "python")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res := execute(t, ctx, srv, `{"code":"import time; time.sleep(9)"}`)
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	line, err := br.ReadString('\n')
	if err != nil || !strings.Contains(line, `"keepalive"`) {
		t.Fatalf("got %q, %v; want a keepalive while the cell runs", line, err)
	}
	close(release)
	rest := lines(t, br)
	if got := types(rest); len(got) == 0 || got[len(got)-1] != "end_of_execution" {
		t.Fatalf("got %v after the cell ended", got)
	}
}

// TestExecuteClientGone: a client that goes away interrupts its cell.
func TestExecuteClientGone(t *testing.T) {
	f := newFakeCells()
	started := make(chan struct{})
	f.run = func(f *fakeCells, id string) {
		f.emit(id, "started", nil)
		close(started)
	}
	srv := serve(t, NewInterpreter(f, nil), "python")
	ctx, cancel := context.WithCancel(t.Context())
	res := execute(t, ctx, srv, `{"code":"while True: pass"}`)
	<-started
	cancel()
	res.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.mu.Lock()
		n := f.interrupted
		f.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cell was not interrupted when its client went away")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestExecuteApproval: a cell awaiting approval keeps its stream alive;
// past ApprovalWait the stream ends with an error naming the approval,
// and the cell is left pending, neither cancelled nor charged.
func TestExecuteApproval(t *testing.T) {
	f := newFakeCells()
	f.awaiting = true
	srv := serve(t, NewInterpreterWith(f, nil, InterpreterOptions{KeepAlive: 10 * time.Millisecond, ApprovalWait: 100 * time.Millisecond}), "python")
	res := execute(t, t.Context(), srv, `{"code":"1"}`)
	defer res.Body.Close()
	msgs := lines(t, res.Body)
	keepalives := 0
	for _, m := range msgs {
		if m["type"] == "keepalive" {
			keepalives++
		}
	}
	got := types(msgs)
	if keepalives == 0 || strings.Join(got, ",") != "approval_required,error,end_of_execution" {
		t.Fatalf("got %d keepalives and %v", keepalives, got)
	}
	e := msgs[len(msgs)-2]
	if e["name"] != "ApprovalPending" || !strings.Contains(e["value"].(string), "ap_1") || !strings.Contains(e["value"].(string), "nothing is charged") {
		t.Errorf("got %v", e)
	}
	if len(f.cancelled) != 0 {
		t.Errorf("the pending cell was cancelled: %v", f.cancelled)
	}
	// Other code is refused, admitting nothing; the same code follows the
	// pending cell to its end.
	res2 := execute(t, t.Context(), srv, `{"code":"2"}`)
	msgs = lines(t, res2.Body)
	res2.Body.Close()
	if e := msgs[len(msgs)-2]; e["name"] != "SandboxBusy" || len(f.codes) != 1 {
		t.Errorf("other code: got %v and cells %q", msgs, f.codes)
	}
	// Approved and run once the stream has subscribed again.
	f.onSubscribe = func(id string) {
		go func() {
			f.emit(id, "started", nil)
			f.end(id, model.StatusSucceeded, &engine.CellResult{Status: sandbox.StatusSucceeded, CellEnd: wire.CellEnd{Outputs: []wire.CellOutput{{MimeType: "text/plain", Data: "1"}}}})
		}()
	}
	res3 := execute(t, t.Context(), srv, `{"code":"1"}`)
	msgs = lines(t, res3.Body)
	res3.Body.Close()
	if got := strings.Join(types(msgs), ","); got != "approval_required,result,number_of_executions,end_of_execution" || len(f.codes) != 1 {
		t.Errorf("the same code: got %v and cells %q", got, f.codes)
	}
}

// TestExecuteApproved: a cell approved within the wait runs in the same
// stream; a denied one ends with ApprovalDenied, and its stream is cut.
func TestExecuteApproved(t *testing.T) {
	for _, approve := range []bool{true, false} {
		f := newFakeCells()
		f.awaiting = true
		f.run = func(f *fakeCells, id string) {
			time.Sleep(30 * time.Millisecond)
			if !approve {
				f.end(id, model.StatusDenied, nil)
				return
			}
			f.emit(id, "started", nil)
			f.end(id, model.StatusSucceeded, &engine.CellResult{Status: sandbox.StatusSucceeded, CellEnd: wire.CellEnd{Outputs: []wire.CellOutput{{MimeType: "text/plain", Data: "1"}}}})
		}
		srv := serve(t, NewInterpreterWith(f, nil, InterpreterOptions{KeepAlive: 5 * time.Millisecond}), "python")
		res := execute(t, t.Context(), srv, `{"code":"1"}`)
		msgs, err := linesErr(t, res.Body)
		res.Body.Close()
		got := strings.Join(types(msgs), ",")
		// A denied cell's stream is cut after its error, so that the SDK
		// raises.
		if (err != nil) == approve {
			t.Errorf("approve %v: the body ended with %v", approve, err)
		}
		switch {
		case approve && got != "approval_required,result,number_of_executions,end_of_execution":
			t.Errorf("approved: got %v", got)
		case !approve && !strings.Contains(got, "error"):
			t.Errorf("denied: got %v", got)
		case !approve && msgs[len(msgs)-2]["name"] != "ApprovalDenied":
			t.Errorf("denied: got %v", msgs[len(msgs)-2])
		}
	}
}

func TestExecuteRefusals(t *testing.T) {
	f := newFakeCells()
	srv := serve(t, NewInterpreter(f, nil), "python")
	for _, c := range []struct {
		name, body string
		status     int
	}{
		{"not JSON", `{"code":`, 400},
		{"context and language", `{"code":"1","context_id":"python","language":"python"}`, 400},
		{"a bad variable name", `{"code":"1","env_vars":{"A=B":"1"}}`, 400},
		{"two values", `{"code":"1"} {}`, 400},
		{"an unknown context", `{"code":"1","context_id":"ctx_nope"}`, 404},
	} {
		res := execute(t, t.Context(), srv, c.body)
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != c.status || len(b) == 0 {
			t.Errorf("%s: got %d %q, want %d and a reason", c.name, res.StatusCode, b, c.status)
		}
	}
	f.admitErr = errdefs.Publicf("too few credits: %w", errdefs.ErrPaymentRequired)
	res := execute(t, t.Context(), srv, `{"code":"1"}`)
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 429 || !strings.Contains(string(b), "credits") {
		t.Errorf("a refused admission: got %d %q", res.StatusCode, b)
	}
	// A language the sandbox cannot run is the execution's error, with
	// nothing admitted.
	f.admitErr = nil
	res = execute(t, t.Context(), srv, `{"code":"1","language":"r"}`)
	msgs := lines(t, res.Body)
	res.Body.Close()
	if len(msgs) != 2 || msgs[0]["name"] != "UnsupportedLanguage" || len(f.codes) != 0 {
		t.Errorf("got %v and cells %v", msgs, f.codes)
	}
}

// TestContexts: contexts are created, listed, restarted and removed
// without running a cell; their cells go through the helper, which then
// does the restart and the removal.
func TestContexts(t *testing.T) {
	f := newFakeCells()
	f.run = func(f *fakeCells, id string) {
		f.emit(id, "started", nil)
		f.end(id, model.StatusSucceeded, &engine.CellResult{Status: sandbox.StatusSucceeded, CellEnd: wire.CellEnd{Outputs: []wire.CellOutput{}}})
	}
	srv := serve(t, NewInterpreter(f, nil), "python")
	do := func(method, path, body string) (int, []byte) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, b
	}
	code, b := do("POST", "/contexts", `{"language":"bash","cwd":"/tmp"}`)
	var bash ciContext
	if code != 200 || json.Unmarshal(b, &bash) != nil || bash.Language != "bash" || bash.Cwd != "/tmp" || bash.ID == "" {
		t.Fatalf("create: got %d %s", code, b)
	}
	code, b = do("POST", "/contexts", `{"language":"cobol"}`)
	if code != 404 || !strings.Contains(string(b), "cobol") {
		t.Errorf("create of an unknown language: got %d %s", code, b)
	}
	code, b = do("GET", "/contexts", "")
	var list []ciContext
	if code != 200 || json.Unmarshal(b, &list) != nil || len(list) != 2 || list[0].ID != "python" || list[1].ID != bash.ID {
		t.Fatalf("list: got %d %s", code, b)
	}
	res := execute(t, t.Context(), srv, `{"code":"echo $A","context_id":"`+bash.ID+`","env_vars":{"A":"1"}}`)
	lines(t, res.Body)
	res.Body.Close()
	if len(f.codes) != 1 || !strings.Contains(f.codes[0], ciHelperModule) || !strings.Contains(f.codes[0], `"echo $A"`) || !strings.Contains(f.codes[0], `{"A":"1"}`) {
		t.Fatalf("got the cell %q", f.codes)
	}
	if code, _ = do("POST", "/contexts/"+bash.ID+"/restart", ""); code != 204 {
		t.Errorf("restart: got %d", code)
	}
	if code, _ = do("DELETE", "/contexts/"+bash.ID, ""); code != 204 {
		t.Errorf("remove: got %d", code)
	}
	if code, _ = do("DELETE", "/contexts/"+bash.ID, ""); code != 404 {
		t.Errorf("a second remove: got %d, want 404", code)
	}
	if len(f.codes) != 1 {
		t.Fatalf("context calls ran cells: %q", f.codes[1:])
	}
	// The next cell ends the removed context's bash first; the one after
	// is the code as written again.
	for range 2 {
		res = execute(t, t.Context(), srv, `{"code":"x"}`)
		lines(t, res.Body)
		res.Body.Close()
	}
	if !strings.Contains(f.codes[1], `["`+bash.ID+`"]`) || f.codes[2] != "x" {
		t.Errorf("got the cells %q", f.codes[1:])
	}
}

func TestNodeSandboxContexts(t *testing.T) {
	f := newFakeCells()
	f.run = func(f *fakeCells, id string) {
		f.end(id, model.StatusSucceeded, &engine.CellResult{Status: sandbox.StatusSucceeded, CellEnd: wire.CellEnd{Outputs: []wire.CellOutput{}}})
	}
	srv := serve(t, NewInterpreter(f, nil), "node")
	res := execute(t, t.Context(), srv, `{"code":"1 + 1","language":"javascript","env_vars":{"A":"x"}}`)
	lines(t, res.Body)
	res.Body.Close()
	res = execute(t, t.Context(), srv, `{"code":"print(1)","language":"python"}`)
	msgs := lines(t, res.Body)
	res.Body.Close()
	if len(f.codes) != 1 || f.codes[0] != "Object.assign(process.env, {\"A\":\"x\"});\n1 + 1" {
		t.Errorf("got the cells %q", f.codes)
	}
	if len(msgs) != 2 || msgs[0]["name"] != "UnsupportedLanguage" {
		t.Errorf("python in a node sandbox: got %v", msgs)
	}
}

// TestContextsBounded: the daemon keeps the contexts of at most
// ciMaxSandboxes sandboxes, forgetting the least recently used.
func TestContextsBounded(t *testing.T) {
	c := newCIContexts(4)
	target := func(i int) Target { return Target{SessionID: fmt.Sprint("ses_", i), Runtime: "python"} }
	c.sandbox(target(0)).list[0].Cwd = "/kept"
	for i := 1; i <= ciMaxSandboxes; i++ {
		c.sandbox(target(i))
		if i == 1 {
			c.sandbox(target(0)) // used again: not the oldest
		}
	}
	if len(c.sandboxes) != ciMaxSandboxes {
		t.Fatalf("got %d sandboxes, want %d", len(c.sandboxes), ciMaxSandboxes)
	}
	if _, ok := c.sandboxes["ses_1"]; ok {
		t.Error("the least recently used sandbox was kept")
	}
	if sb := c.sandboxes["ses_0"]; sb == nil || sb.list[0].Cwd != "/kept" {
		t.Error("a sandbox used since was forgotten")
	}
}

// TestContextsRequeue: a cell that ran nothing (denied) leaves the
// restart and removal it carried to the next cell.
func TestContextsRequeue(t *testing.T) {
	f := newFakeCells()
	deny := true
	f.run = func(f *fakeCells, id string) {
		if deny {
			f.end(id, model.StatusDenied, nil)
			return
		}
		f.end(id, model.StatusSucceeded, &engine.CellResult{Status: sandbox.StatusSucceeded, CellEnd: wire.CellEnd{Outputs: []wire.CellOutput{}}})
	}
	srv := serve(t, NewInterpreter(f, nil), "python")
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/contexts/python/restart", nil)
	res, err := srv.Client().Do(req)
	if err != nil || res.StatusCode != 204 {
		t.Fatalf("restart: %v %v", res, err)
	}
	for range 2 {
		res = execute(t, t.Context(), srv, `{"code":"x"}`)
		lines(t, res.Body)
		res.Body.Close()
		deny = false
	}
	res = execute(t, t.Context(), srv, `{"code":"x"}`)
	lines(t, res.Body)
	res.Body.Close()
	if len(f.codes) != 3 || !strings.Contains(f.codes[0], ", True, []") || !strings.Contains(f.codes[1], ", True, []") || f.codes[2] != "x" {
		t.Errorf("got the cells %q", f.codes)
	}
}

// TestExecuteQueued: a cell sent while the sandbox runs another waits
// for its turn, with keepalives, as E2B's kernel queues executions; past
// QueueWait it ends with SandboxBusy, admitting nothing.
func TestExecuteQueued(t *testing.T) {
	f := newFakeCells()
	f.busy = 4
	f.run = func(f *fakeCells, id string) {
		f.emit(id, "started", nil)
		f.end(id, model.StatusSucceeded, &engine.CellResult{Status: sandbox.StatusSucceeded, CellEnd: wire.CellEnd{Outputs: []wire.CellOutput{{MimeType: "text/plain", Data: "2"}}}})
	}
	srv := serve(t, NewInterpreterWith(f, nil, InterpreterOptions{KeepAlive: 20 * time.Millisecond, QueueWait: 5 * time.Second}), "python")
	res := execute(t, t.Context(), srv, `{"code":"1 + 1"}`)
	msgs := lines(t, res.Body)
	res.Body.Close()
	if got := strings.Join(types(msgs), ","); res.StatusCode != 200 || got != "result,number_of_executions,end_of_execution" || len(f.codes) != 1 || msgs[0]["type"] != "keepalive" {
		t.Errorf("a queued cell: got %d %v, cells %q", res.StatusCode, msgs, f.codes)
	}

	f.busy = -1 // busy for good
	srv = serve(t, NewInterpreterWith(f, nil, InterpreterOptions{KeepAlive: 20 * time.Millisecond, QueueWait: 200 * time.Millisecond}), "python")
	res = execute(t, t.Context(), srv, `{"code":"1 + 1"}`)
	msgs = lines(t, res.Body)
	res.Body.Close()
	if got := strings.Join(types(msgs), ","); got != "error,end_of_execution" || msgs[len(msgs)-2]["name"] != "SandboxBusy" || len(f.codes) != 1 {
		t.Errorf("a cell that never gets its turn: got %v, cells %q", msgs, f.codes)
	}
}
