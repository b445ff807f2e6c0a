package vercel

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	clipping "github.com/stockade-sh/stockade/internal/clip"

	"github.com/stockade-sh/stockade/errdefs"
)

// The Vercel Sandbox REST API as the official SDK (@vercel/sandbox 3.5.0,
// its src/api-client) calls it: a bearer token in Authorization, the team
// in the query (teamId), JSON bodies, and a command's output as NDJSON.
// Only the fields the driver reads are declared; every answer is read
// within a bound and checked before use.

// Bounds of what the driver reads from the API.
const (
	// maxBody bounds a JSON answer (a sandbox, a session, a command).
	maxBody = 1 << 20
	// maxLine bounds one NDJSON line of a command's stream: a chunk of
	// output, JSON-escaped (up to six bytes per byte of output).
	maxLine = 4 << 20
	// maxString bounds the identifiers and messages the driver keeps.
	maxString = 1024
)

// createRequest is POST /v2/sandboxes: a sandbox of a runtime (the SDK
// posts to /v3/sandboxes only when no runtime is named).
type createRequest struct {
	ProjectID     string            `json:"projectId"`
	Name          string            `json:"name,omitempty"`
	Ports         []int             `json:"ports"`
	Timeout       int64             `json:"timeout"` // milliseconds
	Resources     *resources        `json:"resources,omitempty"`
	Runtime       string            `json:"runtime"`
	NetworkPolicy networkPolicy     `json:"networkPolicy"`
	Tags          map[string]string `json:"tags,omitempty"`
	Persistent    bool              `json:"persistent"`
}

type resources struct {
	VCPUs int `json:"vcpus"`
}

// networkPolicy is the API's policy: {"mode":"deny-all"}, or an allow
// list of domains ({"allow":["example.com"]}).
type networkPolicy struct {
	Mode  string   `json:"mode,omitempty"`
	Allow []string `json:"allow,omitempty"`
}

// denyAll is the policy of a sandbox without network: no way out.
var denyAll = networkPolicy{Mode: "deny-all"}

// commandRequest is POST /v2/sandboxes/sessions/{id}/cmd with wait and
// logs set: the answer is the command's NDJSON stream.
type commandRequest struct {
	Command string            `json:"command"`
	Args    []string          `json:"args"`
	Cwd     string            `json:"cwd,omitempty"`
	Env     map[string]string `json:"env"`
	Sudo    bool              `json:"sudo"`
	Wait    bool              `json:"wait"`
	Logs    bool              `json:"logs"`
	Timeout int64             `json:"timeout,omitempty"` // milliseconds
}

// killRequest is POST .../cmd/{cmdId}/kill.
type killRequest struct {
	Signal int `json:"signal"`
}

// createAnswer is what creating a sandbox returns: the sandbox and its
// first session, whose id names the VM that runs commands.
type createAnswer struct {
	Sandbox struct {
		Name   string `json:"name"`
		Status string `json:"status"`
	} `json:"sandbox"`
	Session struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	} `json:"session"`
}

// sandboxAnswer is GET /v2/sandboxes/{name}.
type sandboxAnswer struct {
	Sandbox struct {
		Name   string `json:"name"`
		Status string `json:"status"`
	} `json:"sandbox"`
}

// listAnswer is GET /v2/sandboxes.
type listAnswer struct {
	Sandboxes []struct {
		Name   string            `json:"name"`
		Status string            `json:"status"`
		Tags   map[string]string `json:"tags"`
	} `json:"sandboxes"`
	Pagination struct {
		Next *string `json:"next"`
	} `json:"pagination"`
}

// command is a command as the API describes it; ExitCode is null while
// it runs.
type command struct {
	ID       string `json:"id"`
	ExitCode *int   `json:"exitCode"`
}

// streamLine is one line of a command's NDJSON stream: the command (first
// when it starts, last with its exit code), or a log line of stdout or
// stderr, or an error.
type streamLine struct {
	Command *command        `json:"command"`
	Stream  string          `json:"stream"`
	Data    json.RawMessage `json:"data"`
}

// event is a decoded stream line.
type event struct {
	kind     eventKind
	cmdID    string
	exitCode int    // kindExit
	data     []byte // kindStdout, kindStderr
	errCode  string // kindError
	errMsg   string // kindError
}

type eventKind int

const (
	kindStarted eventKind = iota + 1
	kindExit
	kindStdout
	kindStderr
	kindError
)

// decodeLine decodes one NDJSON line of a command's stream.
func decodeLine(line []byte) (event, error) {
	if len(line) > maxLine {
		return event{}, fmt.Errorf("a line of %d bytes, more than %d", len(line), maxLine)
	}
	var l streamLine
	if err := json.Unmarshal(line, &l); err != nil {
		return event{}, fmt.Errorf("a line that is no JSON object: %v", err)
	}
	if l.Command != nil {
		if err := checkID("command id", l.Command.ID); err != nil {
			return event{}, err
		}
		if l.Command.ExitCode == nil {
			return event{kind: kindStarted, cmdID: l.Command.ID}, nil
		}
		if c := *l.Command.ExitCode; c < -1 || c > 255 {
			return event{}, fmt.Errorf("exit code %d out of range", c)
		}
		return event{kind: kindExit, cmdID: l.Command.ID, exitCode: *l.Command.ExitCode}, nil
	}
	switch l.Stream {
	case "stdout", "stderr":
		var s string
		if err := json.Unmarshal(l.Data, &s); err != nil {
			return event{}, fmt.Errorf("a %s line whose data is no string", l.Stream)
		}
		k := kindStdout
		if l.Stream == "stderr" {
			k = kindStderr
		}
		return event{kind: k, data: []byte(s)}, nil
	case "error":
		var e struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(l.Data, &e); err != nil {
			return event{}, fmt.Errorf("an error line whose data is no object")
		}
		return event{kind: kindError, errCode: clip(e.Code), errMsg: clip(e.Message)}, nil
	}
	return event{}, fmt.Errorf("a line of unknown stream %q", clip(l.Stream))
}

