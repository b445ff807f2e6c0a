package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/stockade-sh/stockade/client"
)

// SessionBackend is what the session tools need of Stockade besides
// Backend: the sessions API, as *client.Client has it.
type SessionBackend interface {
	CreateSession(ctx context.Context, req client.SessionRequest) (*client.Session, error)
	CloseSession(ctx context.Context, id string) (*client.Session, error)
	// StreamCell runs a cell and returns its events, as POST
	// /v1/sessions/{id}/exec with Accept: text/event-stream.
	StreamCell(ctx context.Context, id string, req client.CellRequest) (*client.Stream, error)
	// WaitCell returns the cell of execution id once it has ended or wait
	// has passed.
	WaitCell(ctx context.Context, executionID string, wait time.Duration) (*client.Cell, error)
	PutFile(ctx context.Context, id, path string, r io.Reader, size int64) (*client.FileInfo, error)
	GetFile(ctx context.Context, id, path string, w io.Writer, max int64) (*client.FileInfo, error)
	ListFiles(ctx context.Context, id, dir string) ([]client.FileEntry, bool, error)
}

var _ SessionBackend = (*client.Client)(nil)

// MaxDownload bounds what download_file returns in one tool result: the
// file travels in the result's JSON, base64 for a binary one.
const MaxDownload = 8 << 20

// CreateSessionInput is create_session's arguments.
type CreateSessionInput struct {
	Language    string `json:"language" jsonschema:"the session's kernel: python, node or shell"`
	IdleTimeout int64  `json:"idle_timeout,omitempty" jsonschema:"end the session after this many seconds without a cell; the default and the ceiling are the server's"`
	TTL         int64  `json:"ttl,omitempty" jsonschema:"end the session this many seconds after it opened; the default and the ceiling are the server's"`
	Snapshot    string `json:"snapshot,omitempty" jsonschema:"start from this snapshot (a snapshot_session's snapshot_id): its variables, imports and files; language must be the snapshot's"`
}

// SessionOutput is the structured result of create_session and
// close_session.
type SessionOutput struct {
	SessionID     string     `json:"session_id" jsonschema:"the session's id, for run_cell and the file tools"`
	Language      string     `json:"language" jsonschema:"the session's kernel"`
	State         string     `json:"state" jsonschema:"active or ended"`
	Tier          string     `json:"tier,omitempty" jsonschema:"the isolation tier of the session's sandbox"`
	ExpiresAt     time.Time  `json:"expires_at" jsonschema:"when the session ends whatever happens"`
	IdleExpiresAt time.Time  `json:"idle_expires_at" jsonschema:"when the session ends unless a cell runs first"`
	Cells         int        `json:"cells" jsonschema:"the cells run so far"`
	EndedAt       *time.Time `json:"ended_at,omitempty" jsonschema:"when it ended"`
	EndReason     string     `json:"end_reason,omitempty" jsonschema:"why it ended"`
}

// SessionInput names a session.
type SessionInput struct {
	SessionID string `json:"session_id" jsonschema:"the session_id create_session returned"`
}

// RunCellInput is run_cell's arguments.
type RunCellInput struct {
	SessionID string `json:"session_id" jsonschema:"the session_id create_session returned"`
	Code      string `json:"code" jsonschema:"the cell's code, run in the session's kernel, whose variables, imports and files persist"`
	Timeout   int64  `json:"timeout,omitempty" jsonschema:"wall clock limit of the cell in seconds; the default and the ceiling are the workspace policy's"`
}

