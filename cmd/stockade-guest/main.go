// The runtime names each anonymous mapping it makes (Go 1.25's
// decoratemappings), one prctl each: about 23 system calls at the guest's
// start, each 12-24 µs under gVisor, for names only a debugger reads.
//go:debug decoratemappings=0

// Command stockade-guest is the agent that runs as PID 1 inside every
// Stockade sandbox. It speaks protocol v2 of package guest on its stdin
// (frames from the host) and stdout (frames to the host), or on
// descriptors 3 and 4 when its environment says so (guest.ChannelEnv); its
// stderr is a diagnostic log that stays silent except for one line on a
// fatal error.
//
// It serves one exec at a time (the program in its own process group, its
// output streamed back up to the request's cap, stdin fed or streamed,
// signal and cancel), file operations below /tmp and /workspace, kernels
// (long-lived interpreters, see kernel.go) and pings. It is the only reaper
// of the sandbox: when an exec ends, every process of the sandbox that no
// kernel owns is killed (see reaper.go). The end of its input (stdin, or
// descriptor 3) makes it kill everything and exit 0; a frame it cannot
// parse (its framing, not its
// JSON) makes it report a FrameError with id 0 and exit 1.
//
// The same binary has more modes, chosen by its arguments: the kernel
// wrapper (argv[0] kernelWrapper, see kernel.go), the shell kernel (argv[1]
// guest.ShellKernel, see shellkernel.go) and the test kernel (argv[1]
// testKernelMode, see testkernel.go).
//
// It must be built static, and is small when stripped:
//
//	CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o stockade-guest ./cmd/stockade-guest
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/guest"
)

func main() {
	switch {
	case os.Args[0] == kernelWrapper:
		wrapKernel()
	case len(os.Args) > 1 && os.Args[1] == testKernelMode:
		testKernel()
	case len(os.Args) > 1 && os.Args[1] == guest.ShellKernel:
		shellKernel()
	case len(os.Args) > 1 && os.Args[1] == testDaemonMode:
		testDaemon()
	}
	// Code in the sandbox runs as the guest's uid. A dumpable guest would let
	// it open /proc/1/fd/1 (or 4) and forge frames to the host, or
	// /proc/1/fd/0 (or 3) and steal the host's frames; a non-dumpable
	// process's /proc entries belong
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
	a := newAgent(out, os.Getpid() == 1)
	if !a.init {
		// Outside a PID namespace (tests, a workstation) the guest makes
		// itself the reaper of its programs' orphans, as PID 1 is.
		if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
			fatalf("setting PR_SET_CHILD_SUBREAPER: %v", errno)
		}
	}
	if err := guest.WriteHello(a.out, guest.Hello{Version: guest.MaxVersion, Min: guest.MinVersion, Max: guest.MaxVersion, Features: features}); err != nil {
		fatalf("writing hello to host: %v", err)
	}
	a.serve(bufio.NewReaderSize(in, 64<<10))
}

// features are the optional abilities this guest announces in its hello.
var features = []string{"exec", "files", "kernels", guest.FeatureExitNotice}

const prSetChildSubreaper = 36 // PR_SET_CHILD_SUBREAPER

// stdio returns the guest's ends of the frame streams: stdin, and a
// duplicate of stdout; or, when guest.ChannelEnv says so, the descriptors
// guest.ChannelIn and guest.ChannelOut, which no program inherits.
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
	if os.Getenv(guest.ChannelEnv) == guest.ChannelFDs {
		for _, fd := range []int{guest.ChannelIn, guest.ChannelOut} {
			// Without the host's descriptors these numbers may be
			// anything the runtime opened (Go keeps its cgroup's CPU
			// quota files open): only a pipe or a socket is a channel.
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				return nil, nil, fmt.Errorf("channel descriptor %d: %w", fd, err)
			}
			if t := st.Mode & unix.S_IFMT; t != unix.S_IFIFO && t != unix.S_IFSOCK {
				return nil, nil, fmt.Errorf("channel descriptor %d is not a pipe or a socket (mode %#o)", fd, st.Mode)
			}
			// Programs get the descriptors they are given only (see
			// launch): any other must be close-on-exec.
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
				return nil, nil, fmt.Errorf("channel descriptor %d: %w", fd, err)
			}
		}
		if in, err = pollable(guest.ChannelIn, "channel-in"); err != nil {
			return nil, nil, err
		}
		return in, os.NewFile(guest.ChannelOut, "channel-out"), nil
	}
	if in, err = pollable(0, "stdin"); err != nil {
		return nil, nil, err
	}
	fd, err := syscall.Dup(1)
	if err != nil {
		return nil, nil, fmt.Errorf("duplicating stdout: %w", err)
	}
	syscall.CloseOnExec(fd)
	return in, os.NewFile(uintptr(fd), "frames"), nil
}

