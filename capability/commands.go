package capability

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/contract"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
	"github.com/stockade-sh/stockade/wire"
)

// CommandRequest is a command cell: a program run in a session's
// sandbox beside its kernel (the E2B wire's commands.run), admitted as a
// cell is (see ExecCommand).
type CommandRequest struct {
	// Argv is the program and its arguments (Argv[0] absolute).
	Argv []string `json:"argv"`
	// Env is added to the runtime's environment.
	Env map[string]string `json:"env,omitempty"`
	// Cwd is the directory it starts in; empty is /workspace.
	Cwd string `json:"cwd,omitempty"`
	// User is the user the client asked to run as; it is recorded, and
	// the program runs as the sandbox's one user.
	User string `json:"user,omitempty"`
	// Stdin keeps the program's stdin open for CommandInput.
	Stdin bool `json:"stdin,omitempty"`
	// TimeoutMS bounds it within the policy's limit; zero is the tool's.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// TimeoutUpTo makes TimeoutMS the most the client waits rather than
	// a bound it asks for: above the workspace's maximum it is lowered
	// to it instead of refused (E2B's SDKs always send their own 60 s).
	TimeoutUpTo bool `json:"timeout_up_to,omitempty"`
}

// maxArgv bounds a command's argv, in bytes all told.
const maxArgv = 1 << 20

// CommandResultDoc is a command cell's result document: its execution's
// result.
type CommandResultDoc struct {
	ExecutionID string         `json:"execution_id"`
	SessionID   string         `json:"session_id"`
	Cell        int            `json:"cell"`
	Status      sandbox.Status `json:"status"`
	ExitCode    int            `json:"exit_code"`
	Signal      int            `json:"signal,omitempty"`
	DurationMS  int64          `json:"duration_ms"`
	Driver      string         `json:"driver"`
	EndedBy     string         `json:"ended_by,omitempty"`
}

// commandProcs holds the programs of the command cells running, by
// execution id, for their input and signals.
type commandProcs struct {
	mu sync.Mutex
	m  map[string]sandbox.Exec
}

func (c *commandProcs) put(id string, ex sandbox.Exec) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]sandbox.Exec{}
	}
	c.m[id] = ex
}

func (c *commandProcs) drop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, id)
}

func (c *commandProcs) get(id string) sandbox.Exec {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[id]
}

// commandLine is the text of a command for its approval card and input
// hash.
func commandLine(argv []string) string { return strings.Join(argv, " ") }

// ExecCommand admits a command cell of session id: a program run in the
// session's sandbox, beside its kernel, with the same admission as a
// cell (gate.admit: the policy's decision, credits, the approval the
// session's mode asks for, its tool_calls row and audit events). Use
// Wait or Subscribe (stdout and stderr events) for the outcome, whose
// result is a CommandResultDoc; CommandInput and CommandSignal reach the
// program while it runs.
func (s *Service) ExecCommand(ctx context.Context, p Principal, id string, req CommandRequest, o InvokeOptions) (*Invocation, error) {
	return s.cells.ExecCommand(ctx, p, id, req, o)
}

