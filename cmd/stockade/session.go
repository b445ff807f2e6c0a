package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/sandbox"
)

func init() {
	commands["session"] = command{summary: "open a session on a daemon and run cells in it that keep their state", run: sessionCmd}
}

func sessionCmd(ctx context.Context, args []string) int {
	return dispatch(ctx, "session", map[string]verb{
		"create":    {"open a session; prints its id on stdout", sessionCreate},
		"exec":      {"run a cell in a session, streaming its output", sessionExec},
		"put":       {"copy a local file into a session's /workspace", sessionPut},
		"get":       {"copy a file of a session's /workspace to a local file or stdout", sessionGet},
		"ls":        {"list a directory of a session's /workspace", sessionLs},
		"rm":        {"remove a file of a session's /workspace", sessionRm},
		"list":      {"list the workspace's sessions", sessionList},
		"pause":     {"save a session's sandbox to a checkpoint and end it until it resumes", sessionPause},
		"resume":    {"start a paused session again from its checkpoint", sessionResume},
		"snapshot":  {"save a session's state, leaving it running, for new sessions to start from", sessionSnapshot},
		"fork":      {"start new sessions from a session's current state", sessionFork},
		"interrupt": {"interrupt the cell a session runs (SIGINT to its kernel)", sessionInterrupt},
		"delete":    {"end a session and destroy its sandbox", sessionDelete},
	}, args)
}

// maxGet bounds what session get downloads: the daemon's files are
// bounded by its sessions.max_file_size, far below it.
const maxGet = 1 << 30

// sessionVerbFlags parses the flags of a session verb: --url, --key, --json
// and the verb's own (added by add), and returns the client and the
// positional arguments, which must number between min and max.
func sessionVerbFlags(name, synopsis string, args []string, min, max int, add func(fs *flag.FlagSet)) (*client.Client, []string, bool, error) {
	fs := newFlags("session "+name, synopsis)
	var r remoteFlags
	r.register(fs, "the daemon's URL")
	asJSON := fs.Bool("json", false, "print the answer as JSON on stdout")
	if add != nil {
		add(fs)
	}
	pos, err := parse(fs, args)
	if err != nil {
		return nil, nil, *asJSON, err
	}
	if len(pos) < min || len(pos) > max {
		return nil, nil, *asJSON, usagef("session %s: got %d arguments, want %s (stockade session %s --help)", name, len(pos), argCount(min, max), name)
	}
	r.fromEnv(fs)
	if r.url == "" {
		return nil, nil, *asJSON, usagef("no daemon: give --url URL or set STOCKADE_URL (sessions live on a daemon, stockade serve)")
	}
	c, err := r.client()
	return c, pos, *asJSON, err
}

func argCount(min, max int) string {
	if min == max {
		return fmt.Sprint(min)
	}
	return fmt.Sprintf("%d to %d", min, max)
}

// printJSON prints v indented on stdout.
func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

const sessionCreateUsage = `usage: stockade session create --runtime python|node|shell [--tool NAME] [--idle-timeout 10m] [--ttl 1h] [--network allow|deny] [--url URL] [--key KEY] [--json]

Opens a session on the daemon: a sandbox of its own whose kernel keeps its
state from cell to cell, and whose /workspace holds files until the
session ends (stockade session delete, its idle timeout or its TTL).
Prints the session's id alone on stdout, so that S=$(stockade session
create ...) captures it; with --json, the whole session.`

