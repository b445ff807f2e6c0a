package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/guest"
)

// execution is the exec that runs: its program (pid, also its process
// group) and the guest's ends of its stdio pipes.
type execution struct {
	a   *agent
	id  uint32
	pid int

	stdin  *os.File    // write end
	stdinQ chan []byte // streamed stdin; a nil chunk closes it; nil if not streamed
	ended  chan struct{}
	status chan syscall.WaitStatus
	// notice receives the status of the program's exit notice
	// (guest.ExecRequest.ExitNotice); nil if it was not asked for.
	notice     chan int
	noticeFile *os.File

	cancelled atomic.Bool

	mu    sync.Mutex
	usage usage

	// outMu orders the output the pumps forward with the exit report
	// sent once every process is stopped (reportStopped): no output is
	// sent after reported is set.
	outMu    sync.Mutex
	reported bool
}

// drainGrace is how long an exec's output pumps may still read once its
// processes are gone: a kernel could hold a pipe's write end (opened
// through /proc), which must not hold the exec's end.
const drainGrace = 250 * time.Millisecond

// sweepTime bounds the rounds of killing an exec's processes.
const sweepTime = 10 * time.Second

// noticeStopTime bounds the wait for a sandbox's processes to stop after
// an exit notice; past it they are killed and reaped before the report.
const noticeStopTime = 100 * time.Millisecond

// startExec starts the program of an ExecRequest and answers FrameStarted,
// or FrameError when it cannot. Only one exec runs at a time.
func (a *agent) startExec(f guest.Frame) {
	var req guest.ExecRequest
	if !a.decode(f, &req) {
		return
	}
	a.mu.Lock()
	for a.sweeping != nil {
		done := a.sweeping
		a.mu.Unlock()
		<-done
		a.mu.Lock()
	}
	if a.exec != nil {
		a.mu.Unlock()
		a.replyError(f.ID, guest.ErrorBusy, fmt.Sprintf("exec %d runs", a.exec.id))
		return
	}
	e, fds, code, err := a.launch(f.ID, &req)
	if err == nil {
		a.exec = e
	}
	a.mu.Unlock()
	if err != nil {
		a.replyError(f.ID, code, err.Error())
		return
	}
	a.sendJSON(guest.FrameStarted, f.ID, guest.Started{PID: e.pid})
	switch {
	case req.StdinStream:
		go e.feedStream()
	default:
		go feed(e.stdin, req.Stdin)
	}
	// After an exit notice the pipes keep their writers (stopped, not
	// gone): the pumps are flushed instead of drained to their end.
	var flushes [2]chan chan struct{}
	if fds.notice != nil {
		flushes = [2]chan chan struct{}{make(chan chan struct{}, 1), make(chan chan struct{}, 1)}
		e.noticeFile = fds.notice
		go e.readNotice(fds.notice)
	}
	pumps := []*pump{
		a.newPump(fds.stdout, flushes[0], e.forwarder(guest.FrameStdout, req.OutputCap)),
		a.newPump(fds.stderr, flushes[1], e.forwarder(guest.FrameStderr, req.OutputCap)),
	}
	go e.run(pumps)
}

// execFiles are the guest's ends of an exec's pipes; notice is nil
// without an exit notice.
type execFiles struct{ stdout, stderr, notice *os.File }