// ExecCommand admits a command cell (see Service.ExecCommand).
func (s *cells) ExecCommand(ctx context.Context, p Principal, id string, req CommandRequest, o InvokeOptions) (*Invocation, error) {
	n := 0
	for _, a := range req.Argv {
		n += len(a) + 1
	}
	switch {
	case len(req.Argv) == 0 || !strings.HasPrefix(req.Argv[0], "/"):
		return nil, errdefs.Publicf("a command needs an absolute program path: %w", errdefs.ErrInvalidArgument)
	case n > maxArgv:
		return nil, errdefs.Publicf("a command of %d bytes is more than %d: %w", n, maxArgv, errdefs.ErrTooLarge)
	case req.TimeoutMS < 0 || req.TimeoutMS > math.MaxInt64/int64(time.Millisecond):
		return nil, errdefs.Publicf("timeout_ms %d is out of range: %w", req.TimeoutMS, errdefs.ErrInvalidArgument)
	}
	ss, live, done, err := s.host.usable(ctx, p, id)
	if err != nil {
		return nil, err
	}
	defer done()
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	if req.TimeoutUpTo && timeout > 0 {
		pol, err := s.gate.st.GetPolicy(ctx, p.WorkspaceID)
		if err != nil {
			return nil, fmt.Errorf("loading workspace policy: %w", err)
		}
		d := policy.Decide(pol, policy.Request{Capability: contract.CodeExecute, Runtime: ss.Runtime}, s.runner.Ceiling().Timeout)
		if d.MaxTimeout > 0 && timeout > d.MaxTimeout {
			timeout, req.TimeoutMS = d.MaxTimeout, d.MaxTimeout.Milliseconds()
		}
	}
	line := commandLine(req.Argv)
	rec := &runRecord{g: s.gate, unit: "a command",
		ne: store.NewExecution{ID: o.ExecutionID, WorkspaceID: p.WorkspaceID, KeyID: p.KeyID, Runtime: ss.Runtime, Tool: ss.Tool,
			Request: mustJSON(cellRecord{SessionID: ss.ID, Runtime: ss.Runtime, Command: &req}), InputSHA256: InputHash(ss.Runtime, "$ "+line),
			IdempotencyKey: o.IdempotencyKey, SessionID: ss.ID},
		failed: func(ctx context.Context, err error) error {
			if errdefs.IsConflict(err) {
				return errdefs.Public(&SessionBusyError{SessionID: ss.ID})
			}
			if errdefs.IsFailedPrecondition(err) {
				if cur, gerr := s.st.GetSession(ctx, p.WorkspaceID, ss.ID); gerr == nil {
					return expiredError(sessionOf(cur))
				}
			}
			return fmt.Errorf("admitting a command: %w", err)
		},
	}
	g := Grant{Kind: Session, Session: sessionOf(ss)}
	c := &claim{by: p, grant: g, idempotencyKey: o.IdempotencyKey, charged: true, record: rec,
		ask: policy.Request{Capability: contract.CodeExecute, Runtime: ss.Runtime, Timeout: timeout, Network: ss.Network},
		asked: audit.Invocation{Capability: contract.CodeExecute.Name, Runtime: ss.Runtime, TimeoutMS: req.TimeoutMS,
			Network: policy.NetworkWord(ss.Network), InputSHA256: rec.ne.InputSHA256, StdinSHA256: sha256Hex(nil)},
		check: func() (tools.Tool, sandbox.Driver, error) {
			tool, drv, _, err := s.runner.Validate(engine.Request{Runtime: ss.Runtime, Tool: ss.Tool, Driver: ss.Driver, Code: []byte(line),
				Limits: sandbox.Limits{Timeout: timeout}})
			return tool, drv, err
		},
		card: func(in Admit) (bool, wire.ApprovalCard) {
			wait, _ := cellApproval(g, in)
			return wait, wire.ApprovalCard{Code: "$ " + line, SessionID: ss.ID, Cell: ss.Cells + 1, CoversSession: coversSession(g)}
		},
	}
	rec.dispatch = func(e model.Execution, _ *ticket) { s.dispatchCell(e, live, c.timeout) }
	if err := s.gate.admit(ctx, c); err != nil {
		return nil, err
	}
	return rec.inv, nil
}

