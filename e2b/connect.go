package e2b

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
)

// Connect-RPC (https://connectrpc.com/docs/protocol), the JSON codec
// only: the SDKs' transport is connect-web with useBinaryFormat false.
// A unary call is a JSON body answered with a JSON body (an error: its
// status and {"code", "message"}); a server-streaming call's request and
// answer are envelopes, 5 bytes (flags, big-endian length) then the
// message, the last one flagged end-of-stream with the error if any.

// maxMessage bounds one Connect message this server reads.
const maxMessage = 4 << 20

// Envelope flags.
const (
	flagCompressed = 0x01
	flagEndStream  = 0x02
)

// rpcError is a Connect error: a code word and a message.
type rpcError struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

func (e *rpcError) Error() string { return e.Code + ": " + e.Message }

// Connect's codes this server answers, with their HTTP statuses for
// unary calls.
var codeStatus = map[string]int{
	"canceled": 499, "unknown": 500, "invalid_argument": 400, "deadline_exceeded": 504, "not_found": 404,
	"already_exists": 409, "permission_denied": 403, "resource_exhausted": 429, "failed_precondition": 400,
	"aborted": 409, "out_of_range": 400, "unimplemented": 501, "internal": 500, "unavailable": 503,
	"unauthenticated": 401,
}

// rpcErrorOf is err as a Connect error, by its errdefs class.
func rpcErrorOf(err error) *rpcError {
	if e, ok := err.(*rpcError); ok {
		return e
	}
	code := "internal"
	switch {
	case errdefs.IsInvalidArgument(err):
		code = "invalid_argument"
	case errdefs.IsNotFound(err):
		code = "not_found"
	case errdefs.IsConflict(err):
		code = "already_exists"
	case errdefs.IsPermissionDenied(err):
		code = "permission_denied"
	case errdefs.IsUnauthenticated(err):
		code = "unauthenticated"
	case errdefs.IsResourceExhausted(err), errdefs.IsPaymentRequired(err), errdefs.IsTooLarge(err):
		code = "resource_exhausted"
	case errdefs.IsFailedPrecondition(err):
		code = "failed_precondition"
	case errdefs.IsUnavailable(err), errdefs.IsGone(err):
		code = "unavailable"
	}
	return &rpcError{Code: code, Message: messageOf(err)}
}

// readEnvelope reads one envelope of at most max bytes of message. A
// compressed one is refused (the server announces no compression), as
// is an end-of-stream flag on a request.
func readEnvelope(r io.Reader, max int) ([]byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, &rpcError{Code: "invalid_argument", Message: "a Connect envelope needs a 5-byte prefix"}
	}
	if h[0]&flagCompressed != 0 {
		return nil, &rpcError{Code: "unimplemented", Message: "compressed messages are not accepted"}
	}
	if h[0]&^flagCompressed != 0 {
		return nil, &rpcError{Code: "invalid_argument", Message: "unknown envelope flags " + strconv.Itoa(int(h[0]))}
	}
	n := binary.BigEndian.Uint32(h[1:])
	if int64(n) > int64(max) {
		return nil, &rpcError{Code: "resource_exhausted", Message: "a message of " + strconv.FormatUint(uint64(n), 10) + " bytes is more than " + strconv.Itoa(max)}
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, &rpcError{Code: "invalid_argument", Message: "the Connect envelope is cut short"}
	}
	return b, nil
}

// appendEnvelope appends the envelope of msg with flags to dst.
func appendEnvelope(dst []byte, flags byte, msg []byte) []byte {
	var h [5]byte
	h[0] = flags
	binary.BigEndian.PutUint32(h[1:], uint32(len(msg)))
	return append(append(dst, h[:]...), msg...)
}

// rpcRequest decodes a call's request message into v: a JSON body for a
// unary call (Content-Type application/json), one envelope for a
// streaming one (application/connect+json). Unknown fields are allowed,
// as protobuf's JSON mapping allows them.
func rpcRequest(r *http.Request, streaming bool, v any) error {
	ct, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";")
	var b []byte
	if streaming {
		if ct != "application/connect+json" {
			return &rpcError{Code: "unimplemented", Message: "a streaming call takes application/connect+json, not " + quote(ct)}
		}
		var err error
		if b, err = readEnvelope(r.Body, maxMessage); err != nil {
			return err
		}
	} else {
		if ct != "application/json" {
			return &rpcError{Code: "unimplemented", Message: "a unary call takes application/json, not " + quote(ct)}
		}
		var err error
		b, err = io.ReadAll(io.LimitReader(r.Body, maxMessage+1))
		if err != nil {
			return &rpcError{Code: "invalid_argument", Message: "reading the request"}
		}
		if len(b) > maxMessage {
			return &rpcError{Code: "resource_exhausted", Message: "a request of more than " + strconv.Itoa(maxMessage) + " bytes"}
		}
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return &rpcError{Code: "invalid_argument", Message: "the request message is not valid JSON: " + err.Error()}
	}
	return nil
}

// writeUnary answers a unary call with v, or err.
func writeUnary(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		e := rpcErrorOf(err)
		w.WriteHeader(codeStatus[e.Code])
		_ = json.NewEncoder(w).Encode(e)
		return
	}
	w.WriteHeader(http.StatusOK)
	_ = json.NewEncoder(w).Encode(v)
}

// stream is the answer of a server-streaming call: messages, then the
// end of the stream. Its methods are safe for concurrent use.
type stream struct {
	mu   sync.Mutex
	w    http.ResponseWriter
	rc   *http.ResponseController
	done bool
}

// openStream sends the headers of a streaming answer.
func openStream(w http.ResponseWriter) *stream {
	w.Header().Set("Content-Type", "application/connect+json")
	w.WriteHeader(http.StatusOK)
	s := &stream{w: w, rc: http.NewResponseController(w)}
	_ = s.rc.Flush()
	return s
}

// send writes one message and flushes it.
func (s *stream) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return io.ErrClosedPipe
	}
	_ = s.rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
	if _, err := s.w.Write(appendEnvelope(nil, 0, b)); err != nil {
		return err
	}
	return s.rc.Flush()
}

// end writes the end of the stream: err's Connect error, if any.
func (s *stream) end(err error) {
	body := map[string]any{}
	if err != nil {
		body["error"] = rpcErrorOf(err)
	}
	b, _ := json.Marshal(body)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return
	}
	s.done = true
	_, _ = s.w.Write(appendEnvelope(nil, flagEndStream, b))
	_ = s.rc.Flush()
}

// connectTimeout is a call's Connect-Timeout-Ms, zero when it has none
// (or a bad one, which the caller refuses).
func connectTimeout(r *http.Request) (time.Duration, error) {
	v := r.Header.Get("Connect-Timeout-Ms")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 || len(v) > 10 {
		return 0, &rpcError{Code: "invalid_argument", Message: "Connect-Timeout-Ms " + quote(v) + " is not a positive number of at most 10 digits"}
	}
	return time.Duration(n) * time.Millisecond, nil
}
