package errdefs_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
)

// TestPublicMessage checks which message of an error's chain a client may
// read: the outermost made public, none when an argument of Publicf is an
// error of neither kind.
func TestPublicMessage(t *testing.T) {
	notFound := errdefs.Publicf("execution %q not found: %w", "ex_1", errdefs.ErrNotFound)
	pathErr := &os.PathError{Op: "open", Path: "/var/lib/stockade/checkpoints/ss_1", Err: os.ErrPermission}
	tests := []struct {
		name string
		err  error
		want string // "" is no public message
	}{
		{"public", notFound, `execution "ex_1" not found: not found`},
		{"wrapped by context", fmt.Errorf("reading /var/lib/x: %w", notFound), `execution "ex_1" not found: not found`},
		{"public wrapping public", errdefs.Publicf("cell of session %s: %w", "ss_1", notFound), `cell of session ss_1: execution "ex_1" not found: not found`},
		{"plain", fmt.Errorf("getting execution: %w", errdefs.ErrNotFound), ""},
		{"an operating system error as argument", errdefs.Publicf("saving: %v: %w", pathErr, errdefs.ErrFailedPrecondition), ""},
		// The outer message wraps a text of no public error ("x: "): the
		// inner public message is what a client reads.
		{"a wrapped error as argument", errdefs.Publicf("saving: %w", fmt.Errorf("x: %w", notFound)), `execution "ex_1" not found: not found`},
		{"marked", errdefs.Public(errors.New("session ss_1 is busy")), "session ss_1 is busy"},
		{"nil marked", errdefs.Public(nil), ""},
		{"a Publicer", fmt.Errorf("reading /host/path: %w", publicer{true}), "the client's words"},
		{"a Publicer that says no", fmt.Errorf("reading: %w", publicer{false}), ""},
		{"joined", errors.Join(errors.New("/host/path"), notFound), `execution "ex_1" not found: not found`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := errdefs.PublicMessage(tt.err)
			if got != tt.want || ok != (tt.want != "") {
				t.Errorf("got %q, %v; want %q, %v", got, ok, tt.want, tt.want != "")
			}
			if tt.err != nil && !strings.Contains(tt.name, "ublicer") && tt.name != "marked" && !errors.Is(tt.err, errdefs.ErrNotFound) && !errors.Is(tt.err, errdefs.ErrFailedPrecondition) {
				t.Errorf("%v lost its class", tt.err)
			}
		})
	}
}

type publicer struct{ ok bool }

func (p publicer) Error() string { return "the client's words" }
func (p publicer) Public() bool  { return p.ok }
func (p publicer) Unwrap() error { return errdefs.ErrNotFound }

// TestGoneIsAFailedPrecondition checks that ErrGone refines
// ErrFailedPrecondition: what checks the wider class still sees it, and
// a plain failed precondition is not gone.
func TestGoneIsAFailedPrecondition(t *testing.T) {
	gone := fmt.Errorf("session ses_1 ended: %w", errdefs.ErrGone)
	if !errdefs.IsGone(gone) || !errdefs.IsFailedPrecondition(gone) {
		t.Errorf("a gone error: IsGone %v, IsFailedPrecondition %v; want both", errdefs.IsGone(gone), errdefs.IsFailedPrecondition(gone))
	}
	if paused := fmt.Errorf("session ses_1 is paused: %w", errdefs.ErrFailedPrecondition); errdefs.IsGone(paused) {
		t.Errorf("a failed precondition: IsGone true, want false")
	}
	if msg, ok := errdefs.PublicMessage(errdefs.Publicf("session %s ended: %w", "ses_1", errdefs.ErrGone)); !ok || msg != "session ses_1 ended: gone" {
		t.Errorf("Publicf with ErrGone: got %q, %v; want a public message", msg, ok)
	}
}
