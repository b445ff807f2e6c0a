package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/wire"
)

// Event is one event of an execution's stream: *ApprovalRequired,
// *Started, *Output, then *Ended as the last, or *StreamError.
type Event interface{ isEvent() }

// ApprovalRequired says that the execution waits for a human decision;
// Card is what the approver is shown.
type ApprovalRequired struct{ Card ApprovalCard }

// Started says that the sandbox runs the code.
type Started struct{ wire.Started }

// Output is a chunk of the program's stdout or stderr, as it came. A
// subscriber that falls behind may miss chunks; the Result of Ended has
// the output from its start, up to the output cap.
type Output struct{ wire.Output }

// Ended is the execution once it has ended: ran (Result), denied by the
// approver, or expired before anyone decided (Execution.Status says
// which). It is the last event of a stream.
type Ended struct{ Execution Execution }

// StreamError says that the daemon could not read the execution's outcome;
// GetExecution may, later.
type StreamError struct{ wire.ErrorDetail }

func (*ApprovalRequired) isEvent() {}
func (*Started) isEvent()          {}
func (*Output) isEvent()           {}
func (*Ended) isEvent()            {}
func (*StreamError) isEvent()      {}

// ParseEvent decodes one event of the stream by its name, as the API
// sends it. An unknown name is an error, so that a newer daemon's events
// are noticed rather than dropped.
func ParseEvent(name string, data []byte) (Event, error) {
	var ev Event
	var dst any
	switch name {
	case wire.EventApprovalRequired:
		e := &ApprovalRequired{}
		ev, dst = e, &e.Card
	case wire.EventStarted:
		e := &Started{}
		ev, dst = e, &e.Started
	case wire.EventStdout, wire.EventStderr:
		e := &Output{}
		e.Stream = name
		ev, dst = e, &e.Output
	case wire.EventResult, wire.EventDenied:
		e := &Ended{}
		ev, dst = e, &e.Execution
	case wire.EventError:
		var b wire.ErrorBody
		if err := json.Unmarshal(data, &b); err != nil {
			return nil, fmt.Errorf("decoding event %q: %w", name, err)
		}
		return &StreamError{b.Error}, nil
	default:
		return nil, fmt.Errorf("unknown event %q: %w", name, errdefs.ErrInvalidArgument)
	}
	if err := json.Unmarshal(data, dst); err != nil {
		return nil, fmt.Errorf("decoding event %q: %w", name, err)
	}
	return ev, nil
}

// Stream is an execution's events as they happen. Call Close when done:
// closing a stream stops watching the execution, it does not stop the
// execution. A Stream is not safe for concurrent use.
type Stream struct {
	next  func() (name string, data []byte, err error)
	close func() error
	// parse decodes an event: ParseEvent, or a cell stream's.
	parse func(name string, data []byte) (Event, error)
	ended bool
}

// NewStream returns a stream over the events that next reads, each an
// event name and its JSON data as the API sends them, io.EOF after the
// last; close releases what next reads from. It serves transports other
// than HTTP (an in-process server) with the same events as the API.
func NewStream(next func() (name string, data []byte, err error), close func() error) *Stream {
	return &Stream{next: next, close: close, parse: ParseEvent}
}

// Next returns the next event. After *Ended it returns io.EOF; a stream
// cut before *Ended returns another error (io.ErrUnexpectedEOF when the
// daemon closed it, the context's error when that ended).
func (s *Stream) Next() (Event, error) {
	if s.ended {
		return nil, io.EOF
	}
	name, data, err := s.next()
	if errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("the event stream ended before the execution did: %w", io.ErrUnexpectedEOF)
	}
	if err != nil {
		return nil, err
	}
	ev, err := s.parse(name, data)
	if err != nil {
		return nil, err
	}
	switch ev.(type) {
	case *Ended, *CellEnded, *StreamError:
		s.ended = true
	}
	return ev, nil
}

// Close releases the stream.
func (s *Stream) Close() error { return s.close() }

// StreamExecution asks for req to run and returns its events as they
// happen: *ApprovalRequired first when a human must decide, then *Started,
// *Output chunks and *Ended. The stream lasts until the execution ends or
// ctx does; an error before the stream (a policy that refuses, too few
// credits, a server at capacity) is returned as the error.
func (c *Client) StreamExecution(ctx context.Context, req ExecutionRequest) (*Stream, error) {
	hreq, err := c.request(ctx, http.MethodPost, "/v1/executions", nil, req)
	if err != nil {
		return nil, err
	}
	if req.IdempotencyKey != "" {
		hreq.Header.Set("Idempotency-Key", req.IdempotencyKey)
	}
	st, err := c.openStream(ctx, hreq)
	if err != nil {
		return nil, fmt.Errorf("creating an execution: %w", err)
	}
	return st, nil
}

// sseReader reads Server-Sent Events: "event:" and "data:" lines up to a
// blank line; comments (keep-alives) and other fields are skipped. An
// event longer than MaxAnswer is an error.
type sseReader struct {
	r *bufio.Reader
}

func (s *sseReader) next() (name string, data []byte, err error) {
	var buf []byte
	size := 0
	for {
		line, err := s.line(&size)
		if err != nil {
			return "", nil, err
		}
		switch {
		case len(line) == 0:
			if name == "" && buf == nil {
				size = 0 // a block of comments only: a keep-alive
				continue
			}
			if name == "" {
				name = "message"
			}
			return name, buf, nil
		case line[0] == ':':
		case bytes.HasPrefix(line, []byte("event:")):
			name = string(bytes.TrimSpace(line[len("event:"):]))
		case bytes.HasPrefix(line, []byte("data:")):
			d := bytes.TrimPrefix(line[len("data:"):], []byte(" "))
			if buf != nil {
				buf = append(buf, '\n')
			}
			buf = append(buf, d...)
		}
	}
}

// line reads one line without its end, counting its bytes into size.
func (s *sseReader) line(size *int) ([]byte, error) {
	var out []byte
	for {
		frag, err := s.r.ReadSlice('\n')
		*size += len(frag)
		if *size > MaxAnswer {
			return nil, fmt.Errorf("an event of the stream is larger than %d bytes: %w", MaxAnswer, errdefs.ErrTooLarge)
		}
		out = append(out, frag...)
		switch {
		case err == nil:
			return bytes.TrimRight(out, "\r\n"), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(out) > 0:
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}
