package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/stockade-sh/stockade/errdefs"
)

// ErrClosed is wrapped by the errors of requests that could not complete
// because the guest's stream ended (the sandbox died or was destroyed) or
// the guest broke the protocol.
var ErrClosed = errors.New("guest connection ended")

// Client is the host's end of one guest: it sends requests, routes the
// guest's frames to them by id and bounds everything it keeps. It is safe
// for concurrent use. A Client does not own its streams: the caller closes
// them (killing the sandbox ends both), which ends every request in flight.
//
// After a protocol violation (Err wraps ErrProtocol) nothing more the guest
// says is believed: every request fails, and the caller should kill the
// sandbox.
//
//	h, err := guest.ReadHello(stdout)
//	...
//	c, err := guest.NewClient(stdout, stdin, h)
//	ex, err := c.Exec(ctx, guest.ExecRequest{Argv: argv, OutputCap: cap + 1}, guest.ExecOptions{OutputCap: cap})
//	res, err := ex.Wait(ctx)
type Client struct {
	r       io.Reader
	w       io.Writer
	version int
	hello   Hello

	queue  chan write
	accept []byte // the Accept frame, sent before the first request

	mu      sync.Mutex
	nextID  uint32
	waiters map[uint32]*waiter
	err     error         // why the connection ended; set before done closes
	done    chan struct{} // closed when the guest's stream ended or broke
	fatal   string        // the guest's last words (a FrameError with id 0)

	unknownTypes atomic.Int64
	unknownIDs   atomic.Int64
}

// waiter receives the frames of one request. handle runs on the reader
// goroutine and must not block for long; it returns final when the request
// is complete, or an error when the frame breaks the protocol. fail is
// called instead, once, when the connection ends first.
type waiter struct {
	handle func(f Frame) (final bool, err error)
	fail   func(err error)
}

// write is one queued frame (or several, concatenated).
type write struct {
	buf  []byte
	done chan error // buffered; nil when nobody waits
}

// queueDepth bounds the frames queued for the writer goroutine.
const queueDepth = 16

