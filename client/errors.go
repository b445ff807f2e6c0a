package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/wire"
)

// Error is an error answer of the API: its HTTP status, its stable code
// and its sentence. It unwraps to the errdefs class of the code, so that
// errdefs.IsNotFound(err) and the like work on it.
type Error struct {
	// Status is the HTTP status of the answer; zero for an error that did
	// not come over HTTP (an in-process server's).
	Status int
	// Code is the API's stable code ("permission_denied", ...), or the
	// status text of an answer that was not the API's JSON.
	Code string
	// Message is the API's sentence for people.
	Message string
	// RetryAfter is how long the server asked the client to wait before
	// trying again (429 and 503 answers); zero when it did not say.
	RetryAfter time.Duration
	// EndedAt and EndReason say when and why a session ended
	// (session_expired).
	EndedAt   *time.Time
	EndReason string
	// RequestID is the answer's X-Request-Id: the daemon's log line of an
	// error it did not explain (an internal one) carries it.
	RequestID string
}

// Error is the API's sentence; a server's error (5xx) names its request
// id too, which finds its cause in the daemon's log.
func (e *Error) Error() string {
	msg := e.Message
	if e.Status >= 500 && e.RequestID != "" {
		msg += " (request " + e.RequestID + ")"
	}
	if e.RetryAfter > 0 {
		return fmt.Sprintf("%s (retry after %s)", msg, e.RetryAfter)
	}
	return msg
}

// Unwrap returns the error class of the code.
func (e *Error) Unwrap() error { return classOf(e.Code, e.Status) }

// classes maps the API's stable codes to error classes: the inverse of
// the server's mapping (api's classes).
var classes = map[string]error{
	wire.CodeInvalidArgument:    errdefs.ErrInvalidArgument,
	wire.CodeUnauthenticated:    errdefs.ErrUnauthenticated,
	wire.CodeInsufficientCredit: errdefs.ErrPaymentRequired,
	wire.CodePermissionDenied:   errdefs.ErrPermissionDenied,
	wire.CodeNotFound:           errdefs.ErrNotFound,
	wire.CodeConflict:           errdefs.ErrConflict,
	wire.CodeFailedPrecondition: errdefs.ErrFailedPrecondition,
	wire.CodeTooLarge:           errdefs.ErrTooLarge,
	wire.CodeResourceExhausted:  errdefs.ErrResourceExhausted,
	wire.CodeUnavailable:        errdefs.ErrUnavailable,
	// A method the path does not take is the caller's mistake; a body that
	// came too late is worth sending again.
	wire.CodeMethodNotAllowed: errdefs.ErrInvalidArgument,
	wire.CodeRequestTimeout:   errdefs.ErrUnavailable,
	// Sessions: an ended one (gone for good, a FailedPrecondition too),
	// one that runs another cell, a workspace with as many live sessions
	// as it may have, a file path outside /workspace.
	wire.CodeSessionExpired: errdefs.ErrGone,
	wire.CodeGone:           errdefs.ErrGone,
	wire.CodeSessionBusy:    errdefs.ErrConflict,
	wire.CodeSessionQuota:   errdefs.ErrResourceExhausted,
	wire.CodeInvalidPath:    errdefs.ErrInvalidArgument,
}

// classOf is the error class of an answer: its code's, else its status's
// (an answer that is not the API's, from a proxy in between, say). An
// internal error has none. It is the one place the client reads codes.
func classOf(code string, status int) error {
	if c, ok := classes[code]; ok {
		return c
	}
	switch {
	case status == http.StatusUnauthorized:
		return errdefs.ErrUnauthenticated
	case status == http.StatusPaymentRequired:
		return errdefs.ErrPaymentRequired
	case status == http.StatusForbidden:
		return errdefs.ErrPermissionDenied
	case status == http.StatusNotFound:
		return errdefs.ErrNotFound
	case status == http.StatusConflict:
		return errdefs.ErrConflict
	case status == http.StatusGone:
		return errdefs.ErrGone
	case status == http.StatusRequestEntityTooLarge:
		return errdefs.ErrTooLarge
	case status == http.StatusTooManyRequests:
		return errdefs.ErrResourceExhausted
	case status == http.StatusBadGateway, status == http.StatusServiceUnavailable, status == http.StatusGatewayTimeout,
		status == http.StatusRequestTimeout:
		return errdefs.ErrUnavailable
	case status >= 400 && status < 500:
		return errdefs.ErrInvalidArgument
	}
	return nil
}

// maxErrorBody bounds what is read of an error answer.
const maxErrorBody = 64 << 10

// errorOf turns an error answer (status >= 400) into an *Error: the API's
// {"error":{"code","message"}} when the body is that, else the status and
// the start of the body. header gives Retry-After.
func errorOf(status int, header http.Header, body []byte) *Error {
	e := &Error{Status: status, RetryAfter: retryAfter(header.Get("Retry-After")), RequestID: header.Get("X-Request-Id")}
	var b wire.ErrorBody
	if err := json.Unmarshal(body, &b); err == nil && b.Error.Code != "" {
		e.Code, e.Message, e.EndedAt, e.EndReason = b.Error.Code, b.Error.Message, b.Error.EndedAt, b.Error.EndReason
		return e
	}
	e.Code = http.StatusText(status)
	e.Message = fmt.Sprintf("the server answered %d %s", status, http.StatusText(status))
	if len(body) > 0 {
		const show = 200
		if len(body) > show {
			body = body[:show]
		}
		e.Message += ": " + strconv.Quote(string(body))
	}
	return e
}

// retryAfter reads a Retry-After header: seconds or an HTTP date.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t).Round(time.Second), 0)
	}
	return 0
}

// AsError returns the *Error in err's chain, if there is one.
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}
