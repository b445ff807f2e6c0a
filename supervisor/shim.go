package supervisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/guest"
)

// readyFD is the descriptor on which Launch waits for the shim: the shim
// writes "ok" once it serves, or why it cannot, and closes it.
const readyFD = 3

// clientWriteTimeout bounds a write to a client: a client that reads
// nothing for this long is dropped, so that the guest never waits on it.
var clientWriteTimeout = 30 * time.Second

// maxLog bounds shim.log.
const maxLog = 64 << 10

// runtimeWaitDelay is how long the shim still copies the runtime's stderr
// after the runtime exited.
const runtimeWaitDelay = time.Second

// watchEvery is how often the shim checks its deadline and whether a
// client could still reach it (watch).
const watchEvery = time.Second

// endGrace is how long the shim, ending its sandbox by itself, waits for
// each step to end the runtime before it takes the next (end).
const endGrace = 5 * time.Second

// runtimeCmdTimeout bounds each of the runtime's commands the shim runs
// (Meta.KillArgv, Meta.DeleteArgv).
const runtimeCmdTimeout = 30 * time.Second

// Main is `stockade shim DIR`: it serves the sandbox whose record is in
// DIR until its runtime exits, and returns the process's exit status.
// When ctx ends (the shim is sent SIGTERM) it kills the runtime first.
func Main(ctx context.Context, args []string) int {
	ready := readyPipe()
	fail := func(err error) int {
		if ready != nil {
			fmt.Fprintf(ready, "%v\n", err)
			ready.Close()
		}
		fmt.Fprintf(os.Stderr, "stockade shim: %v\n", err)
		return 1
	}
	if len(args) != 1 || !filepath.IsAbs(args[0]) {
		return fail(errors.New("usage: stockade shim DIR (an absolute path; started by a driver, not by hand)"))
	}
	if err := Serve(ctx, args[0], ready); err != nil {
		return fail(err)
	}
	return 0
}

// readyPipe returns the pipe Launch passes as readyFD, or nil when that
// descriptor is not a pipe (the shim run by hand, whose fd 3 may be open
// on anything, which the shim then neither writes nor closes). The
// descriptor is marked close-on-exec first of all, so that the runtime
// and its processes never inherit it: a process holding it would keep
// Launch from seeing the shim's end.
func readyPipe() *os.File {
	syscall.CloseOnExec(readyFD)
	var st syscall.Stat_t
	if err := syscall.Fstat(readyFD, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
		return nil
	}
	return os.NewFile(readyFD, "ready")
}

