package e2b

import (
	"net/http"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/wire"
)

// E2B's snapshots and forks are Stockade's (capability/snapshots.go): a
// snapshot of a sandbox is one of its session, left running, whose id is
// what Sandbox.create(snapshotId) starts from (placement); a fork is a
// snapshot and that many sessions started from it, each a sandbox like
// its source (template, metadata, envs, what its timeout does). Where the
// driver cannot checkpoint (runc) the service's refusal is answered in
// E2B's error shape with its reason.

// snapshotAnswer is E2B's SnapshotInfo.
type snapshotAnswer struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func snapshotOf(sn model.Snapshot) snapshotAnswer {
	out := snapshotAnswer{SnapshotID: sn.ID, Names: []string{}}
	if sn.Name != "" {
		out.Names = append(out.Names, sn.Name)
	}
	return out
}

// createSnapshot serves POST /sandboxes/{id}/snapshots {"name"?}.
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	var body struct {
		Name string `json:"name"`
	}
	if err := decode(r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	id := r.PathValue("id")
	if _, _, err := s.live(r.Context(), p, id); err != nil {
		s.fail(w, r, err)
		return
	}
	sn, _, err := s.svc.SnapshotSession(r.Context(), p, id, wire.SnapshotRequest{Name: body.Name})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotOf(sn))
}

// listSnapshots serves GET /snapshots?sandboxID=&name=: the snapshots of
// one sandbox, or of every sandbox of p's workspace this server knows
// (one page, no x-next-token).
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	q := r.URL.Query()
	var ids []string
	if id := q.Get("sandboxID"); id != "" {
		if _, _, err := s.sandbox(r.Context(), p, id); err != nil {
			s.fail(w, r, err)
			return
		}
		ids = []string{id}
	} else {
		recs, err := s.st.ListE2BSandboxes(r.Context(), p.WorkspaceID, 1000)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		for _, rec := range recs {
			ids = append(ids, rec.SessionID)
		}
	}
	out := []snapshotAnswer{}
	for _, id := range ids {
		l, err := s.svc.ListSnapshots(r.Context(), p, id)
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		for _, sn := range l {
			if name := q.Get("name"); name != "" && sn.Name != name {
				continue
			}
			out = append(out, snapshotOf(sn))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteSnapshot serves DELETE /templates/{id}, which is how the SDKs
// delete a snapshot: 404 (the SDK's false) when there is none.
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	if err := s.svc.DeleteSnapshot(r.Context(), p, r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// forkResult is an element of E2B's fork answer: a sandbox or an error.
type forkResult struct {
	Sandbox *sandboxAnswer `json:"sandbox,omitempty"`
	Error   *apiError      `json:"error,omitempty"`
}

// fork serves POST /sandboxes/{id}/fork {"timeout"?, "count"?}: count
// sandboxes (default 1) from a snapshot of id, all or none, each recorded
// like its source.
func (s *Server) fork(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	var body struct {
		Timeout *int64 `json:"timeout"`
		Count   *int   `json:"count"`
	}
	if err := decode(r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	timeout := defaultTimeout
	if body.Timeout != nil {
		d, err := secondsOf(*body.Timeout, s.o.TTL)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		timeout = d
	}
	count := 1
	if body.Count != nil {
		count = *body.Count
	}
	id := r.PathValue("id")
	src, _, err := s.live(r.Context(), p, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	forked, err := s.svc.ForkSession(r.Context(), p, id, wire.ForkRequest{Count: count, TTLMS: s.o.TTL.Milliseconds(), IdleTimeoutMS: s.o.IdleTimeout.Milliseconds()})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]forkResult, 0, len(forked.Sessions))
	for _, ss := range forked.Sessions {
		rec, err := s.record(r.Context(), p, ss, store.E2BSandbox{Template: src.Template, Metadata: src.Metadata, Envs: src.Envs, OnTimeout: src.OnTimeout}, timeout)
		if err != nil {
			st := statusOf(err)
			out = append(out, forkResult{Error: &apiError{Code: st, Message: messageOf(err)}})
			continue
		}
		a := s.answer(rec)
		out = append(out, forkResult{Sandbox: &a})
	}
	writeJSON(w, http.StatusCreated, out)
}

// updateNetwork serves PUT /sandboxes/{id}/network: a session's network
// is fixed when it starts (its namespace, the tool's allowlist and its
// approval), so a live change is refused, in E2B's shape, saying so.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	if _, _, err := s.live(r.Context(), p, r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	writeError(w, http.StatusBadRequest, "a running sandbox's network cannot be changed here: a Stockade session's egress is fixed when it starts "+
		"(the tool's allowlist and the policy); create the sandbox with allowInternetAccess instead")
}