// decodeCreate decodes the answer to a create.
func decodeCreate(body []byte) (createAnswer, error) {
	var a createAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return a, fmt.Errorf("decoding the created sandbox: %v", err)
	}
	if err := checkID("session id", a.Session.ID); err != nil {
		return a, err
	}
	if err := checkID("sandbox name", a.Sandbox.Name); err != nil {
		return a, err
	}
	return a, nil
}

// decodeSandbox decodes GET /v2/sandboxes/{name}.
func decodeSandbox(body []byte) (sandboxAnswer, error) {
	var a sandboxAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return a, fmt.Errorf("decoding a sandbox: %v", err)
	}
	if err := checkID("sandbox name", a.Sandbox.Name); err != nil {
		return a, err
	}
	a.Sandbox.Status = clip(a.Sandbox.Status)
	return a, nil
}

// decodeList decodes GET /v2/sandboxes.
func decodeList(body []byte) (listAnswer, error) {
	var a listAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return a, fmt.Errorf("decoding the list of sandboxes: %v", err)
	}
	for _, s := range a.Sandboxes {
		if err := checkID("sandbox name", s.Name); err != nil {
			return a, err
		}
	}
	if a.Pagination.Next != nil && len(*a.Pagination.Next) > maxString {
		return a, fmt.Errorf("a cursor of %d bytes", len(*a.Pagination.Next))
	}
	return a, nil
}

// decodeError returns the message of an error answer ({"error":
// {"message": ...}}, which the SDK reads), or its status alone.
func decodeError(status int, body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		return fmt.Sprintf("%d %s", status, clip(e.Error.Message))
	}
	return fmt.Sprintf("%d %s", status, http.StatusText(status))
}

// apiError classes an error answer of the API.
func apiError(what string, status int, body []byte) error {
	class := errdefs.ErrUnavailable
	switch {
	case status == http.StatusUnauthorized:
		class = errdefs.ErrUnauthenticated
	case status == http.StatusForbidden:
		class = errdefs.ErrPermissionDenied
	case status == http.StatusNotFound || status == http.StatusGone:
		class = errdefs.ErrNotFound
	case status == http.StatusConflict:
		class = errdefs.ErrConflict
	case status == http.StatusTooManyRequests || status == http.StatusPaymentRequired:
		class = errdefs.ErrResourceExhausted
	case status == http.StatusBadRequest || status == http.StatusUnprocessableEntity:
		class = errdefs.ErrInvalidArgument
	}
	return &answerError{status: status, err: fmt.Errorf("vercel: %s: %s: %w", what, decodeError(status, body), class)}
}

// answerError is an error answer of the API: its status, and the error
// apiError made of it (classed).
type answerError struct {
	status int
	err    error
}

func (e *answerError) Error() string { return e.err.Error() }
func (e *answerError) Unwrap() error { return e.err }

// refused tells whether err is the API's refusal of a request: an
// answer of status 4xx, after which nothing of the request was done.
func refused(err error) bool {
	var a *answerError
	return errors.As(err, &a) && a.status/100 == 4
}

// readBody reads at most maxBody bytes of r.
func readBody(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxBody+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxBody {
		return nil, fmt.Errorf("an answer of more than %d bytes", maxBody)
	}
	return b, nil
}

// checkID accepts an identifier the API gave: printable ASCII without
// a slash, a '?', a '#' or '%' (it goes into paths), at most maxString bytes.
func checkID(what, id string) error {
	if id == "" || len(id) > maxString {
		return fmt.Errorf("a %s of %d bytes", what, len(id))
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c >= 0x7f || strings.IndexByte("/?#%\\", c) >= 0 {
			return fmt.Errorf("a %s with byte %#x", what, c)
		}
	}
	return nil
}

// clip bounds a string the API gave to maxString bytes of valid UTF-8
// (and says how long it was). Invalid bytes are replaced first: each
// becomes a 3-byte U+FFFD, so replacing them after the cut could triple
// its length.
func clip(s string) string {
	return clipping.String(strings.ToValidUTF8(s, "\uFFFD"), maxString)
}

// lineReader splits a stream into lines of at most maxLine bytes.
type lineReader struct {
	r    *bufio.Reader
	line []byte
}

func newLineReader(r io.Reader) *lineReader { return &lineReader{r: bufio.NewReaderSize(r, 64<<10)} }

// next returns the next non-empty line, io.EOF at the end. The line is
// valid until the next call.
func (l *lineReader) next() ([]byte, error) {
	for {
		l.line = l.line[:0]
		for {
			frag, err := l.r.ReadSlice('\n')
			if len(l.line)+len(frag) > maxLine+1 {
				return nil, fmt.Errorf("vercel: a stream line of more than %d bytes", maxLine)
			}
			l.line = append(l.line, frag...)
			if err == bufio.ErrBufferFull {
				continue
			}
			if err != nil && err != io.EOF {
				return nil, err
			}
			if err == io.EOF && len(bytes.TrimSpace(l.line)) == 0 {
				return nil, io.EOF
			}
			break
		}
		if line := bytes.TrimSpace(l.line); len(line) > 0 {
			return line, nil
		}
	}
}
