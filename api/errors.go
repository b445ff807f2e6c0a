package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/wire"
)

// The API's own error classes: only HTTP has methods and request bodies
// that arrive late. They are mapped in classes beside errdefs' classes.
var (
	errMethodNotAllowed = errdefs.Public(errors.New("method not allowed"))
	errRequestTimeout   = errdefs.Public(errors.New("request timeout"))
)

// class is one error class as clients see it: its status, its stable code
// and the sentence that stands for any message of it a client may not
// read (errdefs.PublicMessage).
type class struct {
	is       func(error) bool
	status   int
	code     string
	sentence string
}

// classes are the error classes in the order they are matched: the
// specific ones (a session's) before the errdefs classes they belong to.
// It is the only place where error classes meet HTTP; MCP and the console
// answer through it too.
var classes = []class{
	{asType[*capability.SessionExpiredError], http.StatusGone, wire.CodeSessionExpired, "the session has ended"},
	{asType[*capability.SessionBusyError], http.StatusConflict, wire.CodeSessionBusy, "the session is running a cell; wait for it to end or interrupt it"},
	{asType[*capability.QuotaError], http.StatusTooManyRequests, wire.CodeSessionQuota, "the workspace has as many live sessions as it may; close one or retry later"},
	{isErr(capability.ErrInvalidPath), http.StatusBadRequest, wire.CodeInvalidPath, "the path is not a path below /tmp or /workspace"},
	{isErr(errMethodNotAllowed), http.StatusMethodNotAllowed, wire.CodeMethodNotAllowed, "method not allowed"},
	{isErr(errRequestTimeout), http.StatusRequestTimeout, wire.CodeRequestTimeout, "the request body did not arrive in time"},
	{errdefs.IsInvalidArgument, http.StatusBadRequest, wire.CodeInvalidArgument, "the request is not valid"},
	{errdefs.IsUnauthenticated, http.StatusUnauthorized, wire.CodeUnauthenticated, "the API key is missing, invalid or revoked"},
	{errdefs.IsPaymentRequired, http.StatusPaymentRequired, wire.CodeInsufficientCredit, "the workspace has too few credits"},
	{errdefs.IsPermissionDenied, http.StatusForbidden, wire.CodePermissionDenied, "this key may not do this"},
	{errdefs.IsNotFound, http.StatusNotFound, wire.CodeNotFound, "not found"},
	{errdefs.IsConflict, http.StatusConflict, wire.CodeConflict, "the request conflicts with the current state"},
	// Gone before FailedPrecondition, which it refines.
	{errdefs.IsGone, http.StatusGone, wire.CodeGone, "it has ended and will not come back"},
	{errdefs.IsFailedPrecondition, http.StatusConflict, wire.CodeFailedPrecondition, "the request cannot be done in the current state"},
	{errdefs.IsTooLarge, http.StatusRequestEntityTooLarge, wire.CodeTooLarge, "the request is too large"},
	{errdefs.IsResourceExhausted, http.StatusTooManyRequests, wire.CodeResourceExhausted, "the server is at capacity; retry later"},
	{errdefs.IsUnavailable, http.StatusServiceUnavailable, wire.CodeUnavailable, "the service is unavailable; retry later"},
}

// internal is the class of an error of none of the classes.
var internal = class{status: http.StatusInternalServerError, code: wire.CodeInternal, sentence: "internal error"}

func asType[T error](err error) bool {
	var t T
	return errors.As(err, &t)
}

func isErr(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}

// classOf is err's class.
func classOf(err error) class {
	for _, c := range classes {
		if c.is(err) {
			return c
		}
	}
	return internal
}

// status maps an error class to its HTTP status and stable code.
func status(err error) (int, string) {
	c := classOf(err)
	return c.status, c.code
}

// HTTPStatus is the HTTP status of err's class, for the daemon's other
// handlers (the console), which answer errors of the same classes.
func HTTPStatus(err error) int {
	code, _ := status(err)
	return code
}

