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
	"github.com/stockade-sh/stockade/wire"
)

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
		cell := wire.CellOf(ex)
		cell.SessionID = id
		return &cell, nil
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
// from the execution's result document (wire.CellOf). Credits are not
// part of it (0).
func CellOfExecution(b []byte) (*Cell, error) {
	var ex Execution
	if err := json.Unmarshal(b, &ex); err != nil {
		return nil, fmt.Errorf("decoding the execution of a cell: %w", err)
	}
	cell := wire.CellOf(ex)
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
	case wire.EventOutput:
		e := &Display{}
		if err := json.Unmarshal(data, &e.Output); err != nil {
			return nil, fmt.Errorf("decoding event %q: %w", name, err)
		}
		return e, nil
	case wire.EventResult:
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
	var out wire.Interrupted
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
	var out wire.FileList
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