// launch validates req, writes its file and starts its program, with a.mu
// held. On error nothing is left running; code is the ErrorReply's.
func (a *agent) launch(id uint32, req *guest.ExecRequest) (*execution, execFiles, string, error) {
	var none execFiles
	if req.OutputCap <= 0 {
		return nil, none, guest.ErrorInvalid, fmt.Errorf("output cap %d is not positive", req.OutputCap)
	}
	if len(req.Argv) == 0 {
		return nil, none, guest.ErrorInvalid, errors.New("empty argv")
	}
	if req.StdinStream && len(req.Stdin) > 0 {
		return nil, none, guest.ErrorInvalid, errors.New("stdin given and streamed")
	}
	argv := req.Argv
	cwd := req.Cwd
	if req.File != nil {
		if _, _, err := guest.ValidatePath(req.File.Path, false); err != nil {
			return nil, none, guest.ErrorInvalid, err
		}
		if req.File.Mode&^0o777 != 0 {
			return nil, none, guest.ErrorInvalid, fmt.Errorf("file mode %#o has bits outside 0777", req.File.Mode)
		}
		argv = make([]string, len(req.Argv))
		for i, s := range req.Argv {
			argv[i] = strings.ReplaceAll(s, "{file}", req.File.Path)
		}
		if cwd == "" {
			cwd = path.Dir(req.File.Path)
		}
	}
	if cwd == "" {
		cwd = "/"
	}
	if !path.IsAbs(argv[0]) {
		return nil, none, guest.ErrorInvalid, fmt.Errorf("program %q is not an absolute path", argv[0])
	}
	if !path.IsAbs(cwd) {
		return nil, none, guest.ErrorInvalid, fmt.Errorf("working directory %q is not an absolute path", cwd)
	}
	if req.File != nil {
		mode := req.File.Mode
		if mode == 0 {
			mode = 0o644
		}
		if code, err := writeWhole(req.File.Path, req.File.Data, mode); err != nil {
			return nil, none, code, err
		}
	}

	n := 3
	if req.ExitNotice {
		n = 4
		// Whether /proc is this namespace's is asked at the notice; asked
		// now, it is known to a sandbox restored from a checkpoint taken
		// while the program waits (a pool's), off the run's path.
		procIsOurs()
	}
	p, err := newPipes(n)
	if err != nil {
		return nil, none, guest.ErrorIO, err
	}
	inR, inW := p[0][0], p[0][1]
	outR, outW := p[1][0], p[1][1]
	errR, errW := p[2][0], p[2][1]
	files := []uintptr{inR.Fd(), outW.Fd(), errW.Fd()}
	var noticeR *os.File
	if req.ExitNotice {
		noticeR = p[3][0]
		files = append(files, p[3][1].Fd())
	}
	env := req.Env
	if env == nil {
		// syscall.ForkExec treats nil as empty too; say it here, since
		// os/exec would inherit the guest's environment.
		env = []string{}
	}
	e := &execution{a: a, id: id, stdin: inW, ended: make(chan struct{}), status: make(chan syscall.WaitStatus, 1)}
	if req.StdinStream {
		e.stdinQ = make(chan []byte, guest.StdinWindow+1)
	}
	if req.ExitNotice {
		e.notice = make(chan int, 1)
	}
	// syscall.ForkExec rather than os/exec: the guest is the one reaper of
	// the sandbox (see reaper.go). Fd puts the child's ends in blocking
	// mode, which is what a program expects.
	pid, err := a.reaper.start(func() (int, error) {
		return syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{
			Dir:   cwd,
			Env:   env,
			Files: files,
			Sys:   &syscall.SysProcAttr{Setpgid: true},
		})
	}, false, func(ws syscall.WaitStatus, ru *syscall.Rusage) {
		e.account(ru)
		e.status <- ws
	})
	// The guest must not hold the child's ends: the pumps see EOF only when
	// every write end is closed, and the feeder sees EPIPE only when every
	// read end is.
	inR.Close()
	outW.Close()
	errW.Close()
	if noticeR != nil {
		p[3][1].Close()
	}
	if err != nil {
		inW.Close()
		outR.Close()
		errR.Close()
		if noticeR != nil {
			noticeR.Close()
		}
		return nil, none, guest.ErrorStart, fmt.Errorf("starting %s: %w", argv[0], err)
	}
	e.pid = pid
	a.reaper.setStray(func(_ syscall.WaitStatus, ru *syscall.Rusage) { e.account(ru) })
	return e, execFiles{stdout: outR, stderr: errR, notice: noticeR}, "", nil
}

// newPipes makes n pipes, each [read end, write end], close-on-exec.
func newPipes(n int) ([][2]*os.File, error) {
	var out [][2]*os.File
	for range n {
		r, w, err := os.Pipe()
		if err != nil {
			for _, p := range out {
				p[0].Close()
				p[1].Close()
			}
			return nil, fmt.Errorf("creating pipe: %w", err)
		}
		out = append(out, [2]*os.File{r, w})
	}
	return out, nil
}

func (e *execution) account(ru *syscall.Rusage) {
	e.mu.Lock()
	e.usage.add(ru)
	e.mu.Unlock()
}

// run waits for the program's end (or its exit notice), kills what it
// left (or what a cancel left), drains its output and reports its exit.
func (e *execution) run(pumps []*pump) {
	a := e.a
	var ws syscall.WaitStatus
	notice := -1
	select {
	case ws = <-e.status:
	case notice = <-e.notice:
		if a.stopAll(noticeStopTime) {
			e.reportStopped(pumps, notice)
			return
		}
	}
	a.sweep(true, sweepTime)
	a.reaper.setStray(nil)
	close(e.ended)
	e.stdin.Close()
	if e.noticeFile != nil {
		// A process of a kernel could hold the write end (see drainGrace).
		e.noticeFile.Close()
	}
	drain(pumps, drainGrace)

	e.mu.Lock()
	u := e.usage
	e.mu.Unlock()
	rep := u.report(e.cancelled.Load())
	switch {
	case notice >= 0:
		rep.ExitCode = notice
	case ws.Signaled():
		rep.ExitCode, rep.Signal = -1, int(ws.Signal())
	default:
		// Without WUNTRACED the only other status is a normal exit.
		rep.ExitCode = ws.ExitStatus()
	}
	a.mu.Lock()
	a.exec = nil
	a.mu.Unlock()
	a.sendJSON(guest.FrameExit, e.id, rep)
}

