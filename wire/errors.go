package wire

import "time"

// ErrorBody is the JSON of every error answer, and the data of a
// stream's error event.
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

// The stable codes of error answers, each with its HTTP status. The
// server maps an error's class to its code in one function (api's
// classes) and the Go client maps a code back to the class in one
// (client's classOf); a class survives the trip.
const (
	CodeInvalidArgument    = "invalid_argument"     // 400
	CodeInvalidPath        = "invalid_path"         // 400, a session's file path
	CodeUnauthenticated    = "unauthenticated"      // 401
	CodeInsufficientCredit = "insufficient_credits" // 402
	CodePermissionDenied   = "permission_denied"    // 403
	CodeNotFound           = "not_found"            // 404
	CodeMethodNotAllowed   = "method_not_allowed"   // 405
	CodeRequestTimeout     = "request_timeout"      // 408
	CodeConflict           = "conflict"             // 409: the request conflicts with another (a decided approval)
	CodeSessionBusy        = "session_busy"         // 409: a session runs another cell
	CodeFailedPrecondition = "failed_precondition"  // 409: not in the state it needs (a paused session)
	CodeSessionExpired     = "session_expired"      // 410: the session has ended for good
	CodeGone               = "gone"                 // 410: another thing that has ended for good
	CodeTooLarge           = "too_large"            // 413
	CodeResourceExhausted  = "resource_exhausted"   // 429
	CodeSessionQuota       = "session_quota"        // 429
	CodeInternal           = "internal"             // 500
	CodeUnavailable        = "unavailable"          // 503
)
