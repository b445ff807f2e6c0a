package guest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
)

// ShellKernel is the argument that makes the guest binary the shell
// kernel: `/.stockade/guest stockade-kernel-shell SHELL...`, started as a
// kernel, keeps one SHELL (e.g. /bin/sh) whose working directory,
// variables and functions carry over from cell to cell.
const ShellKernel = "stockade-kernel-shell"

// Kernel is a long-lived interpreter process owned by the guest, named by
// the id of the request that started it. Its processes stay between cells
// and execs until Stop. Its methods are safe for concurrent use.
type Kernel struct {
	c   *Client
	id  uint32
	pid int

	mu   sync.Mutex
	exit *KernelExit
	err  error         // why the kernel is gone when it did not exit (the connection ended)
	done chan struct{} // closed when the kernel is gone
}

// StartKernel starts a kernel and waits until it is ready to run cells.
func (c *Client) StartKernel(ctx context.Context, req KernelRequest) (*Kernel, error) {
	if len(req.Argv) == 0 {
		return nil, invalid("starting kernel: empty argv")
	}
	op := "starting kernel " + req.Argv[0]
	k := &Kernel{c: c, done: make(chan struct{})}
	// started receives the outcome of the start, once; later sends (a
	// start cancelled by ctx, then the kernel's exit) are dropped.
	started := make(chan error, 1)
	report := func(err error) {
		select {
		case started <- err:
		default:
		}
	}
	isStarted := false
	id, err := c.register(&waiter{
		handle: func(f Frame) (bool, error) {
			switch f.Type {
			case FrameStarted:
				var s Started
				if isStarted {
					return true, fmt.Errorf("kernel started twice: %w", ErrProtocol)
				}
				if err := decodeReply(f.Payload, &s); err != nil {
					return true, err
				}
				isStarted = true
				k.pid = s.PID
				report(nil)
				return false, nil
			case FrameError:
				if isStarted {
					return true, fmt.Errorf("error report after the kernel started: %w", ErrProtocol)
				}
				err := replyError(op, f.Payload)
				if errors.Is(err, ErrProtocol) {
					return true, err
				}
				k.gone(nil, err)
				report(err)
				return true, nil
			case FrameKernelExit:
				var x KernelExit
				if err := decodeReply(f.Payload, &x); err != nil {
					return true, err
				}
				k.gone(&x, nil)
				if !isStarted {
					report(fmt.Errorf("%s: the kernel exited before it was ready (exit code %d, signal %d): %w", op, x.ExitCode, x.Signal, ErrClosed))
				}
				return true, nil
			}
			return true, unexpectedFrame(f, op)
		},
		fail: func(err error) {
			err = fmt.Errorf("%s: %w", op, err)
			k.gone(nil, err)
			report(err)
		},
	})
	if err != nil {
		return nil, err
	}
	k.id = id
	if err := c.sendJSON(ctx, FrameKernel, id, req); err != nil {
		c.forget(id)
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	select {
	case err := <-started:
		if err != nil {
			return nil, err
		}
		return k, nil
	case <-ctx.Done():
		// The guest kills a kernel whose start is cancelled.
		_ = c.post(FrameCancel, id, nil)
		return nil, fmt.Errorf("%s: %w", op, ctx.Err())
	}
}

// AdoptKernel returns a handle of kernel id, which another client of the
// same guest started and the guest still runs (Pong.Kernels): a client
// that re-attached to the guest adopts its kernels. The id must not be one
// this client may use for its own requests (see ReserveIDs), nor be
// adopted twice. PID is 0 for an adopted kernel.
func (c *Client) AdoptKernel(id uint32) (*Kernel, error) {
	if id == 0 {
		return nil, invalid("adopting kernel 0")
	}
	k := &Kernel{c: c, id: id, done: make(chan struct{})}
	op := fmt.Sprintf("kernel %d", id)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.err != nil:
		return nil, c.err
	case id > c.nextID:
		return nil, invalid("adopting kernel %d: above the reserved ids (%d)", id, c.nextID)
	case c.waiters[id] != nil:
		return nil, invalid("adopting kernel %d: the id is in use", id)
	}
	c.waiters[id] = &waiter{
		handle: func(f Frame) (bool, error) {
			if f.Type != FrameKernelExit {
				return true, unexpectedFrame(f, op)
			}
			var x KernelExit
			if err := decodeReply(f.Payload, &x); err != nil {
				return true, err
			}
			k.gone(&x, nil)
			return true, nil
		},
		fail: func(err error) { k.gone(nil, fmt.Errorf("%s: %w", op, err)) },
	}
	return k, nil
}

func (k *Kernel) gone(x *KernelExit, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	select {
	case <-k.done:
		return
	default:
	}
	k.exit, k.err = x, err
	close(k.done)
}

// ID is the kernel's id.
func (k *Kernel) ID() uint32 { return k.id }

// PID is the kernel process's pid in the sandbox; 0 for an adopted kernel.
func (k *Kernel) PID() int { return k.pid }

// Done is closed when the kernel has ended (or the connection has).
func (k *Kernel) Done() <-chan struct{} { return k.done }

// Exit is how the kernel ended, nil while it runs or when the connection
// ended first (then Err says so).
func (k *Kernel) Exit() *KernelExit {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.exit
}