// Serve runs the shim of dir: it reads and checks the record, starts the
// runtime, reports on ready (which may be nil) and relays until the
// runtime exits.
func Serve(ctx context.Context, dir string, ready *os.File) error {
	key, err := readKey(filepath.Dir(dir))
	if err != nil {
		return err
	}
	m, err := ReadMeta(dir, key)
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(dir, LogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening the shim's log: %w", err)
	}
	defer logf.Close()
	logw := &boundedFile{f: logf, left: maxLog}
	s := &shim{dir: dir, id: m.ID, meta: m, log: slog.New(slog.NewTextHandler(logw, nil)), lastID: m.LastID, restored: m.Hello != nil,
		deadline: m.Deadline}
	switch {
	case len(m.CreateArgv) > 0 && m.Hello != nil:
		// A hello would let clients' frames reach the created sandbox
		// before its start: the start's record carries it (awaitStart).
		return fmt.Errorf("shim %s: the record of a sandbox created ahead carries a hello", dir)
	case len(m.CreateArgv) > 0:
		s.waiting, s.start, s.unused = true, make(chan struct{}), make(chan struct{})
	case len(m.Argv) == 0:
		return fmt.Errorf("shim %s: the record names no runtime command", dir)
	}
	if m.Hello != nil {
		if s.hello, err = helloFrame(*m.Hello); err != nil {
			return err
		}
		s.accepted = true
	}
	if err := os.WriteFile(filepath.Join(dir, PIDFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return fmt.Errorf("writing the shim's pid: %w", err)
	}
	sock := filepath.Join(dir, SocketFile)
	_ = os.Remove(sock)
	name, release, err := socketName(dir)
	if err != nil {
		return err
	}
	// The listener removes its socket by name when it closes: the name
	// must hold until then.
	defer release()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		return fmt.Errorf("listening on %s: %w", sock, err)
	}
	defer ln.Close()
	if err := os.Chmod(sock, 0o600); err != nil {
		return fmt.Errorf("making %s root-only: %w", sock, err)
	}
	if s.sock, err = os.Stat(sock); err != nil {
		return fmt.Errorf("checking %s: %w", sock, err)
	}

	inR, inW, err := os.Pipe()
	if err != nil {
		return err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return err
	}
	s.stdin = inW
	var cmd *exec.Cmd
	if len(m.CreateArgv) > 0 {
		// A sandbox created ahead: the create takes the channel, the
		// start later runs without it.
		if err := s.create(ctx, inR, outW, logw); err != nil {
			inR.Close()
			outW.Close()
			return err
		}
		inR.Close()
		outW.Close()
		if ready != nil {
			fmt.Fprintln(ready, "ok")
			ready.Close()
		}
		go s.accept(ln)
		if cmd = s.awaitStart(ctx, dir, key, logw); cmd == nil {
			s.runRuntime(ctx, "delete", s.meta.DeleteArgv)
			s.recordExit(Exit{ExitCode: -1, At: time.Now().UTC(), Ended: EndedUnused})
			return nil
		}
	} else {
		cmd = s.command(m.Argv, logw)
		if m.ChannelFDs {
			cmd.ExtraFiles = []*os.File{inR, outW}
			cmd.Stdout = logw
		} else {
			cmd.Stdin, cmd.Stdout = inR, outW
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("starting %s: %w", m.Argv[0], err)
		}
		inR.Close()
		outW.Close()
		s.setRuntime(cmd.Process)
		s.log.Info("runtime started", "pid", cmd.Process.Pid, "argv", m.Argv)
		if ready != nil {
			fmt.Fprintln(ready, "ok")
			ready.Close()
		}
		go s.accept(ln)
	}

	exited := make(chan struct{})
	go func() {
		<-ctx.Done()
		select {
		case <-exited:
		default:
			s.log.Info("stopping: killing the runtime")
			s.killRuntime()
		}
	}()
	go s.relayGuest(bufio.NewReaderSize(outR, 64<<10))
	go s.watch(ctx, exited)
	werr := cmd.Wait()
	close(exited)
	x := Exit{ExitCode: cmd.ProcessState.ExitCode(), At: time.Now().UTC()}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		x.ExitCode, x.Signal = -1, int(ws.Signal())
	}
	s.mu.Lock()
	x.Ended = s.ended
	s.mu.Unlock()
	s.log.Info("runtime exited", "exit_code", x.ExitCode, "signal", x.Signal, "ended", x.Ended, "err", werr)
	// A sandbox created ahead is not its runtime's child: the runtime
	// killed (the shim sent SIGTERM) leaves it running, and its state is
	// kept when it ends. DeleteArgv ends and removes it.
	if x.Ended != "" || s.start != nil {
		// What the runtime keeps of a sandbox it was made to end (a
		// killed runc's container) goes as the driver's Destroy removes
		// it; one that ended by itself removed it already.
		s.runRuntime(ctx, "delete", s.meta.DeleteArgv)
	}
	s.recordExit(x)
	return nil
}

// recordExit writes x, how the sandbox ended, for the driver (ReadExit),
// and drops the clients.
func (s *shim) recordExit(x Exit) {
	b, _ := json.Marshal(x)
	if err := os.WriteFile(filepath.Join(s.dir, ExitFile), b, 0o600); err != nil {
		s.log.Error("recording the exit", "err", err)
	}
	s.drop(nil)
}

