package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/wire"
)

// TestClassesSurviveTheWire checks the two mappings against each other:
// an error of each class, answered as the API answers it (classes) and
// read as the Go client reads the answer (its classOf), is of the same
// class again, with a status and code of its own where classes differ
// (FailedPrecondition, Conflict and Gone are three answers).
func TestClassesSurviveTheWire(t *testing.T) {
	s := &server{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	tests := []struct {
		name   string
		err    error
		class  error
		status int
		code   string
	}{
		{"invalid argument", errdefs.ErrInvalidArgument, errdefs.ErrInvalidArgument, http.StatusBadRequest, wire.CodeInvalidArgument},
		{"unauthenticated", errdefs.ErrUnauthenticated, errdefs.ErrUnauthenticated, http.StatusUnauthorized, wire.CodeUnauthenticated},
		{"payment required", errdefs.ErrPaymentRequired, errdefs.ErrPaymentRequired, http.StatusPaymentRequired, wire.CodeInsufficientCredit},
		{"permission denied", errdefs.ErrPermissionDenied, errdefs.ErrPermissionDenied, http.StatusForbidden, wire.CodePermissionDenied},
		{"not found", errdefs.ErrNotFound, errdefs.ErrNotFound, http.StatusNotFound, wire.CodeNotFound},
		{"conflict", errdefs.ErrConflict, errdefs.ErrConflict, http.StatusConflict, wire.CodeConflict},
		{"failed precondition", errdefs.ErrFailedPrecondition, errdefs.ErrFailedPrecondition, http.StatusConflict, wire.CodeFailedPrecondition},
		{"gone", errdefs.ErrGone, errdefs.ErrGone, http.StatusGone, wire.CodeGone},
		{"too large", errdefs.ErrTooLarge, errdefs.ErrTooLarge, http.StatusRequestEntityTooLarge, wire.CodeTooLarge},
		{"resource exhausted", errdefs.ErrResourceExhausted, errdefs.ErrResourceExhausted, http.StatusTooManyRequests, wire.CodeResourceExhausted},
		{"unavailable", errdefs.ErrUnavailable, errdefs.ErrUnavailable, http.StatusServiceUnavailable, wire.CodeUnavailable},
		{"session expired", &capability.SessionExpiredError{SessionID: "ses_1", EndedAt: time.Now()}, errdefs.ErrGone, http.StatusGone, wire.CodeSessionExpired},
		{"session busy", &capability.SessionBusyError{SessionID: "ses_1"}, errdefs.ErrConflict, http.StatusConflict, wire.CodeSessionBusy},
		{"session quota", &capability.QuotaError{}, errdefs.ErrResourceExhausted, http.StatusTooManyRequests, wire.CodeSessionQuota},
		{"invalid path", capability.ErrInvalidPath, errdefs.ErrInvalidArgument, http.StatusBadRequest, wire.CodeInvalidPath},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := errdefs.Public(fmt.Errorf("doing it: %w", tt.err))
			e, ok := client.AsError(s.clientError(context.Background(), err))
			if !ok {
				t.Fatal("got no *client.Error")
			}
			if e.Status != tt.status || e.Code != tt.code {
				t.Errorf("answer: got %d %s, want %d %s", e.Status, e.Code, tt.status, tt.code)
			}
			if got := e.Unwrap(); got != tt.class {
				t.Errorf("the client's class: got %v, want %v", got, tt.class)
			}
			for _, other := range []error{errdefs.ErrConflict, errdefs.ErrFailedPrecondition, errdefs.ErrGone} {
				if errors.Is(tt.class, other) != errors.Is(e, other) {
					t.Errorf("errors.Is(answer, %v): got %v, want %v", other, errors.Is(e, other), errors.Is(tt.class, other))
				}
			}
		})
	}
}
