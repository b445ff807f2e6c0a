package engine

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// CommandRequest is a shell command to run in a session's sandbox, beside
// its kernel: a command cell (see docs/design.md, "E2B compatibility").
type CommandRequest struct {
	// Argv is the program and its arguments (Argv[0] absolute).
	Argv []string
	// Env is added to the runtime's environment of programs.
	Env map[string]string
	// Cwd is the directory it starts in; empty is /workspace.
	Cwd string
	// Stdin makes the program's stdin a stream (Exec.Stdin); otherwise
	// it reads nothing.
	Stdin bool
	// Timeout bounds it; zero means the session's limit.
	Timeout time.Duration
	// OnStart receives the started program's handle (to signal it or
	// write its stdin) before its output comes; OnOutput its output.
	OnStart  func(sandbox.Exec)
	OnOutput func(sandbox.Stream, []byte)
}

// maxCommandEnv bounds the variables a command adds.
const maxCommandEnv = 256

// commandArgv is the argv that runs req.Argv in cwd: a shell changes
// directory, then replaces itself with the program.
func commandArgv(argv []string, cwd string) []string {
	return append([]string{"/bin/sh", "-c", `cd -- "$1" || exit 1; shift; exec "$@"`, "stockade-command", cwd}, argv...)
}

// commandEnv is the runtime's environment with env added (sorted, so that
// the same request starts the same program).
func commandEnv(base []string, env map[string]string) ([]string, error) {
	if len(env) > maxCommandEnv {
		return nil, errdefs.Publicf("%d environment variables, more than %d: %w", len(env), maxCommandEnv, errdefs.ErrInvalidArgument)
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(env[k], 0) {
			return nil, errdefs.Publicf("environment variable %q is not a valid name=value: %w", k, errdefs.ErrInvalidArgument)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]string, 0, len(base)+len(keys))
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		if _, ok := env[name]; !ok {
			out = append(out, kv)
		}
	}
	for _, k := range keys {
		out = append(out, k+"="+env[k])
	}
	return out, nil
}

// Command runs req in the session's sandbox (not its kernel) and returns
// how it ended. One program runs at a time in a sandbox: another one
// meanwhile is ErrConflict. When ctx ends the program and what it started
// are ended and the result says killed. An error means the program could
// not start (a bad request, or the sandbox is gone).
func (s *Session) Command(ctx context.Context, req CommandRequest) (*sandbox.Result, error) {
	if len(req.Argv) == 0 || !strings.HasPrefix(req.Argv[0], "/") {
		return nil, errdefs.Publicf("a command needs an absolute program path: %w", errdefs.ErrInvalidArgument)
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = WorkspaceDir
	}
	if !strings.HasPrefix(cwd, "/") || strings.ContainsRune(cwd, 0) {
		return nil, errdefs.Publicf("working directory %q is not an absolute path: %w", cwd, errdefs.ErrInvalidArgument)
	}
	env, err := commandEnv(ProgramEnv(), req.Env)
	if err != nil {
		return nil, err
	}
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = s.Limits.Timeout
	}
	// An Exec carries a file: an empty one, which the command does not
	// read.
	ex, err := s.sb.Start(ctx, sandbox.ExecRequest{File: sandbox.File{Name: "stockade-command"}, Argv: commandArgv(req.Argv, cwd), Env: env, StdinStream: req.Stdin,
		Timeout: timeout, OnOutput: req.OnOutput})
	if err != nil {
		if errdefs.IsConflict(err) {
			return nil, errdefs.Publicf("session sandbox %s is running another command: %w", s.sb.ID(), errdefs.ErrConflict)
		}
		return nil, fmt.Errorf("starting a command: %w", err)
	}
	if req.OnStart != nil {
		req.OnStart(ex)
	}
	res, err := ex.Wait(context.WithoutCancel(ctx))
	var cut *sandbox.CutShortError
	if errors.As(err, &cut) && cut.Result != nil {
		return cut.Result, nil
	}
	if err != nil && ctx.Err() != nil {
		return &sandbox.Result{Status: sandbox.StatusKilled, ExitCode: -1}, nil
	}
	return res, err
}
