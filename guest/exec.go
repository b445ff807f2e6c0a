package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
)

// Stream names an output stream.
type Stream uint8

const (
	Stdout Stream = 1
	Stderr Stream = 2
)

// ExecOptions is what the host does with an exec's output.
type ExecOptions struct {
	// OutputCap is the bytes kept of each stream, whatever the guest
	// sends; the rest is dropped and the stream marked truncated. Zero
	// keeps nothing.
	OutputCap int64
	// OnOutput, if set, receives each chunk that is kept, as it arrives.
	// It is called from the client's reader goroutine, one call at a time:
	// it must not block for long (it holds up every request's frames) and
	// must not retain p.
	OnOutput func(s Stream, p []byte)
}

// ExecResult is what the host kept of an exec.
type ExecResult struct {
	// Exit is the guest's report, nil if the exec did not end (yet).
	Exit            *ExitReport
	PID             int // 0 until the program started
	Stdout, Stderr  []byte
	StdoutTruncated bool
	StderrTruncated bool
}

// Exec is an exec in flight. Its methods are safe for concurrent use.
type Exec struct {
	c    *Client
	id   uint32
	opts ExecOptions

	// credits holds one token per FrameStdin the guest may still buffer.
	credits chan struct{}
	stdin   *execStdin

	mu      sync.Mutex
	res     ExecResult
	started bool
	err     error         // why the exec failed; set before done closes
	done    chan struct{} // closed when the exec ended
}

// Exec sends req and returns at once; Wait collects the answer. The
// guest refuses a second exec while one runs (ErrorBusy). A program that
// could not be started makes Wait return an *Error with code ErrorStart
// (and the guest's message); an exec that did not complete because the
// connection ended, an error wrapping ErrClosed.
func (c *Client) Exec(ctx context.Context, req ExecRequest, opts ExecOptions) (*Exec, error) {
	if len(req.Argv) == 0 {
		return nil, invalid("exec: empty argv")
	}
	if opts.OutputCap < 0 {
		return nil, invalid("exec: negative output cap")
	}
	if req.ExitNotice && !c.hello.Has(FeatureExitNotice) {
		req.ExitNotice = false
	}
	e := &Exec{c: c, opts: opts, done: make(chan struct{})}
	if req.StdinStream {
		e.credits = make(chan struct{}, StdinWindow)
		for range StdinWindow {
			e.credits <- struct{}{}
		}
		e.stdin = &execStdin{e: e}
	}
	p, err := marshal(req)
	if err != nil {
		return nil, err
	}
	id, err := c.register(&waiter{handle: e.handle, fail: func(err error) { e.finish(fmt.Errorf("exec %s: %w", req.Argv[0], err)) }})
	if err != nil {
		return nil, err
	}
	e.id = id
	buf, err := AppendFrame(nil, FrameExec, id, p)
	if err != nil {
		c.forget(id)
		return nil, invalid("exec: %v", err)
	}
	written, err := c.enqueue(ctx, buf)
	if err != nil {
		c.forget(id)
		return nil, err
	}
	// The frame is written after Exec returns: waiting for it does not end
	// with ctx (the connection's end ends it), so that a caller's cancel
	// after the start does not fail the exec.
	go func() {
		if err := c.written(context.WithoutCancel(ctx), written); err != nil {
			e.finish(err)
		}
	}()
	return e, nil
}

// AdoptExec returns a handle of exec id, which another client of the
// same guest started and the guest still runs (Pong.Exec): a client that
// re-attached to a restored guest adopts the exec a pool left waiting for
// its input, whose earlier client is gone. stdinStream says whether the
// exec was started with StdinStream (its window is taken as whole: the
// exec must have had no stdin yet); opts are what this client does with
// its output from now on. The id must not be one this client may use for
// its own requests (see ReserveIDs), nor be adopted twice. PID is 0 for an
// adopted exec.
func (c *Client) AdoptExec(id uint32, stdinStream bool, opts ExecOptions) (*Exec, error) {
	if id == 0 {
		return nil, invalid("adopting exec 0")
	}
	if opts.OutputCap < 0 {
		return nil, invalid("exec: negative output cap")
	}
	e := &Exec{c: c, id: id, opts: opts, started: true, done: make(chan struct{})}
	if stdinStream {
		e.credits = make(chan struct{}, StdinWindow)
		for range StdinWindow {
			e.credits <- struct{}{}
		}
		e.stdin = &execStdin{e: e}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.err != nil:
		return nil, c.err
	case id > c.nextID:
		return nil, invalid("adopting exec %d: above the reserved ids (%d)", id, c.nextID)
	case c.waiters[id] != nil:
		return nil, invalid("adopting exec %d: the id is in use", id)
	}
	c.waiters[id] = &waiter{handle: e.handle, fail: func(err error) { e.finish(fmt.Errorf("exec %d: %w", id, err)) }}
	return e, nil
}

// ID is the exec's request id.
func (e *Exec) ID() uint32 { return e.id }