// shim is one shim's relay state.
type shim struct {
	dir, id string
	meta    Meta
	log     *slog.Logger
	sock    os.FileInfo // the socket as it was made: watch compares

	// mu guards client, hello, clients, lastID, deadline, ended, runtime,
	// restored, waiting and start (meta is written once more, by
	// awaitStart, before the goroutines that read it start). A
	// client is published (and the hello decided for it) under mu, while
	// its write lock is held, so that its status and hello precede every
	// guest frame.
	mu       sync.Mutex
	client   *client
	hello    []byte // the guest's greeting as replayed, nil until it came
	clients  int
	lastID   uint32
	deadline time.Time // zero: none
	ended    string    // why end ended the sandbox; "" while it has not
	runtime  *os.Process
	restored bool
	// waiting is true while a sandbox created ahead waits for its start;
	// start is closed when a client asks for it (FrameStart), unused when
	// the slot is to end unstarted. Both are nil for other sandboxes.
	waiting bool
	start   chan struct{}
	unused  chan struct{}
	killed  bool // a kill was asked for

	// stdinMu serialises the frames into the guest's input and guards
	// accepted and stdinClosed.
	stdinMu     sync.Mutex
	stdin       *os.File
	accepted    bool // the guest has had its first Accept
	stdinClosed bool
}

// client is one connection.
type client struct {
	conn *net.UnixConn
	wmu  sync.Mutex // one frame at a time, in order
}

// write writes p whole within clientWriteTimeout; wmu is held.
func (c *client) write(p []byte) error {
	_ = c.conn.SetWriteDeadline(time.Now().Add(clientWriteTimeout))
	_, err := c.conn.Write(p)
	return err
}

// accept serves connections until the listener is closed. A connection
// from another user than the shim's is refused.
func (s *shim) accept(ln *net.UnixListener) {
	for {
		conn, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		if uid, err := peerUID(conn); err != nil || uid != os.Geteuid() {
			s.log.Warn("refused a connection of another user", "uid", uid, "err", err)
			conn.Close()
			continue
		}
		s.attach(&client{conn: conn})
	}
}

// attach makes c the client, replacing the one before: it sends the
// status and the hello, then serves c's frames.
func (s *shim) attach(c *client) {
	c.wmu.Lock()
	s.mu.Lock()
	old := s.client
	s.client = c
	st := Status{ID: s.id, PID: os.Getpid(), LastID: s.lastID, Greeted: s.hello != nil, Restored: s.restored, Clients: s.clients,
		Deadline: s.deadline, Waiting: s.waiting}
	hello := s.hello
	s.clients++
	s.mu.Unlock()
	if old != nil {
		// Closing the old connection ends its reader, and a write to it
		// that blocked.
		old.conn.Close()
	}
	p, _ := json.Marshal(st)
	frame, _ := guest.AppendFrame(nil, FrameStatus, 0, p)
	err := c.write(append(frame, hello...))
	c.wmu.Unlock()
	s.log.Info("client attached", "clients_before", st.Clients, "last_id", st.LastID)
	if err != nil {
		s.drop(c)
		return
	}
	go s.serveClient(c)
}

// drop closes c if it is still the client (nil: whoever is).
func (s *shim) drop(c *client) {
	s.mu.Lock()
	if c == nil {
		c = s.client
	}
	if c != nil && s.client == c {
		s.client = nil
	}
	s.mu.Unlock()
	if c != nil {
		c.conn.Close()
	}
}

// serveClient passes c's frames on to the guest until c ends or is
// replaced.
func (s *shim) serveClient(c *client) {
	defer s.drop(c)
	r := bufio.NewReaderSize(c.conn, 64<<10)
	accepted := false
	for {
		f, err := readClient(r, accepted)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.Info("client dropped", "err", err)
			}
			return
		}
		switch {
		case f.control == FrameCloseStdin:
			s.closeStdin("as the client asks")
		case f.control == FrameKill:
			s.log.Info("killing the runtime, as the client asks")
			s.killRuntime()
		case f.control == FrameStart:
			s.startAhead()
		case f.control == FrameDeadline:
			s.mu.Lock()
			s.deadline = f.deadline.At
			s.mu.Unlock()
			s.log.Info("deadline moved, as the client asks", "deadline", f.deadline.At)
		case f.accept != 0:
			accepted = true
			if !s.toGuest(c, f.id, func(first bool) []byte { return acceptFrame(f.accept, first) }) {
				return
			}
		default:
			if !s.toGuest(c, f.id, func(bool) []byte { return f.frame }) {
				return
			}
		}
	}
}

