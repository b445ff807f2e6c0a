// Command stockade-guest is the agent that runs as PID 1 inside every
// Stockade sandbox. It speaks the framed protocol of package guest on its
// stdin (frames from the host) and stdout (frames to the host); its stderr is
// a diagnostic log that stays silent except for one line on a fatal error.
//
// For each FrameExec it writes the delivered file, runs the program in its
// own process group, streams stdout and stderr back in chunks up to the
// request's output cap, reaps every process of the sandbox and reports how
// the program ended. Closing its stdin makes it kill everything and exit 0;
// a malformed frame makes it report FrameError and exit 1.
//
// It must be built static, and is small when stripped:
//
//	CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o stockade-guest ./cmd/stockade-guest
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/guest"
)

func main() {
	// Code in the sandbox runs as the guest's uid. A dumpable guest would let
	// it open /proc/1/fd/1 and forge frames to the host, or /proc/1/fd/0 and
	// steal the host's frames; a non-dumpable process's /proc entries belong
	// to root and cannot be ptraced. Fail closed if the kernel refuses.
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0); errno != 0 {
		fatalf("setting PR_SET_DUMPABLE to 0: %v", errno)
	}
	if err := dropSignals(); err != nil {
		fatalf("%v", err)
	}
	resetIgnoredSignals()
	in, out, err := stdio()
	if err != nil {
		fatalf("%v", err)
	}

	a := &agent{
		out:  out,
		in:   make(chan frame),
		init: os.Getpid() == 1,
	}
	go readFrames(in, a.in)
	a.sendJSON(guest.FrameReady, guest.Ready{Version: guest.Version})
	a.serve()
}

// stdio returns the guest's ends of the frame streams: stdin, and a
// duplicate of stdout.
//
// Every blocked read of a blocking descriptor holds a thread of its own,
// which takes 1-2 ms to start under gVisor; stdin is made non-blocking so
// that the runtime's poller waits for it instead, where it can (on a pipe,
// as from the runtimes; not on a file). Frames go out through a duplicate
// of stdout because the runtime makes a program die of SIGPIPE when its
// write to descriptor 1 or 2 fails with EPIPE: through any other
// descriptor a host that went away is a write error like any other, which
// kills everything before the guest exits.
func stdio() (in, out *os.File, err error) {
	if err := syscall.SetNonblock(0, true); err != nil {
		return nil, nil, fmt.Errorf("setting stdin non-blocking: %w", err)
	}
	in = os.NewFile(0, "stdin")
	// A descriptor the poller does not take has no deadlines; it must
	// block then, or reads would fail with EAGAIN.
	if in.SetReadDeadline(time.Time{}) != nil {
		if err := syscall.SetNonblock(0, false); err != nil {
			return nil, nil, fmt.Errorf("setting stdin blocking: %w", err)
		}
	}
	fd, err := syscall.Dup(1)
	if err != nil {
		return nil, nil, fmt.Errorf("duplicating stdout: %w", err)
	}
	syscall.CloseOnExec(fd)
	return in, os.NewFile(uintptr(fd), "frames"), nil
}

// agent is the guest's state. Only the main goroutine runs execs and reads
// in; frames are written by it and by the output pumps (see write).
type agent struct {
	outMu sync.Mutex
	out   io.Writer // frames to the host; write only through send
	in    chan frame
	// init is true when the guest is PID 1 of its own PID namespace, as it
	// is in every sandbox. Only then may it kill(-1): see killAll.
	init bool
	// pgid is the process group of the running program, 0 between execs.
	pgid atomic.Int64
}

// frame is one frame read from the host, or the error that ended reading.
type frame struct {
	t   guest.FrameType
	p   []byte
	err error
}

// readFrames sends every frame read from r on ch, then the error that ended
// reading (io.EOF when the host closed the stream cleanly).
func readFrames(r io.Reader, ch chan<- frame) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		t, p, err := guest.ReadFrame(br, guest.MaxPayload)
		ch <- frame{t: t, p: p, err: err}
		if err != nil {
			return
		}
	}
}

// serve runs execs one at a time until the host closes stdin. It does not
// return.
func (a *agent) serve() {
	for {
		f := <-a.in
		if f.err != nil {
			a.hostEnded(f.err)
		}
		if f.t != guest.FrameExec {
			a.protocolError(fmt.Errorf("unexpected frame type %q from host: %w", byte(f.t), guest.ErrProtocol))
		}
		var req guest.ExecRequest
		if err := guest.DecodeJSON(f.p, &req); err != nil {
			a.protocolError(err)
		}
		a.exec(&req)
	}
}

// hostEnded handles the end of the host's frame stream. EOF between frames is
// the host's request to exit: everything is killed and reaped and the guest
// exits 0. Anything else (a truncated or malformed frame, a read error) is a
// protocol error.
func (a *agent) hostEnded(err error) {
	if errors.Is(err, io.EOF) {
		a.killAll()
		reapAll()
		os.Exit(0)
	}
	a.protocolError(err)
}

// protocolError reports err to the host as a FrameError, kills everything and
// exits 1.
func (a *agent) protocolError(err error) {
	a.killAll()
	// A write error is ignored: the guest is exiting either way.
	a.write(guest.FrameError, mustJSON(guest.ErrorReport{Message: err.Error()}))
	fatalf("%v", err)
}

// write writes one frame and returns the write's error. The output pumps
// and the main goroutine write concurrently, and guest.WriteFrame keeps a
// frame whole only if one writer at a time calls it, so writes hold outMu.
func (a *agent) write(t guest.FrameType, p []byte) error {
	a.outMu.Lock()
	defer a.outMu.Unlock()
	return guest.WriteFrame(a.out, t, p)
}

// send writes one frame. The host reading this stream is the guest's only
// reason to exist, so a failed write kills everything and exits 1.
func (a *agent) send(t guest.FrameType, p []byte) {
	if err := a.write(t, p); err != nil {
		a.killAll()
		fatalf("writing frame %q to host: %v", byte(t), err)
	}
}

// sendJSON writes v, which must marshal, as one frame.
func (a *agent) sendJSON(t guest.FrameType, v any) {
	a.send(t, mustJSON(v))
}

// fatalf prints one line to stderr and exits 1.
func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "stockade-guest: "+format+"\n", args...)
	os.Exit(1)
}