func sessionCreate(ctx context.Context, args []string) int {
	var req client.SessionRequest
	var idle, ttl time.Duration
	c, _, asJSON, err := sessionVerbFlags("create", sessionCreateUsage, args, 0, 0, func(fs *flag.FlagSet) {
		fs.StringVar(&req.Runtime, "runtime", "python", "the session's kernel: python, node or shell")
		fs.StringVar(&req.Tool, "tool", "", "the tool to run as (default: the daemon's default tool)")
		durationFlag(fs, &idle, "idle-timeout", 0, "end the session after this long without a cell (default: the daemon's, 10m)")
		durationFlag(fs, &ttl, "ttl", 0, "end the session this long after it opened, whatever happens (default: the daemon's, 1h)")
		fs.StringVar(&req.Network, "network", "", "allow or deny (the default): egress, within the tool's record")
		fs.StringVar(&req.Snapshot, "snapshot", "", "start from this snapshot (stockade session snapshot); its runtime and tool are the snapshot's")
	})
	if err != nil {
		return report(err, asJSON)
	}
	if req.Snapshot != "" {
		req.Runtime, req.Tool = "", ""
	}
	req.IdleTimeoutMS, req.TTLMS = idle.Milliseconds(), ttl.Milliseconds()
	s, err := c.CreateSession(ctx, req)
	if err != nil {
		return report(remoteErr(ctx, err), asJSON)
	}
	if asJSON {
		return reportErr(printJSON(s))
	}
	fmt.Println(s.ID)
	fmt.Fprintf(os.Stderr, "session %s: %s on %s, idle timeout %s, ends by %s\n", s.ID, s.Runtime, s.Tier,
		time.Duration(s.IdleTimeoutMS)*time.Millisecond, s.ExpiresAt.Local().Format("15:04:05"))
	return 0
}

// reportErr reports a failure to write the answer, or returns 0.
func reportErr(err error) int {
	if err != nil {
		return fail(err)
	}
	return 0
}

const sessionExecUsage = `usage: stockade session exec ID [FILE|-] [--code CODE] [--stdin FILE] [--timeout 30s] [--out DIR] [--url URL] [--key KEY] [--json]

Runs one cell in session ID: the code of FILE, of standard input (-), or of
--code. Its stdout and stderr stream as they come; the value of its last
expression is printed on stdout; a figure (image/png) is written to --out
DIR as cell-N-K.png (named on stderr; without --out, figures are counted,
not written). A cell that raised prints its traceback on stderr and exits
1; a cell that timed out exits 124 (the kernel restarted if an interrupt did
not stop it); a cell killed (out of memory, its kernel killed, or ended by
a cancel, its session's end or the daemon's shutdown) exits 137. A cell
that needs approval waits for an approver's decision.

An interruption of the CLI (SIGINT, SIGTERM, SIGHUP) interrupts the cell on
the daemon (a cell waiting for its approval is cancelled) before the CLI
exits 130, so that nothing goes on running that was stopped here; so does
a reader of the output that goes away (exit 141).`

