package mcp_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/internal/daemontest"
	"github.com/stockade-sh/stockade/mcp"
)

// rpc posts one 2026-07-28 request to /mcp as a stateless client sends
// it (its version, client info and capabilities in _meta and the
// headers) and returns the result, or the JSON-RPC error's message.
func rpc(t *testing.T, url, key, method string, params map[string]any, tasks bool) (map[string]any, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(statelessRequest(t.Context(), url, key, method, params, tasks))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if id := resp.Header.Get("Mcp-Session-Id"); id != "" {
		t.Errorf("%s: answered with session %q, want none", method, id)
	}
	var msg struct {
		Result map[string]any
		Error  *struct{ Message string }
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	var raw strings.Builder
	for sc.Scan() {
		line := sc.Text()
		raw.WriteString(line + "\n")
		if data, ok := strings.CutPrefix(line, "data:"); ok && strings.Contains(data, `"id":1`) {
			if err := json.Unmarshal([]byte(data), &msg); err != nil {
				t.Fatalf("%s: decoding %q: %v", method, data, err)
			}
		} else if strings.HasPrefix(line, "{") {
			_ = json.Unmarshal([]byte(line), &msg)
		}
	}
	if msg.Error != nil {
		return nil, msg.Error.Message
	}
	if msg.Result == nil {
		t.Fatalf("%s: no answer (HTTP %d): %s", method, resp.StatusCode, raw.String())
	}
	return msg.Result, ""
}

// statelessRequest is the POST of one 2026-07-28 request, as rpc sends
// it, with ctx.
func statelessRequest(ctx context.Context, url, key, method string, params map[string]any, tasks bool) *http.Request {
	caps := map[string]any{}
	if tasks {
		caps["extensions"] = map[string]any{mcp.TasksExtension: map[string]any{}}
	}
	params["_meta"] = map[string]any{
		"io.modelcontextprotocol/protocolVersion":    mcp.StatelessProtocol,
		"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "wire-test", "version": "1"},
		"io.modelcontextprotocol/clientCapabilities": caps,
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	req, _ := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", mcp.StatelessProtocol)
	req.Header.Set("Mcp-Method", method)
	for _, k := range []string{"name", "taskId"} {
		if v, ok := params[k].(string); ok {
			req.Header.Set("Mcp-Name", v)
		}
	}
	return req
}

// TestTaskWire drives a task on the wire: an approval-gated run_code
// with the Tasks extension answers with a working task at once,
// tasks/get reads it, tasks/cancel cancels it (and its approval
// request), and it reads as cancelled after; another workspace's key
// can neither read nor cancel it; a client without the extension gets no
// task, and unknown task ids are refused.
func TestTaskWire(t *testing.T) {
	d := daemontest.Start(t, daemontest.Options{API: api.Options{MCP: mcp.Options{ApprovalWait: time.Second}}})
	ws := d.Workspace(t, nil, 100)
	url := d.URL + "/mcp"
	call := map[string]any{"name": "run_code", "arguments": map[string]any{"language": "python", "code": "print(1)"}}

	res, msg := rpc(t, url, ws.Agent, "tools/call", call, true)
	id, _ := res["taskId"].(string)
	if msg != "" || res["resultType"] != "task" || res["status"] != "working" || !strings.HasPrefix(id, "code:ex_") {
		t.Fatalf("tools/call: got %v %q, want a working task", res, msg)
	}
	if m, _ := res["statusMessage"].(string); !strings.Contains(m, "awaiting approval") {
		t.Errorf("the task's status message: got %q, want it to say it awaits approval", m)
	}
	got, msg := rpc(t, url, ws.Agent, "tasks/get", map[string]any{"taskId": id}, true)
	if msg != "" || got["resultType"] != "complete" || got["status"] != "working" || got["taskId"] != id {
		t.Fatalf("tasks/get: got %v %q, want the task working", got, msg)
	}
	if res["createdAt"] != got["createdAt"] || res["createdAt"] == nil {
		t.Errorf("createdAt: the handle says %v, tasks/get %v; want the execution's in both", res["createdAt"], got["createdAt"])
	}
	// Another workspace's key can neither read nor cancel the task.
	other := d.Workspace(t, nil, 100)
	if _, msg := rpc(t, url, other.Agent, "tasks/get", map[string]any{"taskId": id}, true); msg == "" {
		t.Errorf("tasks/get of another workspace's task: answered, want an error")
	}
	if _, msg := rpc(t, url, other.Agent, "tasks/cancel", map[string]any{"taskId": id}, true); msg == "" {
		t.Errorf("tasks/cancel of another workspace's task: answered, want an error")
	}
	if got, msg := rpc(t, url, ws.Agent, "tasks/get", map[string]any{"taskId": id}, true); msg != "" || got["status"] != "working" {
		t.Errorf("tasks/get after another workspace's tasks/cancel: got %v %q, want the task still working", got, msg)
	}
	if _, msg := rpc(t, url, ws.Agent, "tasks/cancel", map[string]any{"taskId": id}, true); msg != "" {
		t.Fatalf("tasks/cancel: %s", msg)
	}
	got, msg = rpc(t, url, ws.Agent, "tasks/get", map[string]any{"taskId": id}, true)
	if msg != "" || got["status"] != "cancelled" {
		t.Errorf("tasks/get after tasks/cancel: got %v %q, want cancelled", got, msg)
	}
	c, _ := client.New(d.URL, ws.Approver)
	if p, err := c.ListApprovals(t.Context(), client.ApprovalFilter{Status: client.ApprovalPending}); err != nil || len(p.Items) != 0 {
		t.Errorf("pending approvals after the cancel: got %v, %v; want none", p, err)
	}

	// Without the extension: the wait path, bounded by the approval wait.
	res, msg = rpc(t, url, ws.Agent, "tools/call", call, false)
	if msg != "" || res["resultType"] != "complete" || res["taskId"] != nil {
		t.Errorf("tools/call without the extension: got %v %q, want a complete result", res, msg)
	}

	for _, bad := range []string{"nope", "code:ex_none", id[:5] + "x/y"} {
		if _, msg := rpc(t, url, ws.Agent, "tasks/get", map[string]any{"taskId": bad}, true); msg == "" {
			t.Errorf("tasks/get %q: answered, want an error", bad)
		}
	}
}

// TestTaskWireCell runs an approval-gated run_cell as a task: created at
// once, completed with the cell's output once approved through the API.
func TestTaskWireCell(t *testing.T) {
	d := daemontest.Start(t, daemontest.Options{API: api.Options{MCP: mcp.Options{ApprovalWait: time.Second}}})
	ws := d.Workspace(t, nil, 100)
	url := d.URL + "/mcp"
	agent, _ := client.New(d.URL, ws.Agent)
	approver, _ := client.New(d.URL, ws.Approver)
	ss, err := agent.CreateSession(t.Context(), client.SessionRequest{Runtime: "python"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agent.CloseSession(t.Context(), ss.ID) })
	res, msg := rpc(t, url, ws.Agent, "tools/call", map[string]any{"name": "run_cell",
		"arguments": map[string]any{"session_id": ss.ID, "code": "x = 6*7\nprint(x)"}}, true)
	id, _ := res["taskId"].(string)
	if msg != "" || res["resultType"] != "task" || !strings.HasPrefix(id, "cell:ex_") {
		t.Fatalf("tools/call run_cell: got %v %q, want a task", res, msg)
	}
	p, err := approver.ListApprovals(t.Context(), client.ApprovalFilter{Status: client.ApprovalPending})
	if err != nil || len(p.Items) != 1 {
		t.Fatalf("pending approvals: got %v, %v; want the cell's", p, err)
	}
	decide(t, approver, p.Items[0].ID, true)
	var got map[string]any
	for range 300 {
		if got, msg = rpc(t, url, ws.Agent, "tasks/get", map[string]any{"taskId": id}, true); msg != "" || got["status"] != "working" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	result, _ := got["result"].(map[string]any)
	b, _ := json.Marshal(result)
	if msg != "" || got["status"] != "completed" || result["isError"] == true || !strings.Contains(string(b), `"text":"42\n"`) {
		t.Fatalf("the cell's task: got %v %q, want completed with 42", got, msg)
	}
	if sc, _ := result["structuredContent"].(map[string]any); sc["session_id"] != ss.ID || sc["status"] != "succeeded" {
		t.Errorf("the cell's structured content: got %v, want session %s, succeeded", sc, ss.ID)
	}
}
