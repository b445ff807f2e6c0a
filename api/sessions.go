package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
)

// SessionView is a session on the wire.
type SessionView struct {
	ID      string `json:"id"`
	Runtime string `json:"runtime"`
	Tool    string `json:"tool"`
	Tier    string `json:"tier"`
	Driver  string `json:"driver"`
	// State is active, paused or ended; EndReason (closed, idle_timeout,
	// ttl, interrupted, failed) and EndedAt are set once it ended, PausedAt
	// and CheckpointBytes while it is paused.
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
	// Approval is the approval mode its cells are admitted under, and
	// ApprovalID the approval that covers them (per_session).
	Approval       string `json:"approval"`
	ApprovalID     string `json:"approval_id,omitempty"`
	WorkspaceBytes int64  `json:"workspace_bytes"`
	Replayed       bool   `json:"replayed,omitempty"`
}

func (s *server) sessionView(ss model.Session) SessionView {
	v := SessionView{ID: ss.ID, Runtime: ss.Runtime, Tool: ss.Tool, Driver: ss.Driver, State: string(ss.State),
		Network: policy.NetworkWord(ss.Network), CreatedAt: ss.CreatedAt, ExpiresAt: ss.ExpiresAt, IdleExpiresAt: ss.IdleExpiresAt(),
		IdleTimeoutMS: ss.IdleTimeout.Milliseconds(), EndReason: string(ss.EndReason), Cells: ss.Cells, Approval: string(ss.Approval),
		ApprovalID: ss.ApprovalID, WorkspaceBytes: ss.WorkspaceBytes}
	if d, ok := s.svc.Runner().Drivers()[ss.Driver]; ok {
		v.Tier = string(d.Capabilities().Tier)
	}
	if !ss.EndedAt.IsZero() {
		v.EndedAt = &ss.EndedAt
	}
	if !ss.PausedAt.IsZero() {
		v.PausedAt, v.CheckpointBytes = &ss.PausedAt, ss.CheckpointBytes
	}
	return v
}

func (s *server) createSession(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	var req capability.CreateSessionRequest
	if err := s.decodeBody(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	c, err := s.svc.CreateSession(r.Context(), p, req, capability.CreateSessionOptions{IdempotencyKey: r.Header.Get("Idempotency-Key")})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	v := s.sessionView(c.Session)
	v.Replayed = c.Replayed
	w.Header().Set("Location", "/v1/sessions/"+v.ID)
	code := http.StatusCreated
	if c.Replayed {
		code = http.StatusOK
	}
	writeJSON(w, code, v)
}

func (s *server) listSessions(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	pr, err := pageOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	f := store.SessionFilter{PageRequest: pr}
	switch v := r.URL.Query().Get("state"); v {
	case "":
	case string(model.SessionActive), string(model.SessionPaused), string(model.SessionEnded):
		f.States = []model.SessionState{model.SessionState(v)}
	default:
		s.writeError(w, r, errdefs.Publicf("state=%q: expected active, paused or ended: %w", v, errdefs.ErrInvalidArgument))
		return
	}
	page, err := s.svc.ListSessions(r.Context(), p, f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := listResponse[SessionView]{Items: []SessionView{}, Next: page.Next}
	for _, ss := range page.Items {
		out.Items = append(out.Items, s.sessionView(ss))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) getSession(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	ss, err := s.svc.GetSession(r.Context(), p, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.sessionView(ss))
}

func (s *server) deleteSession(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	ss, err := s.svc.CloseSession(r.Context(), p, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.sessionView(ss))
}

// CellView is a cell's outcome on the wire: its result (see
// engine.CellResult), what it was charged, and its execution.
type CellView struct {
	ExecutionID     string               `json:"execution_id"`
	SessionID       string               `json:"session_id"`
	Cell            int                  `json:"cell"`
	Status          string               `json:"status"`
	Stdout          string               `json:"stdout"`
	Stderr          string               `json:"stderr"`
	StdoutTruncated bool                 `json:"stdout_truncated"`
	StderrTruncated bool                 `json:"stderr_truncated"`
	Outputs         []cellOutput         `json:"outputs"`
	OutputsDropped  int                  `json:"outputs_dropped,omitempty"`
	Error           *capabilityCellError `json:"error,omitempty"`
	KernelRestarted bool                 `json:"kernel_restarted"`
	DurationMS      int64                `json:"duration_ms"`
	EndedBy         string               `json:"ended_by,omitempty"`
	Credits         int64                `json:"credits"`
	Replayed        bool                 `json:"replayed,omitempty"`
}

type cellOutput struct {
	MimeType string `json:"mime_type"`
	Data     string `json:"data"`
}

type capabilityCellError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// cellView is the outcome of cell e, which has ended.
func (s *server) cellView(ctx context.Context, p capability.Principal, e model.Execution) CellView {
	var doc struct {
		capability.CellResultDoc
		Error json.RawMessage `json:"error"`
	}
	_ = json.Unmarshal(e.Result, &doc)
	v := CellView{ExecutionID: e.ID, SessionID: e.SessionID, Cell: e.Cell, Status: string(e.Status), Stdout: doc.Stdout, Stderr: doc.Stderr,
		StdoutTruncated: doc.StdoutTruncated, StderrTruncated: doc.StderrTruncated, Outputs: []cellOutput{}, OutputsDropped: doc.OutputsDropped,
		KernelRestarted: doc.KernelRestarted, DurationMS: doc.DurationMS, EndedBy: doc.EndedBy}
	for _, o := range doc.Outputs {
		v.Outputs = append(v.Outputs, cellOutput(o))
	}
	// The error is the exception the cell raised, or, for a cell that
	// could not run, the sentence of the result document.
	var raised capabilityCellError
	var msg string
	switch {
	case len(doc.Error) == 0 || string(doc.Error) == "null":
	case json.Unmarshal(doc.Error, &raised) == nil:
		v.Error = &raised
	case json.Unmarshal(doc.Error, &msg) == nil:
		v.Error = &capabilityCellError{Name: "StockadeError", Value: sentence(msg)}
	}
	if tc, err := s.st.GetToolCall(ctx, p.WorkspaceID, e.ID); err == nil {
		v.Credits = tc.CreditsCharged
	}
	return v
}

func (s *server) execCell(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	var req capability.CellRequest
	if err := s.decodeBody(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	id := r.PathValue("id")
	opts := capability.InvokeOptions{IdempotencyKey: r.Header.Get("Idempotency-Key"), ExecutionID: capability.NewExecutionID()}
	admit := func() (*capability.Invocation, error) { return s.svc.ExecCell(r.Context(), p, id, req, opts) }
	if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		flusher, ok := w.(http.Flusher)
		if !ok {
			s.writeError(w, r, errdefs.Publicf("streaming is not supported by this connection: %w", errdefs.ErrInvalidArgument))
			return
		}
		es, err := s.openAdmitted(r.Context(), p, opts.ExecutionID, admit)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		es.result = func(ctx context.Context, e model.Execution) any {
			v := s.cellView(ctx, p, e)
			v.Replayed = es.replayed
			return v
		}
		defer es.close()
		s.writeStream(w, r, flusher, es)
		return
	}
	inv, err := admit()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.answerAdmission(w, r, p, inv, func(e model.Execution) (int, any) {
		if !e.Status.Terminal() {
			// Still running after MaxWait: follow it with GET
			// /v1/executions/{id}?wait=.
			return http.StatusAccepted, viewOf(e)
		}
		v := s.cellView(r.Context(), p, e)
		v.Replayed = inv.Replayed
		return http.StatusOK, v
	})
}

// writeStream writes es as Server-Sent Events until its outcome, with
// keep-alive comments while nothing happens.
func (s *server) writeStream(w http.ResponseWriter, r *http.Request, flusher http.Flusher, es *executionStream) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	keep := time.NewTicker(s.opts.KeepAlive)
	defer keep.Stop()
	for {
		event, data, err := es.next(r.Context(), keep.C)
		switch {
		case err != nil:
			return // the outcome was sent, or the client went away
		case event == "":
			fmt.Fprint(w, ": keep-alive\n\n")
		default:
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, data)
		}
		flusher.Flush()
	}
}

func (s *server) interruptCell(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	ok, err := s.svc.InterruptCell(r.Context(), p, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"interrupted": ok})
}

