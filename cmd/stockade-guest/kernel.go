package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"sync"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/guest"
)

// A kernel is a long-lived interpreter process that runs cells. The guest
// starts it through the kernel wrapper (this binary with argv[0]
// kernelWrapper), which makes itself the subreaper of its tree and then
// execs the kernel's argv: every orphan of the kernel's tree reparents to
// the kernel, never to the guest, so the sweeps that end each exec spare
// it. Stopping a kernel kills it; its orphans then reparent to the guest
// and are swept.
//
// The kernel wire, between the guest and the kernel process:
//
//   - fd 0 is /dev/null (a cell's stdin travels in its request); fd 1 and
//     fd 2 are pipes the guest forwards as the running cell's output;
//   - fd 3 carries the guest's requests, fd 4 the kernel's events: one JSON
//     object per line, each line at most maxWireLine bytes;
//   - the kernel sends {"type":"ready"} once it can run cells; for each
//     {"type":"cell","cell":N,"code":...,"stdin":...} it may send
//     {"type":"display","cell":N,"mime_type":...,"data":<base64>} and then
//     sends one {"type":"result","cell":N,"status":"ok"|"error",
//     "error":{"name","value","traceback"},"value":{"mime_type","data"},
//     "exit_code":N} (exit_code for kernels whose cells have one);
//   - on a result the guest first forwards what is already in the output
//     pipes, so that output written before the result belongs to the cell;
//   - SIGINT interrupts the running cell (the kernel decides what that
//     means; the test kernel ends the cell with a KeyboardInterrupt error).
//
// The test kernel (testkernel.go) and the shell kernel (shellkernel.go),
// modes of this binary, speak it; so do the python and node kernels of
// package kernel.

// kernelWrapper is argv[0] of the kernel wrapper mode.
const kernelWrapper = "stockade-kernel-wrapper"

// maxWireLine bounds one line of the kernel wire: a display of MaxDisplay
// bytes, base64-encoded, with room to spare.
const maxWireLine = 2*guest.MaxDisplay + 64<<10

// wireRequest is a line the guest sends to a kernel.
type wireRequest struct {
	Type  string `json:"type"`
	Cell  int    `json:"cell"`
	Code  string `json:"code"`
	Stdin string `json:"stdin,omitempty"`
}

// wireEvent is a line a kernel sends to the guest.
type wireEvent struct {
	Type     string             `json:"type"`
	Cell     int                `json:"cell"`
	MimeType string             `json:"mime_type,omitempty"`
	Data     []byte             `json:"data,omitempty"`
	Status   string             `json:"status,omitempty"`
	Error    *guest.CellFailure `json:"error,omitempty"`
	Value    *guest.Display     `json:"value,omitempty"`
	ExitCode *int               `json:"exit_code,omitempty"`
}

// wrapKernel is the kernel wrapper: it makes itself a subreaper, a flag
// that survives execve, and becomes the kernel. It does not return.
func wrapKernel() {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		fatalf("kernel wrapper: setting PR_SET_CHILD_SUBREAPER: %v", errno)
	}
	if len(os.Args) < 2 {
		fatalf("kernel wrapper: no kernel to run")
	}
	err := syscall.Exec(os.Args[1], os.Args[1:], os.Environ())
	fatalf("kernel wrapper: starting %s: %v", os.Args[1], err)
}

// kernel is one kernel the guest runs.
type kernel struct {
	a     *agent
	id    uint32
	pid   int
	wire  *os.File // requests, the guest's end of fd 3
	pumps []*pump
	// events is closed when the kernel's events end (fd 4 is closed).
	events chan struct{}

	mu       sync.Mutex
	ready    bool
	dead     bool
	cell     *cellRun // the running cell, nil if none
	lastCell int
	early    []byte // stderr before ready, for the start error
}

// cellRun is the cell a kernel runs.
type cellRun struct {
	id    uint32
	n     int
	limit int64
	sent  [2]int64 // stdout, stderr
	// interrupted is set (under the kernel's mu) once the cell was
	// interrupted: interruptAgain repeats it while the cell runs; ended
	// once the kernel sent its result, which stops the repeats.
	interrupted, ended bool
}

// startKernel starts a kernel; FrameStarted follows once it is ready, or
// FrameError when it ends first.
func (a *agent) startKernel(f guest.Frame) {
	var req guest.KernelRequest
	if !a.decode(f, &req) {
		return
	}
	code, err := a.launchKernel(f.ID, &req)
	if err != nil {
		a.replyError(f.ID, code, err.Error())
	}
}

