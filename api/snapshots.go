package api

import (
	"net/http"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/wire"
)

// snapshotView is snapshot sn on the wire (never its directory).
func snapshotView(sn model.Snapshot, stall time.Duration) wire.Snapshot {
	return wire.Snapshot{ID: sn.ID, SessionID: sn.SessionID, Name: sn.Name, Runtime: sn.Runtime, Tool: sn.Tool, Bytes: sn.Bytes,
		CreatedAt: sn.CreatedAt, ExpiresAt: sn.ExpiresAt, StallMS: stall.Milliseconds()}
}

// snapshotSession takes a snapshot of a session: POST
// /v1/sessions/{id}/snapshots, whose body ({"name": ...}) may be empty.
func (s *server) snapshotSession(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	var req wire.SnapshotRequest
	if r.ContentLength != 0 {
		if err := s.decodeBody(w, r, &req); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	sn, stall, err := s.svc.SnapshotSession(r.Context(), p, r.PathValue("id"), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotView(sn, stall))
}

func (s *server) listSnapshots(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	l, err := s.svc.ListSnapshots(r.Context(), p, r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := wire.SnapshotList{Items: []wire.Snapshot{}}
	for _, sn := range l {
		out.Items = append(out.Items, snapshotView(sn, 0))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) deleteSnapshot(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	if err := s.svc.DeleteSnapshot(r.Context(), p, r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// forkSession starts count sessions from a snapshot of a session: POST
// /v1/sessions/{id}/fork {"count": n}, answered 201 with all of them.
func (s *server) forkSession(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	var req wire.ForkRequest
	if err := s.decodeBody(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	f, err := s.svc.ForkSession(r.Context(), p, r.PathValue("id"), req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := wire.Fork{SourceID: f.Source.ID, SnapshotID: f.SnapshotID, StallMS: f.Stall.Milliseconds(), Sessions: []wire.Session{}}
	for _, ss := range f.Sessions {
		out.Sessions = append(out.Sessions, s.sessionView(ss))
	}
	writeJSON(w, http.StatusCreated, out)
}
