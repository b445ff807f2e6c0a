package capability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
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

// cells admits and runs the cells of sessions, in their sessions'
// kernels.
type cells struct {
	*core
	st   cellStore
	host *sessionHost
	runs *runs
	gate *gate
	// procs are the programs of the command cells running (commands.go).
	procs commandProcs
}

// cellStore is what cells needs of the store.
type cellStore interface {
	runStore
	GetSession(ctx context.Context, workspaceID, id string) (model.Session, error)
}

// CellRequest is the body of POST /v1/sessions/{id}/exec, as the wire
// declares it: its TimeoutMS bounds the cell within the policy's limit;
// its IdempotencyKey is not read (InvokeOptions carries it).
type CellRequest = wire.CellRequest

// cellRecord is a cell's stored request (the execution's request): the
// cell and its session's runtime, in the shape of an InvokeRequest's
// fields where they mean the same (the console shows it as one).
type cellRecord struct {
	SessionID string `json:"session_id"`
	Runtime   string `json:"runtime"`
	CellRequest
	// Command is set for a command cell (commands.go): a program in the
	// session's sandbox instead of code in its kernel.
	Command *CommandRequest `json:"command,omitempty"`
}

// ExecCell admits a cell of session id, which runs in the session's
// kernel in the background: a decision of the workspace policy, credits
// reserved and charged as any invocation's, the approval the session's
// mode asks for (see session.go), its tool_calls row and audit events.
// Use Wait or Subscribe for the outcome, whose result is the cell's
// (engine.CellResult). A cell while another of the session has not ended
// is a SessionBusyError; a retry of an admitted cell (the same
// IdempotencyKey and body) returns the first.
func (s *cells) ExecCell(ctx context.Context, p Principal, id string, req CellRequest, o InvokeOptions) (*Invocation, error) {
	ss, live, done, err := s.host.usable(ctx, p, id)
	if err != nil {
		return nil, err
	}
	defer done()
	if req.TimeoutMS < 0 || req.TimeoutMS > math.MaxInt64/int64(time.Millisecond) {
		return nil, errdefs.Publicf("timeout_ms %d is out of range: %w", req.TimeoutMS, errdefs.ErrInvalidArgument)
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	rec := &runRecord{g: s.gate, unit: "a cell",
		ne: store.NewExecution{ID: o.ExecutionID, WorkspaceID: p.WorkspaceID, KeyID: p.KeyID, Runtime: ss.Runtime, Tool: ss.Tool,
			Request: mustJSON(cellRecord{SessionID: ss.ID, Runtime: ss.Runtime, CellRequest: req}), InputSHA256: InputHash(ss.Runtime, req.Code),
			IdempotencyKey: o.IdempotencyKey, SessionID: ss.ID},
		failed: func(ctx context.Context, err error) error {
			switch {
			case errdefs.IsConflict(err):
				return errdefs.Public(&SessionBusyError{SessionID: ss.ID})
			case errdefs.IsFailedPrecondition(err):
				if cur, gerr := s.st.GetSession(ctx, p.WorkspaceID, ss.ID); gerr == nil {
					return expiredError(sessionOf(cur))
				}
			}
			return fmt.Errorf("admitting a cell: %w", err)
		},
	}
	g := Grant{Kind: Session, Session: sessionOf(ss)}
	// A cell's network is its session's, and its tool the session's:
	// decided, and reviewed, when the session opened; a cell of a session
	// with network is refused still if its tool's record or the server
	// no longer gives egress (egress).
	c := &claim{by: p, grant: g, idempotencyKey: o.IdempotencyKey, charged: true, egress: ss.Network, record: rec,
		ask: policy.Request{Capability: contract.CodeExecute, Runtime: ss.Runtime, Timeout: timeout, Network: ss.Network},
		asked: audit.Invocation{Capability: contract.CodeExecute.Name, Runtime: ss.Runtime, TimeoutMS: req.TimeoutMS,
			Network: policy.NetworkWord(ss.Network), InputSHA256: rec.ne.InputSHA256, StdinSHA256: sha256Hex([]byte(req.Stdin))},
		check: func() (tools.Tool, sandbox.Driver, error) {
			tool, drv, _, err := s.runner.Validate(engine.Request{Runtime: ss.Runtime, Tool: ss.Tool, Driver: ss.Driver, Code: []byte(req.Code),
				Stdin: []byte(req.Stdin), Limits: sandbox.Limits{Timeout: timeout}})
			return tool, drv, err
		},
		// The session's mode says which cells wait for a human (see
		// session.go).
		card: func(in Admit) (bool, wire.ApprovalCard) {
			wait, _ := cellApproval(g, in)
			card := wire.ApprovalCard{Code: req.Code, Stdin: req.Stdin, SessionID: ss.ID, Cell: ss.Cells + 1, CoversSession: coversSession(g)}
			card.EgressAllow, card.EgressPorts = live.Egress()
			return wait, card
		},
	}
	rec.dispatch = func(e model.Execution, _ *ticket) { s.dispatchCell(e, live, c.timeout) }
	if err := s.gate.admit(ctx, c); err != nil {
		return nil, err
	}
	return rec.inv, nil
}

// dispatchCell runs an admitted cell in the background, in live.
func (s *cells) dispatchCell(e model.Execution, live *liveSession, timeout time.Duration) {
	// Tracked before its run starts, so that the idle sweep and a pause
	// see the session busy from now on.
	live.track(e.ID)
	if !s.runs.spawn(e.ID, func(ctx context.Context) {
		defer live.untrack(e.ID)
		s.runCell(ctx, e, live, timeout)
	}) {
		live.untrack(e.ID) // the next start of the daemon ends it failed, uncharged
	}
}

// runCell runs cell e in live's kernel and records its outcome.
func (s *cells) runCell(ctx context.Context, e model.Execution, live *liveSession, timeout time.Duration) {
	on := e
	on.Driver = live.Driver
	ctx = s.withTier(s.traces.Context(ctx, e.ID), on)
	g := GrantOf(e, nil)
	end := func(in Input) { s.runs.end(context.WithoutCancel(ctx), g, in) }
	var req cellRecord
	if err := json.Unmarshal(e.Request, &req); err != nil {
		end(LaunchFailed{Err: fmt.Errorf("decoding stored cell: %w", err), At: s.opts.Now()})
		return
	}
	ex, out, ok := s.startCell(ctx, e, live, req, end)
	if !ok {
		return
	}
	g = GrantOf(ex, nil) // end records the started execution's end
	if req.Command != nil {
		s.runCommand(ctx, e, live, req, timeout, out, end)
		return
	}
	res, err := live.Cell(ctx, engine.CellRequest{Code: req.Code, Stdin: req.Stdin, Timeout: timeout, OnOutput: out.add,
		OnDisplay: func(d sandbox.Display) {
			s.hub.publish(e.ID, StreamEvent{Type: "output", Data: mustJSON(engine.OutputOf(d))})
		}})
	out.flush()
	at := s.opts.Now()
	cut, c := ctx.Err() != nil, cancellationOf(ctx)
	lost := err != nil
	var ended *engine.SandboxLostError
	known := errors.As(err, &ended)
	// expired: the sandbox ended itself at its deadline, past the
	// session's TTL, before the daemon ended the session (a slow sweep).
	expired := lost && !known && !cut && s.pastTTL(ctx, e.WorkspaceID, req.SessionID, at)
	switch {
	case known:
		// It ran, and the host knows how it ended (an OOM kill of the
		// whole sandbox): charged as any cell that ran.
		s.log.Warn("a cell's session lost its sandbox", "execution", e.ID, "status", ended.Result.Status, "err", err)
		res = ended.Result
	case err != nil && !cut && !expired:
		// The sandbox could not run the cell: the session has lost it.
		end(LaunchFailed{Err: err, At: at})
		s.endLost(ctx, e.WorkspaceID, req.SessionID, model.EndFailed)
		return
	case err != nil:
		// Cut short after it launched (a cancel, its session's end, the
		// daemon's shutdown, its sandbox's own end past the session's
		// TTL) and its sandbox lost or destroyed under it: it ends killed
		// as below, with the output it had made.
		s.log.Info("a cell cut short lost its sandbox", "execution", e.ID, "cancel", c, "expired", expired, "err", err)
		stdout, stderr := out.kept[sandbox.Stdout], out.kept[sandbox.Stderr]
		res = &engine.CellResult{Status: sandbox.StatusKilled, CellEnd: wire.CellEnd{Stdout: string(stdout.data), Stderr: string(stderr.data),
			StdoutTruncated: stdout.truncated, StderrTruncated: stderr.truncated, Outputs: []engine.CellOutput{},
			DurationMS: max(at.Sub(ex.StartedAt), 0).Milliseconds()}, Driver: live.Driver, Runtime: live.Runtime.Name}
	}
	switch {
	case cut && res.Status == sandbox.StatusKilled:
		// Stockade ended it: charged as any launched run, as a one-shot
		// run cut short is.
		res.EndedBy = endedBy(ctx)
	case expired:
		// Its session's TTL ended it: the session ends ttl first, as the
		// sweep would have ended it.
		res.EndedBy = engine.EndedBySessionEnd
		s.endLost(ctx, e.WorkspaceID, req.SessionID, model.EndTTL)
	}
	status := model.ExecutionStatus(res.Status)
	s.host.sessionObserver().SessionCell(status)
	end(Finish{Status: status, Driver: live.Driver, Cancel: c, At: at,
		Result: mustJSON(CellResultDoc{ExecutionID: e.ID, SessionID: req.SessionID, Cell: e.Cell, CellResult: *res}),
		Output: model.Output{Stdout: []byte(res.Stdout), Stderr: []byte(res.Stderr), StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated}})
	if lost && !expired && (c != nil || !cut) {
		// The sandbox is gone (a session's end has ended the session
		// already); a shutdown leaves the session to the next start of
		// the daemon, which re-attaches its sandbox or ends it.
		s.endLost(ctx, e.WorkspaceID, req.SessionID, model.EndFailed)
	}
}

// startCell records cell e (its stored record req) started in live and
// returns the execution and the output's publisher; ok is false when it
// did not start, which it has recorded (end).
func (s *cells) startCell(ctx context.Context, e model.Execution, live *liveSession, req cellRecord, end func(Input)) (_ model.Execution, _ *outputChunks, ok bool) {
	g := GrantOf(e, nil)
	step, err := Transition(g, Start{Driver: live.Driver, At: s.opts.Now()})
	if err != nil {
		s.runs.endUnstarted(e, cancellationOf(ctx))
		return e, nil, false
	}
	ex, err := s.st.Apply(ctx, e.ID, *step.Write)
	if err != nil {
		// Cancelled before it started, or the store failed.
		if c := cancellationOf(ctx); c != nil || errdefs.IsConflict(err) {
			s.runs.endUnstarted(e, c)
			return e, nil, false
		}
		end(LaunchFailed{Err: err, At: s.opts.Now()})
		return e, nil, false
	}
	s.hub.publish(e.ID, StreamEvent{Type: "started", Data: mustJSON(wire.Started{ExecutionID: e.ID, Driver: live.Driver, SessionID: req.SessionID, Cell: e.Cell})})
	s.runs.notify(step, ex)
	return ex, &outputChunks{keep: sandbox.DefaultLimits().OutputCap, publish: func(st sandbox.Stream, p []byte) {
		s.hub.publish(e.ID, StreamEvent{Type: st.String(), Data: mustJSON(map[string]string{"data": string(p)})})
	}}, true
}

// pastTTL says whether session id is past its TTL at at.
func (s *cells) pastTTL(ctx context.Context, workspaceID, id string, at time.Time) bool {
	ss, err := s.st.GetSession(context.WithoutCancel(ctx), workspaceID, id)
	return err == nil && !at.Before(ss.ExpiresAt)
}

// endLost ends session id, whose sandbox is lost, for reason (failed, or
// ttl when its sandbox ended itself past the TTL), if it is still active.
func (s *cells) endLost(ctx context.Context, workspaceID, id string, reason model.SessionEndReason) {
	ctx = context.WithoutCancel(ctx)
	if ss, err := s.st.GetSession(ctx, workspaceID, id); err == nil && ss.State == model.SessionActive {
		if _, err := s.host.endSession(ctx, ss, Principal{}, reason, "", engine.EndedBySessionEnd); err != nil {
			s.log.Error("ending a session whose sandbox is lost", "session", ss.ID, "reason", reason, "err", err)
		}
	}
}

// CellResultDoc is a cell's result document: its execution's result.
type CellResultDoc struct {
	ExecutionID string `json:"execution_id"`
	SessionID   string `json:"session_id"`
	Cell        int    `json:"cell"`
	engine.CellResult
}

// InterruptCell interrupts the running cell of session id (SIGINT to its
// kernel) and reports whether one ran.
//
// A paused session runs no cell: it is not resumed, and the answer is
// false.
func (s *cells) InterruptCell(ctx context.Context, p Principal, id string) (bool, error) {
	if ss, err := s.st.GetSession(ctx, p.WorkspaceID, id); err == nil && ss.State == model.SessionPaused {
		return false, mayTransition(Grant{WorkspaceID: ss.WorkspaceID, KeyID: ss.KeyID}, p, "interrupt")
	}
	_, live, done, err := s.host.usable(ctx, p, id)
	if err != nil {
		return false, err
	}
	defer done()
	return live.Interrupt()
}

// dispatchApproved runs execution e, just approved, for timeout: a cell in
// its session's sandbox, any other in a sandbox of its own. A cell whose
// session's sandbox this daemon does not serve ends launch_failed.
func (s *cells) dispatchApproved(ctx context.Context, e model.Execution, timeout time.Duration) {
	if e.SessionID == "" {
		s.runs.dispatch(e, timeout, nil)
		return
	}
	live := s.host.sessions.get(e.SessionID)
	if live == nil {
		s.runs.end(context.WithoutCancel(ctx), GrantOf(e, nil), LaunchFailed{Err: fmt.Errorf("session %s has no sandbox on this daemon", e.SessionID), At: s.opts.Now()})
		return
	}
	s.dispatchCell(e, live, timeout)
}
