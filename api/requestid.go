package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
)

// RequestIDHeader carries a request's id, in the request (the client's,
// if sane) and in every answer.
const RequestIDHeader = "X-Request-Id"

type requestIDKey struct{}

// RequestID is the id of the request whose context ctx is, or "" outside
// of one. The log lines of the request's errors carry it.
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// withRequestID gives every request an id: the client's X-Request-Id when
// it is sane (saneRequestID), else a new one. The answer carries it in
// its X-Request-Id header, and the request's context in RequestID.
func withRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(RequestIDHeader)
		if !saneRequestID(id) {
			id = newRequestID()
		}
		w.Header().Set(RequestIDHeader, id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id)))
	})
}

// saneRequestID reports whether id, a client's, may stand in the log and
// the answer as it is: 1 to 128 letters, digits and . _ : - only, so that
// it neither forges a log line nor carries a payload.
func saneRequestID(id string) bool {
	if len(id) == 0 || len(id) > 128 {
		return false
	}
	for _, c := range []byte(id) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

// newRequestID is a fresh request id: 16 random bytes, in hex.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
