package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path"
	"strconv"
	"strings"
	"syscall"

	"github.com/stockade-sh/stockade/guest"
)

// The shell kernel is a mode of the guest binary (`<guest>
// stockade-kernel-shell SHELL...`, started as a kernel) that keeps one
// SHELL process, e.g. /bin/sh (dash) or /bin/busybox sh, and runs each cell
// in it with the dot command: the working directory, variables, functions
// and options a cell sets carry over to the next. A shell script cannot
// speak the kernel wire well (it would have to decode JSON strings,
// escapes and all, to read a cell's code), so this Go mode speaks the wire
// and drives the shell through pipes:
//
//   - the shell is interactive (-i, without job control: +m) and reads one
//     command line per cell on its stdin; interactive, an interrupt or an
//     error of a special built-in ends the command line, not the shell;
//   - the cell's code and stdin are files in a directory of the kernel's
//     below /tmp; the command line checks the code with `SHELL -n` (so that
//     a cell with a syntax error runs none of its lines), then sources it
//     with its stdin, its stdout and stderr the kernel's (which the guest
//     pumps as the cell's output);
//   - the shell's own stderr is a pipe to the kernel on which it writes
//     its prompt, PS1 (read-only): "@stockade TOKEN S", TOKEN random per
//     kernel and S the exit status of the last command, once a command
//     line has ended, however it ended. A cell's command line first writes
//     "@stockade TOKEN start N" there, N the cell's number, before any of
//     the cell runs; one cell runs at a time, so the first prompt after
//     the start is the cell's end, whatever the cell set (no variable of
//     the shell's says which cell ran). The result carries that status
//     (ExitCode), with an error status when it is not 0;
//   - SIGINT to the kernel, during a cell, goes to the shell's process
//     group once the cell's command line started (before, it would end the
//     wait for a line, not the cell): the cell's programs end, and so does
//     its command line, with status 130 (KeyboardInterrupt). Between cells
//     it is dropped.
//
// A cell that ends the shell (exit) ends the kernel too, after its result:
// the host then sees the kernel exit and starts another. The kernel is the
// subreaper of its tree (the wrapper's flag) and reaps the orphans of the
// cells' programs.
func shellKernel() {
	shell := os.Args[2:]
	if len(shell) == 0 || !path.IsAbs(shell[0]) {
		fatalf("shell kernel: the shell to run must be an absolute path, got %q", shell)
	}
	// The wire is the kernel's own: the shell and the cells' programs do
	// not inherit it.
	syscall.CloseOnExec(3)
	syscall.CloseOnExec(4)
	k, err := startShell(shell)
	if err != nil {
		fatalf("shell kernel: %v", err)
	}
	os.Exit(k.serve(os.NewFile(3, "wire"), os.NewFile(4, "events")))
}

// shellState is the shell kernel's shell.
type shellState struct {
	pid      int
	tag      string   // the prompt's beginning: shellPromptTag and the token
	dir      string   // the cell's files; the kernel's own
	check    string   // the syntax check's command, quoted
	commands *os.File // the shell's stdin
	prompts  chan shellPrompt
	exited   chan syscall.WaitStatus
	intr     chan os.Signal
}

// shellPrompt is one line of the kernel's on the shell's stderr: the start
// of cell's command line (start), or a prompt, with the status of the
// command line that ended.
type shellPrompt struct {
	start        bool
	cell, status int
}

// shellPromptTag begins the kernel's prompt, before the token.
const shellPromptTag = "@stockade "

func startShell(shell []string) (*shellState, error) {
	dir, err := os.MkdirTemp("/tmp", ".stockade-shell-")
	if err != nil {
		return nil, fmt.Errorf("creating the cells' directory: %w", err)
	}
	null, err := os.OpenFile("/dev/null", os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("opening /dev/null: %w", err)
	}
	defer null.Close()
	p, err := newPipes(2)
	if err != nil {
		return nil, err
	}
	cmdR, cmdW := p[0][0], p[0][1]
	prR, prW := p[1][0], p[1][1]
	quoted := make([]string, len(shell))
	for i, a := range shell {
		quoted[i] = shellQuote(a)
	}
	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		return nil, err
	}
	k := &shellState{
		tag:      shellPromptTag + hex.EncodeToString(token) + " ",
		dir:      dir,
		check:    strings.Join(quoted, " ") + " -n",
		commands: cmdW,
		prompts:  make(chan shellPrompt, 1),
		exited:   make(chan syscall.WaitStatus, 1),
		intr:     make(chan os.Signal, 1),
	}
	signal.Notify(k.intr, syscall.SIGINT)
	// The reaper is ready before the shell can end.
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	k.pid, err = syscall.ForkExec(shell[0], append(shell[:len(shell):len(shell)], "-i", "+m"), &syscall.ProcAttr{
		Env: os.Environ(),
		// Its stdout is nothing (busybox greets there), its stderr the
		// prompts; fd 3 and 4 are the kernel's stdout and stderr, for the
		// cells.
		Files: []uintptr{cmdR.Fd(), null.Fd(), prW.Fd(), 1, 2},
		// Its own process group, which an interrupt signals whole.
		Sys: &syscall.SysProcAttr{Setpgid: true},
	})
	cmdR.Close()
	prW.Close()
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", shell[0], err)
	}
	go k.reap(chld)
	go k.readPrompts(prR)
	// The first prompt with the token says the shell took its prompt.
	if _, err := io.WriteString(cmdW, "PS1='"+k.tag+"$?\n'; PS2=; readonly PS1\n"); err != nil {
		return nil, fmt.Errorf("starting %s: %w", shell[0], err)
	}
	for pr := range k.prompts {
		if !pr.start {
			return k, nil
		}
	}
	return nil, fmt.Errorf("%s ended before its first prompt", shell[0])
}