func sessionExec(ctx context.Context, args []string) int {
	var code, stdinFile, out string
	var timeout time.Duration
	c, pos, asJSON, err := sessionVerbFlags("exec", sessionExecUsage, args, 1, 2, func(fs *flag.FlagSet) {
		fs.StringVar(&code, "code", "", "the cell's code (instead of FILE)")
		fs.StringVar(&stdinFile, "stdin", "", "a file whose content is the cell's standard input")
		durationFlag(fs, &timeout, "timeout", 0, "bound the cell (default: the tool's limit)")
		fs.StringVar(&out, "out", "", "a directory to write the cell's figures to")
	})
	if err != nil {
		return report(err, asJSON)
	}
	id := pos[0]
	switch {
	case len(pos) == 2 && code != "":
		return report(usagef("session exec: give FILE or --code, not both"), asJSON)
	case len(pos) == 2 && pos[1] == "-":
		b, err := io.ReadAll(io.LimitReader(os.Stdin, 1<<20+1))
		if err != nil {
			return report(fmt.Errorf("reading the cell from stdin: %w", err), asJSON)
		}
		code = string(b)
	case len(pos) == 2:
		b, err := os.ReadFile(pos[1])
		if err != nil {
			return report(usageError{fmt.Errorf("reading the cell: %w", err)}, asJSON)
		}
		code = string(b)
	case code == "":
		return report(usagef("session exec: no code: give FILE, - (stdin) or --code"), asJSON)
	}
	req := client.CellRequest{Code: code, TimeoutMS: timeout.Milliseconds()}
	if stdinFile != "" {
		b, err := os.ReadFile(stdinFile)
		if err != nil {
			return report(usageError{fmt.Errorf("reading --stdin: %w", err)}, asJSON)
		}
		req.Stdin = string(b)
	}
	if out != "" {
		if fi, err := os.Stat(out); err != nil || !fi.IsDir() {
			return report(usagef("--out %s: not a directory", out), asJSON)
		}
	}
	signal.Ignore(syscall.SIGPIPE)
	s, err := c.StreamCell(ctx, id, req)
	if err != nil {
		return report(remoteErr(ctx, err), asJSON)
	}
	defer s.Close()
	var cell runningCell
	for {
		ev, err := s.Next()
		if err != nil {
			if ctx.Err() != nil {
				err = cell.stop(ctx, c, id, err)
			}
			return report(remoteErr(ctx, err), asJSON)
		}
		switch e := ev.(type) {
		case *client.ApprovalRequired:
			cell = runningCell{execution: e.Card.ExecutionID, pending: true}
			fmt.Fprintf(os.Stderr, "stockade: waiting for an approver to decide on %s (expires %s)\n", e.Card.ApprovalID, e.Card.ExpiresAt.Local().Format("15:04:05"))
		case *client.Started:
			cell = runningCell{execution: e.ExecutionID}
		case *client.Output:
			cell.pending = false
			if asJSON {
				continue
			}
			w := os.Stdout
			if e.Stream == "stderr" {
				w = os.Stderr
			}
			if _, err := io.WriteString(w, e.Data); err != nil {
				fmt.Fprintf(os.Stderr, "stockade: writing the cell's %s: %v\n", e.Stream, cell.stop(ctx, c, id, err))
				return exitOutputClosed
			}
		case *client.StreamError:
			return report(fmt.Errorf("the daemon could not read the cell's outcome: %s", e.Message), asJSON)
		case *client.Ended:
			return finishRemote(&e.Execution, asJSON)
		case *client.CellEnded:
			return finishCell(&e.Cell, out, asJSON)
		}
	}
}

// runningCell is what session exec knows of its cell: its execution,
// once the daemon has said it (approval required, started), and whether
// it waits for its approval.
type runningCell struct {
	execution string
	pending   bool
}

// stop stops the cell of session id that the CLI was interrupted during:
// it cancels the cell while it waits for its approval, or else interrupts
// the cell the session runs (SIGINT to its kernel, as a notebook's
// interrupt) and waits a little for it to end, so that the session takes
// the next cell at once. It returns why (err) with what became of the
// cell.
func (r runningCell) stop(ctx context.Context, c *client.Client, id string, why error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	if r.pending {
		ex, err := c.CancelExecution(ctx, r.execution, "stockade session exec was interrupted")
		if err != nil {
			return fmt.Errorf("%w; cancelling cell %s of session %s: %v: it may run once approved", why, r.execution, id, err)
		}
		return fmt.Errorf("%w; cancelled cell %s of session %s, which is %s", why, r.execution, id, ex.Status)
	}
	ok, err := c.InterruptCell(ctx, id)
	switch {
	case err != nil:
		return fmt.Errorf("%w; %v: the cell may go on in the session", why, err)
	case !ok:
		return fmt.Errorf("%w; session %s runs no cell now", why, id)
	case r.execution == "":
		return fmt.Errorf("%w; interrupted the cell session %s ran", why, id)
	}
	// The kernel ends the cell as it handles the interrupt (or the
	// daemon restarts it when it does not, within seconds).
	cell, err := c.WaitCell(ctx, r.execution, 10*time.Second)
	if err != nil || !cell.Status.Final() {
		return fmt.Errorf("%w; interrupted the cell session %s ran, which had not ended when the CLI stopped waiting", why, id)
	}
	return fmt.Errorf("%w; interrupted the cell session %s ran, which ended %s", why, id, cell.Status)
}