// Err is why the kernel is gone without an exit report.
func (k *Kernel) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// Signal sends sig to the kernel process.
func (k *Kernel) Signal(sig syscall.Signal) error {
	if sig < 1 || sig > 64 {
		return invalid("signal %d out of range", sig)
	}
	p, _ := marshal(SignalRequest{Signal: int(sig)})
	return k.c.post(FrameSignal, k.id, p)
}

// Interrupt interrupts the running cell (SIGINT to the kernel).
func (k *Kernel) Interrupt() error { return k.Signal(syscall.SIGINT) }

// Stop kills the kernel's process tree and waits until the guest reports
// it gone.
func (k *Kernel) Stop(ctx context.Context) error {
	if err := k.c.post(FrameCancel, k.id, nil); err != nil {
		select {
		case <-k.done:
			return nil
		default:
			return err
		}
	}
	select {
	case <-k.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stopping kernel %d: %w", k.id, ctx.Err())
	}
}

// CellOptions is what the host does with a cell's output.
type CellOptions struct {
	// Stdin is the cell's input, passed through the kernel wire.
	Stdin string
	// OutputCap is the bytes kept of each stream; zero keeps nothing.
	OutputCap int64
	// MaxDisplays bounds the displays kept; the rest are counted in
	// DisplaysDropped. Zero keeps none.
	MaxDisplays int
	// OnOutput and OnDisplay, if set, receive what is kept as it arrives,
	// as ExecOptions.OnOutput.
	OnOutput  func(s Stream, p []byte)
	OnDisplay func(d *Display)
}

// CellOutput is what the host kept of a cell.
type CellOutput struct {
	Result          *CellResult // nil if the cell did not end
	Stdout, Stderr  []byte
	StdoutTruncated bool
	StderrTruncated bool
	Displays        []Display
	DisplaysDropped int
}

// Run runs code in the kernel and waits for its result. A kernel that dies
// during the cell makes Run return an *Error with code ErrorKernelGone;
// Done then closes. When ctx ends first, the cell is interrupted and Run
// returns ctx's error with what was kept so far.
func (k *Kernel) Run(ctx context.Context, code string, opts CellOptions) (*CellOutput, error) {
	op := fmt.Sprintf("running a cell in kernel %d", k.id)
	var (
		mu  sync.Mutex
		out CellOutput
	)
	snapshot := func() *CellOutput {
		mu.Lock()
		defer mu.Unlock()
		o := out
		o.Stdout = append([]byte(nil), o.Stdout...)
		o.Stderr = append([]byte(nil), o.Stderr...)
		o.Displays = append([]Display(nil), o.Displays...)
		return &o
	}
	done := make(chan error, 1)
	id, err := k.c.register(&waiter{
		handle: func(f Frame) (bool, error) {
			// The callbacks run after the lock is released.
			var deliver func()
			mu.Lock()
			defer func() {
				mu.Unlock()
				if deliver != nil {
					deliver()
				}
			}()
			switch f.Type {
			case FrameStdout, FrameStderr:
				if len(f.Payload) > MaxChunk {
					return true, fmt.Errorf("output chunk of %d bytes: %w", len(f.Payload), ErrProtocol)
				}
				buf, trunc, s := &out.Stdout, &out.StdoutTruncated, Stdout
				if f.Type == FrameStderr {
					buf, trunc, s = &out.Stderr, &out.StderrTruncated, Stderr
				}
				p := f.Payload
				if room := opts.OutputCap - int64(len(*buf)); int64(len(p)) > room {
					p = p[:max(room, 0)]
					*trunc = true
				}
				if len(p) > 0 {
					*buf = append(*buf, p...)
					if opts.OnOutput != nil {
						deliver = func() { opts.OnOutput(s, p) }
					}
				}
				return false, nil
			case FrameDisplay:
				var d Display
				if err := decodeReply(f.Payload, &d); err != nil {
					return true, err
				}
				if len(out.Displays) >= opts.MaxDisplays {
					out.DisplaysDropped++
					return false, nil
				}
				out.Displays = append(out.Displays, d)
				if opts.OnDisplay != nil {
					deliver = func() { opts.OnDisplay(&d) }
				}
				return false, nil
			case FrameResult:
				var r CellResult
				if err := decodeReply(f.Payload, &r); err != nil {
					return true, err
				}
				out.Result = &r
				done <- nil
				return true, nil
			case FrameError:
				err := replyError(op, f.Payload)
				if errors.Is(err, ErrProtocol) {
					return true, err
				}
				done <- err
				return true, nil
			}
			return true, unexpectedFrame(f, op)
		},
		fail: func(err error) { done <- fmt.Errorf("%s: %w", op, err) },
	})
	if err != nil {
		return nil, err
	}
	if err := k.c.sendJSON(ctx, FrameCell, id, CellRequest{Kernel: k.id, Code: code, Stdin: opts.Stdin, OutputCap: opts.OutputCap + 1}); err != nil {
		k.c.forget(id)
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	select {
	case err := <-done:
		return snapshot(), err
	case <-ctx.Done():
		// The waiter stays until the cell's end, so that its last frames
		// are not counted as unknown.
		_ = k.c.post(FrameCancel, id, nil)
		return snapshot(), fmt.Errorf("%s: %w", op, ctx.Err())
	}
}