// readPrompts sends the shell's prompts on k.prompts until its stderr
// ends. What else the shell writes there is not the kernel's concern.
func (k *shellState) readPrompts(r *os.File) {
	defer close(k.prompts)
	br := bufio.NewReader(r)
	for {
		line, err := readLine(br, 4096)
		if errors.Is(err, errLongLine) {
			continue
		}
		if err != nil {
			return
		}
		// The shell's first prompt, its default PS1, and what it writes
		// without a newline come before a prompt on its line.
		i := bytes.LastIndex(line, []byte(k.tag))
		if i < 0 {
			continue
		}
		var pr shellPrompt
		rest := string(line[i+len(k.tag):])
		if n, ok := strings.CutPrefix(rest, "start "); ok {
			pr.start = true
			pr.cell, err = strconv.Atoi(n)
		} else {
			pr.status, err = strconv.Atoi(rest)
		}
		if err == nil {
			k.prompts <- pr
		}
	}
}

// shellQuote quotes s for the shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// reap reaps the kernel's children on every SIGCHLD: the shell, whose end
// it reports, and the orphans of the cells' programs.
func (k *shellState) reap(chld <-chan os.Signal) {
	for range chld {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
			if pid == k.pid {
				k.exited <- ws
			}
		}
	}
}

// serve runs the cells the guest sends until the wire or the shell ends,
// and returns the kernel's exit code.
func (k *shellState) serve(wire, events *os.File) int {
	defer os.RemoveAll(k.dir)
	emit := func(ev wireEvent) {
		b, _ := json.Marshal(ev)
		events.Write(append(b, '\n'))
	}
	emit(wireEvent{Type: "ready"})
	sc := bufio.NewScanner(wire)
	sc.Buffer(make([]byte, 64<<10), maxWireLine)
	for sc.Scan() {
		var req wireRequest
		if json.Unmarshal(sc.Bytes(), &req) != nil || req.Type != "cell" {
			continue
		}
		select {
		case <-k.intr: // an interrupt between cells
		default:
		}
		res, exited := k.run(&req)
		emit(res)
		if exited {
			return *res.ExitCode
		}
	}
	// The guest is gone or stopped the kernel: so is the shell.
	syscall.Kill(-k.pid, syscall.SIGKILL)
	return 0
}

// run runs one cell; exited is true when the shell ended during it.
func (k *shellState) run(req *wireRequest) (res wireEvent, exited bool) {
	res = wireEvent{Type: "result", Cell: req.Cell, Status: guest.CellOK}
	fail := func(name, value string) {
		res.Status = guest.CellError
		res.Error = &guest.CellFailure{Name: name, Value: clipText(value)}
	}
	cell, stdin, syntax := path.Join(k.dir, "cell"), path.Join(k.dir, "stdin"), path.Join(k.dir, "syntax")
	err := os.WriteFile(cell, []byte(req.Code), 0o600)
	if err == nil {
		err = os.WriteFile(stdin, []byte(req.Stdin), 0o600)
	}
	if err != nil {
		fail("OSError", fmt.Sprintf("writing the cell for the shell: %v", err))
		return res, false
	}
	line := fmt.Sprintf("echo %s >&2; if %s %s </dev/null 2>%s 3>&- 4>&-; then . %s <%s 1>&3 2>&4 3>&- 4>&-; fi\n",
		shellQuote(fmt.Sprintf("%sstart %d", k.tag, req.Cell)), k.check, shellQuote(cell), shellQuote(syntax), shellQuote(cell), shellQuote(stdin))
	prompts := k.prompts
	if _, err := io.WriteString(k.commands, line); err != nil {
		// The shell is ending: its exit answers the cell.
		prompts = nil
	}
	interrupted, started := false, false
	for {
		select {
		case <-k.intr:
			interrupted = true
			if started {
				syscall.Kill(-k.pid, syscall.SIGINT)
			}
		case ws := <-k.exited:
			code := ws.ExitStatus()
			if ws.Signaled() {
				code = 128 + int(ws.Signal())
			}
			res.ExitCode = &code
			if code != 0 {
				fail("ShellExited", fmt.Sprintf("the shell exited with status %d; the kernel ends with it", code))
			}
			return res, true
		case pr, ok := <-prompts:
			switch {
			case !ok:
				// The shell is ending: its exit follows.
				prompts = nil
				continue
			case pr.start:
				started = started || pr.cell == req.Cell
				if started && interrupted {
					syscall.Kill(-k.pid, syscall.SIGINT)
				}
				continue
			case !started || pr.status < 0 || pr.status > 255:
				// Not this cell's end.
				continue
			}
			code := pr.status
			res.ExitCode = &code
			if msg, _ := os.ReadFile(syntax); !interrupted && len(msg) > 0 {
				res.ExitCode = nil
				fail("SyntaxError", strings.ReplaceAll(strings.TrimSpace(string(msg)), cell, fmt.Sprintf("cell-%d", req.Cell)))
				return res, false
			}
			switch {
			case interrupted:
				fail("KeyboardInterrupt", "the cell was interrupted")
			case code != 0:
				fail("ExitStatus", fmt.Sprintf("exit status %d", code))
			}
			return res, false
		}
	}
}

// clipText bounds a text of a cell's failure, as the guest does.
func clipText(s string) string {
	const max = 60 << 10
	if len(s) > max {
		return strings.ToValidUTF8(s[:max], "") + "..."
	}
	return s
}