func (a *agent) launchKernel(id uint32, req *guest.KernelRequest) (string, error) {
	cwd := req.Cwd
	if cwd == "" {
		cwd = "/"
	}
	switch {
	case len(req.Argv) == 0:
		return guest.ErrorInvalid, errors.New("empty argv")
	case !path.IsAbs(req.Argv[0]):
		return guest.ErrorInvalid, fmt.Errorf("kernel %q is not an absolute path", req.Argv[0])
	case !path.IsAbs(cwd):
		return guest.ErrorInvalid, fmt.Errorf("working directory %q is not an absolute path", cwd)
	}
	exe, err := os.Executable()
	if err != nil {
		return guest.ErrorStart, fmt.Errorf("finding the guest's binary for the kernel wrapper: %w", err)
	}
	null, err := os.Open("/dev/null")
	if err != nil {
		return guest.ErrorStart, fmt.Errorf("opening /dev/null: %w", err)
	}
	defer null.Close()
	p, err := newPipes(4)
	if err != nil {
		return guest.ErrorIO, err
	}
	outR, outW := p[0][0], p[0][1]
	errR, errW := p[1][0], p[1][1]
	reqR, reqW := p[2][0], p[2][1]
	evR, evW := p[3][0], p[3][1]
	env := req.Env
	if env == nil {
		env = []string{}
	}
	k := &kernel{a: a, id: id, wire: reqW, events: make(chan struct{})}

	a.mu.Lock()
	if len(a.kernels) >= guest.MaxKernels {
		a.mu.Unlock()
		for _, f := range []*os.File{outR, outW, errR, errW, reqR, reqW, evR, evW} {
			f.Close()
		}
		return guest.ErrorBusy, fmt.Errorf("%d kernels run, the most a guest runs", guest.MaxKernels)
	}
	pid, err := a.reaper.start(func() (int, error) {
		return syscall.ForkExec(exe, append([]string{kernelWrapper}, req.Argv...), &syscall.ProcAttr{
			Dir:   cwd,
			Env:   env,
			Files: []uintptr{null.Fd(), outW.Fd(), errW.Fd(), reqR.Fd(), evW.Fd()},
			// Its own process group, so that an exec's signals never
			// reach it.
			Sys: &syscall.SysProcAttr{Setpgid: true},
		})
	}, true, k.exited)
	if err == nil {
		k.pid = pid
		a.kernels[id] = k
	}
	a.mu.Unlock()
	outW.Close()
	errW.Close()
	reqR.Close()
	evW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		reqW.Close()
		evR.Close()
		return guest.ErrorStart, fmt.Errorf("starting kernel %s: %w", req.Argv[0], err)
	}
	k.pumps = []*pump{
		a.newPump(outR, make(chan chan struct{}, 4), k.forwarder(0)),
		a.newPump(errR, make(chan chan struct{}, 4), k.forwarder(1)),
	}
	go k.readEvents(evR)
	return "", nil
}

// forwarder returns the pump callback of stream s (0 stdout, 1 stderr):
// output goes to the running cell, up to its cap; without a cell it is
// dropped, but for the first bytes of stderr before the kernel is ready,
// which explain a kernel that failed to start.
func (k *kernel) forwarder(s int) func([]byte) {
	t := [2]guest.FrameType{guest.FrameStdout, guest.FrameStderr}[s]
	return func(p []byte) {
		k.mu.Lock()
		c := k.cell
		if c == nil {
			if !k.ready && s == 1 {
				k.early = append(k.early, p[:min(len(p), guest.MaxMessage-len(k.early))]...)
			}
			k.mu.Unlock()
			return
		}
		m := min(int64(len(p)), c.limit-c.sent[s])
		if m > 0 {
			c.sent[s] += m
		}
		k.mu.Unlock()
		if m > 0 {
			k.a.send(t, c.id, p[:m])
		}
	}
}

// readEvents reads the kernel's events until fd 4 ends.
func (k *kernel) readEvents(r *os.File) {
	defer close(k.events)
	defer r.Close()
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := readLine(br, maxWireLine)
		if err != nil {
			if errors.Is(err, errLongLine) {
				// A kernel that breaks the wire is stopped.
				k.stop()
			}
			return
		}
		var ev wireEvent
		if json.Unmarshal(line, &ev) != nil {
			continue
		}
		k.event(&ev)
	}
}

