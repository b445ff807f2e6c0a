package mcp_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/internal/daemontest"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/mcp"
	"github.com/stockade-sh/stockade/model"
)

// transport is one way an MCP client reaches Stockade's tools.
type transport struct {
	name string
	// daemon starts the daemon the tools talk to, with the MCP options o
	// where the transport takes them from the daemon (/mcp).
	daemon func(t *testing.T, svc capability.ServiceOptions, o mcp.Options) *daemontest.Daemon
	// connect connects the Go SDK's client with options co to the tools
	// acting with key, with the MCP options o where the transport takes
	// them from the client's side.
	connect func(t *testing.T, d *daemontest.Daemon, key string, o mcp.Options, co *sdk.ClientOptions) *sdk.ClientSession
}

func plainDaemon(t *testing.T, svc capability.ServiceOptions, _ mcp.Options) *daemontest.Daemon {
	return daemontest.Start(t, daemontest.Options{Service: svc})
}

var transports = []transport{
	{"in-process", plainDaemon, func(t *testing.T, d *daemontest.Daemon, key string, o mcp.Options, co *sdk.ClientOptions) *sdk.ClientSession {
		c, err := client.New(d.URL, key)
		if err != nil {
			t.Fatal(err)
		}
		o.BaseURL = c.URL()
		st, ct := sdk.NewInMemoryTransports()
		ss, err := mcp.New(c, o).Connect(t.Context(), st, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ss.Close() })
		return connect(t, ct, co)
	}},
	{"stdio", plainDaemon, func(t *testing.T, d *daemontest.Daemon, key string, o mcp.Options, co *sdk.ClientOptions) *sdk.ClientSession {
		args := []string{"mcp", "--url", d.URL, "--key", key}
		if o.ApprovalWait > 0 {
			args = append(args, "--approval-wait", o.ApprovalWait.String())
		}
		return connect(t, &sdk.CommandTransport{Command: exec.Command(testenv.Build(t, "./cmd/stockade"), args...)}, co)
	}},
	// Streamable HTTP with sessions: the versions before 2026-07-28.
	{"http", httpDaemon, func(t *testing.T, d *daemontest.Daemon, key string, _ mcp.Options, co *sdk.ClientOptions) *sdk.ClientSession {
		hc := &http.Client{Transport: bearer{key: key}}
		return connectAt(t, &sdk.StreamableClientTransport{Endpoint: d.URL + "/mcp", HTTPClient: hc}, co, legacyProtocol)
	}},
	// Stateless streamable HTTP: 2026-07-28, the SDK client's default.
	{"http-stateless", httpDaemon, func(t *testing.T, d *daemontest.Daemon, key string, _ mcp.Options, co *sdk.ClientOptions) *sdk.ClientSession {
		hc := &http.Client{Transport: bearer{key: key}}
		cs := connect(t, &sdk.StreamableClientTransport{Endpoint: d.URL + "/mcp", HTTPClient: hc}, co)
		if v := cs.InitializeResult().ProtocolVersion; v != mcp.StatelessProtocol || cs.ID() != "" {
			t.Fatalf("connecting: got version %s, session %q; want %s without a session", v, cs.ID(), mcp.StatelessProtocol)
		}
		return cs
	}},
}

// legacyProtocol is the newest MCP version with sessions.
const legacyProtocol = "2025-11-25"

func httpDaemon(t *testing.T, svc capability.ServiceOptions, o mcp.Options) *daemontest.Daemon {
	return daemontest.Start(t, daemontest.Options{Service: svc, API: api.Options{MCP: o}})
}

// bearer sends its key as the bearer token of each request.
type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

func connect(t *testing.T, tr sdk.Transport, co *sdk.ClientOptions) *sdk.ClientSession {
	t.Helper()
	return connectAt(t, tr, co, "")
}