// CellOutput is the structured result of run_cell (and of
// wait_for_approval for a cell). Its stdout, stderr, value, figures and
// traceback are the result's content.
type CellOutput struct {
	Status          client.ExecutionStatus `json:"status" jsonschema:"succeeded, failed (the cell raised), timed_out, oom_killed, killed, or awaiting_approval"`
	ExecutionID     string                 `json:"execution_id" jsonschema:"the cell's execution in Stockade"`
	SessionID       string                 `json:"session_id,omitempty" jsonschema:"the session the cell ran in"`
	Cell            int                    `json:"cell,omitempty" jsonschema:"the cell's number in its session"`
	ErrorName       string                 `json:"error_name,omitempty" jsonschema:"the exception the cell raised"`
	ErrorValue      string                 `json:"error_value,omitempty" jsonschema:"the exception's message"`
	KernelRestarted bool                   `json:"kernel_restarted" jsonschema:"the kernel was restarted: the session's variables are gone (its files stay)"`
	DurationMS      int64                  `json:"duration_ms,omitempty" jsonschema:"how long the cell ran, in milliseconds"`
	Figures         int                    `json:"figures" jsonschema:"the images among the content"`
	ApprovalID      string                 `json:"approval_id,omitempty" jsonschema:"the approval request an approver must decide"`
	ApprovalURL     string                 `json:"approval_url,omitempty" jsonschema:"where an approver decides"`
}

// UploadInput is upload_file's arguments.
type UploadInput struct {
	SessionID string `json:"session_id" jsonschema:"the session_id create_session returned"`
	Path      string `json:"path" jsonschema:"where to write, relative to /workspace or absolute below it"`
	Content   string `json:"content" jsonschema:"the file's content: text, or base64 when encoding is base64"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"text (the default) or base64"`
}

// PathInput names a file or directory of a session.
type PathInput struct {
	SessionID string `json:"session_id" jsonschema:"the session_id create_session returned"`
	Path      string `json:"path,omitempty" jsonschema:"relative to /workspace or absolute below it; list_files defaults to /workspace"`
}

// FileOutput is the structured result of upload_file and download_file.
type FileOutput struct {
	Path   string `json:"path" jsonschema:"the file's path in the session"`
	Size   int64  `json:"size" jsonschema:"its size in bytes"`
	SHA256 string `json:"sha256,omitempty" jsonschema:"its SHA-256"`
	// Content is the file's text, or its base64 (Encoding base64) when it
	// is not UTF-8 text; download_file only.
	Content  string `json:"content,omitempty" jsonschema:"the file's content (download_file)"`
	Encoding string `json:"encoding,omitempty" jsonschema:"text or base64 (download_file)"`
}

// ListOutput is list_files' structured result.
type ListOutput struct {
	Entries   []client.FileEntry `json:"entries" jsonschema:"the directory's entries"`
	Truncated bool               `json:"truncated" jsonschema:"there were more entries than listed"`
}

func sessionsOf(t *tools) (SessionBackend, bool) {
	sb, ok := t.b.(SessionBackend)
	return sb, ok
}

