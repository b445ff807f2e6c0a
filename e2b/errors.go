package e2b

import (
	"encoding/json"
	"net/http"

	"github.com/stockade-sh/stockade/errdefs"
)

// apiError is E2B's error body: the SDKs raise their own error classes
// from its code (401 AuthenticationError, 404 NotFoundError, 409 on a
// pause of a paused sandbox, 429 RateLimitError).
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// writeError answers status with E2B's error body.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

// writeJSON answers status with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// statusOf is the HTTP status of err's errdefs class.
func statusOf(err error) int {
	switch {
	case errdefs.IsInvalidArgument(err):
		return http.StatusBadRequest
	case errdefs.IsUnauthenticated(err):
		return http.StatusUnauthorized
	case errdefs.IsPermissionDenied(err):
		return http.StatusForbidden
	case errdefs.IsNotFound(err), errdefs.IsGone(err):
		// An ended sandbox is not found, as E2B answers for a killed one.
		return http.StatusNotFound
	case errdefs.IsConflict(err), errdefs.IsFailedPrecondition(err):
		return http.StatusConflict
	case errdefs.IsTooLarge(err):
		return http.StatusRequestEntityTooLarge
	case errdefs.IsResourceExhausted(err), errdefs.IsPaymentRequired(err):
		return http.StatusTooManyRequests
	case errdefs.IsUnavailable(err):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// messageOf is what a client may read of err: its public message, or its
// class's word.
func messageOf(err error) string {
	if m, ok := errdefs.PublicMessage(err); ok {
		return m
	}
	switch statusOf(err) {
	case http.StatusInternalServerError:
		return "internal error"
	default:
		return http.StatusText(statusOf(err))
	}
}

// fail answers err in E2B's shape, logging what is not the client's.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	st := statusOf(err)
	if st >= 500 {
		s.log.Error("e2b request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	} else {
		s.log.Debug("e2b request refused", "method", r.Method, "path", r.URL.Path, "status", st, "err", err)
	}
	writeError(w, st, messageOf(err))
}
