package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/internal/wiring"
	"github.com/stockade-sh/stockade/sandbox"
)

func init() {
	commands["run"] = command{summary: "run code once in a fresh sandbox, here or on a daemon (--url)", run: runCmd}
}

const runSynopsis = `usage: stockade run --runtime python|node|shell [--driver runc|gvisor|docker] [--timeout 30s]
                    [--memory 512MiB] [--stdin FILE] [--json] (-c CODE | FILE | -)
       stockade run --url URL [--key KEY] --runtime ... [--tool NAME] [--timeout 30s] [--stdin FILE] [--json] (-c CODE | FILE | -)

Runs the code once in a fresh sandbox that is destroyed afterwards. The code
is -c CODE, a FILE, or - for the code from the standard input. The program's
standard input is --stdin FILE (--stdin - for the CLI's standard input), else
the CLI's standard input when that is a pipe or a file and does not carry the
code; a terminal is not read. Output is printed as it comes, stdout and
stderr in the order the program wrote them; --json prints one result object
at the end instead.

Exit status: the program's; 124 on timeout, 137 on an OOM kill, 128+N when
killed by signal N; 2 for bad input; 125 when the code could not be run (a
driver or runtime failure, a missing image); 130 when interrupted (SIGINT,
SIGTERM, SIGHUP) and 141 when the reader of the output went away (the
sandbox is destroyed first). --json exits the same.

With --url, or STOCKADE_URL when --url is not given, the code runs on that
daemon, through its policy, approval, credits and audit trail, with the key
--key (STOCKADE_KEY): the output is streamed from the daemon, a required
approval is waited for (exit 1 when it is denied or expires), and the flags
that choose the sandbox (--driver, --memory, --tools and the host's paths)
are refused (exit 2) rather than ignored. --url "" runs here whatever
STOCKADE_URL says. A refusal of the daemon's (policy, an unknown key or
runtime) exits 2; too few credits or a daemon at capacity or unreachable, 1.
An interruption (or a reader of the output that goes away) cancels the
execution on the daemon.

The sandbox of a run has no network: a name lookup in it fails
("Temporary failure in name resolution"), and when the program's stderr
shows such a failure the CLI says on stderr that the run had none. --json
says what the run could reach in "network": "none", "broker" (only the
credential broker of the tool's record) or "allowlist" (the tool's egress
allowlist, which an API request with "network": true asks for).`

// runOptions are the flags of `stockade run` beyond the configuration.
type runOptions struct {
	runtime, tool, driver string
	code, stdin, memory   string
	timeout               time.Duration
	timeoutSet            bool
	asJSON                bool
}

func runCmd(ctx context.Context, args []string) int {
	fs := newFlags("run", runSynopsis)
	cfg, load := configFlags(fs)
	var o runOptions
	fs.StringVar(&o.runtime, "runtime", "", "runtime: python, node or shell (required)")
	fs.StringVar(&o.driver, "driver", "", "driver: runc, gvisor or docker (default: the tool's tier; the default tool runs on the configured default driver, gvisor)")
	fs.StringVar(&o.tool, "tool", "", "tool to run as (default: the built-in code.execute)")
	fs.StringVar(&cfg.Tools, "tools", cfg.Tools, "tools file or directory")
	fs.StringVar(&cfg.Templates, "templates", cfg.Templates, "templates file or directory, declaring the templates tools name")
	durationFlag(fs, &o.timeout, "timeout", 0, "wall clock limit, e.g. 30s or 2m (default 30s)")
	fs.StringVar(&o.memory, "memory", "", "memory limit, e.g. 512MiB (default 512MiB)")
	fs.StringVar(&o.stdin, "stdin", "", "read the program's standard input from `FILE`; - is the CLI's standard input")
	fs.BoolVar(&o.asJSON, "json", false, "print the result as a JSON object, and errors as {\"error\":{\"code\",\"message\"}}")
	fs.StringVar(&o.code, "c", "", "code to run")
	var remote remoteFlags
	remote.register(fs, "run on the daemon at `URL` instead of in a local sandbox")
	pos, err := load(args)
	if err != nil {
		return report(flagErr(fs, err), o.asJSON)
	}
	o.timeoutSet = isSet(fs, "timeout")
	req, err := runRequest(pos, o)
	if err != nil {
		return report(err, o.asJSON)
	}
	remote.fromEnv(fs)
	if remote.url != "" {
		return runRemote(ctx, fs, remote, req, o.asJSON)
	}
	if isSet(fs, "key") {
		return report(usagef("--key needs a daemon to run on: give --url URL or set STOCKADE_URL"), o.asJSON)
	}
	e, err := wiring.Engine(*cfg)
	if err != nil {
		return report(runErr(rootHint(err)), o.asJSON)
	}
	// A reader of stdout that goes away (`stockade run ... | head -1`)
	// ends the run: without this the write would kill the process with
	// SIGPIPE and leave the sandbox behind.
	signal.Ignore(syscall.SIGPIPE)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := &streams{cancel: cancel}
	if !o.asJSON {
		req.OnOutput = out.write
	}
	res, err := e.Run(runCtx, req)
	switch {
	case out.err != nil:
		fmt.Fprintf(os.Stderr, "stockade: %v; the sandbox was destroyed\n", out.err)
		return exitOutputClosed
	case err != nil && ctx.Err() != nil:
		err = fmt.Errorf("%v; the sandbox was destroyed: %w", context.Cause(ctx), context.Canceled)
		return report(err, o.asJSON)
	case err != nil:
		return report(runErr(rootHint(err)), o.asJSON)
	}
	return finishRun(res, o.asJSON)
}

