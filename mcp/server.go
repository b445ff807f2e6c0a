// Package mcp is Stockade's Model Context Protocol server: the tools an
// agent calls to run code behind Stockade's policy, approval, credits and
// audit trail. One implementation serves both transports: the tools are
// written against Backend, which the Go client satisfies (stockade mcp,
// over stdio, talking to a daemon with an agent key) and the daemon
// satisfies in process (its /mcp endpoint, streamable HTTP, with the agent
// key as the bearer token).
//
//	c, _ := client.New("http://127.0.0.1:8700", key)
//	s := mcp.New(c, mcp.Options{BaseURL: c.URL()})
//	err := s.Run(ctx, &sdk.StdioTransport{})
//
// The tools are registered from one table, toolTable, each with what it needs
// of the backend: run_code and wait_for_approval need Backend alone. Tools
// that need more (the session tools: create_session, run_cell,
// upload_file, download_file, list_files, close_session) go in the table
// with a small interface of their own (SessionBackend, and the
// wait_for_cell tool), found on the backend by type assertion, so that a
// backend without sessions serves the one-shot tools unchanged.
package mcp

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/errdefs"
)

// Backend is what the one-shot tools need of Stockade, acting as one API
// key: the daemon's API through the Go client (*client.Client), or the
// daemon's own handlers in process.
type Backend interface {
	// StreamExecution admits req and returns its events, as POST
	// /v1/executions with Accept: text/event-stream.
	StreamExecution(ctx context.Context, req client.ExecutionRequest) (*client.Stream, error)
	// GetExecution returns execution id once it has ended or wait has
	// passed, as GET /v1/executions/{id}?wait=.
	GetExecution(ctx context.Context, id string, wait time.Duration) (*client.Execution, error)
}

var _ Backend = (*client.Client)(nil)

// Options configure the server. Zero fields take the defaults noted.
type Options struct {
	// BaseURL is the daemon's URL, which a relative ApprovalURL is
	// resolved against. Nil leaves a relative ApprovalURL relative, and
	// then URL-mode elicitation (which needs an absolute URL) is not used.
	BaseURL *url.URL
	// ApprovalURL is the template of an approval request's page: "{id}" is
	// replaced by the approval id. Empty is config.DefaultMCPApprovalURL.
	ApprovalURL string
	// ApprovalWait bounds the wait for a decision when the client does not
	// support elicitation (or declines to open the page): the tool then
	// answers that approval is pending, and wait_for_approval waits again
	// as long. Zero is config.DefaultMCPApprovalWait.
	ApprovalWait time.Duration
	// Version is the server's version in the MCP handshake; empty is
	// "devel".
	Version string
	// SchemaCache, if set, is shared by servers created for each session,
	// so that the tools' schemas are inferred once.
	SchemaCache *sdk.SchemaCache
}