var errLongLine = errors.New("line too long")

// readLine reads one line of at most max bytes, without its newline.
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > max {
			return nil, errLongLine
		}
		line = append(line, frag...)
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, err
		}
	}
}

// event handles one event of the kernel.
func (k *kernel) event(ev *wireEvent) {
	k.mu.Lock()
	c := k.cell
	switch {
	case ev.Type == "ready":
		if k.ready || k.dead {
			k.mu.Unlock()
			return
		}
		k.ready, k.early = true, nil
		k.mu.Unlock()
		k.a.sendJSON(guest.FrameStarted, k.id, guest.Started{PID: k.pid})
		return
	case c == nil || ev.Cell != c.n:
		// An event of no cell, or of an interrupted one the host gave up.
		k.mu.Unlock()
		return
	}
	k.mu.Unlock()
	switch ev.Type {
	case "display":
		d := guest.Display{MimeType: ev.MimeType, Data: ev.Data}
		if d.Validate() == nil {
			k.a.sendJSON(guest.FrameDisplay, c.id, d)
		}
	case "result":
		k.mu.Lock()
		c.ended = true
		k.mu.Unlock()
		// What the kernel wrote before its result belongs to the cell.
		flushPumps(k.pumps, time.Second)
		k.mu.Lock()
		if k.cell != c {
			k.mu.Unlock()
			return
		}
		k.cell = nil
		k.mu.Unlock()
		res := guest.CellResult{Status: ev.Status, Error: ev.Error, Value: ev.Value, ExitCode: ev.ExitCode}
		if err := res.Validate(); err != nil {
			k.a.replyError(c.id, guest.ErrorInvalid, fmt.Sprintf("the kernel's result: %v", err))
			return
		}
		k.a.sendJSON(guest.FrameResult, c.id, res)
	}
}

// startCell sends a cell to its kernel; the kernel's events answer it.
func (a *agent) startCell(f guest.Frame) {
	var req guest.CellRequest
	if !a.decode(f, &req) {
		return
	}
	if req.OutputCap <= 0 {
		a.replyError(f.ID, guest.ErrorInvalid, fmt.Sprintf("output cap %d is not positive", req.OutputCap))
		return
	}
	a.mu.Lock()
	k := a.kernels[req.Kernel]
	a.mu.Unlock()
	if k == nil {
		a.replyError(f.ID, guest.ErrorKernelGone, fmt.Sprintf("no kernel %d", req.Kernel))
		return
	}
	k.mu.Lock()
	switch {
	case k.dead:
		k.mu.Unlock()
		a.replyError(f.ID, guest.ErrorKernelGone, fmt.Sprintf("kernel %d ended", req.Kernel))
		return
	case !k.ready || k.cell != nil:
		k.mu.Unlock()
		a.replyError(f.ID, guest.ErrorBusy, fmt.Sprintf("kernel %d is not ready for a cell", req.Kernel))
		return
	}
	k.lastCell++
	c := &cellRun{id: f.ID, n: k.lastCell, limit: req.OutputCap}
	k.cell = c
	k.mu.Unlock()
	line := append(mustJSON(wireRequest{Type: "cell", Cell: c.n, Code: req.Code, Stdin: req.Stdin}), '\n')
	// The kernel may be slow to read a large cell: the write must not hold
	// the main goroutine. A failed write means the kernel is ending, and
	// its end answers the cell.
	go k.wire.Write(line)
}

// interruptCell interrupts the kernel that runs cell id, if any.
func (a *agent) interruptCell(id uint32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, k := range a.kernels {
		k.mu.Lock()
		running := k.cell != nil && k.cell.id == id
		k.mu.Unlock()
		if running {
			k.interrupt()
		}
	}
}

// interrupt sends SIGINT to the kernel and, when a cell runs, repeats it
// while that cell runs on (interruptAgain).
func (k *kernel) interrupt() {
	k.mu.Lock()
	c := k.cell
	first := c != nil && !c.interrupted
	if first {
		c.interrupted = true
	}
	k.mu.Unlock()
	k.signal(syscall.SIGINT)
	if first {
		go k.interruptAgain(c)
	}
}

// interruptAgainAfter is how long an interrupted cell may run on before
// its interrupt is repeated (time for a cell's own handling of an
// interrupt, an except or a trap, to finish); each repeat waits twice as
// long, up to interruptAgainMax.
const (
	interruptAgainAfter = time.Second
	interruptAgainMax   = 8 * time.Second
)

