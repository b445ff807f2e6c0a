package api

import (
	"net/http"

	"github.com/stockade-sh/stockade/engine"
)

// cancelExecution answers POST /v1/executions/{id}/cancel with the
// execution as the cancel left it (see engine.Service.Cancel).
func (s *server) cancelExecution(w http.ResponseWriter, r *http.Request, p engine.Principal) {
	var body DecisionRequest
	if r.ContentLength != 0 {
		if err := s.decodeBody(w, r, &body); err != nil {
			writeError(w, err)
			return
		}
	}
	e, err := s.svc.Cancel(r.Context(), p, r.PathValue("id"), body.Reason)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(e))
}
