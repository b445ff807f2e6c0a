package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
)

// SessionRequest asks for a session (POST /v1/sessions).
type SessionRequest struct {
	// Runtime is python, node or shell: the session's kernel.
	Runtime string `json:"runtime"`
	// Tool names the tool to run as; empty is the default tool.
	Tool string `json:"tool,omitempty"`
	// IdleTimeoutMS and TTLMS ask for other lifetimes than the daemon's
	// defaults, within its ceilings; zero takes the defaults.
	IdleTimeoutMS int64 `json:"idle_timeout_ms,omitempty"`
	TTLMS         int64 `json:"ttl_ms,omitempty"`
	// Network is "deny" (the default, also when empty) or "allow".
	Network string `json:"network,omitempty"`
	// IdempotencyKey, if set, makes a retried request return the first
	// session instead of opening another.
	IdempotencyKey string `json:"-"`
}

// Session is a session as the API shows it.
type Session struct {
	ID      string `json:"id"`
	Runtime string `json:"runtime"`
	Tool    string `json:"tool"`
	Tier    string `json:"tier"`
	Driver  string `json:"driver"`
	// State is "active", "paused" or "ended"; EndedAt and EndReason
	// (closed, idle_timeout, ttl, interrupted, failed) are set once it
	// ended, PausedAt and CheckpointBytes while it is paused.
	State           string     `json:"state"`
	Network         string     `json:"network"`
	CreatedAt       time.Time  `json:"created_at"`
	ExpiresAt       time.Time  `json:"expires_at"`
	IdleExpiresAt   time.Time  `json:"idle_expires_at"`
	IdleTimeoutMS   int64      `json:"idle_timeout_ms"`
	EndedAt         *time.Time `json:"ended_at,omitempty"`
	EndReason       string     `json:"end_reason,omitempty"`
	PausedAt        *time.Time `json:"paused_at,omitempty"`
	CheckpointBytes int64      `json:"checkpoint_bytes,omitempty"`
	Cells           int        `json:"cells"`
	// Approval is the approval mode the session's cells are admitted
	// under; ApprovalID the approval that covers them (per_session).
	Approval       string `json:"approval"`
	ApprovalID     string `json:"approval_id,omitempty"`
	WorkspaceBytes int64  `json:"workspace_bytes"`
	Replayed       bool   `json:"replayed,omitempty"`
}

// CellRequest is a cell to run in a session (POST /v1/sessions/{id}/exec).
type CellRequest struct {
	Code  string `json:"code"`
	Stdin string `json:"stdin,omitempty"`
	// TimeoutMS bounds the cell; zero is the tool's limit.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// IdempotencyKey, if set, makes a retried request return the first
	// cell instead of running it again.
	IdempotencyKey string `json:"-"`
}

// Cell is a cell's outcome. Status is the cell's execution status:
// awaiting_approval (then ApprovalID is set and WaitCell waits for it),
// or how it ended (succeeded, failed for a cell that raised, timed_out,
// oom_killed, killed, denied, approval_expired).
type Cell struct {
	ExecutionID     string          `json:"execution_id"`
	SessionID       string          `json:"session_id"`
	Cell            int             `json:"cell"`
	Status          ExecutionStatus `json:"status"`
	Stdout          string          `json:"stdout"`
	Stderr          string          `json:"stderr"`
	StdoutTruncated bool            `json:"stdout_truncated"`
	StderrTruncated bool            `json:"stderr_truncated"`
	// Outputs are the cell's rich outputs: text/plain for the value of its
	// last expression, image/png (Data base64) for a figure.
	Outputs        []CellOutput `json:"outputs"`
	OutputsDropped int          `json:"outputs_dropped,omitempty"`
	// Error is the exception the cell raised, or why it could not run.
	Error *CellError `json:"error,omitempty"`
	// KernelRestarted says the kernel was restarted (after a timeout that
	// an interrupt did not end, or an OOM kill): its state is gone.
	KernelRestarted bool  `json:"kernel_restarted"`
	DurationMS      int64 `json:"duration_ms"`
	// EndedBy is set when Stockade ended the cell before its code did
	// (status killed): cancel, session_ended or daemon_shutdown.
	EndedBy  string `json:"ended_by,omitempty"`
	Credits  int64  `json:"credits"`
	Replayed bool   `json:"replayed,omitempty"`
	// ApprovalID is the approval request a cell awaiting approval waits
	// for; it is not part of the daemon's cell answer.
	ApprovalID string `json:"-"`
}

// CellOutput is one rich output of a cell.
type CellOutput struct {
	MimeType string `json:"mime_type"`
	// Data is the text of a text/* output, base64 for any other.
	Data string `json:"data"`
}