// connectAt connects as connect does, asking for MCP version v (empty:
// the SDK's newest).
func connectAt(t *testing.T, tr sdk.Transport, co *sdk.ClientOptions, v string) *sdk.ClientSession {
	t.Helper()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "stockade-test", Version: "1"}, co).Connect(t.Context(), tr, &sdk.ClientSessionOptions{ProtocolVersion: v})
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// call calls a tool, failing t on a protocol error (a tool error is a
// result).
func call(t *testing.T, cs *sdk.ClientSession, name string, args any, meta sdk.Meta) *sdk.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args, Meta: meta})
	if err != nil {
		t.Fatalf("calling %s: %v", name, err)
	}
	return res
}

func text(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
			b.WriteString("\n")
		}
	}
	return b.String()
}

// output decodes a result's structured content.
func output(t *testing.T, res *sdk.CallToolResult) mcp.RunOutput {
	t.Helper()
	var out mcp.RunOutput
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return out
}

// want42 checks the result of print(6*7): stdout first, then success.
func want42(t *testing.T, res *sdk.CallToolResult) {
	t.Helper()
	if res.IsError {
		t.Fatalf("got a tool error %q, want 42", text(res))
	}
	if tc, ok := res.Content[0].(*sdk.TextContent); !ok || tc.Text != "42\n" {
		t.Errorf("first content: got %#v, want the text 42", res.Content[0])
	}
	out := output(t, res)
	if out.Status != client.StatusSucceeded || out.ExitCode == nil || *out.ExitCode != 0 || out.ExecutionID == "" {
		t.Errorf("structured content: got %+v, want succeeded with exit code 0", out)
	}
}

func wantError(t *testing.T, res *sdk.CallToolResult, parts ...string) {
	t.Helper()
	if !res.IsError {
		t.Fatalf("got a result %q, want a tool error", text(res))
	}
	for _, p := range parts {
		if !strings.Contains(text(res), p) {
			t.Errorf("tool error: got %q, want it to mention %q", text(res), p)
		}
	}
}

var print42 = map[string]any{"language": "python", "code": "print(6*7)"}

