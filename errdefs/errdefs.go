// Package errdefs holds Stockade's error classes. Every error that crosses a
// package boundary wraps one of them, so that the API can map it to a status
// code in exactly one place:
//
//	return fmt.Errorf("resolving image %q: %w", name, errdefs.ErrNotFound)
//	...
//	if errdefs.IsNotFound(err) { ... }
package errdefs

import (
	"errors"
	"fmt"
)

// The error classes.
var (
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrNotFound           = errors.New("not found")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnavailable        = errors.New("unavailable")
	ErrUnauthenticated    = errors.New("unauthenticated")
	ErrConflict           = errors.New("conflict")
	ErrTooLarge           = errors.New("too large")
	ErrPaymentRequired    = errors.New("insufficient credits")
	// ErrGone is ErrFailedPrecondition for good: what the request names
	// has ended and will not come back (an ended session). It is of
	// class ErrFailedPrecondition too, so that IsFailedPrecondition holds
	// for it; the API answers it 410 where FailedPrecondition is 409.
	ErrGone error = gone{}
)

// gone is ErrGone: a refinement of ErrFailedPrecondition.
type gone struct{}

func (gone) Error() string { return "gone" }
func (gone) Unwrap() error { return ErrFailedPrecondition }

func IsInvalidArgument(err error) bool    { return errors.Is(err, ErrInvalidArgument) }
func IsNotFound(err error) bool           { return errors.Is(err, ErrNotFound) }
func IsPermissionDenied(err error) bool   { return errors.Is(err, ErrPermissionDenied) }
func IsFailedPrecondition(err error) bool { return errors.Is(err, ErrFailedPrecondition) }
func IsResourceExhausted(err error) bool  { return errors.Is(err, ErrResourceExhausted) }
func IsUnavailable(err error) bool        { return errors.Is(err, ErrUnavailable) }
func IsUnauthenticated(err error) bool    { return errors.Is(err, ErrUnauthenticated) }
func IsConflict(err error) bool           { return errors.Is(err, ErrConflict) }
func IsTooLarge(err error) bool           { return errors.Is(err, ErrTooLarge) }
func IsPaymentRequired(err error) bool    { return errors.Is(err, ErrPaymentRequired) }
func IsGone(err error) bool               { return errors.Is(err, ErrGone) }

// classes are the error classes, the only errors that Publicf lets a
// public message wrap besides other public errors.
var classes = []error{ErrInvalidArgument, ErrNotFound, ErrPermissionDenied, ErrFailedPrecondition,
	ErrResourceExhausted, ErrUnavailable, ErrUnauthenticated, ErrConflict, ErrTooLarge, ErrPaymentRequired, ErrGone}

// public is an error whose message a client may read.
type public struct{ err error }

func (e *public) Error() string { return e.err.Error() }
func (e *public) Unwrap() error { return e.err }
func (e *public) Public() bool  { return true }

// Publicer is an error that says whether its message is fit for a client
// (as Publicf's contract says): an error type whose messages are so for
// some of its values implements it.
type Publicer interface {
	error
	Public() bool
}

// Publicf is fmt.Errorf for an error whose message a client may read: the
// API answers it as it is, where it answers any other error with its
// class's fixed sentence. The message names only what the client sent or
// owns (ids, fields, limits, its own policy's reasons) and says what to
// do; never a host path, an address, a user, a database's or a driver's
// words:
//
//	return errdefs.Publicf("execution %q not found: %w", id, errdefs.ErrNotFound)
//
// Its error arguments may be error classes and public errors only. Any
// other error among them (a store's, the operating system's) makes the
// result an ordinary error, whose message the API hides: a mistake hides
// a message rather than leaking one.
func Publicf(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	for _, a := range args {
		if e, ok := a.(error); ok && !isClass(e) && !isPublic(e) {
			return err
		}
	}
	return &public{err}
}

// Public marks err, whose message its maker vouches for as Publicf's
// contract says, as one a client may read. It is for error types whose
// Error method builds such a message from their fields.
func Public(err error) error {
	if err == nil {
		return nil
	}
	return &public{err}
}

// PublicMessage returns the message of the outermost error in err's chain
// that a client may read (made by Publicf or Public, or a Publicer that
// says so), and false when there is none: then err's message is the
// operator's, not the client's.
func PublicMessage(err error) (string, bool) {
	for err != nil {
		if p, ok := err.(Publicer); ok && p.Public() {
			return p.Error(), true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if msg, ok := PublicMessage(e); ok {
					return msg, true
				}
			}
			return "", false
		default:
			return "", false
		}
	}
	return "", false
}

func isClass(err error) bool {
	for _, c := range classes {
		if err == c {
			return true
		}
	}
	return false
}

func isPublic(err error) bool {
	p, ok := err.(Publicer)
	return ok && p.Public()
}