func addSessionTools(s *sdk.Server, t *tools) bool {
	sb, ok := sessionsOf(t)
	if !ok {
		return false
	}
	in := inputWithLanguages[CreateSessionInput]("create_session")
	sdk.AddTool(s, &sdk.Tool{
		Name:  "create_session",
		Title: "Open a session",
		Description: "Opens a session: a hardened sandbox without network whose kernel (python, node or shell) keeps variables, " +
			"imports and files from one run_cell to the next, and whose /workspace holds files (upload_file, download_file). " +
			"It ends with close_session, after its idle timeout, or at its TTL.",
		InputSchema: in,
		Annotations: closedWorld(),
	}, func(ctx context.Context, _ *sdk.CallToolRequest, in CreateSessionInput) (*sdk.CallToolResult, SessionOutput, error) {
		ss, err := sb.CreateSession(ctx, client.SessionRequest{Runtime: in.Language, IdleTimeoutMS: in.IdleTimeout * 1000, TTLMS: in.TTL * 1000, Snapshot: in.Snapshot})
		if err != nil {
			return nil, SessionOutput{}, failure(err)
		}
		out := sessionOutput(ss)
		return textResult(fmt.Sprintf("Session %s is open (%s on %s); it ends at %s, or at %s unless a cell runs first.",
			ss.ID, ss.Runtime, ss.Tier, ss.ExpiresAt.Format(time.RFC3339), ss.IdleExpiresAt.Format(time.RFC3339))), out, nil
	})
	sdk.AddTool(s, &sdk.Tool{
		Name:  "run_cell",
		Title: "Run a cell in a session",
		Description: "Runs code in a session's kernel, where the variables and imports of earlier cells persist. Returns its " +
			"stdout and stderr, the value of its last expression, its figures as images (python: matplotlib), and the traceback " +
			"of an exception it raised, as content; its status as structured content. A human may have to approve it first; " +
			"see wait_for_cell.",
		Annotations: closedWorld(),
	}, func(ctx context.Context, req *sdk.CallToolRequest, in RunCellInput) (*sdk.CallToolResult, CellOutput, error) {
		return t.runCell(ctx, req, sb, in)
	})
	sdk.AddTool(s, &sdk.Tool{
		Name:  "wait_for_cell",
		Title: "Wait for a cell's approval",
		Description: fmt.Sprintf("Waits (up to %s) for an approver's decision on a run_cell call whose approval is pending, "+
			"then for the cell, and returns what run_cell would have. Call it again while approval is still pending.", t.opts.ApprovalWait),
		Annotations: readOnly(),
	}, func(ctx context.Context, req *sdk.CallToolRequest, in WaitInput) (*sdk.CallToolResult, CellOutput, error) {
		if in.ExecutionID == "" {
			return nil, CellOutput{}, errors.New("execution_id is required: the execution_id of a run_cell result whose approval is pending")
		}
		return t.awaitCell(ctx, req, sb, in.ExecutionID, time.Now().Add(t.opts.ApprovalWait))
	})
	sdk.AddTool(s, &sdk.Tool{
		Name:        "upload_file",
		Title:       "Upload a file into a session",
		Description: "Writes a file into the session's /workspace, where its cells can read it.",
		Annotations: closedWorld(),
	}, func(ctx context.Context, _ *sdk.CallToolRequest, in UploadInput) (*sdk.CallToolResult, FileOutput, error) {
		data := []byte(in.Content)
		switch in.Encoding {
		case "", "text":
		case "base64":
			var err error
			if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
				return nil, FileOutput{}, fmt.Errorf("invalid request: content is not base64: %v", err)
			}
		default:
			return nil, FileOutput{}, fmt.Errorf("invalid request: encoding must be text or base64, got %q", in.Encoding)
		}
		fi, err := sb.PutFile(ctx, in.SessionID, in.Path, bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return nil, FileOutput{}, failure(err)
		}
		return textResult(fmt.Sprintf("Wrote %s (%d bytes).", fi.Path, fi.Size)), FileOutput{Path: fi.Path, Size: fi.Size, SHA256: fi.SHA256}, nil
	})
	sdk.AddTool(s, &sdk.Tool{
		Name:  "download_file",
		Title: "Download a file from a session",
		Description: fmt.Sprintf("Reads a file of the session's /workspace (at most %d MiB): its text as content, or, for an image, "+
			"the image; other binary files as base64 in the structured content.", MaxDownload>>20),
		Annotations: readOnly(),
	}, func(ctx context.Context, _ *sdk.CallToolRequest, in PathInput) (*sdk.CallToolResult, FileOutput, error) {
		var b bytes.Buffer
		fi, err := sb.GetFile(ctx, in.SessionID, in.Path, &b, MaxDownload)
		if err != nil {
			return nil, FileOutput{}, failure(err)
		}
		out := FileOutput{Path: fi.Path, Size: fi.Size, SHA256: fi.SHA256}
		data := b.Bytes()
		if mime := imageType(data); mime != "" {
			out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(data)
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.ImageContent{Data: data, MIMEType: mime}}}, out, nil
		}
		if isText(data) {
			out.Encoding, out.Content = "text", string(data)
			return textResult(string(data)), out, nil
		}
		out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(data)
		return textResult(fmt.Sprintf("%s is a binary file of %d bytes; its base64 is the structured content's content.", fi.Path, fi.Size)), out, nil
	})
	sdk.AddTool(s, &sdk.Tool{
		Name:        "list_files",
		Title:       "List a session's files",
		Description: "Lists a directory of the session's /workspace (default /workspace itself): name, type, size, mode, mtime.",
		Annotations: readOnly(),
	}, func(ctx context.Context, _ *sdk.CallToolRequest, in PathInput) (*sdk.CallToolResult, ListOutput, error) {
		dir := in.Path
		if dir == "" {
			dir = "/workspace"
		}
		entries, truncated, err := sb.ListFiles(ctx, in.SessionID, dir)
		if err != nil {
			return nil, ListOutput{}, failure(err)
		}
		var lines []string
		for _, e := range entries {
			lines = append(lines, fmt.Sprintf("%s\t%s\t%d bytes", e.Type, e.Name, e.Size))
		}
		if len(lines) == 0 {
			lines = append(lines, dir+" is empty")
		}
		if entries == nil {
			entries = []client.FileEntry{}
		}
		return textResult(strings.Join(lines, "\n")), ListOutput{Entries: entries, Truncated: truncated}, nil
	})
	sdk.AddTool(s, &sdk.Tool{
		Name:        "close_session",
		Title:       "Close a session",
		Description: "Ends a session and destroys its sandbox, with its kernel's state and its files.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: jsonschema.Ptr(true), OpenWorldHint: jsonschema.Ptr(false)},
	}, func(ctx context.Context, _ *sdk.CallToolRequest, in SessionInput) (*sdk.CallToolResult, SessionOutput, error) {
		ss, err := sb.CloseSession(ctx, in.SessionID)
		if err != nil {
			return nil, SessionOutput{}, failure(err)
		}
		return textResult(fmt.Sprintf("Session %s ended after %d cell(s).", ss.ID, ss.Cells)), sessionOutput(ss), nil
	})
	return true
}

