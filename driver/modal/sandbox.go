package modal

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stockade-sh/stockade/driver/modal/internal/pb"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// killGrace is how much longer than the Exec's timeout the provider's
// own bound on a command is, behind the driver's.
const killGrace = 10 * time.Second

// launcher starts every Exec's program, with the arguments PROGRAM N K=V
// (N of them) ARG...: the program found by its base name on the
// sandbox's PATH when the image has it elsewhere than Stockade's runtime
// images (/usr/local/bin/python3), and exactly its environment (env -i),
// with no shell left between. The loops put the program between the
// environment and the arguments.
const launcher = `p=$1 n=$2; shift 2; m=$(($# - n))
if [ ! -x "$p" ]; then q=$(command -v "${p##*/}") && p=$q; fi
i=0; while [ $i -lt $n ]; do set -- "$@" "$1"; shift; i=$((i+1)); done
set -- "$@" "$p"
i=0; while [ $i -lt $m ]; do set -- "$@" "$1"; shift; i=$((i+1)); done
exec /usr/bin/env -i -- "$@"`

// writer writes its stdin to the file $1 with mode $2.
const writer = `umask 077 && cat >"$1" && chmod "$2" "$1"`

// stdinChunk bounds one write of a command's stdin.
const stdinChunk = 1 << 20

// Sandbox is one Modal sandbox and its task. It runs one Exec at a time,
// and none after one the driver ended (by terminating the sandbox).
type Sandbox struct {
	d         *Driver
	id        string
	sandboxID string
	taskID    string
	limits    sandbox.Limits

	mu        sync.Mutex
	running   bool
	dead      bool // terminated by the driver to end an Exec
	destroyed bool
	execs     map[*exec]struct{}
	routers   map[string]bool // the router URLs whose connection it holds a reference on
}

var _ sandbox.Sandbox = (*Sandbox)(nil)

func (s *Sandbox) ID() string { return s.id }

// router is the task's command router and its token.
type router struct {
	c   pb.TaskCommandRouterClient
	jwt string
}

// ctx is ctx with the router's token.
func (r *router) ctx(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+r.jwt)
}

// router returns the command router of the sandbox's task, as the client
// libraries reach it: its URL and a token from the API.
func (s *Sandbox) router(ctx context.Context) (*router, error) {
	cctx, cancel := context.WithTimeout(ctx, s.d.cfg.CallTimeout)
	defer cancel()
	resp, err := s.d.api.TaskGetCommandRouterAccess(cctx, &pb.TaskGetCommandRouterAccessRequest{TaskId: s.taskID})
	if err != nil {
		return nil, callError(ctx, "reaching the sandbox's command router", err)
	}
	if _, err := tokenExpiry(resp.GetJwt()); err != nil {
		return nil, unreadable("reaching the sandbox's command router", err)
	}
	u := resp.GetUrl()
	if len(u) > maxString {
		return nil, unreadable("reaching the sandbox's command router", fmt.Errorf("a URL of %d bytes", len(u)))
	}
	conn, err := s.routerConn(u)
	if err != nil {
		return nil, err
	}
	return &router{c: pb.NewTaskCommandRouterClient(conn), jwt: resp.GetJwt()}, nil
}

// routerConn is the driver's connection to the router at URL u, shared
// by the sandboxes it serves, each holding a reference until Destroy
// (releaseRouters): the last one's Destroy closes it.
func (s *Sandbox) routerConn(u string) (*grpc.ClientConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return nil, fmt.Errorf("modal: sandbox %s is destroyed: %w", s.id, errdefs.ErrFailedPrecondition)
	}
	hold := func(rc *routerConn) *grpc.ClientConn {
		if !s.routers[u] {
			rc.refs++
			if s.routers == nil {
				s.routers = map[string]bool{}
			}
			s.routers[u] = true
		}
		return rc.conn
	}
	s.d.mu.Lock()
	rc := s.d.routers[u]
	if rc != nil {
		defer s.d.mu.Unlock()
		return hold(rc), nil
	}
	s.d.mu.Unlock()
	target, creds, err := dialTarget(u)
	if err != nil {
		return nil, unreadable("reaching the sandbox's command router", fmt.Errorf("router URL %q: %v", clip(redacted(u)), err))
	}
	// NewClient does no I/O.
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage)))
	if err != nil {
		return nil, unreadable("reaching the sandbox's command router", err)
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	if rc = s.d.routers[u]; rc != nil {
		conn.Close()
	} else {
		rc = &routerConn{conn: conn}
		s.d.routers[u] = rc
	}
	return hold(rc), nil
}