// runCommand runs command cell e (its stored record req), started
// (startCell), in live's sandbox and records its outcome; runCell hands
// it the command cells.
func (s *cells) runCommand(ctx context.Context, e model.Execution, live *liveSession, req cellRecord, timeout time.Duration, out *outputChunks, end func(Input)) {
	cmd := req.Command
	defer s.procs.drop(e.ID)
	res, err := live.Command(ctx, engine.CommandRequest{Argv: cmd.Argv, Env: cmd.Env, Cwd: cmd.Cwd, Stdin: cmd.Stdin, Timeout: timeout,
		OnStart: func(x sandbox.Exec) { s.procs.put(e.ID, x) }, OnOutput: out.add})
	out.flush()
	at := s.opts.Now()
	if err != nil {
		// It could not start: a bad request, another command running, or
		// the sandbox is gone (which the next cell finds).
		s.log.Warn("a command cell could not start", "execution", e.ID, "session", req.SessionID, "err", err)
		end(LaunchFailed{Err: err, At: at})
		return
	}
	doc := CommandResultDoc{ExecutionID: e.ID, SessionID: req.SessionID, Cell: e.Cell, Status: res.Status, ExitCode: res.ExitCode,
		Signal: res.Signal, DurationMS: res.Duration.Milliseconds(), Driver: live.Driver}
	c := cancellationOf(ctx)
	if ctx.Err() != nil && res.Status == sandbox.StatusKilled {
		doc.EndedBy = endedBy(ctx)
	}
	status := model.ExecutionStatus(res.Status)
	s.host.sessionObserver().SessionCell(status)
	end(Finish{Status: status, Driver: live.Driver, Cancel: c, At: at, Result: mustJSON(doc),
		Output: model.Output{Stdout: res.Stdout, Stderr: res.Stderr, StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated}})
}

// CommandInput writes data to the stdin of command cell execID of
// session id (close: then closes it). A command that is not running, or
// was started without stdin, is ErrNotFound / ErrFailedPrecondition.
func (s *Service) CommandInput(ctx context.Context, p Principal, id, execID string, data []byte, close bool) error {
	x, err := s.cells.proc(ctx, p, id, execID)
	if err != nil {
		return err
	}
	w := x.Stdin()
	if w == nil {
		return errdefs.Publicf("command %s was started without stdin: %w", execID, errdefs.ErrFailedPrecondition)
	}
	if len(data) > 0 {
		if _, err := w.Write(data); err != nil {
			return errdefs.Publicf("command %s takes no more input: %w", execID, errdefs.ErrFailedPrecondition)
		}
	}
	if close {
		return w.Close()
	}
	return nil
}

// CommandSignal sends sig (SIGTERM or SIGKILL) to command cell execID of
// session id.
func (s *Service) CommandSignal(ctx context.Context, p Principal, id, execID string, sig syscall.Signal) error {
	x, err := s.cells.proc(ctx, p, id, execID)
	if err != nil {
		return err
	}
	if sig != syscall.SIGTERM && sig != syscall.SIGKILL {
		return errdefs.Publicf("signal %d is not SIGTERM or SIGKILL: %w", sig, errdefs.ErrInvalidArgument)
	}
	if sig == syscall.SIGKILL {
		return x.Cancel()
	}
	return x.Signal(sig)
}

// proc returns the running program of command cell execID of p's
// session id.
func (s *cells) proc(ctx context.Context, p Principal, id, execID string) (sandbox.Exec, error) {
	e, err := s.st.GetExecution(ctx, p.WorkspaceID, execID)
	if err != nil || e.SessionID != id {
		return nil, errdefs.Publicf("command %s not found in session %s: %w", execID, id, errdefs.ErrNotFound)
	}
	if e.KeyID != p.KeyID && p.Role != model.RoleAdmin {
		return nil, errdefs.Publicf("only the key that started command %s may reach it: %w", execID, errdefs.ErrPermissionDenied)
	}
	// Admitted, it may not have started yet (its stream's start event
	// comes at admission): wait for its program a little.
	deadline := time.NewTimer(procStartWait)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if x := s.procs.get(execID); x != nil {
			return x, nil
		}
		switch {
		case e.Status.Terminal():
			return nil, errdefs.Publicf("command %s has ended: %w", execID, errdefs.ErrNotFound)
		case e.Status == model.StatusAwaitingApproval:
			return nil, errdefs.Publicf("command %s awaits approval %s: %w", execID, e.ApprovalID, errdefs.ErrFailedPrecondition)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-deadline.C:
			return nil, errdefs.Publicf("command %s has not started: %w", execID, errdefs.ErrUnavailable)
		case <-tick.C:
		}
		if e, err = s.st.GetExecution(ctx, p.WorkspaceID, execID); err != nil {
			return nil, err
		}
	}
}

// procStartWait bounds how long input or a signal waits for an admitted
// command's program to start.
const procStartWait = 10 * time.Second
