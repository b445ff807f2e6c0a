package api

import (
	"net/http"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/wire"
)

// cancelExecution answers POST /v1/executions/{id}/cancel with the
// execution as the cancel left it (see capability.Service.Cancel).
func (s *server) cancelExecution(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	var body wire.DecisionRequest
	if r.ContentLength != 0 {
		if err := s.decodeBody(w, r, &body); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	e, err := s.svc.Cancel(r.Context(), p, r.PathValue("id"), body.Reason)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(e))
}