// routerConn is a connection to a router and the sandboxes that hold it.
type routerConn struct {
	conn *grpc.ClientConn
	refs int
}

// releaseRouters drops the references of a destroyed sandbox on its
// routers' connections, closing those that no sandbox holds.
func (s *Sandbox) releaseRouters() {
	s.mu.Lock()
	urls := s.routers
	s.routers = nil
	s.mu.Unlock()
	var closing []*grpc.ClientConn
	s.d.mu.Lock()
	for u := range urls {
		if rc := s.d.routers[u]; rc != nil {
			if rc.refs--; rc.refs <= 0 {
				delete(s.d.routers, u)
				closing = append(closing, rc.conn)
			}
		}
	}
	s.d.mu.Unlock()
	for _, c := range closing {
		c.Close()
	}
}

// Start writes the code file, then runs the program as one command of
// the router whose output streams back and whose stdin is written.
func (s *Sandbox) Start(ctx context.Context, req sandbox.ExecRequest) (sandbox.Exec, error) {
	if err := sandbox.CheckCommand("modal", req); err != nil {
		return nil, err
	}
	s.mu.Lock()
	switch {
	case s.destroyed || s.dead:
		s.mu.Unlock()
		return nil, errdefs.Publicf("modal: sandbox %s has ended (the command router cannot signal a command: a timeout or a cancel ends its sandbox): %w", s.id, errdefs.ErrFailedPrecondition)
	case s.running:
		s.mu.Unlock()
		return nil, fmt.Errorf("modal: sandbox %s runs an exec already: %w", s.id, errdefs.ErrConflict)
	}
	s.running = true
	s.mu.Unlock()
	ex, err := s.start(ctx, req)
	if err != nil {
		s.mu.Lock()
		s.running = false
		s.mu.Unlock()
		return nil, err
	}
	return ex, nil
}

func newExecID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "stockade-" + hex.EncodeToString(b[:])
}

func (s *Sandbox) start(ctx context.Context, req sandbox.ExecRequest) (*exec, error) {
	r, err := s.router(ctx)
	if err != nil {
		return nil, err
	}
	filePath := ""
	if req.File.Name != "" {
		filePath = "/tmp/" + req.File.Name
		mode := req.File.Mode
		if mode == 0 {
			mode = 0o644
		}
		if err := s.writeFile(ctx, r, filePath, req.File.Data, mode&0o7777); err != nil {
			return nil, err
		}
	}
	args := []string{"/bin/sh", "-c", launcher, "sh", strings.ReplaceAll(req.Argv[0], "{file}", filePath), strconv.Itoa(len(req.Env))}
	args = append(args, req.Env...)
	for _, a := range req.Argv[1:] {
		args = append(args, strings.ReplaceAll(a, "{file}", filePath))
	}
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = s.limits.Timeout
	}
	execID := newExecID()
	began := time.Now()
	if err := s.startCommand(ctx, r, execID, args, timeout+killGrace, true); err != nil {
		return nil, err
	}
	streamCtx, cancelStream := context.WithCancel(context.WithoutCancel(ctx))
	ex := &exec{s: s, r: r, execID: execID, req: req, began: began, cap: s.limits.OutputCap, done: make(chan struct{}), cancelStream: cancelStream}
	s.mu.Lock()
	if s.execs == nil {
		s.execs = map[*exec]struct{}{}
	}
	s.execs[ex] = struct{}{}
	s.mu.Unlock()
	go ex.run(streamCtx)
	go ex.watch(ctx, time.Until(began.Add(timeout)))
	return ex, nil
}