// Validate checks the options' values.
func (o Options) Validate() error {
	if o.ApprovalWait < 0 {
		return fmt.Errorf("the MCP approval wait must not be negative, got %s: %w", o.ApprovalWait, errdefs.ErrInvalidArgument)
	}
	if o.ApprovalURL != "" {
		if !strings.Contains(o.ApprovalURL, "{id}") {
			return fmt.Errorf("the MCP approval URL %q must contain {id}, the approval id: %w", o.ApprovalURL, errdefs.ErrInvalidArgument)
		}
		if _, err := url.Parse(strings.ReplaceAll(o.ApprovalURL, "{id}", "apr_x")); err != nil {
			return fmt.Errorf("the MCP approval URL %q: %v: %w", o.ApprovalURL, err, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.ApprovalURL == "" {
		o.ApprovalURL = config.DefaultMCPApprovalURL
	}
	if o.ApprovalWait == 0 {
		o.ApprovalWait = config.DefaultMCPApprovalWait
	}
	if o.Version == "" {
		o.Version = "devel"
	}
	return o
}

// approvalURL is the page of approval request id, absolute when the
// template is or BaseURL is set.
func (o Options) approvalURL(id string) string {
	u := strings.ReplaceAll(o.ApprovalURL, "{id}", url.PathEscape(id))
	ref, err := url.Parse(u)
	if err != nil || ref.IsAbs() || o.BaseURL == nil {
		return u
	}
	return o.BaseURL.ResolveReference(ref).String()
}

const instructions = `Stockade runs code in hardened, network-less sandboxes behind a workspace
policy, human approval, credits and an audit trail. run_code runs one
program (python, node or shell) in a fresh sandbox and returns its stdout,
stderr and exit status; nothing persists between calls. When a human must
approve a call first, the result may say that approval is pending: call
wait_for_approval with its execution_id to keep waiting for the decision.
create_session opens a session whose kernel keeps variables, imports and
files from one run_cell to the next (figures come back as images); move
files with upload_file, download_file and list_files, and end it with
close_session.`

// tool is one entry of the tool table: add registers it on s when the
// backend b has what it needs.
type tool struct {
	name string
	add  func(s *sdk.Server, t *tools) bool
}

// toolTable lists the server's tools.
var toolTable = []tool{
	{"run_code", addRunCode},
	{"wait_for_approval", addWaitForApproval},
	{"create_session, run_cell, wait_for_cell, upload_file, download_file, list_files, close_session", addSessionTools},
	{"fork_session, snapshot_session, pause_session, resume_session", addSnapshotTools},
	{"list_templates", addTemplateTools},
}

// inputWithLanguages is T's input schema, inferred, with its language
// property's values the Languages: run_code's and create_session's.
func inputWithLanguages[T any](tool string) *jsonschema.Schema {
	in, err := jsonschema.For[T](nil)
	if err != nil {
		panic("mcp: inferring " + tool + "'s input schema: " + err.Error())
	}
	for _, l := range Languages {
		in.Properties["language"].Enum = append(in.Properties["language"].Enum, l)
	}
	return in
}

// closedWorld annotates a tool that acts on Stockade alone, not on an
// open world of outside services.
func closedWorld() *sdk.ToolAnnotations {
	return &sdk.ToolAnnotations{OpenWorldHint: jsonschema.Ptr(false)}
}

// readOnly annotates a tool that acts on Stockade alone and changes
// nothing.
func readOnly() *sdk.ToolAnnotations {
	return &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: jsonschema.Ptr(false)}
}

// tools is the state the tool handlers share.
type tools struct {
	b    Backend
	opts Options
}

// New returns an MCP server whose tools act through b. Serve it with
// Server.Run (stdio) or an sdk.StreamableHTTPHandler.
func New(b Backend, o Options) *sdk.Server {
	o = o.withDefaults()
	// The SDK's default capabilities (logging), and the Tasks extension.
	// Tools without listChanged: the list never changes, and a
	// subscriptions/listen stream (2026-07-28) that subscribes to nothing
	// ends at once instead of holding a request open.
	caps := &sdk.ServerCapabilities{Logging: &sdk.LoggingCapabilities{}, Tools: &sdk.ToolCapabilities{}}
	caps.AddExtension(TasksExtension, map[string]any{})
	s := sdk.NewServer(&sdk.Implementation{Name: "stockade", Title: "Stockade", Version: o.Version},
		&sdk.ServerOptions{Instructions: instructions, SchemaCache: o.SchemaCache, Capabilities: caps})
	t := &tools{b: b, opts: o}
	for _, tl := range toolTable {
		tl.add(s, t)
	}
	addTasks(s, t)
	s.AddReceivingMiddleware(traceMiddleware)
	return s
}

// ToolSummary is one tool as a listing for people shows it.
type ToolSummary struct {
	Name string
	// Summary is the tool's title, else the first sentence of its
	// description.
	Summary string
}

// Tools lists the tools New serves over b, in the order a client lists
// them, each with its title (or the first sentence of its description).
// It asks a server
// built as New builds it, in memory, so that a list printed elsewhere
// (stockade mcp --help) cannot drift from the tools served. b is not
// called.
func Tools(ctx context.Context, b Backend) ([]ToolSummary, error) {
	list, err := servedTools(ctx, b)
	if err != nil {
		return nil, err
	}
	out := make([]ToolSummary, 0, len(list))
	for _, t := range list {
		sum := t.Title
		if sum == "" {
			sum, _, _ = strings.Cut(t.Description, ". ")
		}
		out = append(out, ToolSummary{Name: t.Name, Summary: sum})
	}
	return out, nil
}

// servedTools lists the tools of a server built as New builds it over b,
// in memory, as a client lists them.
func servedTools(ctx context.Context, b Backend) ([]*sdk.Tool, error) {
	st, ct := sdk.NewInMemoryTransports()
	ss, err := New(b, Options{}).Connect(ctx, st, nil)
	if err != nil {
		return nil, fmt.Errorf("listing the MCP tools: %w", err)
	}
	defer ss.Close()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "stockade-tools", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		return nil, fmt.Errorf("listing the MCP tools: %w", err)
	}
	defer cs.Close()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("listing the MCP tools: %w", err)
	}
	return res.Tools, nil
}
