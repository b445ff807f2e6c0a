// Package errdefs holds Stockade's error classes. Every error that crosses a
// package boundary wraps one of them, so that the API can map it to a status
// code in exactly one place:
//
//	return fmt.Errorf("resolving image %q: %w", name, errdefs.ErrNotFound)
//	...
//	if errdefs.IsNotFound(err) { ... }
package errdefs

import "errors"

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
)

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