const sessionInterruptUsage = `usage: stockade session interrupt ID [--url URL] [--key KEY] [--json]

Interrupts the cell session ID runs: SIGINT to its kernel, as a notebook's
interrupt, so that Python raises KeyboardInterrupt in the cell (its
session exec then ends with the traceback, exit 1). The session and its
state are kept. Prints whether a cell ran; --json prints
{"interrupted": true|false}. A paused session is not resumed for it.`

func sessionInterrupt(ctx context.Context, args []string) int {
	c, pos, asJSON, err := sessionVerbFlags("interrupt", sessionInterruptUsage, args, 1, 1, nil)
	if err != nil {
		return report(err, asJSON)
	}
	ok, err := c.InterruptCell(ctx, pos[0])
	if err != nil {
		return report(remoteErr(ctx, err), asJSON)
	}
	if asJSON {
		return reportErr(printJSON(map[string]bool{"interrupted": ok}))
	}
	if ok {
		fmt.Fprintf(os.Stderr, "session %s: interrupted its cell\n", pos[0])
	} else {
		fmt.Fprintf(os.Stderr, "session %s: no cell was running\n", pos[0])
	}
	return 0
}

// finishCell reports a cell's outcome: its value and figures, its error,
// and the exit status it deserves.
func finishCell(cell *client.Cell, out string, asJSON bool) int {
	var written []string
	figures := 0
	for _, o := range cell.Outputs {
		if !strings.HasPrefix(o.MimeType, "image/") {
			continue
		}
		figures++
		if out == "" {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(o.Data)
		if err != nil {
			return report(fmt.Errorf("decoding figure %d of cell %d: %w", figures, cell.Cell, err), asJSON)
		}
		ext := strings.TrimPrefix(o.MimeType, "image/")
		if ext == "svg+xml" {
			ext = "svg"
		}
		p := filepath.Join(out, fmt.Sprintf("cell-%d-%d.%s", cell.Cell, figures, filepath.Base(ext)))
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return report(fmt.Errorf("writing figure %d: %w", figures, err), asJSON)
		}
		written = append(written, p)
	}
	if asJSON {
		if err := printJSON(cell); err != nil {
			return fail(err)
		}
	} else {
		for _, o := range cell.Outputs {
			if o.MimeType == "text/plain" {
				fmt.Println(o.Data)
			}
		}
		for _, p := range written {
			fmt.Fprintf(os.Stderr, "stockade: wrote %s\n", p)
		}
		if out == "" && figures > 0 {
			fmt.Fprintf(os.Stderr, "stockade: the cell made %d figure(s); --out DIR writes them\n", figures)
		}
		if cell.Error != nil {
			if cell.Error.Traceback != "" {
				fmt.Fprintln(os.Stderr, strings.TrimRight(cell.Error.Traceback, "\n"))
			} else {
				fmt.Fprintf(os.Stderr, "%s: %s\n", cell.Error.Name, cell.Error.Value)
			}
		}
		if cell.KernelRestarted {
			fmt.Fprintln(os.Stderr, "stockade: the kernel was restarted: the session's state is gone")
		}
		if cell.EndedBy != "" {
			fmt.Fprintf(os.Stderr, "stockade: killed: ended by %s\n", strings.ReplaceAll(cell.EndedBy, "_", " "))
		}
	}
	switch cell.Status {
	case client.StatusSucceeded:
		return 0
	case client.StatusFailed:
		return 1
	case client.StatusTimedOut:
		return 124
	case client.StatusOOMKilled, client.StatusKilled:
		// 128+SIGKILL, as a shell reports a killed program: the kernel
		// was killed, or Stockade ended the cell (ended_by).
		return 137
	}
	return exitRunFailure
}

