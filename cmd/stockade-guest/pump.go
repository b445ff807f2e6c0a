package main

import (
	"errors"
	"os"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/guest"
)

// pump reads one output pipe and passes what it reads, at most
// guest.MaxChunk bytes at a time, to forward. It reads through the
// runtime's poller (the guest's ends of its pipes are non-blocking), so a
// pump holds no thread while it waits.
//
// A kernel's pumps can be flushed: flush returns once everything that was
// in the pipe when it was called has been forwarded, so that a kernel's
// output written before a cell's result is attributed to that cell.
type pump struct {
	f       *os.File
	forward func([]byte)
	flushes chan chan struct{} // nil: the pump cannot be flushed
	done    chan struct{}      // closed when the pump ended
}

// newPump starts a pump on f; flushable pumps get a flush channel.
func (a *agent) newPump(f *os.File, flushes chan chan struct{}, forward func([]byte)) *pump {
	p := &pump{f: f, forward: forward, flushes: flushes, done: make(chan struct{})}
	go p.run()
	return p
}

func (p *pump) run() {
	defer close(p.done)
	defer p.f.Close()
	buf := make([]byte, guest.MaxChunk)
	for {
		n, err := p.f.Read(buf)
		if n > 0 {
			p.forward(buf[:n])
		}
		if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && p.flushes != nil {
			if !p.flush(buf) {
				return
			}
			continue
		}
		if err != nil {
			return
		}
	}
}

// flush serves the flush requests that set the read deadline: it clears
// the deadline, takes the pending requests, forwards what the pipe holds
// without waiting and acknowledges them, until no request is pending. A
// request made after the requests were taken set a deadline after it was
// cleared, so the next read serves it. It returns false at the pipe's end.
func (p *pump) flush(buf []byte) bool {
	open := true
	for {
		p.f.SetReadDeadline(time.Time{})
		var acks []chan struct{}
		for more := true; more; {
			select {
			case ack := <-p.flushes:
				acks = append(acks, ack)
			default:
				more = false
			}
		}
		if len(acks) == 0 {
			return open
		}
		if open {
			open = p.readAvailable(buf)
		}
		for _, ack := range acks {
			close(ack)
		}
	}
}

// readAvailable forwards what the pipe holds, without waiting for more. It
// returns false at the pipe's end or on an error.
func (p *pump) readAvailable(buf []byte) bool {
	rc, err := p.f.SyscallConn()
	if err != nil {
		return false
	}
	open := true
	read := func(fd uintptr) bool {
		for {
			n, err := syscall.Read(int(fd), buf)
			if n > 0 {
				p.forward(buf[:n])
				continue
			}
			if err == syscall.EINTR {
				continue
			}
			open = err == syscall.EAGAIN
			return true
		}
	}
	// A deadline set by a flush request made meanwhile fails the read
	// before it starts: clear it and read (the request is served by the
	// caller's next round).
	for errors.Is(rc.Read(read), os.ErrDeadlineExceeded) {
		p.f.SetReadDeadline(time.Time{})
	}
	return open
}

// flushPumps waits until the pumps forwarded what their pipes hold, at
// most within. The pumps flush at the same time.
func flushPumps(pumps []*pump, within time.Duration) {
	timeout := time.After(within)
	acks := make([]chan struct{}, len(pumps))
	for i, p := range pumps {
		ack := make(chan struct{})
		select {
		case p.flushes <- ack:
		case <-p.done:
			continue
		}
		// The request is queued before the deadline is set: see flush.
		p.f.SetReadDeadline(time.Unix(1, 0))
		acks[i] = ack
	}
	for i, p := range pumps {
		if acks[i] == nil {
			continue
		}
		select {
		case <-acks[i]:
		case <-p.done:
		case <-timeout:
			return
		}
	}
}

// drain waits for the pumps to reach EOF, at most within; then it closes
// their read ends, which ends them.
func drain(pumps []*pump, within time.Duration) {
	timeout := time.After(within)
wait:
	for _, p := range pumps {
		select {
		case <-p.done:
		case <-timeout:
			break wait
		}
	}
	for _, p := range pumps {
		p.f.Close()
		<-p.done
	}
}