// retryAfter is sent with 429 and 503 answers.
const retryAfter = time.Second

// Public is what a client may read of err: its status and its detail,
// whose message is err's public message (errdefs.Publicf) or else its
// class's fixed sentence. An internal error always has the fixed
// sentence. hidden says that err said more than the client reads: its
// cause is the operator's, to be logged (Report).
func Public(err error) (code int, d wire.ErrorDetail, hidden bool) {
	c := classOf(err)
	d = wire.ErrorDetail{Code: c.code, Message: c.sentence}
	if msg, ok := errdefs.PublicMessage(err); ok && c.status != http.StatusInternalServerError {
		d.Message = sentence(msg)
	}
	var expired *capability.SessionExpiredError
	if errors.As(err, &expired) {
		at := expired.EndedAt.UTC()
		d.EndedAt, d.EndReason = &at, string(expired.Reason)
	}
	return c.status, d, d.Message != sentence(err.Error())
}

// Report is Public, and it logs err with its cause and the request's id
// (RequestID) when the answer is a 5xx or hides err's message, so that
// what a client reads as "internal error" can be found in the log: in the
// request's own line (observe) when ctx is an API request's and that line
// is still to be written and holds no other cause, else in a line of its
// own.
func Report(ctx context.Context, log *slog.Logger, err error) (code int, d wire.ErrorDetail) {
	code, d, hidden := Public(err)
	if code >= 500 || hidden {
		if rl := requestLogOf(ctx); rl != nil && rl.note(err, d.Code, code) {
			return code, d
		}
		level := slog.LevelWarn
		if code >= 500 {
			level = slog.LevelError
		}
		log.LogAttrs(ctx, level, "request failed", slog.String("request_id", RequestID(ctx)),
			slog.Int("status", code), slog.String("code", d.Code), slog.String("err", err.Error()))
	}
	return code, d
}

// answer is the error answer of err: its status, its body, and whether it
// says when to retry (Retry-After). It logs what Report logs.
func (s *server) answer(ctx context.Context, err error) (code int, d wire.ErrorDetail, retry bool) {
	code, d = Report(ctx, s.log, err)
	return code, d, code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable
}

func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	code, d, retry := s.answer(r.Context(), err)
	if retry {
		after := retryAfter
		var quota *capability.QuotaError
		if errors.As(err, &quota) {
			after = quota.RetryAfter
		}
		w.Header().Set("Retry-After", strconv.Itoa(int((after+time.Second-1)/time.Second)))
	}
	writeJSON(w, code, wire.ErrorBody{Error: d})
}

// Describe is err's stable code and its whole sentence, for the operator:
// the CLI prints errors in this form, where only the operator reads them.
// A client's answer is Public's.
func Describe(err error) wire.ErrorDetail {
	_, name := status(err)
	d := wire.ErrorDetail{Code: name, Message: sentence(err.Error())}
	var expired *capability.SessionExpiredError
	if errors.As(err, &expired) {
		at := expired.EndedAt.UTC()
		d.EndedAt, d.EndReason = &at, string(expired.Reason)
	}
	return d
}

// classTexts are the error classes' texts that wrapping appends.
var classTexts = []error{errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrPermissionDenied,
	errdefs.ErrFailedPrecondition, errdefs.ErrResourceExhausted, errdefs.ErrUnavailable, errdefs.ErrUnauthenticated,
	errdefs.ErrConflict, errdefs.ErrTooLarge, errdefs.ErrPaymentRequired, errdefs.ErrGone, errMethodNotAllowed, errRequestTimeout}

// sentence returns an error message without the class names that wrapping
// appends (": not found"), which repeat the stable code. An error
// classified again on its way up carries several
// (`unknown tool "x": not found: invalid argument`); all of them go.
func sentence(msg string) string {
	for {
		trimmed := msg
		for _, c := range classTexts {
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