// toGuest writes one frame into the guest's input, if c is still the
// client; frame gets whether the guest has had no Accept yet. It returns
// false when c should stop.
func (s *shim) toGuest(c *client, id uint32, frame func(first bool) []byte) bool {
	s.stdinMu.Lock()
	defer s.stdinMu.Unlock()
	// The check and the record of the id are one step under mu, as a
	// client's attach is: a frame that passes is counted in every later
	// client's status, and one of a client replaced meanwhile is dropped.
	s.mu.Lock()
	// A sandbox created ahead takes no frame before its start has
	// passed the hello on: its guest does not run yet.
	ok := s.client == c && !s.stdinClosed && (s.start == nil || s.hello != nil)
	if ok {
		s.lastID = max(s.lastID, id)
	}
	s.mu.Unlock()
	if !ok {
		return false
	}
	if _, err := s.stdin.Write(frame(!s.accepted)); err != nil {
		s.log.Info("writing to the guest", "err", err)
		return false
	}
	s.accepted = true
	return true
}

// closeStdin closes the guest's input, once; why is logged.
func (s *shim) closeStdin(why string) {
	s.stdinMu.Lock()
	defer s.stdinMu.Unlock()
	if !s.stdinClosed {
		s.stdinClosed = true
		s.stdin.Close()
		s.log.Info("closed the guest's stdin, " + why)
	}
	s.endUnused() // a sandbox created ahead has no guest running to end
}

// watch ends the sandbox (end) once its deadline has passed, or once no
// client is attached and none could attach any more: the socket at the
// directory's path is not the one the shim serves (the directory, or the
// state directory above it, was deleted, moved or made again), so that no
// restarted daemon could ever reach the sandbox. A client attached still
// reaches it: its creator runs, and ends it. watch returns when exited is
// closed.
func (s *shim) watch(ctx context.Context, exited <-chan struct{}) {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for {
		select {
		case <-exited:
			return
		case <-t.C:
		}
		s.mu.Lock()
		deadline, attached := s.deadline, s.client != nil
		s.mu.Unlock()
		switch {
		case !deadline.IsZero() && !time.Now().Before(deadline):
			s.end(ctx, EndedDeadline, exited)
			return
		case !attached && !s.reachable():
			s.end(ctx, EndedUnreachable, exited)
			return
		}
	}
}

