package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

func init() {
	commands["run"] = command{summary: "run code once in a fresh sandbox (no server)", run: runCmd}
}

func runCmd(ctx context.Context, args []string) int {
	fs := newFlags("run", "usage: stockade run --runtime python|node|shell [--driver runc|gvisor] [--timeout 30s] [--memory 512MiB] [--json] (-c CODE | FILE | -)")
	cfg, load := configFlags(fs)
	runtime := fs.String("runtime", "", "runtime: python, node or shell (required)")
	driver := fs.String("driver", "", "driver: runc, gvisor or docker (default: the tool's tier; the default tool runs on the configured default driver, gvisor)")
	tool := fs.String("tool", "", "tool to run as (default: the built-in code.execute)")
	fs.StringVar(&cfg.Tools, "tools", cfg.Tools, "tools file or directory")
	timeout := fs.Duration("timeout", 0, "wall clock limit (default 30s)")
	memory := fs.String("memory", "", "memory limit, e.g. 512MiB (default 512MiB)")
	asJSON := fs.Bool("json", false, "print the result as a JSON object")
	code := fs.String("c", "", "code to run")
	pos, err := load(args)
	if err != nil {
		return fail(flagErr(fs, err))
	}
	res, err := runOnce(ctx, pos, cfg, *runtime, *tool, *driver, isSet(fs, "timeout"), *timeout, *memory, *code)
	if err != nil {
		return fail(err)
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return fail(err)
		}
		return 0
	}
	os.Stdout.WriteString(res.Stdout)
	os.Stderr.WriteString(res.Stderr)
	switch res.Status {
	case sandbox.StatusSucceeded, sandbox.StatusFailed:
		return res.ExitCode
	case sandbox.StatusTimedOut:
		fmt.Fprintf(os.Stderr, "stockade: timed out after %dms\n", res.DurationMS)
		return 124
	case sandbox.StatusOOMKilled:
		fmt.Fprintln(os.Stderr, "stockade: killed: out of memory")
		return 137
	default:
		fmt.Fprintf(os.Stderr, "stockade: killed by signal %d\n", res.Signal)
		return 128 + res.Signal
	}
}

// runOnce validates the command line and runs the code. Errors caused by
// the input (including a missing image or runtime, which `stockade setup`
// fixes) are usage errors.
func runOnce(ctx context.Context, pos []string, cfg *config.Config, runtime, tool, driver string, timeoutSet bool, timeout time.Duration, memory, code string) (*engine.Result, error) {
	if runtime == "" {
		return nil, usagef("--runtime is required (python, node or shell)")
	}
	var src []byte
	switch {
	case code != "" && len(pos) > 0:
		return nil, usagef("give either -c CODE or a FILE, not both")
	case code != "":
		src = []byte(code)
	case len(pos) == 1 && pos[0] == "-":
		b, err := io.ReadAll(io.LimitReader(os.Stdin, sandbox.MaxCodeSize+1))
		if err != nil {
			return nil, fmt.Errorf("reading code from stdin: %w", err)
		}
		src = b
	case len(pos) == 1:
		b, err := readCodeFile(pos[0])
		if err != nil {
			return nil, usageError{err}
		}
		src = b
	case len(pos) > 1:
		return nil, usagef("only one FILE may be given")
	default:
		return nil, usagef("no code: give -c CODE, a FILE, or - for stdin")
	}
	var limits sandbox.Limits
	if timeoutSet && timeout <= 0 {
		return nil, usagef("--timeout must be positive, got %s", timeout)
	}
	limits.Timeout = timeout
	if memory != "" {
		n, err := sandbox.ParseSize(memory)
		if err != nil {
			return nil, usagef("--memory: %v", err)
		}
		if n == 0 {
			return nil, usagef("--memory must be positive")
		}
		limits.Memory = n
	}
	e, err := engine.Open(*cfg)
	if err != nil {
		return nil, classifyStore(err)
	}
	res, err := e.Run(ctx, engine.Request{Runtime: runtime, Tool: tool, Code: src, Driver: driver, Limits: limits})
	if err != nil {
		return nil, classifyStore(err)
	}
	return res, nil
}

func readCodeFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading code: %w", err)
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, sandbox.MaxCodeSize+1))
}

func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// classifyStore keeps the classes the run command always took as bad
// input.
func classifyStore(err error) error {
	if errdefs.IsNotFound(err) || errdefs.IsFailedPrecondition(err) || errdefs.IsUnavailable(err) {
		return usageError{err}
	}
	return classifyEngine(err)
}