func sessionOutput(ss *client.Session) SessionOutput {
	return SessionOutput{SessionID: ss.ID, Language: ss.Runtime, State: ss.State, Tier: ss.Tier, ExpiresAt: ss.ExpiresAt,
		IdleExpiresAt: ss.IdleExpiresAt, Cells: ss.Cells, EndedAt: ss.EndedAt, EndReason: ss.EndReason}
}

func textResult(s string) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: s}}}
}

// runCell runs a cell, streaming its output as progress; a cell that
// waits for approval is waited for up to the approval wait, and then
// answered as pending (wait_for_approval goes on).
func (t *tools) runCell(ctx context.Context, req *sdk.CallToolRequest, sb SessionBackend, in RunCellInput) (*sdk.CallToolResult, CellOutput, error) {
	if in.SessionID == "" {
		return nil, CellOutput{}, errors.New("session_id is required: call create_session first")
	}
	streamCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := sb.StreamCell(streamCtx, in.SessionID, client.CellRequest{Code: in.Code, TimeoutMS: in.Timeout * 1000})
	if err != nil {
		return nil, CellOutput{}, failure(err)
	}
	defer s.Close()
	p := newProgress(req)
	var (
		id    string
		bound *time.Timer
		over  = make(chan struct{})
	)
	defer func() {
		if bound != nil {
			bound.Stop()
		}
	}()
	for {
		ev, err := s.Next()
		if err != nil {
			select {
			case <-over:
				return t.pendingCell(ctx, sb, id)
			default:
			}
			if ctx.Err() != nil {
				return nil, CellOutput{}, ctx.Err()
			}
			if id != "" {
				// The stream was cut: the cell goes on; wait for it.
				return t.awaitCell(ctx, req, sb, id, time.Now().Add(t.opts.ApprovalWait))
			}
			return nil, CellOutput{}, failure(err)
		}
		switch e := ev.(type) {
		case *client.ApprovalRequired:
			id = e.Card.ExecutionID
			if t.becomeTask(ctx, taskCell, id, e.Card.ApprovalID) {
				return textResult("Approval is pending; this call is task " + TaskID(taskCell, id) + "."), CellOutput{}, nil
			}
			p.note(ctx, fmt.Sprintf("waiting up to %s for an approver to decide on %s at %s", t.opts.ApprovalWait, e.Card.ApprovalID, t.opts.approvalURL(e.Card.ApprovalID)))
			bound = time.AfterFunc(t.opts.ApprovalWait, func() { close(over); cancel() })
		case *client.Started:
			if bound != nil {
				bound.Stop()
			}
			id = e.ExecutionID
		case *client.Output:
			p.output(ctx, e)
		case *client.Display:
			p.note(ctx, "output: "+e.Output.MimeType)
		case *client.CellEnded:
			return cellResult(&e.Cell)
		case *client.Ended:
			return t.cellNotRun(&e.Execution)
		case *client.StreamError:
			return nil, CellOutput{}, fmt.Errorf("Stockade could not read the outcome of cell %s (%s); call wait_for_cell with it to read it again", id, e.Message)
		}
	}
}