// reachable reports whether a client dialing the shim's directory would
// reach this shim: the socket there is the one it listens on.
func (s *shim) reachable() bool {
	fi, err := os.Lstat(filepath.Join(s.dir, SocketFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return true // not known to be gone
	}
	return err == nil && os.SameFile(fi, s.sock)
}

// end ends the sandbox by itself, for why (Exit.Ended), as the driver's
// Destroy would: it closes the guest's input (the guest kills every
// process of the sandbox and exits, and the runtime with it); a runtime
// still running endGrace later is made to kill the sandbox's processes
// (Meta.KillArgv), and one running endGrace after that is killed. The
// runtime's state goes once it has exited (Serve). It returns once the
// runtime has exited or was killed.
func (s *shim) end(ctx context.Context, why string, exited <-chan struct{}) {
	s.mu.Lock()
	s.ended = why
	deadline := s.deadline
	s.mu.Unlock()
	s.log.Warn("ending the sandbox by itself", "why", why, "deadline", deadline)
	s.drop(nil)
	s.closeStdin("to end the sandbox")
	gone := func() bool {
		select {
		case <-exited:
			return true
		case <-time.After(endGrace):
			return false
		}
	}
	if gone() {
		return
	}
	s.runRuntime(ctx, "kill", s.meta.KillArgv)
	if gone() {
		return
	}
	s.log.Warn("the runtime outlived the end of its sandbox: killing it")
	s.killRuntime()
}

// runRuntime runs one of the runtime's commands of the record (Meta.KillArgv,
// Meta.DeleteArgv), named what in the log, bounded by runtimeCmdTimeout
// (also when ctx has ended: the shim stopping still ends its sandbox);
// nil runs nothing.
func (s *shim) runRuntime(ctx context.Context, what string, argv []string) {
	if len(argv) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runtimeCmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = s.meta.Env
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	out, err := cmd.CombinedOutput()
	s.log.Info("ran the runtime's "+what, "argv", argv, "err", err, "output", string(out[:min(len(out), 1<<10)]))
}

// relayGuest reads the guest's frames until its stream ends and passes
// each to the client, if there is one; otherwise it drops them.
func (s *shim) relayGuest(r *bufio.Reader) {
	s.mu.Lock()
	greeted := s.hello != nil
	s.mu.Unlock()
	if !greeted {
		_, hello, err := readHello(r)
		if err != nil {
			s.log.Warn("the guest did not greet", "err", err)
			s.drainGuest(r)
			return
		}
		s.mu.Lock()
		s.hello = hello
		c := s.client
		s.mu.Unlock()
		if c != nil {
			s.send(c, hello)
		}
	}
	for {
		frame, err := readGuest(r)
		if err != nil {
			// At EOF the runtime is ending: the client's connection ends
			// once its exit is recorded.
			if !errors.Is(err, io.EOF) {
				s.log.Warn("the guest's stream broke", "err", err)
				s.drainGuest(r)
			}
			return
		}
		if frame == nil {
			continue
		}
		s.mu.Lock()
		c := s.client
		s.mu.Unlock()
		if c != nil {
			s.send(c, frame)
		}
	}
}

// send writes one frame to c; a client that cannot take it is dropped.
func (s *shim) send(c *client, frame []byte) {
	c.wmu.Lock()
	err := c.write(frame)
	c.wmu.Unlock()
	if err != nil {
		s.log.Info("client dropped: writing", "err", err)
		s.drop(c)
	}
}

// drainGuest reads what the guest still writes after its stream broke the
// protocol, so that it never blocks; nothing of it is passed on.
func (s *shim) drainGuest(r *bufio.Reader) {
	s.drop(nil)
	_, _ = io.Copy(io.Discard, r)
}

// peerUID is the uid of the process at the other end of conn.
func peerUID(conn *net.UnixConn) (int, error) {
	cred, err := peerCred(conn)
	if err != nil {
		return -1, err
	}
	return int(cred.Uid), nil
}

// boundedFile writes at most left bytes to f, then drops the rest while
// reporting every write as complete. It is safe for concurrent use.
type boundedFile struct {
	mu   sync.Mutex
	f    *os.File
	left int
}

func (b *boundedFile) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.left > 0 {
		n, _ := b.f.Write(p[:min(len(p), b.left)])
		b.left -= n
	}
	return len(p), nil
}

// command is the runtime's command argv, with the record's environment,
// its stderr into logw.
func (s *shim) command(argv []string, logw io.Writer) *exec.Cmd {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = s.meta.Env
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	cmd.Stderr = logw
	// The runtime's stderr is copied into the bounded log through a pipe
	// that any process it started may hold open after it exits: Wait
	// stops copying runtimeWaitDelay after the exit, so that the exit is
	// recorded and the shim ends.
	cmd.WaitDelay = runtimeWaitDelay
	return cmd
}

// setRuntime records the runtime's process, killing it when a kill was
// asked for before it started.
func (s *shim) setRuntime(p *os.Process) {
	s.mu.Lock()
	s.runtime = p
	kill := s.killed
	s.mu.Unlock()
	if kill {
		_ = p.Kill()
	}
}

// killRuntime kills the runtime's process; a sandbox created ahead that
// waits for its start ends unused, and one whose start is under way is
// killed as soon as its runtime runs.
func (s *shim) killRuntime() {
	s.mu.Lock()
	p := s.runtime
	s.killed = true
	s.mu.Unlock()
	if p != nil {
		_ = p.Kill()
		return
	}
	s.endUnused()
}