// rootHint adds to err, when it is a permission error of a user other than
// root, what to do about it: a local run's sandboxes, their state and
// images need root. The hint follows the system's words ("permission
// denied"), which stay.
func rootHint(err error) error {
	if os.Geteuid() == 0 || !errors.Is(err, fs.ErrPermission) || strings.Contains(err.Error(), "as root") {
		return err
	}
	return fmt.Errorf("%w; running sandboxes here needs root: run stockade run as root (sudo), or on a daemon with --url", err)
}

// finishRun reports a run that produced a result, locally or on a daemon:
// the result object with asJSON, else notes of what cut the run short on
// stderr (the output was streamed already), and returns the exit status.
func finishRun(res *engine.Result, asJSON bool) int {
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return report(runError{fmt.Errorf("writing the result: %w", err)}, asJSON)
		}
		return resultStatus(res)
	}
	for _, t := range []struct {
		truncated bool
		stream    sandbox.Stream
	}{{res.StdoutTruncated, sandbox.Stdout}, {res.StderrTruncated, sandbox.Stderr}} {
		if t.truncated {
			fmt.Fprintf(os.Stderr, "stockade: %s truncated at the output cap\n", t.stream)
		}
	}
	if lookupFailed(res.Stderr) {
		// An older daemon's result does not say (Network empty).
		switch res.Network {
		case engine.NetworkNone:
			fmt.Fprintln(os.Stderr, `stockade: this run had no network (network "none"): its sandbox cannot resolve names`)
		case engine.NetworkBroker:
			fmt.Fprintln(os.Stderr, `stockade: this run reached only its tool's credential broker (network "broker"): its sandbox cannot resolve other names`)
		}
	}
	switch res.Status {
	case sandbox.StatusTimedOut:
		fmt.Fprintf(os.Stderr, "stockade: timed out after %dms\n", res.DurationMS)
	case sandbox.StatusOOMKilled:
		fmt.Fprintln(os.Stderr, "stockade: killed: out of memory")
	case sandbox.StatusKilled:
		if res.EndedBy != "" {
			fmt.Fprintf(os.Stderr, "stockade: killed: ended by %s\n", strings.ReplaceAll(res.EndedBy, "_", " "))
		} else {
			fmt.Fprintf(os.Stderr, "stockade: killed by signal %d\n", res.Signal)
		}
	}
	return resultStatus(res)
}

// lookupFailed reports whether stderr shows a failed name lookup, in the
// words of glibc, musl, Node, curl or wget.
func lookupFailed(stderr string) bool {
	for _, s := range []string{"Temporary failure in name resolution", "Name or service not known", "EAI_AGAIN", "ENOTFOUND",
		"Could not resolve host", "unable to resolve host address", "wget: bad address"} {
		if strings.Contains(stderr, s) {
			return true
		}
	}
	return false
}