// awaitCell waits for cell execution id as await does for a run.
func (t *tools) awaitCell(ctx context.Context, req *sdk.CallToolRequest, sb SessionBackend, id string, deadline time.Time) (*sdk.CallToolResult, CellOutput, error) {
	p := newProgress(req)
	wait := time.Duration(0)
	for {
		c, err := sb.WaitCell(ctx, id, wait)
		if err != nil {
			return nil, CellOutput{}, failure(err)
		}
		switch {
		case c.Status.Final():
			return t.cellEnded(c)
		case c.Status == client.StatusAwaitingApproval:
			left := time.Until(deadline)
			if left <= 0 {
				return t.pendingCellResult(c)
			}
			wait = min(left, pollWait)
			p.note(ctx, fmt.Sprintf("waiting for an approver to decide on %s", c.ApprovalID))
		default:
			wait = pollWait
			p.note(ctx, "running")
		}
	}
}

// cellEnded is the result of cell c, which has ended: a tool error when
// it never ran.
func (t *tools) cellEnded(c *client.Cell) (*sdk.CallToolResult, CellOutput, error) {
	if c.Status == client.StatusDenied || c.Status == client.StatusApprovalExpired || c.Status == client.StatusLaunchFailed {
		return t.cellNotRun(&client.Execution{ID: c.ExecutionID, Status: c.Status, ApprovalID: c.ApprovalID})
	}
	return cellResult(c)
}

func (t *tools) pendingCell(ctx context.Context, sb SessionBackend, id string) (*sdk.CallToolResult, CellOutput, error) {
	c, err := sb.WaitCell(context.WithoutCancel(ctx), id, 0)
	if err != nil {
		return nil, CellOutput{}, failure(err)
	}
	if c.Status.Final() {
		return cellResult(c)
	}
	return t.pendingCellResult(c)
}

func (t *tools) pendingCellResult(c *client.Cell) (*sdk.CallToolResult, CellOutput, error) {
	out := CellOutput{Status: c.Status, ExecutionID: c.ExecutionID, SessionID: c.SessionID, ApprovalID: c.ApprovalID}
	if c.Status != client.StatusAwaitingApproval {
		return textResult(fmt.Sprintf("Cell %s was approved and is %s; call wait_for_cell with execution_id %q for its result.", c.ExecutionID, c.Status, c.ExecutionID)), out, nil
	}
	out.ApprovalURL = t.opts.approvalURL(c.ApprovalID)
	return textResult(fmt.Sprintf("Approval is pending: an approver must approve request %s at %s before the cell runs. "+
		"Call wait_for_cell with execution_id %q to keep waiting; the session runs no other cell meanwhile.", c.ApprovalID, out.ApprovalURL, c.ExecutionID)), out, nil
}