// startCommand starts command args as execID, its output piped or
// dropped, bounded by the provider to limit.
func (s *Sandbox) startCommand(ctx context.Context, r *router, execID string, args []string, limit time.Duration, pipe bool) error {
	secs := uint32((limit + time.Second - 1) / time.Second)
	req := &pb.TaskExecStartRequest{TaskId: s.taskID, ExecId: execID, CommandArgs: args, TimeoutSecs: &secs}
	if pipe {
		req.StdoutConfig, req.StderrConfig = pb.TaskExecStdoutConfig_TASK_EXEC_STDOUT_CONFIG_PIPE, pb.TaskExecStderrConfig_TASK_EXEC_STDERR_CONFIG_PIPE
	}
	cctx, cancel := context.WithTimeout(ctx, s.d.cfg.CallTimeout)
	defer cancel()
	if _, err := r.c.TaskExecStart(r.ctx(cctx), req); err != nil {
		return callError(ctx, "starting a command", err)
	}
	return nil
}

// writeStdin writes data to command execID's stdin and closes it.
func (s *Sandbox) writeStdin(ctx context.Context, r *router, execID string, data []byte) error {
	off := 0
	for {
		n := min(len(data)-off, stdinChunk)
		cctx, cancel := context.WithTimeout(ctx, s.d.cfg.CallTimeout)
		_, err := r.c.TaskExecStdinWrite(r.ctx(cctx), &pb.TaskExecStdinWriteRequest{TaskId: s.taskID, ExecId: execID,
			Offset: uint64(off), Data: data[off : off+n], Eof: off+n == len(data)})
		cancel()
		if err != nil {
			return callError(ctx, "writing a command's stdin", err)
		}
		if off += n; off == len(data) {
			return nil
		}
	}
}

