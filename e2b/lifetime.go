package e2b

import (
	"context"
	"net/http"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
)

// A sandbox's lifetime on the E2B control plane: its timeout, moved by
// /timeout and /refreshes, its pause and its resume (connect), and the
// sweep that ends (or pauses) it at its timeout.

// timeoutBody is the body of /timeout (timeout) and /refreshes
// (duration), in seconds.
type timeoutBody struct {
	Timeout  *int64 `json:"timeout"`
	Duration *int64 `json:"duration"`
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	s.moveEnd(w, r, p, false)
}

func (s *Server) refresh(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	s.moveEnd(w, r, p, true)
}

// moveEnd sets a sandbox's end to now + the body's timeout (setTimeout
// may shorten it; a refresh only extends it), within its session's TTL.
func (s *Server) moveEnd(w http.ResponseWriter, r *http.Request, p capability.Principal, refresh bool) {
	id := r.PathValue("id")
	var body timeoutBody
	if err := decode(r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	n := body.Timeout
	if refresh {
		n = body.Duration
	}
	d := defaultTimeout
	if n != nil {
		var err error
		if d, err = secondsOf(*n, s.o.TTL); err != nil {
			s.fail(w, r, err)
			return
		}
	} else if !refresh {
		s.fail(w, r, errdefs.Publicf("timeout is required: %w", errdefs.ErrInvalidArgument))
		return
	}
	rec, ss, err := s.live(r.Context(), p, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	end := minTime(s.o.Now().Add(d), ss.ExpiresAt)
	if refresh && end.Before(rec.EndAt) {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if err := s.st.SetE2BEndAt(r.Context(), p.WorkspaceID, id, end); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	id := r.PathValue("id")
	_, ss, err := s.live(r.Context(), p, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if ss.State == model.SessionPaused {
		writeError(w, http.StatusConflict, "sandbox "+id+" is already paused")
		return
	}
	if _, err := s.svc.PauseSession(r.Context(), p, id); err != nil {
		if statusOf(err) == http.StatusConflict {
			// Not "already paused", which is what the SDKs read a 409
			// as: a sandbox running a cell (a background command) is not
			// paused here.
			writeError(w, http.StatusBadRequest, messageOf(err))
			return
		}
		s.fail(w, r, err)
		return
	}
	// What was served ends: a paused sandbox runs nothing.
	s.procs.dropSandbox(id)
	w.WriteHeader(http.StatusNoContent)
}

// connect answers a connect (v1, v2) or a resume: a paused sandbox is
// resumed (201), a running one answered as it is (200); the body's
// timeout, if any, sets its end, and a resumed one lives at least the
// default timeout.
func (s *Server) connect(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	id := r.PathValue("id")
	var body timeoutBody
	if err := decode(r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	rec, ss, err := s.live(r.Context(), p, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	status := http.StatusOK
	if ss.State == model.SessionPaused {
		if ss, err = s.svc.ResumeSession(r.Context(), p, id); err != nil {
			s.fail(w, r, err)
			return
		}
		status = http.StatusCreated
	}
	var end time.Time
	switch {
	case body.Timeout != nil:
		d, err := secondsOf(*body.Timeout, s.o.TTL)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		end = s.o.Now().Add(d)
	case status == http.StatusCreated && rec.EndAt.Before(s.o.Now().Add(defaultTimeout)):
		end = s.o.Now().Add(defaultTimeout)
	}
	if !end.IsZero() {
		if err := s.st.SetE2BEndAt(r.Context(), p.WorkspaceID, id, minTime(end, ss.ExpiresAt)); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	writeJSON(w, status, s.answer(rec))
}

// Run ends, every second until ctx ends, the sandboxes past their E2B
// timeout: their sessions close, as E2B kills a sandbox at its timeout.
func (s *Server) Run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.sweep(ctx)
	}
}

// sweep closes the sessions of the sandboxes past their end.
func (s *Server) sweep(ctx context.Context) {
	due, err := s.st.DueE2BSandboxes(ctx, s.o.Now(), 100)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("e2b: listing the sandboxes past their timeout", "err", err)
		}
		return
	}
	for _, rec := range due {
		s.procs.dropSandbox(rec.SessionID)
		p := principalOf(rec)
		if rec.OnTimeout == "pause" {
			// autoPause: paused where its driver can save it, ended
			// where it cannot.
			_, err := s.svc.PauseSession(ctx, p, rec.SessionID)
			if err == nil {
				s.log.Info("e2b: sandbox paused at its timeout", "sandbox", rec.SessionID)
				continue
			}
			s.log.Warn("e2b: a sandbox that pauses at its timeout could not; ending it", "sandbox", rec.SessionID, "err", err)
		}
		if _, err := s.svc.CloseSession(ctx, p, rec.SessionID); err != nil && !errdefs.IsNotFound(err) && !errdefs.IsGone(err) {
			s.log.Warn("e2b: ending a sandbox past its timeout", "sandbox", rec.SessionID, "err", err)
			continue
		}
		s.log.Info("e2b: sandbox ended at its timeout", "sandbox", rec.SessionID)
	}
}