// Handshake reads the guest's hello from r and returns a Client speaking
// the negotiated version. A read blocked on a silent guest is not ended by
// ctx: when Handshake returns ctx's error, the caller kills the sandbox,
// which ends the read.
func Handshake(ctx context.Context, r io.Reader, w io.Writer) (*Client, error) {
	type hello struct {
		h   *Hello
		err error
	}
	got := make(chan hello, 1)
	go func() {
		h, err := ReadHello(r)
		got <- hello{h, err}
	}()
	select {
	case h := <-got:
		if h.err != nil {
			return nil, fmt.Errorf("reading the guest's hello: %w", h.err)
		}
		return NewClient(r, w, h.h)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// NewClient negotiates a version with the guest that sent h (see
// ReadHello) and starts serving the connection: r carries the guest's
// frames (it should be buffered) and w the host's. The Accept goes out
// with the first request, so that the handshake costs no round trip of its
// own.
func NewClient(r io.Reader, w io.Writer, h *Hello) (*Client, error) {
	v, err := Negotiate(h, MinVersion, MaxVersion)
	if err != nil {
		return nil, err
	}
	c := &Client{
		r: r, w: w, version: v, hello: *h,
		queue:   make(chan write, queueDepth),
		accept:  AppendAccept(nil, v),
		waiters: map[uint32]*waiter{},
		done:    make(chan struct{}),
	}
	go c.readLoop()
	go c.writeLoop()
	return c, nil
}

// Version is the negotiated protocol version.
func (c *Client) Version() int { return c.version }

// Hello is the guest's greeting.
func (c *Client) Hello() Hello { return c.hello }

// Done is closed when the connection has ended; Err then says why.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is nil while the connection serves, then why it ended: io.EOF
// wrapped in ErrClosed for a stream that ended between frames, or an error
// wrapping ErrProtocol.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Stats counts the guest frames the client dropped: of types it does not
// know (or that only the host sends), and for ids no request waits for.
type Stats struct {
	UnknownTypes int64
	UnknownIDs   int64
}

// Stats returns the counts of dropped frames.
func (c *Client) Stats() Stats {
	return Stats{UnknownTypes: c.unknownTypes.Load(), UnknownIDs: c.unknownIDs.Load()}
}

// readLoop routes the guest's frames until its stream ends. After a
// protocol violation it goes on reading and dropping frames, so that the
// guest (and a relay in between) never blocks on a host that stopped
// reading.
func (c *Client) readLoop() {
	for {
		f, err := ReadFrame(c.r, MaxPayload)
		if err != nil {
			c.end(err)
			return
		}
		if c.Err() != nil {
			continue
		}
		info, known := Frames[f.Type]
		if !known || info.Dir&ToHost == 0 {
			c.unknownTypes.Add(1)
			continue
		}
		if f.ID == 0 {
			if f.Type == FrameError {
				var e ErrorReply
				if DecodeLenient(f.Payload, &e) == nil {
					e.Sanitize()
					c.mu.Lock()
					c.fatal = e.Message
					c.mu.Unlock()
				}
				continue
			}
			c.unknownIDs.Add(1)
			continue
		}
		c.mu.Lock()
		w := c.waiters[f.ID]
		c.mu.Unlock()
		if w == nil {
			c.unknownIDs.Add(1)
			continue
		}
		final, err := w.handle(f)
		if err != nil {
			c.end(fmt.Errorf("%s frame for request %d: %w", f.Type, f.ID, err))
			continue
		}
		if final {
			c.forget(f.ID)
		}
	}
}

// end records why the connection ended (the first reason wins) and fails
// every request in flight.
func (c *Client) end(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	if c.fatal != "" {
		err = fmt.Errorf("%w (the guest said: %s)", err, c.fatal)
	}
	c.err = fmt.Errorf("%w: %w", ErrClosed, err)
	ws := c.waiters
	c.waiters = map[uint32]*waiter{}
	close(c.done)
	c.mu.Unlock()
	for _, w := range ws {
		w.fail(c.err)
	}
}

// ReserveIDs makes the client's request ids start above last. A client
// that re-attaches to a guest through a relay (package supervisor)
// reserves the ids the earlier clients used, whose requests may still be
// in flight in the guest (an exec, a cell, a kernel's id): a new request
// under one of them would be taken for the old one. It never lowers the
// next id.
func (c *Client) ReserveIDs(last uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextID = max(c.nextID, last)
}

// CancelID asks the guest to cancel request id, which may be another
// client's: a client that re-attached cancels the exec an earlier one
// left running (Pong.Exec), whose host is gone. The request's frames are
// dropped here; for an exec, the guest is free for another once it ends.
func (c *Client) CancelID(id uint32) error {
	if id == 0 {
		return invalid("cancelling request 0")
	}
	return c.post(FrameCancel, id, nil)
}

// LastID is the highest request id the client has used, or reserved.
func (c *Client) LastID() uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nextID
}

// register adds a waiter under a new id: non-zero, and not in use (ids
// wrap after 2^32 requests).
func (c *Client) register(w *waiter) (uint32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	for {
		c.nextID++
		if _, busy := c.waiters[c.nextID]; c.nextID != 0 && !busy {
			break
		}
	}
	c.waiters[c.nextID] = w
	return c.nextID, nil
}

// forget drops the waiter of id: later frames for it are counted as
// unknown.
func (c *Client) forget(id uint32) {
	c.mu.Lock()
	delete(c.waiters, id)
	c.mu.Unlock()
}

// writeLoop writes queued frames in order, one Write each, the first one
// prefixed with the Accept.
func (c *Client) writeLoop() {
	var failed error
	for {
		var wr write
		select {
		case wr = <-c.queue:
		case <-c.done:
			// Drain what is queued so that no sender waits forever.
			for {
				select {
				case wr = <-c.queue:
					if wr.done != nil {
						wr.done <- c.Err()
					}
				default:
					return
				}
			}
		}
		if failed == nil {
			buf := wr.buf
			if c.accept != nil {
				buf = append(c.accept, buf...)
				c.accept = nil
			}
			if _, err := c.w.Write(buf); err != nil {
				failed = fmt.Errorf("%w: writing to the guest: %w", ErrClosed, err)
			}
		}
		if wr.done != nil {
			wr.done <- failed
		}
	}
}

// enqueue queues buf for the writer and returns a channel that receives
// the write's error. It blocks while the queue is full, until ctx ends or
// the connection does. A frame is written whole or not at all: when ctx
// ends after enqueue returned, the write still happens. A frame queued as
// the connection ends may never be written, nor its channel answered (the
// writer has stopped): wait for it with written.
func (c *Client) enqueue(ctx context.Context, buf []byte) (<-chan error, error) {
	done := make(chan error, 1)
	select {
	case c.queue <- write{buf: buf, done: done}:
		return done, nil
	case <-c.done:
		return nil, c.Err()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// send queues one frame and waits until it is written, ctx ends or the
// connection does.
func (c *Client) send(ctx context.Context, t FrameType, id uint32, payload []byte) error {
	buf, err := AppendFrame(nil, t, id, payload)
	if err != nil {
		return err
	}
	done, err := c.enqueue(ctx, buf)
	if err != nil {
		return err
	}
	return c.written(ctx, done)
}

// written waits for the write whose channel enqueue returned (done) and
// returns its error; or the connection's, once it has ended (a write
// queued as it ended is never answered); or ctx's.
func (c *Client) written(ctx context.Context, done <-chan error) error {
	select {
	case err := <-done:
		return err
	case <-c.done:
		select {
		case err := <-done:
			return err
		default:
			return c.Err()
		}
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sendJSON queues one frame of v, as send.
func (c *Client) sendJSON(ctx context.Context, t FrameType, id uint32, v any) error {
	p, err := marshal(v)
	if err != nil {
		return err
	}
	return c.send(ctx, t, id, p)
}

// post queues one frame without waiting for the write: for control frames
// (signal, cancel) whose effect shows in the request's answer.
func (c *Client) post(t FrameType, id uint32, payload []byte) error {
	buf, err := AppendFrame(nil, t, id, payload)
	if err != nil {
		return err
	}
	select {
	case c.queue <- write{buf: buf}:
		return nil
	case <-c.done:
		return c.Err()
	}
}

// replyError decodes a FrameError's payload into an *Error for op.
func replyError(op string, p []byte) error {
	var e ErrorReply
	if err := DecodeLenient(p, &e); err != nil {
		return err
	}
	e.Sanitize()
	return &Error{Op: op, ErrorReply: e}
}

// validator is a reply that checks itself.
type validator interface{ Validate() error }

// decodeReply decodes and validates a reply payload.
func decodeReply(p []byte, out any) error {
	if err := DecodeLenient(p, out); err != nil {
		return err
	}
	if v, ok := out.(validator); ok {
		return v.Validate()
	}
	return nil
}

// unexpectedFrame is the error for a frame a request does not take.
func unexpectedFrame(f Frame, op string) error {
	return fmt.Errorf("unexpected %s frame for %s: %w", f.Type, op, ErrProtocol)
}

// answer handles a request's last frame: a FrameResult decoded into out
// (nil: an empty object) or a FrameError as an *Error, sent on done.
// Anything else breaks the protocol.
func answer(f Frame, op string, out any, done chan<- error) (bool, error) {
	switch f.Type {
	case FrameResult:
		if out == nil {
			out = &struct{}{}
		}
		if err := decodeReply(f.Payload, out); err != nil {
			return true, err
		}
		done <- nil
	case FrameError:
		err := replyError(op, f.Payload)
		if errors.Is(err, ErrProtocol) {
			return true, err
		}
		done <- err
	default:
		return true, unexpectedFrame(f, op)
	}
	return true, nil
}

// call sends one request and waits for its FrameResult, decoded into out
// (nil: an empty object), or its FrameError as an *Error. When ctx ends
// first, the request is forgotten: its answer will be dropped.
func (c *Client) call(ctx context.Context, t FrameType, req any, op string, out any) error {
	done := make(chan error, 1)
	id, err := c.register(&waiter{
		handle: func(f Frame) (bool, error) { return answer(f, op, out, done) },
		fail:   func(err error) { done <- fmt.Errorf("%s: %w", op, err) },
	})
	if err != nil {
		return err
	}
	var p []byte
	if req != nil {
		if p, err = marshal(req); err != nil {
			c.forget(id)
			return err
		}
	}
	if err := c.send(ctx, t, id, p); err != nil {
		c.forget(id)
		return fmt.Errorf("%s: %w", op, err)
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		c.forget(id)
		return fmt.Errorf("%s: %w", op, ctx.Err())
	}
}

// Ping asks the guest for its state. A guest that answers with another
// version than the negotiated one breaks the protocol.
func (c *Client) Ping(ctx context.Context) (*Pong, error) {
	var p Pong
	if err := c.call(ctx, FramePing, nil, "ping", &p); err != nil {
		return nil, err
	}
	if p.Version != c.version {
		err := fmt.Errorf("pong of version %d on a connection of version %d: %w", p.Version, c.version, ErrProtocol)
		c.end(err)
		return nil, err
	}
	return &p, nil
}

func marshal(v any) ([]byte, error) { return json.Marshal(v) }

// invalid is the error for a request refused before it is sent.
func invalid(format string, a ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
}