// approveWhenAsked approves the first pending request of the workspace
// with the approver's key, as a human on the console would; deny denies.
func decideWhenAsked(t *testing.T, d *daemontest.Daemon, ws daemontest.Workspace, approve bool) {
	c, err := client.New(d.URL, ws.Approver)
	if err != nil {
		t.Error(err)
		return
	}
	for range 1200 {
		p, err := c.ListApprovals(t.Context(), client.ApprovalFilter{Status: client.ApprovalPending})
		if err == nil && len(p.Items) > 0 {
			decide(t, c, p.Items[0].ID, approve)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Error("no approval request appeared")
}

func decide(t *testing.T, c *client.Client, id string, approve bool) {
	var err error
	if approve {
		_, err = c.Approve(t.Context(), id, "")
	} else {
		_, err = c.Deny(t.Context(), id, "no")
	}
	if err != nil {
		t.Errorf("deciding %s: %v", id, err)
	}
}

func TestTools(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			d := tr.daemon(t, capability.ServiceOptions{}, mcp.Options{ApprovalWait: time.Second})
			open := d.Workspace(t, daemontest.NoApproval, 100)
			gated := d.Workspace(t, nil, 100)
			broke := d.Workspace(t, daemontest.NoApproval, 0)
			pythonOnly := d.Workspace(t, func(p *model.Policy) { p.Approval = model.ApprovalNone; p.Runtimes = []string{"python"} }, 100)
			session := func(t *testing.T, ws daemontest.Workspace, co *sdk.ClientOptions) *sdk.ClientSession {
				return tr.connect(t, d, ws.Agent, mcp.Options{ApprovalWait: time.Second}, co)
			}

			t.Run("list", func(t *testing.T) {
				res, err := session(t, open, nil).ListTools(t.Context(), nil)
				if err != nil {
					t.Fatal(err)
				}
				var names []string
				for _, tl := range res.Tools {
					names = append(names, tl.Name)
					if tl.Name == "run_code" {
						b, _ := json.Marshal(tl.InputSchema)
						if !strings.Contains(string(b), `"enum":["python","node","shell"]`) || tl.OutputSchema == nil {
							t.Errorf("run_code's schemas: got input %s, output %v; want the languages and an output schema", b, tl.OutputSchema)
						}
					}
				}
				slices.Sort(names)
				want := []string{"close_session", "create_session", "download_file", "fork_session", "list_files", "list_templates", "pause_session", "resume_session", "run_cell", "run_code", "snapshot_session", "upload_file", "wait_for_approval", "wait_for_cell"}
				if !slices.Equal(names, want) {
					t.Errorf("tools: got %v, want %v", names, want)
				}
			})
			t.Run("run_code with progress", func(t *testing.T) {
				var mu sync.Mutex
				var notes []string
				cs := session(t, open, &sdk.ClientOptions{ProgressNotificationHandler: func(_ context.Context, r *sdk.ProgressNotificationClientRequest) {
					mu.Lock()
					notes = append(notes, r.Params.Message)
					mu.Unlock()
				}})
				want42(t, call(t, cs, "run_code", print42, sdk.Meta{"progressToken": "p1"}))
				mu.Lock()
				defer mu.Unlock()
				if !slices.Contains(notes, "stdout: 42\n") {
					t.Errorf("progress notes: got %q, want the output as it came", notes)
				}
			})
			t.Run("a program that fails is a result", func(t *testing.T) {
				res := call(t, session(t, open, nil), "run_code", map[string]any{"language": "shell", "code": "echo oops >&2; exit 3", "timeout": 5}, nil)
				out := output(t, res)
				if res.IsError || out.Status != client.StatusFailed || out.ExitCode == nil || *out.ExitCode != 3 || !strings.Contains(text(res), "stderr:\noops") {
					t.Errorf("got %+v %q (error %v), want failed with exit code 3 and the stderr", out, text(res), res.IsError)
				}
			})
			for _, tc := range []struct {
				name  string
				ws    daemontest.Workspace
				args  map[string]any
				parts []string
			}{
				{"unknown language", open, map[string]any{"language": "ruby", "code": "puts 1"}, []string{"python", "node", "shell"}},
				{"insufficient credits", broke, print42, []string{"insufficient credits", "credits grant"}},
				{"refused by policy", pythonOnly, map[string]any{"language": "node", "code": "1"}, []string{"refused by the workspace's policy", "node"}},
				{"timeout out of range", open, map[string]any{"language": "python", "code": "1", "timeout": 100000}, []string{"timeout"}},
			} {
				t.Run(tc.name, func(t *testing.T) {
					wantError(t, call(t, session(t, tc.ws, nil), "run_code", tc.args, nil), tc.parts...)
				})
			}
			t.Run("pending, then wait_for_approval", func(t *testing.T) {
				cs := session(t, gated, nil)
				res := call(t, cs, "run_code", print42, nil)
				out := output(t, res)
				if res.IsError || out.Status != client.StatusAwaitingApproval || !strings.HasPrefix(out.ApprovalID, "apr_") ||
					!strings.Contains(out.ApprovalURL, "/ui/approvals/"+out.ApprovalID) || out.ApprovalExpiresAt == nil {
					t.Fatalf("got %+v %q, want approval pending with its id, page and expiry", out, text(res))
				}
				if !strings.Contains(text(res), "wait_for_approval") || !strings.Contains(text(res), out.ExecutionID) {
					t.Errorf("text: got %q, want it to say how to continue", text(res))
				}
				again := call(t, cs, "wait_for_approval", map[string]any{"execution_id": out.ExecutionID}, nil)
				if o := output(t, again); o.Status != client.StatusAwaitingApproval {
					t.Errorf("waiting again undecided: got %+v, want still pending", o)
				}
				c, _ := client.New(d.URL, gated.Approver)
				decide(t, c, out.ApprovalID, true)
				want42(t, call(t, cs, "wait_for_approval", map[string]any{"execution_id": out.ExecutionID}, nil))
			})
			t.Run("url elicitation", func(t *testing.T) {
				complete := make(chan string, 1)
				c, _ := client.New(d.URL, gated.Approver)
				cs := session(t, gated, &sdk.ClientOptions{
					Capabilities: &sdk.ClientCapabilities{Elicitation: &sdk.ElicitationCapabilities{URL: &sdk.URLElicitationCapabilities{}}},
					ElicitationHandler: func(_ context.Context, r *sdk.ElicitRequest) (*sdk.ElicitResult, error) {
						prefix := d.URL + "/ui/approvals/"
						if r.Params.Mode != "url" || !strings.HasPrefix(r.Params.URL, prefix) || r.Params.ElicitationID == "" {
							t.Errorf("elicitation: got %+v, want the approval page below %s", r.Params, prefix)
						}
						decide(t, c, strings.TrimPrefix(r.Params.URL, prefix), true)
						return &sdk.ElicitResult{Action: "accept"}, nil
					},
					ElicitationCompleteHandler: func(_ context.Context, r *sdk.ElicitationCompleteNotificationRequest) {
						complete <- r.Params.ElicitationID
					},
				})
				res := call(t, cs, "run_code", print42, nil)
				want42(t, res)
				select {
				case id := <-complete:
					if id != output(t, res).ApprovalID {
						t.Errorf("elicitation complete: got %q, want %q", id, output(t, res).ApprovalID)
					}
				case <-time.After(10 * time.Second):
					t.Error("no notifications/elicitation/complete")
				}
			})
			t.Run("url elicitation, denied", func(t *testing.T) {
				c, _ := client.New(d.URL, gated.Approver)
				cs := session(t, gated, &sdk.ClientOptions{
					Capabilities: &sdk.ClientCapabilities{Elicitation: &sdk.ElicitationCapabilities{URL: &sdk.URLElicitationCapabilities{}}},
					ElicitationHandler: func(_ context.Context, r *sdk.ElicitRequest) (*sdk.ElicitResult, error) {
						decide(t, c, r.Params.ElicitationID, false)
						return &sdk.ElicitResult{Action: "accept"}, nil
					},
				})
				wantError(t, call(t, cs, "run_code", print42, nil), "denied", "did not run")
			})
			t.Run("form elicitation, declined", func(t *testing.T) {
				cs := session(t, gated, &sdk.ClientOptions{
					Capabilities: &sdk.ClientCapabilities{Elicitation: &sdk.ElicitationCapabilities{Form: &sdk.FormElicitationCapabilities{}}},
					ElicitationHandler: func(_ context.Context, r *sdk.ElicitRequest) (*sdk.ElicitResult, error) {
						if r.Params.Mode != "form" || !strings.Contains(r.Params.Message, "/ui/approvals/apr_") {
							t.Errorf("elicitation: got %+v, want a form naming the approval page", r.Params)
						}
						return &sdk.ElicitResult{Action: "decline"}, nil
					},
				})
				res := call(t, cs, "run_code", print42, nil)
				if out := output(t, res); res.IsError || out.Status != client.StatusAwaitingApproval {
					t.Errorf("got %+v %q, want approval pending", out, text(res))
				}
			})
		})
	}
}