// resultStatus is the exit status of a run that produced a result: the
// program's exit code, 124 on timeout (as timeout(1)), 137 on an OOM kill
// and 128+N for a program killed by signal N (as a shell reports them); a
// run Stockade ended (a cancel, the daemon's shutdown) is 137.
func resultStatus(res *engine.Result) int {
	switch res.Status {
	case sandbox.StatusSucceeded, sandbox.StatusFailed:
		return res.ExitCode
	case sandbox.StatusTimedOut:
		return 124
	case sandbox.StatusOOMKilled:
		return 137
	}
	if res.Signal == 0 {
		// Stockade ended the run (EndedBy), which kills its sandbox:
		// 128+SIGKILL, as session exec reports a killed cell.
		return 137
	}
	return 128 + res.Signal
}

// runErr classifies an error of opening the engine or running: bad input
// stays bad input (2), anything else means the code could not be run (125),
// a permission of the host's included (ErrPermissionDenied is also a
// policy's refusal, which is bad input).
func runErr(err error) error {
	if errors.Is(err, fs.ErrPermission) {
		return runError{err}
	}
	err = classifyEngine(err)
	if errors.As(err, new(usageError)) {
		return err
	}
	return runError{err}
}

// streams prints a run's output as it arrives, in arrival order. A write
// that fails (a reader that went away) cancels the run.
type streams struct {
	cancel context.CancelFunc
	err    error
}

func (s *streams) write(st sandbox.Stream, p []byte) {
	if s.err != nil {
		return
	}
	w := os.Stdout
	if st == sandbox.Stderr {
		w = os.Stderr
	}
	if _, err := w.Write(p); err != nil {
		s.err = fmt.Errorf("writing the program's %s: %w", st, err)
		s.cancel()
	}
}

// runRequest validates the command line and reads the code and the
// program's stdin. Errors are bad input.
func runRequest(pos []string, o runOptions) (engine.Request, error) {
	if o.runtime == "" {
		return engine.Request{}, usagef("--runtime is required (python, node or shell)")
	}
	req := engine.Request{Runtime: o.runtime, Tool: o.tool, Driver: o.driver}
	codeFromStdin := len(pos) == 1 && pos[0] == "-"
	var err error
	switch {
	case o.code != "" && len(pos) > 0:
		return req, usagef("give either -c CODE or a FILE, not both")
	case o.code != "":
		req.Code = []byte(o.code)
	case codeFromStdin:
		if o.stdin == "-" {
			return req, usagef("the code (-) and --stdin - cannot both be the standard input; give one of them a FILE")
		}
		if req.Code, err = readLimited(os.Stdin, "code from stdin"); err != nil {
			return req, err
		}
	case len(pos) == 1:
		if req.Code, err = readFile(pos[0], "code"); err != nil {
			return req, err
		}
	case len(pos) > 1:
		return req, usagef("only one FILE may be given")
	default:
		return req, usagef("no code: give -c CODE, a FILE, or - for stdin")
	}
	switch {
	case o.stdin == "-":
		req.Stdin, err = readLimited(os.Stdin, "stdin")
	case o.stdin != "":
		req.Stdin, err = readFile(o.stdin, "--stdin")
	case !codeFromStdin && stdinIsData():
		req.Stdin, err = readLimited(os.Stdin, "stdin")
	}
	if err != nil {
		return req, err
	}
	if o.timeoutSet && o.timeout <= 0 {
		return req, usagef("--timeout must be positive, got %s", o.timeout)
	}
	req.Limits.Timeout = o.timeout
	if o.memory != "" {
		n, err := sandbox.ParseSize(o.memory)
		if err != nil {
			return req, usagef("--memory: %v", err)
		}
		if n == 0 {
			return req, usagef("--memory must be positive")
		}
		req.Limits.Memory = n
	}
	return req, nil
}

// stdinIsData reports whether the CLI's standard input is a pipe or a
// file, whose content is the program's input. A terminal, /dev/null, a
// socket (a supervisor's) or no stdin at all is not read.
func stdinIsData() bool {
	fi, err := os.Stdin.Stat()
	return err == nil && (fi.Mode().IsRegular() || fi.Mode()&os.ModeNamedPipe != 0)
}

// readFile reads a file of code or input, up to one byte over the limit
// the engine enforces.
func readFile(path, what string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usagef("reading %s: %w", what, err)
	}
	defer f.Close()
	return readLimited(f, what)
}

func readLimited(r io.Reader, what string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, sandbox.MaxCodeSize+1))
	if err != nil {
		return nil, usagef("reading %s: %w", what, err)
	}
	return b, nil
}

func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