// interruptAgain repeats the interrupt of cell c while c runs, as a user
// would: an interrupt can be lost to races no kernel closes (a SIGINT
// that reaches python just before a sleep's system call, where no check of
// its flag follows; one that reaches a shell's child between its fork and
// its exec, taken by the shell's handler there and gone with the exec).
// The kernels take a SIGINT between cells as nothing. It ends with the
// cell (its result, or the kernel's end: a timeout restarts the kernel).
func (k *kernel) interruptAgain(c *cellRun) {
	for d := interruptAgainAfter; ; d = min(2*d, interruptAgainMax) {
		time.Sleep(d)
		// Signalled under the lock: the check and the signal are one
		// step, so that it cannot reach the next cell.
		k.mu.Lock()
		running := k.cell == c && !c.ended && !k.dead
		if running {
			k.signal(syscall.SIGINT)
		}
		k.mu.Unlock()
		if !running {
			return
		}
	}
}

func (k *kernel) signal(sig syscall.Signal) { syscall.Kill(k.pid, sig) }

// stop kills the kernel and its process group; exited handles the rest.
func (k *kernel) stop() {
	syscall.Kill(-k.pid, syscall.SIGKILL)
	syscall.Kill(k.pid, syscall.SIGKILL)
}

// exited is the reaper's callback for the kernel process: the kernel
// takes no more cells; once the events it wrote before its end are read
// (a result of the cell it ran last, say: a shell kernel's cell may end
// the shell), the cell that still runs fails, the host learns of the end,
// and the kernel's strays (its orphans, now the guest's) are swept.
func (k *kernel) exited(ws syscall.WaitStatus, _ *syscall.Rusage) {
	a := k.a
	a.mu.Lock()
	delete(a.kernels, k.id)
	a.mu.Unlock()
	k.mu.Lock()
	k.dead = true
	k.mu.Unlock()
	k.wire.Close()
	// Not in the reaper's goroutine: the wait must not hold the reaping
	// of other processes.
	go k.ended(ws)
}

// ended reports the end of the kernel once its events and output are
// read, or after drainGrace each if a process it left holds a pipe open.
func (k *kernel) ended(ws syscall.WaitStatus) {
	a := k.a
	select {
	case <-k.events:
	case <-time.After(drainGrace):
	}
	// The host learns of the end once the kernel's strays are swept, so
	// that a host that stopped the kernel finds its tree gone; then the
	// output the kernel wrote before its end (a cell's print, flushed just
	// before it killed the kernel) reaches the cell before the cell ends:
	// its pipes have no writer left once the strays are dead, unless a
	// process of another kernel opened them (drain gives up then).
	a.sweepStrays()
	drain(k.pumps, drainGrace)
	k.mu.Lock()
	c, ready, early := k.cell, k.ready, k.early
	k.cell = nil
	k.mu.Unlock()

	x := guest.KernelExit{ExitCode: ws.ExitStatus()}
	if ws.Signaled() {
		x = guest.KernelExit{ExitCode: -1, Signal: int(ws.Signal())}
	}
	how := fmt.Sprintf("exit code %d", x.ExitCode)
	if x.Signal != 0 {
		how = fmt.Sprintf("signal %d", x.Signal)
	}
	if c != nil {
		a.replyError(c.id, guest.ErrorKernelGone, fmt.Sprintf("kernel %d ended (%s) during the cell", k.id, how))
	}
	if !ready {
		msg := fmt.Sprintf("the kernel ended (%s) before it was ready", how)
		if len(early) > 0 {
			msg += ": " + string(early)
		}
		a.replyError(k.id, guest.ErrorStart, msg)
	} else {
		a.sendJSON(guest.FrameKernelExit, k.id, x)
	}
}

// sweepStrays kills the guest's children that belong to no kernel, unless
// an exec runs: its end sweeps them (and its own orphans must live until
// then).
func (a *agent) sweepStrays() {
	a.mu.Lock()
	if a.exec != nil || a.sweeping != nil {
		a.mu.Unlock()
		return
	}
	done := make(chan struct{})
	a.sweeping = done
	a.mu.Unlock()
	a.sweep(true, sweepTime)
	a.mu.Lock()
	a.sweeping = nil
	a.mu.Unlock()
	close(done)
}
