package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/errdefs"
)

// ErrorBody is the JSON of every error response.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is a stable code and a sentence for people.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// EndedAt and EndReason say when and why a session ended, with the
	// code session_expired.
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	EndReason string     `json:"end_reason,omitempty"`
}

// The API's own error classes: only HTTP has methods and request bodies
// that arrive late. They are mapped in status beside errdefs' classes.
var (
	errMethodNotAllowed = errors.New("method not allowed")
	errRequestTimeout   = errors.New("request timeout")
)

// status maps an error class to its HTTP status and stable code. It is the
// only place where error classes meet HTTP.
func status(err error) (int, string) {
	var (
		expired *capability.SessionExpiredError
		busy    *capability.SessionBusyError
		quota   *capability.QuotaError
	)
	switch {
	case errors.As(err, &expired):
		return http.StatusGone, "session_expired"
	case errors.As(err, &busy):
		return http.StatusConflict, "session_busy"
	case errors.As(err, &quota):
		return http.StatusTooManyRequests, "session_quota"
	case errors.Is(err, capability.ErrInvalidPath):
		return http.StatusBadRequest, "invalid_path"
	}
	switch {
	case errors.Is(err, errMethodNotAllowed):
		return http.StatusMethodNotAllowed, "method_not_allowed"
	case errors.Is(err, errRequestTimeout):
		return http.StatusRequestTimeout, "request_timeout"
	case errdefs.IsInvalidArgument(err):
		return http.StatusBadRequest, "invalid_argument"
	case errdefs.IsUnauthenticated(err):
		return http.StatusUnauthorized, "unauthenticated"
	case errdefs.IsPaymentRequired(err):
		return http.StatusPaymentRequired, "insufficient_credits"
	case errdefs.IsPermissionDenied(err):
		return http.StatusForbidden, "permission_denied"
	case errdefs.IsNotFound(err):
		return http.StatusNotFound, "not_found"
	case errdefs.IsConflict(err), errdefs.IsFailedPrecondition(err):
		return http.StatusConflict, "conflict"
	case errdefs.IsTooLarge(err):
		return http.StatusRequestEntityTooLarge, "too_large"
	case errdefs.IsResourceExhausted(err):
		return http.StatusTooManyRequests, "resource_exhausted"
	case errdefs.IsUnavailable(err):
		return http.StatusServiceUnavailable, "unavailable"
	}
	return http.StatusInternalServerError, "internal"
}

// HTTPStatus is the HTTP status of err's class, for the daemon's other
// handlers (the console), which answer errors of the same classes.
func HTTPStatus(err error) int {
	code, _ := status(err)
	return code
}

// retryAfter is sent with 429 and 503 answers.
const retryAfter = time.Second

// answer is the error answer of err: its status, its body, and whether it
// says when to retry (Retry-After). An internal error's sentence is the
// operator's, not the client's.
func answer(err error) (code int, d ErrorDetail, retry bool) {
	code, _ = status(err)
	d = Describe(err)
	if code == http.StatusInternalServerError {
		d.Message = "internal error"
	}
	return code, d, code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable
}

func writeError(w http.ResponseWriter, err error) {
	code, d, retry := answer(err)
	if retry {
		after := retryAfter
		var quota *capability.QuotaError
		if errors.As(err, &quota) {
			after = quota.RetryAfter
		}
		w.Header().Set("Retry-After", strconv.Itoa(int((after+time.Second-1)/time.Second)))
	}
	writeJSON(w, code, ErrorBody{Error: d})
}

// Describe is err's stable code and its sentence for people. The CLI
// prints errors in this form too; unlike an API answer it keeps the
// sentence of an internal error, which only the operator sees there.
func Describe(err error) ErrorDetail {
	_, name := status(err)
	d := ErrorDetail{Code: name, Message: sentence(err.Error())}
	var expired *capability.SessionExpiredError
	if errors.As(err, &expired) {
		at := expired.EndedAt.UTC()
		d.EndedAt, d.EndReason = &at, string(expired.Reason)
	}
	return d
}

// classes are the error classes whose texts wrapping appends.
var classes = []error{errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrPermissionDenied,
	errdefs.ErrFailedPrecondition, errdefs.ErrResourceExhausted, errdefs.ErrUnavailable, errdefs.ErrUnauthenticated,
	errdefs.ErrConflict, errdefs.ErrTooLarge, errdefs.ErrPaymentRequired, errMethodNotAllowed, errRequestTimeout}

// sentence returns an error message without the class names that wrapping
// appends (": not found"), which repeat the stable code. An error
// classified again on its way up carries several
// (`unknown tool "x": not found: invalid argument`); all of them go.
func sentence(msg string) string {
	for {
		trimmed := msg
		for _, c := range classes {
			trimmed = strings.TrimSuffix(trimmed, ": "+c.Error())
		}
		if trimmed == msg {
			return msg
		}
		msg = trimmed
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