// A decision made elsewhere ends a call's wait for it; an approval that
// expires ends it too.
func TestApprovalWait(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			o := mcp.Options{ApprovalWait: 2 * time.Minute}
			d := tr.daemon(t, capability.ServiceOptions{ApprovalTTL: 3 * time.Second}, o)
			ws := d.Workspace(t, nil, 100)
			cs := tr.connect(t, d, ws.Agent, o, nil)
			t.Run("approved", func(t *testing.T) {
				go decideWhenAsked(t, d, ws, true)
				want42(t, call(t, cs, "run_code", print42, nil))
			})
			t.Run("expired", func(t *testing.T) {
				wantError(t, call(t, cs, "run_code", print42, nil), "expired", "run_code again")
			})
		})
	}
}

func TestAtCapacity(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			d := tr.daemon(t, capability.ServiceOptions{MaxConcurrent: 1, MaxQueue: -1}, mcp.Options{})
			ws := d.Workspace(t, daemontest.NoApproval, 100)
			c, _ := client.New(d.URL, ws.Agent)
			s, err := c.StreamExecution(t.Context(), client.ExecutionRequest{Runtime: "shell", Code: "sleep 30"})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if ev, err := s.Next(); err != nil {
				t.Fatal(err)
			} else if _, ok := ev.(*client.Started); !ok {
				t.Fatalf("got %T, want the long run started", ev)
			}
			cs := tr.connect(t, d, ws.Agent, mcp.Options{}, nil)
			wantError(t, call(t, cs, "run_code", print42, nil), "at capacity", "retry after 1s")
		})
	}
}

