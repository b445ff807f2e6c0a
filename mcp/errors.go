package mcp

import (
	"fmt"

	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/wire"
)

// failure is the tool error of a request Stockade refused or could not
// serve, in words that say what to do: its class decides the advice. It
// is the one place where error classes meet MCP.
func failure(err error) error {
	msg := err.Error()
	if e, ok := client.AsError(err); ok {
		msg = e.Message
	}
	switch {
	case errdefs.IsPermissionDenied(err):
		return fmt.Errorf("refused by the workspace's policy: %s; running it needs a change of the policy or the tool, not a retry", msg)
	case errdefs.IsPaymentRequired(err):
		return fmt.Errorf("%s; the workspace's admin grants credits (stockade credits grant WORKSPACE N)", msg)
	case errdefs.IsResourceExhausted(err):
		return fmt.Errorf("%s; retry after %s", msg, retryAfter(err))
	case errdefs.IsUnavailable(err):
		return fmt.Errorf("Stockade is unavailable: %s; retry after %s", msg, retryAfter(err))
	case errdefs.IsUnauthenticated(err):
		return fmt.Errorf("Stockade refused the API key: %s; configure a valid agent key (STOCKADE_KEY, or the bearer token of /mcp)", msg)
	case errdefs.IsInvalidArgument(err), errdefs.IsTooLarge(err):
		return fmt.Errorf("invalid request: %s", msg)
	case errdefs.IsNotFound(err):
		return fmt.Errorf("%s; check the execution_id or session_id", msg)
	case errdefs.IsGone(err):
		// An ended session (Gone refines FailedPrecondition: first).
		return fmt.Errorf("%s; its state is gone: open another with create_session", msg)
	case errdefs.IsFailedPrecondition(err):
		return fmt.Errorf("%s; this cannot be done in its current state (a paused session resumes with `stockade session resume ID` or POST /v1/sessions/{id}/resume)", msg)
	case errdefs.IsConflict(err) && code(err) == wire.CodeSessionBusy:
		return fmt.Errorf("%s; one cell runs at a time in a session: wait for it (wait_for_cell) and try again", msg)
	case errdefs.IsConflict(err):
		return fmt.Errorf("%s; it conflicts with what happened meanwhile (a request decided already, an idempotency key used for another request): do not retry it as it is", msg)
	}
	return fmt.Errorf("Stockade could not do this: %s", msg)
}

// code is the API's stable code of err, empty when it has none.
func code(err error) string {
	if e, ok := client.AsError(err); ok {
		return e.Code
	}
	return ""
}

// retryAfter is how long the server asked to wait, one second when it did
// not say.
func retryAfter(err error) string {
	if e, ok := client.AsError(err); ok && e.RetryAfter > 0 {
		return e.RetryAfter.String()
	}
	return "1s"
}
