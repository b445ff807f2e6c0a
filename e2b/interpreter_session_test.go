package e2b

import (
	"context"
	"encoding/base64"
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
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/wire"
)

// sessionInterpreter serves the interpreter with options o over a real
// daemon's capability layer on tier's driver, for a python session of a
// workspace whose policy is the default edited by policy, and returns
// its server, the daemon and the workspace.
func sessionInterpreter(t *testing.T, tier string, policy func(*model.Policy), o InterpreterOptions) (*httptest.Server, *tierDaemon, tierWorkspace) {
	t.Helper()
	d := startTier(t, tier)
	ws := d.workspace(t, policy, 1000)
	p, err := d.Service.Authenticate(t.Context(), ws.Agent)
	if err != nil {
		t.Fatal(err)
	}
	created, err := d.Service.CreateSession(t.Context(), p, capability.CreateSessionRequest{Runtime: "python"}, capability.CreateSessionOptions{})
	if err != nil {
		t.Fatalf("CreateSession: %v", err)
	}
	id := created.Session.ID
	t.Cleanup(func() { _, _ = d.Service.CloseSession(context.Background(), p, id) })
	h := NewInterpreterWith(d.Service, nil, o)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(WithTarget(r.Context(), Target{SandboxID: "sb_" + id, SessionID: id, Principal: p, Runtime: "python"})))
	}))
	t.Cleanup(srv.Close)
	return srv, d, ws
}

// run posts body to /execute and returns its lines, keepalives left out.
func run(t *testing.T, srv *httptest.Server, body string) []map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res := execute(t, ctx, srv, body)
	// A cell whose client went away may still be ending.
	for start := time.Now(); res.StatusCode == http.StatusConflict && time.Since(start) < 30*time.Second; {
		res.Body.Close()
		time.Sleep(100 * time.Millisecond)
		res = execute(t, ctx, srv, body)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("%s: got %d", body, res.StatusCode)
	}
	var out []map[string]any
	for _, m := range lines(t, res.Body) {
		if m["type"] != "keepalive" {
			out = append(out, m)
		}
	}
	return out
}

// of returns the first line of type typ in msgs (nil if none).
func of(msgs []map[string]any, typ string) map[string]any {
	for _, m := range msgs {
		if m["type"] == typ {
			return m
		}
	}
	return nil
}

// interrupted posts body, a cell that prints "sleeping" then sleeps,
// and goes away once it has printed; it returns when it went away, once
// the session runs no cell.
func interrupted(t *testing.T, srv *httptest.Server, body string) time.Time {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	res := execute(t, ctx, srv, body)
	var seen strings.Builder
	buf := make([]byte, 256)
	for !strings.Contains(seen.String(), "sleeping") {
		n, err := res.Body.Read(buf)
		seen.Write(buf[:n])
		if err != nil {
			t.Fatalf("reading the sleeping cell: %v (%q)", err, seen.String())
		}
	}
	cancel()
	res.Body.Close()
	return time.Now()
}

// toolCalls lists workspace key's tool calls on the daemon's API.
func toolCalls(t *testing.T, d *tierDaemon, key string) []wire.ToolCall {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, d.URL+"/v1/tool-calls?limit=500", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var page wire.Page[wire.ToolCall]
	decodeJSON(t, res, &page)
	return page.Items
}