// reportStopped reports an exit given notice of, once stopAll stopped
// every process: what their pipes hold is all the output there will be.
// Their usage is the program's figures in /proc (it is not reaped yet:
// its own and its waited-for children's) and the strays' reaped so far,
// not that of children still alive. They are killed and reaped after the
// report, and no exec starts until they are (a kernel may: it runs beside
// stopped processes of the same tenant until the sweep ends them).
func (e *execution) reportStopped(pumps []*pump, status int) {
	a := e.a
	flushPumps(pumps, drainGrace)
	close(e.ended)
	e.stdin.Close()
	e.mu.Lock()
	u := e.usage
	e.mu.Unlock()
	u.addProc(e.pid)
	rep := u.report(e.cancelled.Load())
	rep.ExitCode = status
	done := make(chan struct{})
	a.mu.Lock()
	a.exec = nil
	a.sweeping = done
	a.mu.Unlock()
	e.outMu.Lock()
	e.reported = true
	a.sendJSON(guest.FrameExit, e.id, rep)
	e.outMu.Unlock()
	// The pipes are closed after the report, off the run's path (four
	// system calls); what a process continued since (a SIGCONT) or a
	// kernel writes to them meanwhile is dropped, as their close would.
	drain(pumps, 0)

	a.sweep(true, sweepTime)
	a.reaper.setStray(nil)
	a.mu.Lock()
	a.sweeping = nil
	a.mu.Unlock()
	close(done)
}

// readNotice reads the program's exit notice from f (see
// guest.ExecRequest.ExitNotice) and passes its status to run. A notice
// that is not a decimal status of 0-255 and a newline is ignored: the
// exec then ends when its program does.
func (e *execution) readNotice(f *os.File) {
	defer f.Close()
	var buf [4]byte
	n := 0
	for n < len(buf) {
		m, err := f.Read(buf[n:])
		n += m
		if status, ok := parseNotice(buf[:n]); ok {
			e.notice <- status
			return
		}
		if err != nil || bytes.IndexByte(buf[:n], '\n') >= 0 {
			return
		}
	}
}

// parseNotice parses an exit notice: one to three decimal digits, a status
// of at most 255, and a newline.
func parseNotice(b []byte) (int, bool) {
	if len(b) < 2 || len(b) > 4 || b[len(b)-1] != '\n' {
		return 0, false
	}
	status := 0
	for _, c := range b[:len(b)-1] {
		if c < '0' || c > '9' {
			return 0, false
		}
		status = status*10 + int(c-'0')
	}
	return status, status <= 255
}

// forwarder returns the pump callback that sends the exec's output as
// frames of type t, up to limit bytes in all; past the limit it drops what
// it is given, so that the program never blocks on a full pipe.
func (e *execution) forwarder(t guest.FrameType, limit int64) func([]byte) {
	var sent int64
	return func(p []byte) {
		e.outMu.Lock()
		defer e.outMu.Unlock()
		if m := min(int64(len(p)), limit-sent); m > 0 && !e.reported {
			e.a.send(t, e.id, p[:m])
			sent += m
		}
	}
}

// signal sends sig to the exec's process group, or to its program when
// that left the group.
func (e *execution) signal(sig syscall.Signal) {
	if syscall.Kill(-e.pid, sig) == syscall.ESRCH {
		syscall.Kill(e.pid, sig)
	}
}

// cancel kills the exec's program and its process group; run's sweep
// kills the rest of its tree once the program is reaped.
func (e *execution) cancel() {
	e.cancelled.Store(true)
	syscall.Kill(-e.pid, syscall.SIGKILL)
	syscall.Kill(e.pid, syscall.SIGKILL)
}

// stdinData queues a chunk of streamed stdin, or its end (nil). It never
// blocks the main goroutine: a host keeps at most guest.StdinWindow chunks
// unacknowledged, and a chunk beyond that is dropped.
func (e *execution) stdinData(p []byte) {
	if e.stdinQ == nil {
		return
	}
	select {
	case e.stdinQ <- p:
	default:
		fmt.Fprintf(os.Stderr, "stockade-guest: exec %d: stdin chunk beyond the window dropped\n", e.id)
	}
}

// feedStream writes streamed stdin to the program and acknowledges each
// chunk. A program that exits without reading makes the writes fail with
// EPIPE; the chunks are still acknowledged (and dropped).
func (e *execution) feedStream() {
	broken := false
	for {
		var p []byte
		select {
		case p = <-e.stdinQ:
		case <-e.ended:
			return
		}
		if p == nil {
			e.stdin.Close()
			broken = true
			continue
		}
		if !broken {
			if _, err := e.stdin.Write(p); err != nil {
				broken = true
			}
		}
		select {
		case <-e.ended:
			return
		default:
			e.a.send(guest.FrameStdinAck, e.id, nil)
		}
	}
}

// feed writes data to the program's stdin and closes it. A program that
// exits without reading makes the write fail with EPIPE, which is not an
// error of the guest's.
func feed(w *os.File, data []byte) {
	if len(data) > 0 {
		w.Write(data)
	}
	w.Close()
}
