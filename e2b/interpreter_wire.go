package e2b

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/wire"
)

// The code interpreter's wire, as @e2b/code-interpreter 2.8.0 speaks it
// (dist/index.js: runCode, parseOutput): POST /execute takes
// {"code", "context_id", "language", "env_vars"} and answers NDJSON, one
// JSON object a line, each with a "type": stdout and stderr {"text"},
// result (the MIME bundle's text, html, png, json, ...; is_main_result
// for the value of the cell's last expression), error {"name", "value",
// "traceback"}, number_of_executions {"execution_count"}, and
// end_of_execution. The SDK parses every line as JSON and ignores types it
// does not know: keepalives are {"type": "keepalive"} lines, and a cell
// that awaits a human's approval first says so in an approval_required
// line {"approval_id", "execution_id"}.

// Bounds of an /execute request.
const (
	ciMaxExecuteBody = 8 << 20 // the whole body
	ciMaxEnvVars     = 256
	ciMaxEnvName     = 256
	ciMaxEnvValue    = 64 << 10
	ciMaxLanguage    = 64
	ciMaxContextID   = 128
)

// ciExecuteRequest is the body of POST /execute.
type ciExecuteRequest struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// ciDecodeExecute reads and checks an /execute body (r is bounded by the
// caller): one JSON object, absent and null fields empty.
func ciDecodeExecute(r io.Reader) (ciExecuteRequest, error) {
	var req ciExecuteRequest
	dec := json.NewDecoder(r)
	if err := dec.Decode(&req); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return req, errdefs.Publicf("the request body exceeds %d bytes: %w", tooBig.Limit, errdefs.ErrTooLarge)
		}
		return req, errdefs.Publicf("the request body is not a JSON object of code, context_id, language and env_vars: %w", errdefs.ErrInvalidArgument)
	}
	if _, err := dec.Token(); err != io.EOF {
		return req, errdefs.Publicf("the request body holds more than one JSON value: %w", errdefs.ErrInvalidArgument)
	}
	switch {
	case req.ContextID != "" && req.Language != "":
		return req, errdefs.Publicf("give context_id or language, not both: %w", errdefs.ErrInvalidArgument)
	case len(req.Language) > ciMaxLanguage:
		return req, errdefs.Publicf("language is longer than %d bytes: %w", ciMaxLanguage, errdefs.ErrInvalidArgument)
	case len(req.ContextID) > ciMaxContextID:
		return req, errdefs.Publicf("context_id is longer than %d bytes: %w", ciMaxContextID, errdefs.ErrInvalidArgument)
	case len(req.EnvVars) > ciMaxEnvVars:
		return req, errdefs.Publicf("env_vars has more than %d variables: %w", ciMaxEnvVars, errdefs.ErrInvalidArgument)
	}
	for k, v := range req.EnvVars {
		if !ciEnvName(k) {
			return req, errdefs.Publicf("env_vars: %q is not a variable name (letters, digits and _, at most %d bytes): %w", clipName(k), ciMaxEnvName, errdefs.ErrInvalidArgument)
		}
		if len(v) > ciMaxEnvValue || strings.IndexByte(v, 0) >= 0 {
			return req, errdefs.Publicf("env_vars: the value of %s is longer than %d bytes or holds a NUL: %w", k, ciMaxEnvValue, errdefs.ErrInvalidArgument)
		}
	}
	return req, nil
}