// CellError is an exception a cell raised.
type CellError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// FileEntry is one entry of a session directory's listing.
type FileEntry struct {
	Name string `json:"name"`
	// Type is file, dir, symlink or other.
	Type  string    `json:"type"`
	Size  int64     `json:"size"`
	Mode  uint32    `json:"mode"`
	MTime time.Time `json:"mtime"`
}

// FileInfo is a file moved into a session.
type FileInfo struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// SessionFilter selects sessions; zero lists all, newest first.
type SessionFilter struct {
	// State is "active" or "ended"; empty is both.
	State  string
	Limit  int
	Cursor string
}

func sessionPath(id string, rest ...string) string {
	p := "/v1/sessions/" + url.PathEscape(id)
	for _, r := range rest {
		p += "/" + r
	}
	return p
}

// CreateSession opens a session: a sandbox of its own with a kernel that
// keeps its state from cell to cell, until CloseSession or its lifetime
// ends it.
func (c *Client) CreateSession(ctx context.Context, req SessionRequest) (*Session, error) {
	var s Session
	if _, err := c.do(ctx, http.MethodPost, "/v1/sessions", nil, req, &s, "Idempotency-Key", req.IdempotencyKey); err != nil {
		return nil, fmt.Errorf("creating a session: %w", err)
	}
	return &s, nil
}

// GetSession returns session id, also an ended one (State "ended"). The
// other methods of an ended session answer an *Error with the code
// session_expired (class ErrFailedPrecondition) and its EndedAt and
// EndReason.
func (c *Client) GetSession(ctx context.Context, id string) (*Session, error) {
	var s Session
	if _, err := c.do(ctx, http.MethodGet, sessionPath(id), nil, nil, &s); err != nil {
		return nil, fmt.Errorf("getting session %s: %w", id, err)
	}
	return &s, nil
}

// ListSessions lists the workspace's sessions.
func (c *Client) ListSessions(ctx context.Context, f SessionFilter) (*Page[Session], error) {
	q := pageQuery(f.Limit, f.Cursor)
	if f.State != "" {
		q.Set("state", f.State)
	}
	var p Page[Session]
	if _, err := c.do(ctx, http.MethodGet, "/v1/sessions", q, nil, &p); err != nil {
		return nil, fmt.Errorf("listing sessions: %w", err)
	}
	return &p, nil
}

// CloseSession ends session id and destroys its sandbox; it returns the
// ended session.
func (c *Client) CloseSession(ctx context.Context, id string) (*Session, error) {
	var s Session
	if _, err := c.do(ctx, http.MethodDelete, sessionPath(id), nil, nil, &s); err != nil {
		return nil, fmt.Errorf("closing session %s: %w", id, err)
	}
	return &s, nil
}

// PauseSession pauses session id: its sandbox is saved, with its kernel
// and /workspace, to a checkpoint on the daemon's disk and ended; it
// returns the paused session (a paused one as it is). A session whose
// driver cannot pause (runc) answers an error of class
// ErrFailedPrecondition or ErrConflict (409) with the reason. A cell or
// a file operation on a paused session resumes it.
func (c *Client) PauseSession(ctx context.Context, id string) (*Session, error) {
	var s Session
	if _, err := c.do(ctx, http.MethodPost, sessionPath(id, "pause"), nil, nil, &s); err != nil {
		return nil, fmt.Errorf("pausing session %s: %w", id, err)
	}
	return &s, nil
}

// ResumeSession resumes paused session id from its checkpoint, in a new
// sandbox with its kernel's state; it returns the active session (an
// active one as it is).
func (c *Client) ResumeSession(ctx context.Context, id string) (*Session, error) {
	var s Session
	if _, err := c.do(ctx, http.MethodPost, sessionPath(id, "resume"), nil, nil, &s); err != nil {
		return nil, fmt.Errorf("resuming session %s: %w", id, err)
	}
	return &s, nil
}