func sessionPut(ctx context.Context, args []string) int {
	c, pos, asJSON, err := sessionVerbFlags("put", "usage: stockade session put ID LOCAL-FILE|- PATH [--url URL] [--key KEY] [--json]\n\nCopies LOCAL-FILE (or standard input) to PATH in the session's /workspace\n(relative to /workspace, or absolute below it).", args, 3, 3, nil)
	if err != nil {
		return report(err, asJSON)
	}
	var r io.Reader = os.Stdin
	size := int64(-1)
	if pos[1] != "-" {
		f, err := os.Open(pos[1])
		if err != nil {
			return report(usageError{err}, asJSON)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return report(err, asJSON)
		}
		r, size = f, fi.Size()
	}
	fi, err := c.PutFile(ctx, pos[0], pos[2], r, size)
	if err != nil {
		return report(remoteErr(ctx, err), asJSON)
	}
	if asJSON {
		return reportErr(printJSON(fi))
	}
	fmt.Fprintf(os.Stderr, "wrote %s (%d bytes, sha256 %s)\n", fi.Path, fi.Size, fi.SHA256)
	return 0
}

func sessionGet(ctx context.Context, args []string) int {
	c, pos, asJSON, err := sessionVerbFlags("get", "usage: stockade session get ID PATH [LOCAL-FILE|-] [--url URL] [--key KEY]\n\nCopies PATH of the session's /workspace to LOCAL-FILE (default: its base\nname in the current directory) or to standard output (-). A partial\ndownload leaves no file.", args, 2, 3, nil)
	if err != nil {
		return report(err, asJSON)
	}
	dst := filepath.Base(pos[1])
	if len(pos) == 3 {
		dst = pos[2]
	}
	if dst == "-" {
		if _, err := c.GetFile(ctx, pos[0], pos[1], os.Stdout, maxGet); err != nil {
			return report(remoteErr(ctx, err), asJSON)
		}
		return 0
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".*")
	if err != nil {
		return report(usageError{err}, asJSON)
	}
	defer os.Remove(tmp.Name())
	fi, err := c.GetFile(ctx, pos[0], pos[1], tmp, maxGet)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return report(remoteErr(ctx, err), asJSON)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return report(err, asJSON)
	}
	fmt.Fprintf(os.Stderr, "wrote %s (%d bytes, sha256 %s)\n", dst, fi.Size, fi.SHA256)
	return 0
}