// handle takes one frame of the exec, on the client's reader goroutine.
func (e *Exec) handle(f Frame) (bool, error) {
	// OnOutput is called after the lock is released, so that it may call
	// the Exec's methods.
	var deliver func()
	e.mu.Lock()
	defer func() {
		e.mu.Unlock()
		if deliver != nil {
			deliver()
		}
	}()
	switch f.Type {
	case FrameStarted:
		var s Started
		if e.started {
			return true, fmt.Errorf("exec started twice: %w", ErrProtocol)
		}
		if err := decodeReply(f.Payload, &s); err != nil {
			return true, err
		}
		e.started, e.res.PID = true, s.PID
	case FrameStdout, FrameStderr:
		if !e.started {
			return true, fmt.Errorf("output before the exec started: %w", ErrProtocol)
		}
		if len(f.Payload) > MaxChunk {
			return true, fmt.Errorf("output chunk of %d bytes: %w", len(f.Payload), ErrProtocol)
		}
		buf, trunc, s := &e.res.Stdout, &e.res.StdoutTruncated, Stdout
		if f.Type == FrameStderr {
			buf, trunc, s = &e.res.Stderr, &e.res.StderrTruncated, Stderr
		}
		p := f.Payload
		if room := e.opts.OutputCap - int64(len(*buf)); int64(len(p)) > room {
			p = p[:max(room, 0)]
			*trunc = true
		}
		if len(p) > 0 {
			*buf = append(*buf, p...)
			if e.opts.OnOutput != nil {
				deliver = func() { e.opts.OnOutput(s, p) }
			}
		}
	case FrameStdinAck:
		if e.credits == nil {
			return true, fmt.Errorf("stdin ack for an exec without streamed stdin: %w", ErrProtocol)
		}
		select {
		case e.credits <- struct{}{}:
		default:
			return true, fmt.Errorf("more stdin acks than stdin frames: %w", ErrProtocol)
		}
	case FrameExit:
		if !e.started {
			return true, fmt.Errorf("exit before the exec started: %w", ErrProtocol)
		}
		var r ExitReport
		if err := decodeReply(f.Payload, &r); err != nil {
			return true, err
		}
		e.res.Exit = &r
		e.finishLocked(nil)
		return true, nil
	case FrameError:
		// The guest reports a failure to start only before the start;
		// one after it would turn a program that ran (and is charged)
		// into "could not start".
		if e.started {
			return true, fmt.Errorf("error report after the exec started: %w", ErrProtocol)
		}
		err := replyError("exec", f.Payload)
		if errors.Is(err, ErrProtocol) {
			return true, err
		}
		e.finishLocked(err)
		return true, nil
	default:
		return true, unexpectedFrame(f, "exec")
	}
	return false, nil
}

func (e *Exec) finish(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.finishLocked(err)
}

func (e *Exec) finishLocked(err error) {
	select {
	case <-e.done:
		return
	default:
	}
	e.err = err
	close(e.done)
}

// Done is closed when the exec has ended (Wait then returns at once).
func (e *Exec) Done() <-chan struct{} { return e.done }

// Wait waits for the exec's end and returns what the host kept. When ctx
// ends first it returns what was kept so far with ctx's error; the exec
// goes on (Cancel ends it). After an error other than ctx's, the result
// holds the output received before it.
func (e *Exec) Wait(ctx context.Context) (*ExecResult, error) {
	select {
	case <-e.done:
	case <-ctx.Done():
		return e.snapshot(), ctx.Err()
	}
	return e.snapshot(), e.err
}

// snapshot copies the result so far.
func (e *Exec) snapshot() *ExecResult {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.res
	r.Stdout = append([]byte(nil), r.Stdout...)
	r.Stderr = append([]byte(nil), r.Stderr...)
	if r.Exit != nil {
		x := *r.Exit
		r.Exit = &x
	}
	return &r
}

// Signal sends sig to the exec's process group.
func (e *Exec) Signal(sig syscall.Signal) error {
	if sig < 1 || sig > 64 {
		return invalid("signal %d out of range", sig)
	}
	p, _ := marshal(SignalRequest{Signal: int(sig)})
	return e.c.post(FrameSignal, e.id, p)
}

// Cancel asks the guest to kill the exec's whole process tree; its exit
// report still comes, with Cancelled set.
func (e *Exec) Cancel() error { return e.c.post(FrameCancel, e.id, nil) }

// Stdin is the program's stdin when the request set StdinStream, nil
// otherwise. Writes block while the guest buffers StdinWindow chunks the
// program has not read; Close sends the end of input. Writes after the exec
// ended fail with io.ErrClosedPipe.
func (e *Exec) Stdin() io.WriteCloser {
	if e.stdin == nil {
		return nil
	}
	return e.stdin
}

type execStdin struct {
	e      *Exec
	mu     sync.Mutex // one Write or Close at a time, in order
	closed bool
}

func (s *execStdin) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, io.ErrClosedPipe
	}
	n := 0
	for len(p) > 0 {
		select {
		case <-s.e.credits:
		case <-s.e.done:
			return n, io.ErrClosedPipe
		}
		chunk := p[:min(len(p), MaxChunk)]
		if err := s.e.c.post(FrameStdin, s.e.id, append([]byte(nil), chunk...)); err != nil {
			return n, err
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

func (s *execStdin) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	select {
	case <-s.e.done:
		return nil
	default:
	}
	return s.e.c.post(FrameStdinClose, s.e.id, nil)
}