// ciEnvName says whether k is a portable environment variable name.
func ciEnvName(k string) bool {
	if k == "" || len(k) > ciMaxEnvName || (k[0] >= '0' && k[0] <= '9') {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c != '_' && (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// clipName bounds a client's name quoted in a message.
func clipName(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// ciMsg is one line of an /execute stream.
type ciMsg map[string]any

// ciOutput is one rich output of a cell, as the engine makes it.
type ciOutput = wire.CellOutput

// ciMIME maps the MIME types Stockade's kernels emit (and a few more) to
// the fields of E2B's Result.
var ciMIME = map[string]string{
	"text/plain":             "text",
	"text/html":              "html",
	"text/markdown":          "markdown",
	"text/latex":             "latex",
	"image/png":              "png",
	"image/jpeg":             "jpeg",
	"image/svg+xml":          "svg",
	"application/pdf":        "pdf",
	"application/json":       "json",
	"application/javascript": "javascript",
}

// ciResult is output o as a result line: png, jpeg and pdf stay base64
// (as the engine has them and E2B sends them), json is the document
// itself when it parses. Another MIME type is a field of its own name,
// which the SDK keeps in Result.extra.
func ciResult(o ciOutput, main bool) ciMsg {
	m := ciMsg{"type": "result", "is_main_result": main}
	key, ok := ciMIME[o.MimeType]
	if !ok {
		key = o.MimeType
	}
	if key == "json" && json.Valid([]byte(o.Data)) {
		m[key] = json.RawMessage(o.Data)
	} else {
		m[key] = o.Data
	}
	return m
}

// ciErrorMsg is an error line.
func ciErrorMsg(name, value, traceback string) ciMsg {
	return ciMsg{"type": "error", "name": name, "value": value, "traceback": traceback}
}

// ciCellDoc is what the interpreter reads of a cell's result document
// (capability.CellResultDoc): its error may be an exception (an object)
// or why Stockade could not run it (a string), depending on how it ended.
type ciCellDoc struct {
	Cell    int             `json:"cell"`
	Status  string          `json:"status"`
	Outputs []ciOutput      `json:"outputs"`
	Error   json.RawMessage `json:"error"`
}

// ciOutcome is the end of ended cell e's stream: the outputs not streamed
// yet (the first displays were: the engine publishes a cell's displays
// as they come, and its value last), the main result, its error and
// end_of_execution. The value of the cell's last expression is the last
// output, text/plain (Stockade's kernels display figures as image/png).
func ciOutcome(e model.Execution, displays int) []ciMsg {
	var out []ciMsg
	var doc ciCellDoc
	if len(e.Result) > 0 {
		_ = json.Unmarshal(e.Result, &doc)
	}
	n := len(doc.Outputs)
	main := -1
	if n > 0 && doc.Outputs[n-1].MimeType == "text/plain" && e.Status == model.StatusSucceeded {
		main = n - 1
	}
	for i := min(displays, n); i < n; i++ {
		out = append(out, ciResult(doc.Outputs[i], i == main))
	}
	if doc.Cell > 0 || e.Cell > 0 {
		out = append(out, ciMsg{"type": "number_of_executions", "execution_count": max(doc.Cell, e.Cell)})
	}
	if m := ciEndError(e, doc); m != nil {
		out = append(out, m)
	}
	return append(out, ciMsg{"type": "end_of_execution"})
}

// ciEndError is the error line of cell e that ended as doc says, or nil
// when it succeeded.
func ciEndError(e model.Execution, doc ciCellDoc) ciMsg {
	var raised engine.CellError
	if len(doc.Error) > 0 && doc.Error[0] == '{' && json.Unmarshal(doc.Error, &raised) == nil && raised.Name != "" {
		return ciErrorMsg(raised.Name, raised.Value, raised.Traceback)
	}
	var why string
	if len(doc.Error) > 0 && doc.Error[0] == '"' {
		_ = json.Unmarshal(doc.Error, &why)
	}
	switch e.Status {
	case model.StatusSucceeded:
		return nil
	case model.StatusDenied:
		return ciErrorMsg("ApprovalDenied", fmt.Sprintf("approval %s of cell %s was denied: nothing ran and nothing was charged", e.ApprovalID, e.ID), "")
	case model.StatusApprovalExpired:
		return ciErrorMsg("ApprovalExpired", fmt.Sprintf("approval %s of cell %s expired undecided: nothing ran and nothing was charged", e.ApprovalID, e.ID), "")
	case model.StatusCancelled:
		return ciErrorMsg("CellCancelled", fmt.Sprintf("cell %s was cancelled", e.ID), "")
	case model.StatusTimedOut:
		return ciErrorMsg("TimeoutError", fmt.Sprintf("cell %s ran past its timeout and was interrupted", e.ID), "")
	case model.StatusOOMKilled:
		return ciErrorMsg("MemoryError", "the kernel was killed for using more memory than the sandbox's limit", "")
	}
	if why == "" {
		why = fmt.Sprintf("cell %s ended %s", e.ID, e.Status)
	}
	return ciErrorMsg(wire.StockadeError, why, "")
}

// ciStream writes an /execute answer: NDJSON lines, each flushed. Sends
// after a write error (the client went away) are dropped.
type ciStream struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	flusher http.Flusher
	broken  bool
	buf     bytes.Buffer
}

func newCIStream(w http.ResponseWriter, f http.Flusher) *ciStream {
	return &ciStream{w: w, flusher: f}
}

// start sends the response's headers.
func (s *ciStream) start() {
	s.w.Header().Set("Content-Type", "application/x-ndjson")
	s.w.Header().Set("Cache-Control", "no-store")
	s.w.Header().Set("X-Accel-Buffering", "no")
	s.w.WriteHeader(http.StatusOK)
	s.flusher.Flush()
}

// send writes m as one line.
func (s *ciStream) send(m ciMsg) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken {
		return
	}
	s.buf.Reset()
	enc := json.NewEncoder(&s.buf) // Encode ends the line
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return
	}
	if _, err := s.w.Write(s.buf.Bytes()); err != nil {
		s.broken = true
		return
	}
	s.flusher.Flush()
}