func sessionLs(ctx context.Context, args []string) int {
	c, pos, asJSON, err := sessionVerbFlags("ls", "usage: stockade session ls ID [DIR] [--url URL] [--key KEY] [--json]\n\nLists DIR (default /workspace) of the session: type, mode, size, modified, name.", args, 1, 2, nil)
	if err != nil {
		return report(err, asJSON)
	}
	dir := "/workspace"
	if len(pos) == 2 {
		dir = pos[1]
	}
	entries, truncated, err := c.ListFiles(ctx, pos[0], dir)
	if err != nil {
		return report(remoteErr(ctx, err), asJSON)
	}
	if asJSON {
		return reportErr(printJSON(map[string]any{"entries": entries, "truncated": truncated}))
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	for _, e := range entries {
		fmt.Fprintf(tw, "%s\t%04o\t%d\t%s\t%s\n", e.Type, e.Mode, e.Size, e.MTime.Local().Format(time.DateTime), e.Name)
	}
	tw.Flush()
	if truncated {
		fmt.Fprintln(os.Stderr, "stockade: the listing is truncated")
	}
	return 0
}

func sessionRm(ctx context.Context, args []string) int {
	c, pos, asJSON, err := sessionVerbFlags("rm", "usage: stockade session rm ID PATH [--url URL] [--key KEY]\n\nRemoves the file, symlink or empty directory PATH of the session's /workspace.", args, 2, 2, nil)
	if err != nil {
		return report(err, asJSON)
	}
	if err := c.RemoveFile(ctx, pos[0], pos[1]); err != nil {
		return report(remoteErr(ctx, err), asJSON)
	}
	return 0
}

func sessionList(ctx context.Context, args []string) int {
	var state string
	c, _, asJSON, err := sessionVerbFlags("list", "usage: stockade session list [--state active|ended] [--url URL] [--key KEY] [--json]\n\nLists the workspace's sessions, newest first.", args, 0, 0, func(fs *flag.FlagSet) {
		fs.StringVar(&state, "state", "", "active or ended (default: both)")
	})
	if err != nil {
		return report(err, asJSON)
	}
	var all []client.Session
	f := client.SessionFilter{State: state}
	for {
		p, err := c.ListSessions(ctx, f)
		if err != nil {
			return report(remoteErr(ctx, err), asJSON)
		}
		all = append(all, p.Items...)
		if p.Next == "" {
			break
		}
		f.Cursor = p.Next
	}
	if asJSON {
		return reportErr(printJSON(all))
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tRUNTIME\tTIER\tSTATE\tCELLS\tCREATED\tENDS")
	for _, s := range all {
		ends := s.ExpiresAt.Local().Format(time.DateTime)
		if s.State == "ended" && s.EndedAt != nil {
			ends = s.EndedAt.Local().Format(time.DateTime) + " (" + s.EndReason + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", s.ID, s.Runtime, s.Tier, s.State, s.Cells, s.CreatedAt.Local().Format(time.DateTime), ends)
	}
	tw.Flush()
	return 0
}

func sessionDelete(ctx context.Context, args []string) int {
	c, pos, asJSON, err := sessionVerbFlags("delete", "usage: stockade session delete ID [--url URL] [--key KEY] [--json]\n\nEnds the session and destroys its sandbox, with its kernel and /workspace.", args, 1, 1, nil)
	if err != nil {
		return report(err, asJSON)
	}
	s, err := c.CloseSession(ctx, pos[0])
	if err != nil {
		var ce *client.Error
		if errors.As(err, &ce) && ce.Code == "session_expired" {
			fmt.Fprintf(os.Stderr, "session %s had already ended (%s)\n", pos[0], ce.EndReason)
			return 0
		}
		return report(remoteErr(ctx, err), asJSON)
	}
	if asJSON {
		return reportErr(printJSON(s))
	}
	fmt.Fprintf(os.Stderr, "session %s ended after %d cell(s)\n", s.ID, s.Cells)
	return 0
}

func sessionPause(ctx context.Context, args []string) int {
	return sessionTransition(ctx, args, "pause", "usage: stockade session pause ID [--url URL] [--key KEY] [--json]\n\n"+
		"Saves the session's sandbox, with its kernel's state and /workspace, to a checkpoint on the daemon's disk and ends it.\n"+
		"Its next cell or file operation resumes it; so does stockade session resume. Sessions on runc cannot pause.",
		(*client.Client).PauseSession)
}

func sessionResume(ctx context.Context, args []string) int {
	return sessionTransition(ctx, args, "resume", "usage: stockade session resume ID [--url URL] [--key KEY] [--json]\n\n"+
		"Starts a paused session again from its checkpoint, with its kernel's state and /workspace.",
		(*client.Client).ResumeSession)
}

// sessionTransition runs verb (pause or resume) on the session its
// arguments name and says where the session is after it.
func sessionTransition(ctx context.Context, args []string, verb, synopsis string, do func(*client.Client, context.Context, string) (*client.Session, error)) int {
	c, pos, asJSON, err := sessionVerbFlags(verb, synopsis, args, 1, 1, nil)
	if err != nil {
		return report(err, asJSON)
	}
	s, err := do(c, ctx, pos[0])
	if err != nil {
		return report(remoteErr(ctx, err), asJSON)
	}
	if asJSON {
		return reportErr(printJSON(s))
	}
	if s.State == "paused" {
		fmt.Fprintf(os.Stderr, "session %s paused (checkpoint %s)\n", s.ID, sandbox.FormatSize(s.CheckpointBytes))
	} else {
		fmt.Fprintf(os.Stderr, "session %s %s\n", s.ID, s.State)
	}
	return 0
}