// decodeJSON decodes res's body into v and closes it.
func decodeJSON(t *testing.T, res *http.Response, v any) {
	t.Helper()
	defer res.Body.Close()
	if err := json.NewDecoder(res.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

// stdout joins msgs' stdout.
func stdout(msgs []map[string]any) string {
	var b strings.Builder
	for _, m := range msgs {
		if m["type"] == "stdout" {
			b.WriteString(m["text"].(string))
		}
	}
	return b.String()
}

// TestSessionInterpreter runs the interpreter's cells in a real python
// session, on runc and gVisor: state across cells, a figure, an
// exception, python and bash contexts keeping state of their own,
// env_vars, javascript's refusal in the python image, and interrupts
// when the client goes away; each cell is a tool call charged 2
// credits.
func TestSessionInterpreter(t *testing.T) {
	for _, tier := range tiers {
		t.Run(tier, func(t *testing.T) { testSessionInterpreter(t, tier) })
	}
}

func testSessionInterpreter(t *testing.T, tier string) {
	srv, d, ws := sessionInterpreter(t, tier, noApproval, InterpreterOptions{KeepAlive: time.Second})
	cells := 0
	check := func(name, body string, ok func(msgs []map[string]any) bool) {
		t.Helper()
		start := time.Now()
		msgs := run(t, srv, body)
		cells++
		t.Logf("%s: %s", name, time.Since(start))
		if !ok(msgs) {
			t.Errorf("%s: got %v", name, msgs)
		}
	}
	text := func(want string) func([]map[string]any) bool {
		return func(msgs []map[string]any) bool {
			r := of(msgs, "result")
			return r != nil && r["text"] == want && r["is_main_result"] == true && of(msgs, "error") == nil
		}
	}
	raised := func(name string) func([]map[string]any) bool {
		return func(msgs []map[string]any) bool {
			e := of(msgs, "error")
			return e != nil && e["name"] == name && e["traceback"] != nil
		}
	}
	check("assignment", `{"code":"x = 1"}`, func(msgs []map[string]any) bool {
		return of(msgs, "result") == nil && of(msgs, "end_of_execution") != nil
	})
	check("state", `{"code":"x + 1"}`, text("2"))
	check("a figure", `{"code":"import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"}`, func(msgs []map[string]any) bool {
		r := of(msgs, "result")
		if r == nil {
			return false
		}
		png, err := base64.StdEncoding.DecodeString(r["png"].(string))
		return err == nil && strings.HasPrefix(string(png), "\x89PNG")
	})
	check("an exception", `{"code":"def f(n):\n    return 10 / n\nf(0)"}`, func(msgs []map[string]any) bool {
		e := of(msgs, "error")
		return e != nil && e["name"] == "ZeroDivisionError" && e["value"] == "division by zero" && strings.Contains(e["traceback"].(string), "return 10 / n")
	})
	check("env_vars", `{"code":"import os\nos.environ['E2B_T']","env_vars":{"E2B_T":"v"}}`, text("'v'"))
	check("env_vars are the cell's", `{"code":"os.environ.get('E2B_T')"}`, func(msgs []map[string]any) bool { return of(msgs, "result") == nil && of(msgs, "error") == nil })

	var py, sh, js ciContext
	for _, c := range []struct {
		lang string
		dst  *ciContext
	}{{"python", &py}, {"bash", &sh}, {"javascript", &js}} {
		res, err := srv.Client().Post(srv.URL+"/contexts", "application/json", strings.NewReader(`{"language":"`+c.lang+`","cwd":"/tmp"}`))
		if err != nil || res.StatusCode != 200 {
			t.Fatalf("creating a %s context: %v %v", c.lang, res, err)
		}
		decodeJSON(t, res, c.dst)
	}
	check("a python context has its own namespace", `{"code":"x","context_id":"`+py.ID+`"}`, raised("NameError"))
	check("which keeps state", `{"code":"y = 5","context_id":"`+py.ID+`"}`, func(msgs []map[string]any) bool { return of(msgs, "error") == nil })
	check("its value", `{"code":"y * 2","context_id":"`+py.ID+`"}`, text("10"))
	check("the default context is apart", `{"code":"'y' in dir()"}`, text("False"))
	check("bash", `{"code":"A=3; cd /tmp; echo start","context_id":"`+sh.ID+`"}`, func(msgs []map[string]any) bool { return stdout(msgs) == "start\n" })
	check("bash keeps state", `{"code":"echo $A $PWD; echo err >&2","context_id":"`+sh.ID+`"}`, func(msgs []map[string]any) bool {
		e := of(msgs, "stderr")
		return stdout(msgs) == "3 /tmp\n" && e != nil && e["text"] == "err\n"
	})
	check("bash's env_vars", `{"code":"echo $B","context_id":"`+sh.ID+`","env_vars":{"B":"b"}}`, func(msgs []map[string]any) bool { return stdout(msgs) == "b\n" })
	check("a failing command", `{"code":"false","context_id":"`+sh.ID+`"}`, raised("BashError"))
	check("javascript needs node", `{"code":"1 + 1","context_id":"`+js.ID+`"}`, func(msgs []map[string]any) bool {
		e := of(msgs, "error")
		return e != nil && e["name"] == "NodeUnavailable" && strings.Contains(e["value"].(string), "nodejs")
	})

	// Restart the bash context: its variables are gone, and it still runs.
	res, err := srv.Client().Post(srv.URL+"/contexts/"+sh.ID+"/restart", "application/json", nil)
	if err != nil || res.StatusCode != 204 {
		t.Fatalf("restart: %v %v", res, err)
	}
	res.Body.Close()
	check("a restarted context", `{"code":"echo \"[$A]\"","context_id":"`+sh.ID+`"}`, func(msgs []map[string]any) bool { return stdout(msgs) == "[]\n" })

	// Cells sent together run one after the other, as E2B's kernel
	// queues them.
	var wg sync.WaitGroup
	together := make([][]map[string]any, 2)
	for i, code := range []string{`import time\ntime.sleep(1)\n'first'`, `'second'`} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			res := execute(t, ctx, srv, `{"code":"`+code+`"}`)
			together[i] = lines(t, res.Body)
			res.Body.Close()
		}()
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	cells += 2
	for i, want := range []string{"'first'", "'second'"} {
		if r := of(together[i], "result"); r == nil || r["text"] != want {
			t.Errorf("cells sent together: got %v, want %s", together[i], want)
		}
	}

	// A bash context's cell whose client goes away is interrupted too.
	check("bash state before an interrupt", `{"code":"K=kept","context_id":"`+sh.ID+`"}`, func(msgs []map[string]any) bool { return of(msgs, "error") == nil })
	at := interrupted(t, srv, `{"code":"echo sleeping; sleep 60; K=overwritten","context_id":"`+sh.ID+`"}`)
	cells++
	t.Logf("bash interrupted at %s", at.Format(time.StampMilli))
	check("bash after an interrupt", `{"code":"echo $K","context_id":"`+sh.ID+`"}`, func(msgs []map[string]any) bool { return stdout(msgs) == "kept\n" })
	t.Logf("bash answered again %s after", time.Since(at))

	// A client that goes away interrupts its cell: the kernel is free
	// again at once, its state kept.
	start := interrupted(t, srv, `{"code":"import time\nprint('sleeping', flush=True)\ntime.sleep(60)"}`)
	cells++
	var after []map[string]any
	for time.Since(start) < 30*time.Second {
		res := execute(t, t.Context(), srv, `{"code":"x"}`)
		if res.StatusCode == http.StatusConflict { // the cell is still ending
			res.Body.Close()
			time.Sleep(100 * time.Millisecond)
			continue
		}
		after = lines(t, res.Body)
		res.Body.Close()
		cells++
		break
	}
	t.Logf("python answered again %s after", time.Since(start))
	if r := of(after, "result"); r == nil || r["text"] != "1" || time.Since(start) > 20*time.Second {
		t.Errorf("after the client went away: got %v in %s", after, time.Since(start))
	}
	// Every cell is one tool call charged 2 credits; the cells in a
	// language the sandbox lacks ran nothing (none here).
	calls := toolCalls(t, d, ws.Agent)
	if len(calls) != cells {
		t.Errorf("got %d tool calls for %d cells", len(calls), cells)
	}
	for _, c := range calls {
		if c.CreditsCharged != 2 {
			t.Errorf("tool call %s (%s) charged %d credits, want 2", c.ID, c.Status, c.CreditsCharged)
		}
	}
}

// TestSessionInterpreterApproval runs cells that await approval in a real
// session: one that outlasts ApprovalWait ends its stream with
// ApprovalPending, other code is then refused, and the same code, sent
// again once it is approved, gives its end (it ran once); one approved
// while its stream waits runs in it; a denied one ends with
// ApprovalDenied and a cut stream. Only the cells that ran are charged.
func TestSessionInterpreterApproval(t *testing.T) {
	srv, d, ws := sessionInterpreter(t, "runc", nil, InterpreterOptions{KeepAlive: 100 * time.Millisecond, ApprovalWait: 500 * time.Millisecond})
	agent, err := d.Service.Authenticate(t.Context(), ws.Agent)
	if err != nil {
		t.Fatal(err)
	}
	approver, err := d.Service.Authenticate(t.Context(), ws.Approver)
	if err != nil {
		t.Fatal(err)
	}
	msgs := run(t, srv, `{"code":"x = 41"}`)
	asked, e := of(msgs, "approval_required"), of(msgs, "error")
	if asked == nil || e == nil || e["name"] != "ApprovalPending" || !strings.Contains(e["value"].(string), asked["approval_id"].(string)) {
		t.Fatalf("a cell that outlasts the wait: got %v", msgs)
	}
	// Other code is refused while it waits; the same code follows it.
	if e := of(run(t, srv, `{"code":"print(2)"}`), "error"); e == nil || e["name"] != "SandboxBusy" {
		t.Errorf("other code while a cell awaits approval: got %v", e)
	}
	if _, _, err := d.Service.Decide(t.Context(), approver, asked["approval_id"].(string), true, ""); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	again := run(t, srv, `{"code":"x = 41"}`)
	if n := of(again, "number_of_executions"); n == nil || n["execution_count"] != float64(1) || of(again, "error") != nil {
		t.Errorf("the same code, once approved: got %v, want the first cell's end", again)
	}
	ex, err := d.Service.Wait(t.Context(), agent, asked["execution_id"].(string), time.Minute)
	if err != nil || ex.Status != model.StatusSucceeded {
		t.Fatalf("the approved cell: %+v, %v", ex, err)
	}

	for _, approve := range []bool{true, false} {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		res := execute(t, ctx, srv, `{"code":"x + 1"}`)
		dec := json.NewDecoder(res.Body)
		var first map[string]any
		if err := dec.Decode(&first); err != nil || first["type"] != "approval_required" {
			t.Fatalf("got %v, %v; want approval_required first", first, err)
		}
		if _, _, err := d.Service.Decide(t.Context(), approver, first["approval_id"].(string), approve, "test"); err != nil {
			t.Fatalf("Decide: %v", err)
		}
		var rest []map[string]any
		var end error
		for {
			var m map[string]any
			if end = dec.Decode(&m); end != nil {
				break
			}
			if m["type"] != "keepalive" {
				rest = append(rest, m)
			}
		}
		// A denied cell's stream is cut, so that the SDK raises.
		if (end == io.EOF) != approve {
			t.Errorf("approve %v: the stream ended with %v", approve, end)
		}
		res.Body.Close()
		cancel()
		r, e := of(rest, "result"), of(rest, "error")
		switch {
		case approve && (r == nil || r["text"] != "42" || e != nil):
			t.Errorf("approved while waiting: got %v", rest)
		case !approve && (r != nil || e == nil || e["name"] != "ApprovalDenied"):
			t.Errorf("denied: got %v", rest)
		}
	}
	// The cells that ran were charged 2 credits, the denied one nothing.
	charged := map[string][]int64{}
	for _, c := range toolCalls(t, d, ws.Agent) {
		charged[string(c.Status)] = append(charged[string(c.Status)], c.CreditsCharged)
	}
	if fmt.Sprint(charged["succeeded"]) != "[2 2]" || fmt.Sprint(charged["denied"]) != "[0]" {
		t.Errorf("got the charges %v", charged)
	}
}
