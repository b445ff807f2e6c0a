package api

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/wire"
)

// sessionView is session ss on the wire, with the tier of its driver.
func (s *server) sessionView(ss model.Session) wire.Session {
	v := wire.Session{ID: ss.ID, Runtime: ss.Runtime, Tool: ss.Tool, Driver: ss.Driver, State: string(ss.State),
		Network: policy.NetworkWord(ss.Network), CreatedAt: ss.CreatedAt, ExpiresAt: ss.ExpiresAt, IdleExpiresAt: ss.IdleExpiresAt(),
		IdleTimeoutMS: ss.IdleTimeout.Milliseconds(), EndReason: string(ss.EndReason), EndDetail: ss.EndDetail, Cells: ss.Cells, Approval: string(ss.Approval),
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
	out := wire.Page[wire.Session]{Items: []wire.Session{}, Next: page.Next}
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

// cellView is the outcome of cell e, which has ended: wire.CellOf its
// execution, with what it was charged. A cell that could not run says why
// in the sentence of its class (StockadeError).
func (s *server) cellView(ctx context.Context, p capability.Principal, e model.Execution) wire.Cell {
	v := wire.CellOf(viewOf(e))
	if v.Error != nil && v.Error.Name == wire.StockadeError {
		v.Error.Value = sentence(v.Error.Value)
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
	writeJSON(w, http.StatusOK, wire.Interrupted{Interrupted: ok})
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
		out := wire.FileList{Entries: []wire.FileEntry{}, Truncated: truncated}
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