// An MCP session over /mcp belongs to the key that started it: another
// key's request of it is refused, and so is every request without a valid
// key, before the MCP handler sees it.
func TestHTTPSessionBoundToKey(t *testing.T) {
	d := daemontest.Start(t, daemontest.Options{})
	a, b := d.Workspace(t, daemontest.NoApproval, 10), d.Workspace(t, daemontest.NoApproval, 10)
	post := func(key, session, body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), "POST", d.URL+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	init := post(a.Agent, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	session := init.Header.Get("Mcp-Session-Id")
	if init.StatusCode != http.StatusOK || session == "" {
		t.Fatalf("initialize: got %d, session %q; want 200 and a session", init.StatusCode, session)
	}
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	for _, tc := range []struct {
		name string
		key  string
		want int
	}{
		{"its key", a.Agent, http.StatusOK},
		{"another workspace's key", b.Agent, http.StatusForbidden},
		{"no key", "", http.StatusUnauthorized},
		{"a bad key", "sk_nope", http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := post(tc.key, session, list).StatusCode; got != tc.want {
				t.Errorf("got %d, want %d", got, tc.want)
			}
		})
	}
}

// cellOutput decodes a run_cell result's structured content.
func cellOutput(t *testing.T, res *sdk.CallToolResult) mcp.CellOutput {
	t.Helper()
	var out mcp.CellOutput
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return out
}