// pollable returns descriptor fd as a file whose reads the runtime's
// poller waits for, where it can (a pipe; not a file).
func pollable(fd int, name string) (*os.File, error) {
	if err := syscall.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("setting %s non-blocking: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	// A descriptor the poller does not take has no deadlines; it must
	// block then, or reads would fail with EAGAIN.
	if f.SetReadDeadline(time.Time{}) != nil {
		if err := syscall.SetNonblock(fd, false); err != nil {
			return nil, fmt.Errorf("setting %s blocking: %w", name, err)
		}
	}
	return f, nil
}

// agent is the guest's state. The main goroutine reads the host's frames
// and dispatches them (serve); execs, kernels and the reaper run in
// goroutines of their own and write frames through send.
type agent struct {
	outMu sync.Mutex
	out   io.Writer // frames to the host; write only through write
	// ending is set once the guest exits: a failed write then is no error.
	ending atomic.Bool

	// init is true when the guest is PID 1 of its own PID namespace, as it
	// is in every sandbox. Only then may it kill(-1): see sweep.
	init bool
	self int

	reaper reaper

	// mu guards exec and kernels, and is held while a program or kernel
	// is started and while the strays of a dead kernel are swept, so that
	// a sweep never sees a program that is not registered yet.
	mu      sync.Mutex
	exec    *execution         // the exec that runs, nil if none
	kernels map[uint32]*kernel // by the id of the request that started each
	// sweeping is closed when the sweep of a dead kernel's strays ends;
	// nil if none runs. No exec starts meanwhile.
	sweeping chan struct{}

	// writes are the file writes in progress, by request id. Only the
	// main goroutine touches them.
	writes map[uint32]*fileWrite
}

func newAgent(out io.Writer, init bool) *agent {
	a := &agent{out: out, init: init, self: os.Getpid(), kernels: map[uint32]*kernel{}, writes: map[uint32]*fileWrite{}}
	a.reaper.init()
	return a
}

// serve reads the Accept, then the host's frames until its stream ends. It
// does not return.
func (a *agent) serve(r *bufio.Reader) {
	if _, err := guest.ReadAccept(r); err != nil {
		a.hostEnded(err)
	}
	for {
		f, err := guest.ReadFrame(r, guest.MaxPayload)
		if err != nil {
			a.hostEnded(err)
		}
		a.dispatch(f)
	}
}

// dispatch serves one frame. Requests that take long (an exec, a kernel's
// start and cells) run in goroutines; file operations run here, one at a
// time, each bounded by its size limits.
func (a *agent) dispatch(f guest.Frame) {
	info, known := guest.Frames[f.Type]
	if !known || info.Dir&guest.ToGuest == 0 {
		a.replyError(f.ID, guest.ErrorUnsupported, fmt.Sprintf("frame type %s is not served by this guest (protocol %d)", f.Type, guest.MaxVersion))
		return
	}
	if f.ID == 0 {
		if f.Type == guest.FrameAccept {
			// A host that re-attached (through a relay) accepts again.
			var acc guest.Accept
			if err := guest.DecodeStrict(f.Payload, &acc); err != nil || acc.Version != guest.MaxVersion {
				a.replyError(0, guest.ErrorUnsupported, fmt.Sprintf("this guest speaks protocol %d..%d", guest.MinVersion, guest.MaxVersion))
			}
		}
		return
	}
	switch f.Type {
	case guest.FrameExec:
		a.startExec(f)
	case guest.FrameStdin, guest.FrameStdinClose, guest.FrameSignal, guest.FrameCancel:
		a.control(f)
	case guest.FrameWrite, guest.FrameData, guest.FrameEnd:
		a.writeFrame(f)
	case guest.FrameRead, guest.FrameList, guest.FrameStat, guest.FrameRemove, guest.FrameMkdir:
		a.fileOp(f)
	case guest.FrameKernel:
		a.startKernel(f)
	case guest.FrameCell:
		a.startCell(f)
	case guest.FramePing:
		a.pong(f.ID)
	default:
		a.replyError(f.ID, guest.ErrorUnsupported, fmt.Sprintf("frame type %s is not a request", f.Type))
	}
}

// control routes a frame that acts on a request in flight by its id. A
// frame for an id that has ended is dropped: the host may not have seen
// the end yet.
func (a *agent) control(f guest.Frame) {
	var sig syscall.Signal
	if f.Type == guest.FrameSignal {
		var s guest.SignalRequest
		if err := guest.DecodeStrict(f.Payload, &s); err != nil || s.Signal < 1 || s.Signal > 64 {
			return
		}
		sig = syscall.Signal(s.Signal)
	}
	a.mu.Lock()
	e := a.exec
	k := a.kernels[f.ID]
	a.mu.Unlock()
	switch {
	case e != nil && e.id == f.ID:
		switch f.Type {
		case guest.FrameStdin:
			e.stdinData(f.Payload)
		case guest.FrameStdinClose:
			e.stdinData(nil)
		case guest.FrameSignal:
			e.signal(sig)
		case guest.FrameCancel:
			e.cancel()
		}
	case k != nil:
		switch {
		case f.Type == guest.FrameSignal && sig == syscall.SIGINT:
			k.interrupt()
		case f.Type == guest.FrameSignal:
			k.signal(sig)
		case f.Type == guest.FrameCancel:
			k.stop()
		}
	case f.Type == guest.FrameCancel:
		if w := a.writes[f.ID]; w != nil {
			w.abort()
			delete(a.writes, f.ID)
			return
		}
		a.interruptCell(f.ID)
	}
}

// decode strictly decodes a request, answering ErrorInvalid when it does
// not decode.
func (a *agent) decode(f guest.Frame, v any) bool {
	if err := guest.DecodeStrict(f.Payload, v); err != nil {
		a.replyError(f.ID, guest.ErrorInvalid, fmt.Sprintf("%s request: %v", f.Type, err))
		return false
	}
	return true
}

func (a *agent) pong(id uint32) {
	p := guest.Pong{Version: guest.MaxVersion, Kernels: []uint32{}}
	a.mu.Lock()
	if a.exec != nil {
		p.Exec = a.exec.id
	}
	for kid, k := range a.kernels {
		k.mu.Lock()
		if k.ready && !k.dead {
			p.Kernels = append(p.Kernels, kid)
			if k.cell != nil {
				p.Cells = append(p.Cells, k.cell.id)
			}
		}
		k.mu.Unlock()
	}
	a.mu.Unlock()
	a.sendJSON(guest.FrameResult, id, p)
}

// hostEnded handles the end of the host's frame stream. EOF between frames is
// the host's request to exit: everything is killed and reaped and the guest
// exits 0. Anything else (a truncated or oversized frame, a read error) is a
// protocol error.
func (a *agent) hostEnded(err error) {
	if errors.Is(err, io.EOF) {
		a.shutdown()
		os.Exit(0)
	}
	a.protocolError(err)
}

// protocolError reports err to the host as a FrameError with id 0, kills
// everything and exits 1.
func (a *agent) protocolError(err error) {
	a.ending.Store(true)
	a.killEverything()
	// A write error is ignored: the guest is exiting either way.
	a.write(guest.FrameError, 0, mustJSON(guest.ErrorReply{Code: guest.ErrorProtocol, Message: err.Error()}))
	fatalf("%v", err)
}

// shutdown kills every process of the sandbox, kernels included, waits for
// them to be reaped and drops the temporary files of unfinished writes.
func (a *agent) shutdown() {
	a.ending.Store(true)
	for id, w := range a.writes {
		w.abort()
		delete(a.writes, id)
	}
	a.killEverything()
	a.sweep(false, 5*time.Second)
}

// killEverything sends SIGKILL to every process of the sandbox but the
// guest (outside a PID namespace: to every process the guest started and
// their groups).
func (a *agent) killEverything() {
	if a.init {
		syscall.Kill(-1, syscall.SIGKILL)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.exec != nil {
		syscall.Kill(-a.exec.pid, syscall.SIGKILL)
	}
	for _, k := range a.kernels {
		syscall.Kill(-k.pid, syscall.SIGKILL)
		syscall.Kill(k.pid, syscall.SIGKILL)
	}
}

// write writes one frame and returns the write's error. Goroutines write
// concurrently, and guest.WriteFrame keeps a frame whole only if one writer
// at a time calls it, so writes hold outMu.
func (a *agent) write(t guest.FrameType, id uint32, p []byte) error {
	a.outMu.Lock()
	defer a.outMu.Unlock()
	return guest.WriteFrame(a.out, t, id, p)
}

// send writes one frame. The host reading this stream is the guest's only
// reason to exist, so a failed write kills everything and exits 1 (unless
// the guest is exiting already).
func (a *agent) send(t guest.FrameType, id uint32, p []byte) {
	if err := a.write(t, id, p); err != nil {
		if a.ending.Load() {
			return
		}
		a.ending.Store(true)
		a.killEverything()
		fatalf("writing %s frame to host: %v", t, err)
	}
}

// sendJSON writes v, which must marshal, as one frame.
func (a *agent) sendJSON(t guest.FrameType, id uint32, v any) {
	a.send(t, id, mustJSON(v))
}

// replyError answers request id with an ErrorReply.
func (a *agent) replyError(id uint32, code, msg string) {
	if len(msg) > guest.MaxMessage {
		msg = msg[:guest.MaxMessage]
	}
	a.sendJSON(guest.FrameError, id, guest.ErrorReply{Code: code, Message: msg})
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Only the guest's own fixed types are marshalled.
		panic(err)
	}
	return b
}

// fatalf prints one line to stderr and exits 1.
func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "stockade-guest: "+format+"\n", args...)
	os.Exit(1)
}