// pauseSession and resumeSession answer the session after the transition
// (or as it is, when it was there already).
func (s *server) pauseSession(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	ss, err := s.svc.PauseSession(r.Context(), p, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.sessionView(ss))
}

func (s *server) resumeSession(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	ss, err := s.svc.ResumeSession(r.Context(), p, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.sessionView(ss))
}

// FileEntry is one entry of a listing of a session's files.
type FileEntry struct {
	Name string `json:"name"`
	// Type is file, dir, symlink or other.
	Type string `json:"type"`
	Size int64  `json:"size"`
	// Mode is the permission bits.
	Mode  uint32    `json:"mode"`
	MTime time.Time `json:"mtime"`
}

func (s *server) putFile(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	q := r.URL.Query()
	if !q.Has("path") {
		s.closeWithoutBody(w, r)
		s.writeError(w, r, errdefs.Publicf("?path= names the file to write: %w", capability.ErrInvalidPath))
		return
	}
	if most := s.svc.Options().Sessions.MaxFileSize; r.ContentLength > most {
		s.closeWithoutBody(w, r)
		s.writeError(w, r, errdefs.Publicf("the file is %d bytes, more than this server's limit of %d (sessions.max_file_size): %w", r.ContentLength, most, errdefs.ErrTooLarge))
		return
	}
	f, err := s.svc.PutFile(r.Context(), p, r.PathValue("id"), q.Get("path"), r.Body)
	if err != nil {
		s.closeWithoutBody(w, r)
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, f)
}

func (s *server) getFiles(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	q := r.URL.Query()
	switch {
	case q.Has("path") == q.Has("dir"):
		s.writeError(w, r, errdefs.Publicf("give ?path= to download a file or ?dir= to list a directory, one of them: %w", capability.ErrInvalidPath))
	case q.Has("dir"):
		entries, truncated, err := s.svc.ListFiles(r.Context(), p, r.PathValue("id"), q.Get("dir"))
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		out := struct {
			Entries   []FileEntry `json:"entries"`
			Truncated bool        `json:"truncated"`
		}{Entries: []FileEntry{}, Truncated: truncated}
		for _, e := range entries {
			out.Entries = append(out.Entries, fileEntry(e))
		}
		writeJSON(w, http.StatusOK, out)
	default:
		b, f, err := s.svc.GetFile(r.Context(), p, r.PathValue("id"), q.Get("path"))
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Header().Set("X-Stockade-SHA256", f.SHA256)
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b)
	}
}

func fileEntry(e sandbox.FileInfo) FileEntry {
	return FileEntry{Name: e.Name, Type: string(e.Type), Size: e.Size, Mode: uint32(e.Mode.Perm()), MTime: e.ModTime.UTC()}
}

func (s *server) deleteFile(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	q := r.URL.Query()
	if !q.Has("path") {
		s.writeError(w, r, errdefs.Publicf("?path= names the file to remove: %w", capability.ErrInvalidPath))
		return
	}
	if err := s.svc.RemoveFile(r.Context(), p, r.PathValue("id"), q.Get("path")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
