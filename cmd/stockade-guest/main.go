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
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"

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
	catchSignals()
	resetIgnoredSignals()

	a := &agent{
		out:  os.Stdout,
		in:   make(chan frame),
		init: os.Getpid() == 1,
	}
	go readFrames(os.Stdin, a.in)
	a.sendJSON(guest.FrameReady, guest.Ready{Version: guest.Version})
	a.serve()
}

// catchSignals makes the guest survive the signals that would otherwise end
// it.
//
// Code in the sandbox runs with the guest's uid and, inside the PID
// namespace, may signal PID 1 with any signal for which PID 1 has a handler
// (the kernel drops the others, and SIGKILL and SIGSTOP, for PID 1). The Go
// runtime installs its handler for nearly every signal at start; for most
// of them (SIGUSR1, SIGALRM, the real-time signals, ...) that handler does
// nothing, but SIGHUP, SIGINT and SIGTERM make it exit and SIGQUIT and
// SIGABRT make it crash. Those are caught here, and dropped. SIGHUP and
// SIGINT are the runtime's exceptions to installing a handler: it respects
// an inherited SIG_IGN for them, which would pass on to every program; a
// caught signal is reset to the default in every child. With SIGPIPE
// caught, a write to a host that went away fails with EPIPE and is handled
// like any other write error.
//
// Only these are caught: the runtime enables each caught signal with a
// round trip to a thread of its own, which is slow under gVisor. A
// synchronous-fault signal sent on purpose (SIGTRAP, SIGSYS, ...) still
// crashes the guest, which ends the sandbox: a denial of service of the
// attacker's own box only.
func catchSignals() {
	c := make(chan os.Signal, 16)
	signal.Notify(c, syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGABRT, syscall.SIGTERM, syscall.SIGPIPE)
	go func() {
		for range c {
		}
	}()
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