// wait waits for command execID's end: its exit code, or the signal that
// ended it (a negative code).
func (s *Sandbox) wait(ctx context.Context, r *router, execID string) (code, signal int, err error) {
	for attempt := 0; ; attempt++ {
		resp, err := r.c.TaskExecWait(r.ctx(ctx), &pb.TaskExecWaitRequest{TaskId: s.taskID, ExecId: execID})
		if err == nil {
			return exitOf(resp)
		}
		switch status.Code(err) {
		case codes.DeadlineExceeded, codes.Unavailable:
			// The router ends a long wait; so may the connection.
		case codes.Unauthenticated:
			// The router's token expired during a long command.
			if nr, rerr := s.router(ctx); rerr == nil {
				r = nr
			}
		default:
			return 0, 0, callError(ctx, "waiting for a command", err)
		}
		if ctx.Err() != nil || attempt > 1000 {
			return 0, 0, callError(ctx, "waiting for a command", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// exitOf reads a command's end.
func exitOf(resp *pb.TaskExecWaitResponse) (code, signal int, err error) {
	switch st := resp.GetExitStatus().(type) {
	case *pb.TaskExecWaitResponse_Code:
		if st.Code < 0 || st.Code > 255 {
			return 0, 0, unreadable("waiting for a command", fmt.Errorf("exit code %d", st.Code))
		}
		return int(st.Code), 0, nil
	case *pb.TaskExecWaitResponse_Signal:
		if st.Signal <= 0 || st.Signal > 64 {
			return 0, 0, unreadable("waiting for a command", fmt.Errorf("signal %d", st.Signal))
		}
		return -1, int(st.Signal), nil
	}
	return 0, 0, unreadable("waiting for a command", errors.New("an end with neither exit code nor signal"))
}

// writeFile writes data to the file at p with mode, by a command that
// reads it from its stdin.
func (s *Sandbox) writeFile(ctx context.Context, r *router, p string, data []byte, mode uint32) error {
	ctx, cancel := context.WithTimeout(ctx, s.d.cfg.CallTimeout)
	defer cancel()
	id := newExecID()
	if err := s.startCommand(ctx, r, id, []string{"/bin/sh", "-c", writer, "sh", p, strconv.FormatUint(uint64(mode), 8)}, s.d.cfg.CallTimeout, false); err != nil {
		return err
	}
	if err := s.writeStdin(ctx, r, id, data); err != nil {
		return err
	}
	code, sig, err := s.wait(ctx, r, id)
	if err != nil {
		return err
	}
	if code != 0 || sig != 0 {
		return fmt.Errorf("modal: writing %s: the command ended with code %d, signal %d: %w", p, code, sig, errdefs.ErrUnavailable)
	}
	return nil
}

// Destroy terminates the sandbox; one the provider no longer knows is
// gone already. It bounds itself: ctx may have no deadline.
func (s *Sandbox) Destroy(ctx context.Context) error {
	s.mu.Lock()
	s.destroyed = true
	for ex := range s.execs {
		ex.cancelStream()
	}
	s.mu.Unlock()
	s.releaseRouters()
	if err := s.terminate(ctx); err != nil {
		return err
	}
	s.d.destroyed(s.id)
	return nil
}

// terminate terminates the sandbox within the call timeout, whatever ctx.
func (s *Sandbox) terminate(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.d.cfg.CallTimeout)
	defer cancel()
	_, err := s.d.api.SandboxTerminate(ctx, &pb.SandboxTerminateRequest{SandboxId: s.sandboxID})
	if err != nil && status.Code(err) != codes.NotFound {
		return fmt.Errorf("modal: sandbox %s is left: %w", s.id, rpcError("terminating a sandbox", err))
	}
	return nil
}

// exec is the program's command.
type exec struct {
	s            *Sandbox
	r            *router
	execID       string
	req          sandbox.ExecRequest
	began        time.Time
	cap          int64
	cancelStream context.CancelFunc
	done         chan struct{} // closed once res or err is set

	outMu sync.Mutex
	res   sandbox.Result // its output, until done

	mu       sync.Mutex
	ending   sandbox.Status // the status the driver's end gives, "" if none
	cutShort error
	final    *sandbox.Result
	err      error
}

// run writes the stdin, reads both streams and waits for the command.
func (e *exec) run(ctx context.Context) {
	var wg sync.WaitGroup
	var readErr [2]error
	for i, fd := range []pb.TaskExecStdioFileDescriptor{pb.TaskExecStdioFileDescriptor_TASK_EXEC_STDIO_FILE_DESCRIPTOR_STDOUT, pb.TaskExecStdioFileDescriptor_TASK_EXEC_STDIO_FILE_DESCRIPTOR_STDERR} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			readErr[i] = e.read(ctx, fd)
		}()
	}
	// Written whole or not at all: a program that ends without reading
	// its input is no error.
	_ = e.s.writeStdin(ctx, e.r, e.execID, e.req.Stdin)
	code, sig, err := e.s.wait(ctx, e.r, e.execID)
	if err == nil {
		// The streams end with the command; bound the wait for them.
		t := time.AfterFunc(killGrace, e.cancelStream)
		wg.Wait()
		t.Stop()
	} else {
		e.cancelStream()
		wg.Wait()
	}
	e.finish(code, sig, err == nil && readErr[0] == nil && readErr[1] == nil)
}

// read reads one output stream of the command to its end, from where it
// left off when the stream breaks.
func (e *exec) read(ctx context.Context, fd pb.TaskExecStdioFileDescriptor) error {
	st := sandbox.Stdout
	if fd == pb.TaskExecStdioFileDescriptor_TASK_EXEC_STDIO_FILE_DESCRIPTOR_STDERR {
		st = sandbox.Stderr
	}
	var off uint64
	var err error
	for attempt := 0; attempt < 10; attempt++ {
		var stream grpc.ServerStreamingClient[pb.TaskExecStdioReadResponse]
		stream, err = e.r.c.TaskExecStdioRead(e.r.ctx(ctx), &pb.TaskExecStdioReadRequest{TaskId: e.s.taskID, ExecId: e.execID, Offset: off, FileDescriptor: fd})
		for err == nil {
			var m *pb.TaskExecStdioReadResponse
			if m, err = stream.Recv(); err == nil {
				off += uint64(len(m.GetData()))
				e.output(st, m.GetData())
			}
		}
		if err == io.EOF {
			return nil
		}
		if c := status.Code(err); ctx.Err() != nil || (c != codes.Unavailable && c != codes.DeadlineExceeded && c != codes.Internal) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

func (e *exec) output(st sandbox.Stream, p []byte) {
	e.outMu.Lock()
	defer e.outMu.Unlock()
	out, trunc := &e.res.Stdout, &e.res.StdoutTruncated
	if st == sandbox.Stderr {
		out, trunc = &e.res.Stderr, &e.res.StderrTruncated
	}
	room := e.cap - int64(len(*out))
	if int64(len(p)) > room {
		p, *trunc = p[:max(room, 0)], true
	}
	if len(p) == 0 {
		return
	}
	*out = append(*out, p...)
	if e.req.OnOutput != nil {
		e.req.OnOutput(st, p)
	}
}

// finish sets the result: the end the provider reported, or, when there
// is none, a program killed with its sandbox.
func (e *exec) finish(code, sig int, ended bool) {
	e.outMu.Lock()
	res := e.res
	e.outMu.Unlock()
	res.Duration = time.Since(e.began)
	res.ExitCode = code
	e.mu.Lock()
	switch {
	case e.ending != "":
		res.Status, res.ExitCode, res.Signal = e.ending, -1, int(syscall.SIGKILL)
	case !ended:
		res.Status, res.ExitCode, res.Signal = sandbox.StatusKilled, -1, int(syscall.SIGKILL)
	case sig != 0:
		res.Status, res.ExitCode, res.Signal = sandbox.StatusKilled, -1, sig
	case code == 0:
		res.Status = sandbox.StatusSucceeded
	default:
		res.Status = sandbox.StatusFailed
	}
	if e.cutShort != nil {
		e.err = &sandbox.CutShortError{Result: &res, Err: e.cutShort}
	}
	e.final = &res
	// A sandbox the driver terminated, or whose command's end is
	// unknown, serves no more Execs.
	dead := e.ending != "" || !ended
	e.mu.Unlock()
	e.s.mu.Lock()
	delete(e.s.execs, e)
	e.s.running = false
	if dead {
		e.s.dead = true
	}
	e.s.mu.Unlock()
	e.cancelStream()
	close(e.done)
}

// watch ends the program at its timeout or when ctx ends.
func (e *exec) watch(ctx context.Context, timeout time.Duration) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-e.done:
	case <-t.C:
		e.end(sandbox.StatusTimedOut, nil)
	case <-ctx.Done():
		e.end(sandbox.StatusKilled, ctx.Err())
	}
}

// end ends the program with status: the router cannot signal it, so the
// sandbox is terminated, and with it the command's streams.
func (e *exec) end(st sandbox.Status, cause error) {
	e.mu.Lock()
	if e.final != nil || e.ending != "" {
		e.mu.Unlock()
		return
	}
	e.ending, e.cutShort = st, cause
	e.mu.Unlock()
	go func() {
		_ = e.s.terminate(context.Background())
		select {
		case <-e.done:
		case <-time.After(killGrace):
			e.cancelStream()
		}
	}()
}

func (e *exec) Wait(ctx context.Context) (*sandbox.Result, error) {
	select {
	case <-e.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err != nil {
		return nil, e.err
	}
	return e.final, nil
}

// Signal ends the program for SIGKILL (with its sandbox); the router has
// no call for any other signal.
func (e *exec) Signal(sig syscall.Signal) error {
	select {
	case <-e.done:
		return nil
	default:
	}
	if sig != syscall.SIGKILL {
		return errdefs.Publicf("modal: the task's command router cannot send %v to a command: %w", sig, errdefs.ErrFailedPrecondition)
	}
	e.end(sandbox.StatusKilled, nil)
	return nil
}

func (e *exec) Cancel() error {
	e.end(sandbox.StatusKilled, nil)
	return nil
}

func (e *exec) Stdin() io.WriteCloser { return nil }
