package supervisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/guest"
)

// Launch starts the shim of dir, whose record WriteMeta has written, as a
// detached process: command (e.g. [stockade, "shim"]) with dir appended,
// in a session of its own, stdin and stdout on /dev/null and its stderr in
// shim.log. It returns once the shim serves its socket, or with what the
// shim or its log said when it could not. The shim outlives the caller;
// the caller reaps it while it lives.
func Launch(ctx context.Context, command []string, dir string) error {
	if len(command) == 0 {
		return fmt.Errorf("launching a shim: no command: %w", errdefs.ErrInvalidArgument)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	logf, err := os.OpenFile(filepath.Join(dir, LogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		w.Close()
		return fmt.Errorf("opening the shim's log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(command[0], append(command[1:], dir)...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stderr = logf
	cmd.ExtraFiles = []*os.File{w} // readyFD
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return fmt.Errorf("starting the shim %s: %v: %w", command[0], err, errdefs.ErrUnavailable)
	}
	// Reaped while this process lives; after it, by whoever inherits it.
	go func() { _ = cmd.Wait() }()
	type answer struct {
		line string
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		line, err := bufio.NewReader(io.LimitReader(r, 4<<10)).ReadString('\n')
		got <- answer{strings.TrimSpace(line), err}
	}()
	select {
	case a := <-got:
		if a.line == "ok" {
			return nil
		}
		why := a.line
		if why == "" {
			why = strings.TrimSpace(Log(dir))
		}
		if why == "" {
			why = "it exited without a word"
		}
		return fmt.Errorf("the shim of %s did not start: %s: %w", filepath.Base(dir), why, errdefs.ErrUnavailable)
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		return fmt.Errorf("starting the shim of %s: %w", filepath.Base(dir), ctx.Err())
	}
}

// Conn is a client's connection to a shim: the guest channel (Read and
// Write, for a guest.Client) and the shim's control frames. Writes are
// serialised, each whole. Reads are one reader's: the first to read (the
// guest.Client, or Wait when nothing else has read) owns the read side.
// Closing it leaves the sandbox running.
type Conn struct {
	conn   *net.UnixConn
	r      *bufio.Reader
	wmu    sync.Mutex
	status Status

	// reader is who owns the read side: readerNone until the first Read
	// or Wait claims it.
	reader atomic.Int32
	// ended is closed when a read has returned an error: the connection
	// ended (or was closed) as its reader saw it.
	ended   chan struct{}
	endOnce sync.Once
}

// Owners of a Conn's read side.
const (
	readerNone int32 = iota
	readerRead
	readerWait
)

// errReadByWait is what Read returns once Wait drains the connection.
var errReadByWait = errors.New("the shim connection is drained by Wait")

// maxSocketName is the longest path a unix socket address holds
// (sockaddr_un's sun_path, with its NUL).
const maxSocketName = 107

// socketName returns a name of dir's socket that fits a socket address:
// its path, or, for a longer one (a deep state directory), the path
// through a descriptor of dir, /proc/self/fd/N/shim.sock, which holds
// while release has not been called.
func socketName(dir string) (name string, release func(), err error) {
	p := filepath.Join(dir, SocketFile)
	if len(p) <= maxSocketName {
		return p, func() {}, nil
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("opening %s: %w", dir, err)
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", fd, SocketFile), func() { unix.Close(fd) }, nil
}

// Dial connects to the shim of dir, replacing its client if it has one.
// It checks that the peer is the shim that dir's pid file names and runs
// as this process's user, and reads the shim's Status; the guest's frames
// follow, the hello first (see Status.Greeted). ctx bounds the dial and
// the status.
func Dial(ctx context.Context, dir string) (*Conn, error) {
	sock, release, err := socketName(dir)
	if err != nil {
		return nil, fmt.Errorf("connecting to the shim of %s: %w", filepath.Base(dir), err)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	release()
	if err != nil {
		return nil, fmt.Errorf("connecting to the shim of %s: %v: %w", filepath.Base(dir), err, errdefs.ErrUnavailable)
	}
	conn := c.(*net.UnixConn)
	fail := func(err error) (*Conn, error) {
		conn.Close()
		return nil, err
	}
	cred, err := peerCred(conn)
	if err != nil {
		return fail(fmt.Errorf("asking who serves %s: %w", filepath.Base(dir), err))
	}
	b, err := readBounded(filepath.Join(dir, PIDFile), 32)
	pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
	switch {
	case err != nil || perr != nil:
		return fail(fmt.Errorf("shim of %s: no pid recorded: %w", filepath.Base(dir), ErrNotOurs))
	case int(cred.Uid) != os.Geteuid() || int(cred.Pid) != pid:
		return fail(fmt.Errorf("the socket of %s is served by pid %d (uid %d), not by its shim %d: %w", filepath.Base(dir), cred.Pid, cred.Uid, pid, ErrNotOurs))
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetReadDeadline(dl)
	}
	r := bufio.NewReaderSize(conn, 64<<10)
	f, err := guest.ReadFrame(r, maxStatus)
	_ = conn.SetReadDeadline(time.Time{})
	if err != nil {
		return fail(fmt.Errorf("reading the status of the shim of %s: %v: %w", filepath.Base(dir), err, errdefs.ErrUnavailable))
	}
	var st Status
	if f.Type != FrameStatus || guest.DecodeLenient(f.Payload, &st) != nil || st.ID != filepath.Base(dir) || st.PID != pid {
		return fail(fmt.Errorf("the shim of %s answered %s %.100q, not its status: %w", filepath.Base(dir), f.Type, f.Payload, ErrNotOurs))
	}
	return &Conn{conn: conn, r: r, status: st, ended: make(chan struct{})}, nil
}

// Status is what the shim said when the connection began.
func (c *Conn) Status() Status { return c.status }

// Read reads the guest's frames. It fails once Wait has become the
// connection's reader.
func (c *Conn) Read(p []byte) (int, error) {
	if c.reader.Load() != readerRead && !c.reader.CompareAndSwap(readerNone, readerRead) {
		return 0, errReadByWait
	}
	return c.read(p)
}

// read reads from the connection for its reader, and marks the connection
// ended when the read fails.
func (c *Conn) read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err != nil {
		c.endOnce.Do(func() { close(c.ended) })
	}
	return n, err
}

// Write writes frames for the guest; one call carries whole frames.
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.conn.Write(p)
}

// control sends one of the shim's control frames.
func (c *Conn) control(t guest.FrameType) error {
	b, _ := guest.AppendFrame(nil, t, 0, nil)
	_, err := c.Write(b)
	return err
}

// CloseGuestStdin asks the shim to close the guest's input (its stdin, or
// descriptor 3 under Meta.ChannelFDs): the guest
// kills every process of the sandbox and exits, the runtime ends, and the
// shim with it (the connection then ends).
func (c *Conn) CloseGuestStdin() error { return c.control(FrameCloseStdin) }

// Kill asks the shim to kill the runtime's process and exit.
func (c *Conn) Kill() error { return c.control(FrameKill) }

// Start asks the shim of a sandbox created ahead (Meta.CreateArgv) to
// start it with its record as rewritten; the guest's hello then follows
// on this connection.
func (c *Conn) Start() error { return c.control(FrameStart) }

// EndAt asks the shim to end the sandbox by itself at t (Meta.Deadline),
// instead of its deadline before; the zero t never comes. The shim keeps
// t in memory only: the caller records it in the shim's record too
// (WriteMeta), for the readers of the record.
func (c *Conn) EndAt(t time.Time) error {
	p, err := json.Marshal(Deadline{At: t.UTC()})
	if err != nil {
		return err
	}
	b, err := guest.AppendFrame(nil, FrameDeadline, 0, p)
	if err != nil {
		return err
	}
	_, err = c.Write(b)
	return err
}

// Close closes the connection; the shim and its sandbox go on.
func (c *Conn) Close() error { return c.conn.Close() }

// Wait waits until the shim closes the connection (it exits when its
// runtime has), at most until ctx ends. The connection's reader sees the
// end: a guest.Client reading it goes on receiving its frames; when
// nothing has read the connection, Wait reads and discards them itself.
func (c *Conn) Wait(ctx context.Context) error {
	if c.reader.CompareAndSwap(readerNone, readerWait) {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				if _, err := c.read(buf); err != nil {
					return
				}
			}
		}()
	}
	select {
	case <-c.ended:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// peerCred is the credentials of the process at the other end of conn.
func peerCred(conn *net.UnixConn) (*unix.Ucred, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

// Running reports whether dir's shim process still runs: its pid file
// names a live process whose command line's last argument is dir (as
// Launch starts it), exactly: a pid reused by the shim of another
// directory, whose name dir's may begin, is not dir's.
func Running(dir string) (pid int, ok bool) {
	b, err := readBounded(filepath.Join(dir, PIDFile), 32)
	if err != nil {
		return 0, false
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, false
	}
	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	args := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
	if err != nil || args[len(args)-1] != dir {
		return pid, false
	}
	return pid, true
}

// KillShim ends dir's shim process by its pid, if it still runs (Running), and
// waits at most until ctx ends for it to be gone. The sandbox's runtime is
// the caller's to end: the guest's input closes with the shim, which ends
// the guest.
func KillShim(ctx context.Context, dir string) error {
	pid, ok := Running(dir)
	if !ok {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("killing the shim of %s: %w", filepath.Base(dir), err)
	}
	for {
		if _, ok := Running(dir); !ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the shim of %s to end: %w", filepath.Base(dir), ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