// TestSessionTools drives a session through the session tools over each
// transport: state kept between cells, an exception as a result, files in
// and out, a closed session refused in words an agent can act on.
func TestSessionTools(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			d := tr.daemon(t, capability.ServiceOptions{}, mcp.Options{ApprovalWait: time.Second})
			ws := d.Workspace(t, daemontest.NoApproval, 100)
			cs := tr.connect(t, d, ws.Agent, mcp.Options{ApprovalWait: time.Second}, nil)

			res := call(t, cs, "create_session", map[string]any{"language": "python"}, nil)
			if res.IsError {
				t.Fatalf("create_session: got a tool error %q", text(res))
			}
			var ss mcp.SessionOutput
			b, _ := json.Marshal(res.StructuredContent)
			if err := json.Unmarshal(b, &ss); err != nil || ss.SessionID == "" || ss.State != "active" {
				t.Fatalf("create_session: got %s (%v), want an active session's id", b, err)
			}
			cell := func(code string) *sdk.CallToolResult {
				return call(t, cs, "run_cell", map[string]any{"session_id": ss.SessionID, "code": code}, nil)
			}
			if res := cell("x = 6*7\nprint('set')"); res.IsError || text(res) == "" || !strings.HasPrefix(text(res), "set\n") {
				t.Fatalf("first cell: got %q (error %v), want its stdout set", text(res), res.IsError)
			}
			res = cell("x")
			if out := cellOutput(t, res); res.IsError || out.Status != client.StatusSucceeded || !strings.Contains(text(res), "42") {
				t.Errorf("second cell: got %q, %+v; want the value 42 of x, set by the first", text(res), out)
			}
			res = cell("1/0")
			if out := cellOutput(t, res); res.IsError || out.Status != client.StatusFailed || out.ErrorName != "ZeroDivisionError" || !strings.Contains(text(res), "Traceback") {
				t.Errorf("a cell that raises: got %q, %+v; want a result (not a tool error) with ZeroDivisionError and its traceback", text(res), out)
			}

			res = call(t, cs, "upload_file", map[string]any{"session_id": ss.SessionID, "path": "data.csv", "content": "a,b\n1,2\n3,4\n"}, nil)
			if res.IsError {
				t.Fatalf("upload_file: got a tool error %q", text(res))
			}
			if res := cell("open('/workspace/data.csv').read().count('\\n')"); !strings.Contains(text(res), "3") {
				t.Errorf("a cell reading the uploaded file: got %q, want 3 lines", text(res))
			}
			cell("open('/workspace/out.bin', 'wb').write(bytes(range(256)))")
			res = call(t, cs, "list_files", map[string]any{"session_id": ss.SessionID}, nil)
			if res.IsError || !strings.Contains(text(res), "data.csv") || !strings.Contains(text(res), "out.bin") {
				t.Errorf("list_files: got %q, want data.csv and out.bin", text(res))
			}
			res = call(t, cs, "download_file", map[string]any{"session_id": ss.SessionID, "path": "out.bin"}, nil)
			var f mcp.FileOutput
			b, _ = json.Marshal(res.StructuredContent)
			_ = json.Unmarshal(b, &f)
			if data, err := base64.StdEncoding.DecodeString(f.Content); res.IsError || err != nil || f.Encoding != "base64" || len(data) != 256 || data[255] != 255 {
				t.Errorf("download_file of a binary file: got %s (error %v), want its 256 bytes in base64", b, res.IsError)
			}
			res = call(t, cs, "download_file", map[string]any{"session_id": ss.SessionID, "path": "../etc/passwd"}, nil)
			wantError(t, res, "invalid request")

			res = call(t, cs, "close_session", map[string]any{"session_id": ss.SessionID}, nil)
			if res.IsError {
				t.Fatalf("close_session: got a tool error %q", text(res))
			}
			wantError(t, cell("x"), "ended")
		})
	}
}

// TestHTTPSessionsPerKey checks that /mcp keeps at most
// api.Options.MCPSessionsPerKey sessions of one key open: one more ends
// the key's oldest, whose client then finds it gone, and another key's
// are not counted.
func TestHTTPSessionsPerKey(t *testing.T) {
	d := daemontest.Start(t, daemontest.Options{API: api.Options{MCPSessionsPerKey: 2}})
	one, other := d.Workspace(t, daemontest.NoApproval, 10), d.Workspace(t, daemontest.NoApproval, 10)
	dial := func(key string) *sdk.ClientSession {
		t.Helper()
		tr := &sdk.StreamableClientTransport{Endpoint: d.URL + "/mcp", HTTPClient: &http.Client{Transport: bearer{key: key}}}
		return connectAt(t, tr, nil, legacyProtocol)
	}
	works := func(cs *sdk.ClientSession) error {
		_, err := cs.ListTools(t.Context(), nil)
		return err
	}
	first, second := dial(one.Agent), dial(one.Agent)
	elsewhere := dial(other.Agent)
	// A request that starts no session (the SDK refuses its media type)
	// ends none.
	req, err := http.NewRequestWithContext(t.Context(), "POST", d.URL+"/mcp", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "text/plain")
	if resp, err := (&http.Client{Transport: bearer{key: one.Agent}}).Do(req); err != nil || resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("a POST of text/plain: got %v, %v; want 415", resp, err)
	} else {
		resp.Body.Close()
	}
	if err := works(first); err != nil {
		t.Fatalf("the oldest session after a request that started none: %v", err)
	}
	third := dial(one.Agent)
	if err := works(first); err == nil {
		t.Errorf("the oldest session of a key past its bound: still served, want it ended")
	}
	for name, cs := range map[string]*sdk.ClientSession{"second": second, "third": third, "another key's": elsewhere} {
		if err := works(cs); err != nil {
			t.Errorf("the %s session: %v", name, err)
		}
	}
}
