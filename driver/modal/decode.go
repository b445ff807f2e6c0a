package modal

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	clipping "github.com/stockade-sh/stockade/internal/clip"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stockade-sh/stockade/errdefs"
)

// What the driver reads from the API is protobuf, each message bounded
// by maxMessage; the strings it keeps and the tokens it parses are
// checked here before use.

// maxString bounds the identifiers and messages the driver keeps.
const maxString = 1024

// maxToken bounds a JWT the API hands out.
const maxToken = 16 << 10

// checkID checks an identifier of the API (an app, image, sandbox or task
// id): short, of letters, digits, '-' and '_'.
func checkID(what, id string) error {
	if id == "" || len(id) > 128 {
		return fmt.Errorf("%s of %d bytes", what, len(id))
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("%s %q holds %q", what, clip(id), r)
		}
	}
	return nil
}

// defaultExpiry is the lifetime of a token that names no expiry, as the
// client libraries assume.
const defaultExpiry = 20 * time.Minute

// tokenExpiry reads the expiry (its exp claim) of a JWT the API handed
// out, unverified: the driver only needs to know when to fetch another.
// A token without exp lasts defaultExpiry.
func tokenExpiry(jwt string) (time.Time, error) {
	if jwt == "" || len(jwt) > maxToken || strings.ContainsAny(jwt, " \t\r\n") {
		return time.Time{}, fmt.Errorf("a token of %d bytes", len(jwt))
	}
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return time.Time{}, errors.New("a token that is no JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, fmt.Errorf("a token whose payload is no base64: %v", err)
	}
	var claims struct {
		Exp *float64 `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return time.Time{}, fmt.Errorf("a token whose payload is no JSON object: %v", err)
	}
	if claims.Exp == nil {
		return time.Now().Add(defaultExpiry), nil
	}
	if *claims.Exp < 0 || *claims.Exp > 1<<40 {
		return time.Time{}, fmt.Errorf("a token expiring at %v", *claims.Exp)
	}
	return time.Unix(int64(*claims.Exp), 0), nil
}

// clip returns s cut to maxString bytes of valid UTF-8 (and how long it
// was). Invalid bytes are replaced first: each becomes a 3-byte U+FFFD,
// so replacing them after the cut could triple its length.
func clip(s string) string {
	return clipping.String(strings.ToValidUTF8(s, "\uFFFD"), maxString)
}

// unreadable is the error of an answer the driver cannot use.
func unreadable(what string, err error) error {
	return fmt.Errorf("modal: %s: an unreadable answer: %v: %w", what, err, errdefs.ErrUnavailable)
}

// rpcError classes the error of a call by its gRPC status; its message
// is the provider's, clipped.
func rpcError(what string, err error) error {
	var own *ownError
	if errors.As(err, &own) {
		// The driver's own, from an interceptor: classed already.
		return own.err
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("modal: %s: %v: %w", what, err, errdefs.ErrUnavailable)
	}
	class := errdefs.ErrUnavailable
	switch st.Code() {
	case codes.Unauthenticated:
		class = errdefs.ErrUnauthenticated
	case codes.PermissionDenied:
		class = errdefs.ErrPermissionDenied
	case codes.NotFound:
		class = errdefs.ErrNotFound
	case codes.InvalidArgument, codes.OutOfRange:
		class = errdefs.ErrInvalidArgument
	case codes.AlreadyExists, codes.Aborted:
		class = errdefs.ErrConflict
	case codes.FailedPrecondition:
		class = errdefs.ErrFailedPrecondition
	case codes.ResourceExhausted:
		class = errdefs.ErrResourceExhausted
	}
	msg := st.Message()
	if !utf8.ValidString(msg) || len(msg) > maxString {
		msg = clip(msg)
	}
	return errdefs.Publicf("modal: %s: %s: %s: %w", what, st.Code(), msg, class)
}

// callError is rpcError of a call made on behalf of ctx, the caller's
// context (not the call's own timeout): a call that ended because ctx
// did returns ctx's error, not the service's unavailability.
func callError(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		switch status.Code(err) {
		case codes.Canceled, codes.DeadlineExceeded, codes.Unknown:
			return fmt.Errorf("modal: %s: %w", what, ctx.Err())
		}
	}
	return rpcError(what, err)
}

// ownError carries an error of the driver's through a gRPC call (the
// interceptors' auth token), which rpcError returns as it is.
type ownError struct{ err error }

func (e *ownError) Error() string { return e.err.Error() }
func (e *ownError) Unwrap() error { return e.err }
