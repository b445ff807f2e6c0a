package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/guest"
)

// program is a started program: its pid (also its process group) and the
// guest's ends of its stdio pipes.
type program struct {
	pid    int
	stdin  *os.File // write end; fed then closed
	stdout *os.File // read end
	stderr *os.File // read end
}

// exec runs one request to completion and answers it with FrameStdout and
// FrameStderr chunks, then exactly one FrameExit or FrameError. A frame from
// the host while the program runs ends the guest (see hostEnded and
// protocolError).
func (a *agent) exec(req *guest.ExecRequest) {
	before := childrenUsage()
	p, err := a.start(req)
	if err != nil {
		a.sendJSON(guest.FrameError, guest.ErrorReport{Message: err.Error()})
		return
	}
	a.pgid.Store(int64(p.pid))
	defer a.pgid.Store(0)

	go feed(p.stdin, req.Stdin)
	var pumps sync.WaitGroup
	pumps.Add(2)
	go a.pump(&pumps, guest.FrameStdout, p.stdout, req.OutputCap)
	go a.pump(&pumps, guest.FrameStderr, p.stderr, req.OutputCap)

	done := make(chan guest.ExitReport, 1)
	go func() {
		ws, maxRSS := a.reap(p.pid)
		a.drain(&pumps, p)
		done <- report(ws, before, childrenUsage(), maxRSS)
	}()

	select {
	case rep := <-done:
		a.sendJSON(guest.FrameExit, rep)
	case f := <-a.in:
		// The host sends nothing while a program runs but the end of its
		// stream. Kill the program, let the reaper finish, then exit.
		a.killAll()
		<-done
		if f.err != nil {
			a.hostEnded(f.err)
		}
		a.protocolError(fmt.Errorf("frame %q received while a program runs: %w", byte(f.t), guest.ErrProtocol))
	}
}

// start validates req, writes its file and starts its program. An error is
// reported to the host as FrameError; nothing is left running.
func (a *agent) start(req *guest.ExecRequest) (*program, error) {
	if err := guest.ValidatePath(req.File.Path); err != nil {
		return nil, err
	}
	mode := req.File.Mode
	if mode == 0 {
		mode = 0o644
	}
	if mode&^0o777 != 0 {
		return nil, fmt.Errorf("file mode %#o has bits outside 0777", req.File.Mode)
	}
	if req.OutputCap <= 0 {
		return nil, fmt.Errorf("output cap %d is not positive", req.OutputCap)
	}
	if len(req.Argv) == 0 {
		return nil, errors.New("empty argv")
	}
	argv := make([]string, len(req.Argv))
	for i, s := range req.Argv {
		argv[i] = strings.ReplaceAll(s, "{file}", req.File.Path)
	}
	if !path.IsAbs(argv[0]) {
		return nil, fmt.Errorf("program %q is not an absolute path", argv[0])
	}
	if err := writeFile(req.File.Path, req.File.Data, mode); err != nil {
		return nil, err
	}

	// Pipes are close-on-exec; ForkExec dups the child's ends onto 0, 1, 2.
	var files []*os.File
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	pipe := func() (r, w *os.File, err error) {
		r, w, err = os.Pipe()
		if err == nil {
			files = append(files, r, w)
		}
		return r, w, err
	}
	inR, inW, err := pipe()
	if err != nil {
		return nil, fmt.Errorf("creating stdin pipe: %w", err)
	}
	outR, outW, err := pipe()
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("creating stdout pipe: %w", err)
	}
	errR, errW, err := pipe()
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("creating stderr pipe: %w", err)
	}

	env := req.Env
	if env == nil {
		// syscall.ForkExec treats nil as empty too; say it here, since
		// os/exec would inherit the guest's environment.
		env = []string{}
	}
	// syscall.ForkExec rather than os/exec: the guest is the one reaper of
	// the sandbox (see reap) and must not race an exec.Cmd's Wait. Fd puts
	// the child's ends in blocking mode, which is what a program expects.
	pid, err := syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{
		Dir:   path.Dir(req.File.Path),
		Env:   env,
		Files: []uintptr{inR.Fd(), outW.Fd(), errW.Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("starting %s: %w", argv[0], err)
	}
	// The guest must not hold the child's ends: the pumps see EOF only when
	// every write end is closed, and the feeder sees EPIPE only when every
	// read end is.
	inR.Close()
	outW.Close()
	errW.Close()
	return &program{pid: pid, stdin: inW, stdout: outR, stderr: errR}, nil
}

// writeFile writes the delivered file at p, which ValidatePath accepted. The
// sandbox's code ran earlier in the session with the guest's uid and may have
// planted a symlink at p or on the way to it: every directory below /tmp or
// /workspace must be a real directory, an old file at p is unlinked (never
// opened), and the new one is created with O_EXCL|O_NOFOLLOW. No process runs
// between execs, so nothing can swap a directory between check and use.
func writeFile(p string, data []byte, mode uint32) error {
	if err := mkdirs(path.Dir(p)); err != nil {
		return err
	}
	if err := syscall.Unlink(p); err != nil && err != syscall.ENOENT {
		return fmt.Errorf("removing old %s: %w", p, err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, fs.FileMode(mode))
	if err != nil {
		return fmt.Errorf("creating %s: %w", p, err)
	}
	_, err = f.Write(data)
	if err == nil {
		// The umask must not narrow the mode the host asked for.
		err = f.Chmod(fs.FileMode(mode))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", p, err)
	}
	return nil
}

// mkdirs creates dir and its parents below /tmp or /workspace (which must
// exist), refusing any component that is a symlink or not a directory.
func mkdirs(dir string) error {
	root := "/tmp"
	if !strings.HasPrefix(dir+"/", "/tmp/") {
		root = "/workspace"
	}
	cur := root
	for _, name := range strings.Split(strings.TrimPrefix(dir, root), "/") {
		if name == "" {
			continue
		}
		cur += "/" + name
		fi, err := os.Lstat(cur)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := os.Mkdir(cur, 0o755); err != nil {
				return fmt.Errorf("creating directory: %w", err)
			}
		case err != nil:
			return fmt.Errorf("checking directory: %w", err)
		case !fi.IsDir():
			return fmt.Errorf("%s is not a directory", cur)
		}
	}
	return nil
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

// pump forwards r to the host as frames of type t, each at most
// guest.MaxChunk bytes, up to limit bytes in all; past the limit it keeps
// reading and drops what it reads, so the program never blocks on a full
// pipe. It closes r at EOF.
func (a *agent) pump(wg *sync.WaitGroup, t guest.FrameType, r *os.File, limit int64) {
	defer wg.Done()
	defer r.Close()
	buf := make([]byte, guest.MaxChunk)
	var sent int64
	for {
		n, err := r.Read(buf)
		if m := min(int64(n), limit-sent); m > 0 {
			a.send(t, buf[:m])
			sent += m
		}
		if err != nil {
			return
		}
	}
}

// drain waits for the pumps to reach EOF. As PID 1 this is certain once reap
// returned: every process that could hold a pipe's write end is dead. Outside
// a PID namespace (tests), a process that left the program's process group
// may still hold one; after a grace period the read ends are closed, which
// ends the pumps.
func (a *agent) drain(pumps *sync.WaitGroup, p *program) {
	done := make(chan struct{})
	go func() {
		pumps.Wait()
		close(done)
	}()
	if a.init {
		<-done
		return
	}
	select {
	case <-done:
	case <-time.After(time.Second):
		p.stdout.Close()
		p.stderr.Close()
		<-done
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Only the guest's own fixed types are marshalled.
		panic(err)
	}
	return b
}