// cellNotRun is the tool error of a cell that never ran.
func (t *tools) cellNotRun(ex *client.Execution) (*sdk.CallToolResult, CellOutput, error) {
	switch ex.Status {
	case client.StatusDenied:
		return nil, CellOutput{}, fmt.Errorf("an approver denied approval request %s: the cell did not run and was not charged; change what it does before asking again", ex.ApprovalID)
	case client.StatusApprovalExpired:
		return nil, CellOutput{}, fmt.Errorf("approval request %s expired before an approver decided: the cell did not run; call run_cell again to ask anew", ex.ApprovalID)
	}
	why := "no result"
	if ex.Result != nil && ex.Result.Error != "" {
		why = ex.Result.Error
	}
	return nil, CellOutput{}, fmt.Errorf("Stockade could not run the cell (%s); nothing was charged; the session may have ended: check it, or open another", why)
}

// cellResult is the result of a cell that ran: its output as content, an
// exception included (a cell that raised is a result, not a tool error:
// the agent reads the traceback and fixes the code).
func cellResult(c *client.Cell) (*sdk.CallToolResult, CellOutput, error) {
	out := CellOutput{Status: c.Status, ExecutionID: c.ExecutionID, SessionID: c.SessionID, Cell: c.Cell,
		KernelRestarted: c.KernelRestarted, DurationMS: c.DurationMS, ApprovalID: c.ApprovalID}
	var content []sdk.Content
	if c.Stdout != "" {
		content = append(content, &sdk.TextContent{Text: c.Stdout})
	}
	if c.Stderr != "" {
		content = append(content, &sdk.TextContent{Text: "stderr:\n" + c.Stderr})
	}
	for _, o := range c.Outputs {
		switch {
		case strings.HasPrefix(o.MimeType, "image/"):
			b, err := base64.StdEncoding.DecodeString(o.Data)
			if err != nil {
				return nil, CellOutput{}, fmt.Errorf("Stockade sent figure of cell %d undecodable: %v", c.Cell, err)
			}
			content = append(content, &sdk.ImageContent{Data: b, MIMEType: o.MimeType})
			out.Figures++
		case o.MimeType == "text/plain":
			content = append(content, &sdk.TextContent{Text: o.Data})
		}
	}
	line := fmt.Sprintf("cell %d: %s in %d ms", c.Cell, c.Status, c.DurationMS)
	if c.Error != nil {
		out.ErrorName, out.ErrorValue = c.Error.Name, c.Error.Value
		tb := c.Error.Traceback
		if tb == "" {
			tb = c.Error.Name + ": " + c.Error.Value
		}
		content = append(content, &sdk.TextContent{Text: tb})
		line = fmt.Sprintf("cell %d raised %s", c.Cell, c.Error.Name)
	}
	if c.KernelRestarted {
		line += "; the kernel was restarted, so the session's variables are gone (its files stay)"
	}
	for _, cut := range []struct {
		cut  bool
		name string
	}{{c.StdoutTruncated, "stdout"}, {c.StderrTruncated, "stderr"}} {
		if cut.cut {
			line += "; " + cut.name + " was truncated at the output cap"
		}
	}
	content = append(content, &sdk.TextContent{Text: line})
	return &sdk.CallToolResult{Content: content}, out, nil
}

// imageType is the MIME type of an image file Stockade returns as an
// image, or "".
func imageType(b []byte) string {
	switch {
	case bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")):
		return "image/png"
	case bytes.HasPrefix(b, []byte("\xff\xd8\xff")):
		return "image/jpeg"
	}
	return ""
}

// isText reports whether b is UTF-8 text without NUL bytes.
func isText(b []byte) bool {
	return !bytes.ContainsRune(b, 0) && strings.ToValidUTF8(string(b), "\uFFFD") == string(b)
}