// ExecCell runs a cell in session id and returns its outcome once it
// ended, or, when a human must approve it first, the cell awaiting
// approval (Status StatusAwaitingApproval, ApprovalID set), whose outcome
// WaitCell waits for. A session that runs another cell answers an error of
// class ErrConflict (409 session_busy).
func (c *Client) ExecCell(ctx context.Context, id string, req CellRequest) (*Cell, error) {
	hreq, err := c.request(ctx, http.MethodPost, sessionPath(id, "exec"), nil, req)
	if err != nil {
		return nil, err
	}
	if req.IdempotencyKey != "" {
		hreq.Header.Set("Idempotency-Key", req.IdempotencyKey)
	}
	resp, err := c.send(hreq)
	if err != nil {
		return nil, fmt.Errorf("running a cell in session %s: %w", id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusAccepted {
		var ex Execution
		if err := decodeBounded(resp.Body, &ex); err != nil {
			return nil, fmt.Errorf("running a cell in session %s: %w", id, err)
		}
		return &Cell{ExecutionID: ex.ID, SessionID: id, Status: ex.Status, ApprovalID: ex.ApprovalID, Replayed: ex.Replayed}, nil
	}
	var cell Cell
	if err := decodeBounded(resp.Body, &cell); err != nil {
		return nil, fmt.Errorf("running a cell in session %s: %w", id, err)
	}
	return &cell, nil
}

// WaitCell returns the cell of execution id once it has ended or wait
// has passed, whichever comes first: for a cell that ExecCell left
// awaiting approval. Its Credits are not known here (0); ListToolCalls has
// them.
func (c *Client) WaitCell(ctx context.Context, executionID string, wait time.Duration) (*Cell, error) {
	q := url.Values{}
	if wait > 0 {
		q.Set("wait", wait.String())
	}
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodGet, "/v1/executions/"+url.PathEscape(executionID), q, nil, &raw); err != nil {
		return nil, fmt.Errorf("waiting for cell %s: %w", executionID, err)
	}
	return CellOfExecution(raw)
}

// CellOfExecution returns the cell of an execution as the API shows it
// (GET /v1/executions/{id}): its status, and, once it ran, its outcome,
// from the execution's result document. Credits are not part of it (0).
func CellOfExecution(b []byte) (*Cell, error) {
	var ex struct {
		ID         string          `json:"id"`
		Status     ExecutionStatus `json:"status"`
		SessionID  string          `json:"session_id"`
		ApprovalID string          `json:"approval_id"`
		Result     json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(b, &ex); err != nil {
		return nil, fmt.Errorf("decoding the execution of a cell: %w", err)
	}
	cell := Cell{SessionID: ex.SessionID}
	if len(ex.Result) > 0 && string(ex.Result) != "null" {
		// The result is the cell's document; its status is the
		// program's word, the execution's is the API's.
		var doc struct {
			Cell
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(ex.Result, &doc); err != nil {
			return nil, fmt.Errorf("decoding the result of cell %s: %w", ex.ID, err)
		}
		cell = doc.Cell
		var raised CellError
		var sentence string
		switch {
		case len(doc.Error) == 0 || string(doc.Error) == "null":
		case json.Unmarshal(doc.Error, &raised) == nil:
			cell.Error = &raised
		case json.Unmarshal(doc.Error, &sentence) == nil:
			cell.Error = &CellError{Name: "StockadeError", Value: sentence}
		}
	}
	cell.ExecutionID, cell.Status, cell.ApprovalID = ex.ID, ex.Status, ex.ApprovalID
	return &cell, nil
}

// Display is a rich output of a cell as it came (a figure shown while the
// cell ran); the cell's result has them all.
type Display struct{ Output CellOutput }

// CellEnded is a cell's outcome; it is the last event of a cell's stream.
type CellEnded struct{ Cell Cell }

func (*Display) isEvent()   {}
func (*CellEnded) isEvent() {}

// parseCellEvent decodes one event of a cell's stream: those of an
// execution's, with the outcome a Cell and rich outputs as Displays.
func parseCellEvent(name string, data []byte) (Event, error) {
	switch name {
	case "output":
		e := &Display{}
		if err := json.Unmarshal(data, &e.Output); err != nil {
			return nil, fmt.Errorf("decoding event %q: %w", name, err)
		}
		return e, nil
	case "result":
		e := &CellEnded{}
		if err := json.Unmarshal(data, &e.Cell); err != nil {
			return nil, fmt.Errorf("decoding event %q: %w", name, err)
		}
		return e, nil
	}
	return ParseEvent(name, data)
}

// StreamCell runs a cell in session id and returns its events as they
// happen: *ApprovalRequired first when a human must decide, then
// *Started, *Output chunks, *Display outputs and *CellEnded (or *Ended for
// a cell that never ran: denied, expired). An error before the stream
// (busy, ended, over quota) is returned as the error.
func (c *Client) StreamCell(ctx context.Context, id string, req CellRequest) (*Stream, error) {
	hreq, err := c.request(ctx, http.MethodPost, sessionPath(id, "exec"), nil, req)
	if err != nil {
		return nil, err
	}
	if req.IdempotencyKey != "" {
		hreq.Header.Set("Idempotency-Key", req.IdempotencyKey)
	}
	s, err := c.openStream(ctx, hreq)
	if err != nil {
		return nil, fmt.Errorf("running a cell in session %s: %w", id, err)
	}
	s.parse = parseCellEvent
	return s, nil
}

// NewCellStream is NewStream for the events of a cell (see StreamCell).
func NewCellStream(next func() (name string, data []byte, err error), close func() error) *Stream {
	s := NewStream(next, close)
	s.parse = parseCellEvent
	return s
}

// InterruptCell interrupts the cell session id runs (SIGINT to its
// kernel) and reports whether one ran.
func (c *Client) InterruptCell(ctx context.Context, id string) (bool, error) {
	var out struct {
		Interrupted bool `json:"interrupted"`
	}
	if _, err := c.do(ctx, http.MethodPost, sessionPath(id, "interrupt"), nil, nil, &out); err != nil {
		return false, fmt.Errorf("interrupting session %s: %w", id, err)
	}
	return out.Interrupted, nil
}

// PutFile writes what r yields to path in session id's /workspace (a
// path relative to /workspace, or absolute below it), size bytes when
// size >= 0 (sent as the Content-Length, so that a file over the daemon's
// limit is refused before it is sent).
func (c *Client) PutFile(ctx context.Context, id, path string, r io.Reader, size int64) (*FileInfo, error) {
	hreq, err := c.request(ctx, http.MethodPut, sessionPath(id, "files"), url.Values{"path": {path}}, nil)
	if err != nil {
		return nil, err
	}
	hreq.Body = io.NopCloser(r)
	hreq.ContentLength = size
	if size < 0 {
		hreq.ContentLength = -1
	}
	hreq.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.send(hreq)
	if err != nil {
		return nil, fmt.Errorf("writing %s in session %s: %w", path, id, err)
	}
	defer resp.Body.Close()
	var f FileInfo
	if err := decodeBounded(resp.Body, &f); err != nil {
		return nil, fmt.Errorf("writing %s in session %s: %w", path, id, err)
	}
	return &f, nil
}

// GetFile reads the file at path of session id into w, at most max bytes
// (a larger file is ErrTooLarge and w may hold its start), and returns its
// size and the SHA-256 the daemon computed.
func (c *Client) GetFile(ctx context.Context, id, path string, w io.Writer, max int64) (*FileInfo, error) {
	hreq, err := c.request(ctx, http.MethodGet, sessionPath(id, "files"), url.Values{"path": {path}}, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.send(hreq)
	if err != nil {
		return nil, fmt.Errorf("reading %s in session %s: %w", path, id, err)
	}
	defer resp.Body.Close()
	if resp.ContentLength > max {
		return nil, fmt.Errorf("reading %s in session %s: the file is %d bytes, more than %d: %w", path, id, resp.ContentLength, max, errdefs.ErrTooLarge)
	}
	n, err := io.Copy(w, io.LimitReader(resp.Body, max+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s in session %s: %w: %w", path, id, err, errdefs.ErrUnavailable)
	}
	if n > max {
		return nil, fmt.Errorf("reading %s in session %s: more than %d bytes: %w", path, id, max, errdefs.ErrTooLarge)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return nil, fmt.Errorf("reading %s in session %s: got %d of %d bytes: %w", path, id, n, resp.ContentLength, errdefs.ErrUnavailable)
	}
	return &FileInfo{Path: path, Size: n, SHA256: resp.Header.Get("X-Stockade-SHA256")}, nil
}

// ListFiles lists the directory dir of session id; truncated says there
// were more entries than the daemon lists at once.
func (c *Client) ListFiles(ctx context.Context, id, dir string) (entries []FileEntry, truncated bool, err error) {
	var out struct {
		Entries   []FileEntry `json:"entries"`
		Truncated bool        `json:"truncated"`
	}
	if _, err := c.do(ctx, http.MethodGet, sessionPath(id, "files"), url.Values{"dir": {dir}}, nil, &out); err != nil {
		return nil, false, fmt.Errorf("listing %s in session %s: %w", dir, id, err)
	}
	return out.Entries, out.Truncated, nil
}

// RemoveFile removes the file, symlink or empty directory at path of
// session id.
func (c *Client) RemoveFile(ctx context.Context, id, path string) error {
	if _, err := c.do(ctx, http.MethodDelete, sessionPath(id, "files"), url.Values{"path": {path}}, nil, nil); err != nil {
		return fmt.Errorf("removing %s in session %s: %w", path, id, err)
	}
	return nil
}

// openStream sends hreq asking for an event stream and returns it.
func (c *Client) openStream(ctx context.Context, hreq *http.Request) (*Stream, error) {
	hreq.Header.Set("Accept", "text/event-stream")
	resp, err := c.send(hreq)
	if err != nil {
		return nil, err
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		resp.Body.Close()
		return nil, fmt.Errorf("the daemon answered %q (status %s), not an event stream", ct, strconv.Itoa(resp.StatusCode))
	}
	r := &sseReader{r: bufio.NewReaderSize(resp.Body, 64<<10)}
	return NewStream(func() (string, []byte, error) {
		name, data, err := r.next()
		if err != nil && ctx.Err() != nil {
			return "", nil, ctx.Err()
		}
		return name, data, err
	}, resp.Body.Close), nil
}
