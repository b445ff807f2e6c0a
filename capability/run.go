package capability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/syncctx"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/wire"
)

// runs dispatches admitted executions, runs one-shots on the engine,
// records how every run ends, cancels runs and wakes their waiters: the
// executions' life once admitted.
type runs struct {
	*core
	st runStore
	// slots bounds the sandboxes running at once and the invocations
	// queued for one.
	slots  *admission
	egress *egressAudit

	closeMu sync.Mutex // orders spawn's wg.Add before close's wg.Wait
	closed  bool
	wg      sync.WaitGroup
	// live maps each dispatched execution, until its run has ended, to the
	// cancel of its run's context, which Cancel calls with a cancellation.
	liveMu sync.Mutex
	live   map[string]context.CancelCauseFunc
}

// runStore is what runs needs of the store.
type runStore interface {
	GetExecution(ctx context.Context, workspaceID, executionID string) (model.Execution, error)
	Apply(ctx context.Context, id string, s model.Step) (model.Execution, error)
}

// dispatch runs an admitted execution in the background. t is its
// admission ticket; nil takes one that waits for a slot.
func (s *runs) dispatch(e model.Execution, timeout time.Duration, t *ticket) {
	if t == nil {
		t = s.slots.enqueue()
	}
	// After Close nothing starts: the execution stays queued and the next
	// start of the daemon ends it failed, uncharged.
	if !s.spawn(e.ID, func(ctx context.Context) {
		defer t.release()
		s.run(ctx, e, timeout, t)
	}) {
		t.release()
	}
}

// spawn calls run in the background with a context of its own, which ends
// when the service closes or stopRun(id) cancels it, and reports true;
// after close it runs nothing and reports false. close waits for it.
func (s *runs) spawn(id string, run func(ctx context.Context)) bool {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		s.traces.Drop(id) // it does not run in this process
		return false
	}
	ctx, cancel := context.WithCancelCause(s.ctx)
	s.liveMu.Lock()
	s.live[id] = cancel
	s.liveMu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() {
			// However the run ended (its end recorded or not), its
			// span is kept no longer.
			s.traces.Drop(id)
			s.liveMu.Lock()
			delete(s.live, id)
			s.liveMu.Unlock()
			cancel(nil)
		}()
		run(ctx)
	}()
	return true
}

// close stops every run: nothing starts any more, the runs' contexts end,
// and it waits until each has recorded its end, or until ctx ends: then
// it returns ctx's cause and the runs go on recording.
func (s *runs) close(ctx context.Context) error {
	s.closeMu.Lock()
	s.closed = true
	s.closeMu.Unlock()
	s.cancel()
	if err := syncctx.Wait(ctx, &s.wg); err != nil {
		return fmt.Errorf("waiting for the runs to record their ends: %w", err)
	}
	return nil
}

// run executes one admitted execution, with the timeout it was admitted
// with, and records its outcome. ctx ends when the service closes or the
// execution is cancelled (its cause is then a *Cancellation).
func (s *runs) run(ctx context.Context, e model.Execution, timeout time.Duration, t *ticket) {
	ctx = s.withTier(s.traces.Context(ctx, e.ID), e)
	g := GrantOf(e, nil)
	end := func(in Input) {
		// Recording must happen even when the service is closing.
		s.end(context.WithoutCancel(ctx), g, in)
	}
	var req InvokeRequest
	if err := json.Unmarshal(e.Request, &req); err != nil {
		end(LaunchFailed{Err: fmt.Errorf("decoding stored request: %w", err), At: s.opts.Now()})
		return
	}
	qctx, sp := telemetry.Start(ctx, telemetry.Queue)
	err := t.wait(qctx)
	sp.End(&err)
	if err != nil {
		if c := cancellationOf(ctx); c != nil {
			s.endUnstarted(e, c)
			return
		}
		end(LaunchFailed{Err: err, At: s.opts.Now()})
		return
	}
	network, _ := policy.ParseNetwork(req.Network) // checked by Invoke
	s.egress.startRun(e.ID, e.WorkspaceID, telemetry.TierOf(ctx))
	defer s.egress.endRun(e.ID)
	out := outputChunks{keep: sandbox.DefaultLimits().OutputCap, publish: func(st sandbox.Stream, p []byte) {
		s.hub.publish(e.ID, StreamEvent{Type: st.String(), Data: mustJSON(wire.Output{Data: string(p)})})
	}}
	var (
		driver  string // once the run has started
		started time.Time
	)
	res, err := s.runner.Run(ctx, engine.Request{
		Runtime: req.Runtime, Tool: req.Tool, Code: []byte(req.Code), Stdin: []byte(req.Stdin), Network: network,
		Limits: sandbox.Limits{Timeout: timeout},
		Labels: map[string]string{engine.LabelOwner: s.opts.Owner, engine.LabelExecution: e.ID},
		// The memory reserved at admission, nil for an execution that
		// waited for its approval (the runner takes the budget then).
		Reservation: t.mem,
		// Code runs only once its start is recorded: an execution whose
		// start is not in the store would end uncharged.
		OnStart: func(d string) error {
			step, err := Transition(g, Start{Driver: d, At: s.opts.Now()})
			if err != nil {
				return &startRefused{err}
			}
			ex, err := apply(ctx, s.st, e.ID, step)
			if err != nil {
				return &startRefused{err}
			}
			g, driver, started = GrantOf(ex, nil), d, time.Now()
			s.hub.publish(e.ID, StreamEvent{Type: "started", Data: mustJSON(wire.Started{ExecutionID: e.ID, Driver: d})})
			s.notify(step, ex)
			return nil
		},
		OnOutput: out.add,
	})
	out.flush()
	c := cancellationOf(ctx)
	at := s.opts.Now()
	if err != nil && driver != "" && ctx.Err() != nil {
		// The daemon stopped, or the execution was cancelled, while the
		// code ran: the run was killed after it launched, and is charged as
		// any launched run, with the output it had made. No exit and no
		// signal was observed: the sandbox was destroyed under the program,
		// which EndedBy says.
		stdout, stderr := out.kept[sandbox.Stdout], out.kept[sandbox.Stderr]
		r := engine.Result{Status: sandbox.StatusKilled, Run: wire.Run{ExitCode: -1, Stdout: string(stdout.data), Stderr: string(stderr.data),
			StdoutTruncated: stdout.truncated, StderrTruncated: stderr.truncated, DurationMS: time.Since(started).Milliseconds(),
			Driver: driver, Runtime: req.Runtime, EndedBy: endedBy(ctx)}}
		if cs := (*sandbox.CutShortError)(nil); errors.As(err, &cs) && cs.Result != nil {
			// What it used until then, where the sandbox's cgroup says.
			r.CPUMS, r.PeakMemoryBytes = cs.Result.CPUTime.Milliseconds(), cs.Result.PeakMemory
		}
		why := "killed: the daemon stopped during the run"
		if c != nil {
			why = "killed: " + c.Error()
		}
		end(Finish{Status: model.StatusKilled, Driver: driver, Cancel: c, At: at,
			Output: model.Output{Stdout: stdout.data, Stderr: stderr.data, StdoutTruncated: stdout.truncated, StderrTruncated: stderr.truncated},
			Result: mustJSON(struct {
				engine.Result
				Error string `json:"error"`
			}{r, why})})
		return
	}
	var refused *startRefused
	if err != nil && driver == "" && (c != nil || errors.As(err, &refused)) {
		// Cancelled before the code ran: the cancel ended it (its start was
		// refused), or it ends now.
		s.endUnstarted(e, c)
		return
	}
	if err != nil {
		// The sandbox did not launch or could not run the code: nothing is
		// charged (the reservation is released).
		end(LaunchFailed{Err: err, At: at})
		return
	}
	o := model.Output{Stdout: []byte(res.Stdout), Stderr: []byte(res.Stderr),
		StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated}
	if exit := res.ExitCode; exit >= 0 {
		o.ExitCode = &exit
	}
	end(Finish{Status: model.ExecutionStatus(res.Status), Result: mustJSON(res), Output: o, Driver: res.Driver, At: at})
}

// withTier is ctx carrying the tier of the driver that runs e, for the
// tier label of its phases' durations: from e's tool and runtime, whether
// tracing is on or not (its span's Links keep nothing then).
func (c *core) withTier(ctx context.Context, e model.Execution) context.Context {
	return telemetry.WithTier(ctx, string(c.runner.Tier(engine.Request{Runtime: e.Runtime, Tool: e.Tool, Driver: e.Driver})))
}

// end records the end of g's run that in says, trying again after a
// transient store error: a run whose end is not recorded stays "running"
// with its credits reserved until the next start, which then ends it
// uncharged although it ran.
func (s *runs) end(ctx context.Context, g Grant, in Input) {
	for reread := false; ; reread = true {
		step, err := Transition(g, in)
		if err == nil {
			var ex model.Execution
			err = retryStore(s.log, "recording execution outcome", []any{"execution", g.ID}, storeRetries, func() error {
				ex, err = apply(ctx, s.st, g.ID, step)
				return err
			})
			if err == nil {
				s.notify(step, ex)
				return
			}
		}
		if !reread && errdefs.IsConflict(err) {
			// The execution moved on since it was read here, as a start
			// whose answer was lost does: read it again.
			if cur, gerr := s.st.GetExecution(ctx, g.WorkspaceID, g.ID); gerr == nil && !cur.Status.Terminal() {
				g = GrantOf(cur, nil)
				continue
			}
		}
		s.log.Error("recording execution outcome", "execution", g.ID, "err", err)
		s.traces.Drop(g.ID)
		s.hub.finish(g.ID)
		s.feed.publish(Change{Kind: ExecutionFinished, WorkspaceID: g.WorkspaceID, ApprovalID: g.ApprovalID, ExecutionID: g.ID})
		return
	}
}

// notify does what a step applied to ex tells the service to, besides
// dispatching and stopping a run: tell the observer, the watchers of the
// workspace and the execution's waiters.
func (s *runs) notify(step Step, ex model.Execution) {
	if ex.Status.Terminal() {
		s.traces.Drop(ex.ID)
	}
	if step.Next.Pending != 0 {
		s.opts.Observer.ApprovalsPending(step.Next.Pending)
	}
	if step.Next.Ended {
		if inv := step.Write.Invocation; inv != nil {
			s.opts.Observer.Invocation(inv.Status, inv.Driver, inv.Ran, inv.Credits)
		}
		s.hub.finish(ex.ID)
	}
	if step.Next.Change != "" {
		s.feed.publish(Change{Kind: step.Next.Change, WorkspaceID: ex.WorkspaceID, ApprovalID: ex.ApprovalID, ExecutionID: ex.ID})
	}
}

// endedBy is the ended_by of a run whose ctx ended: the cancel's (see
// Cancellation.EndedBy), or the daemon's shutdown when no cancel ended it.
func endedBy(ctx context.Context) string {
	c := cancellationOf(ctx)
	switch {
	case c == nil:
		return engine.EndedByShutdown
	case c.EndedBy == "":
		return engine.EndedByCancel
	}
	return c.EndedBy
}

// cancellationOf returns the cancellation that ended ctx, or nil.
func cancellationOf(ctx context.Context) *Cancellation {
	var c *Cancellation
	if errors.As(context.Cause(ctx), &c) {
		return c
	}
	return nil
}

// startRefused is OnStart's refusal to record a start (a cancel, or
// another transition, won): the code did not run. It is told apart from
// a runner's own errors of any class, a driver's conflict included.
type startRefused struct{ err error }

func (e *startRefused) Error() string { return "recording the start: " + e.err.Error() }
func (e *startRefused) Unwrap() error { return e.err }

// endUnstarted ends an execution whose run stopped before its code ran
// because it was cancelled (c, or nil when its start found it ended).
// The cancel has normally ended it already; if its start was recorded
// meanwhile, it ends cancelled here, charged nothing, since no code ran.
func (s *runs) endUnstarted(e model.Execution, c *Cancellation) {
	defer s.hub.finish(e.ID)
	defer s.traces.Drop(e.ID)
	ctx := context.WithoutCancel(s.ctx)
	cur, err := s.st.GetExecution(ctx, e.WorkspaceID, e.ID)
	if err != nil || cur.Status.Terminal() || c == nil {
		return
	}
	step, err := Transition(GrantOf(cur, nil), Finish{Status: model.StatusCancelled, Cancel: c, At: s.opts.Now()})
	if err == nil {
		var ex model.Execution
		if ex, err = s.st.Apply(ctx, e.ID, *step.Write); err == nil {
			s.notify(step, ex)
			return
		}
	}
	if !errdefs.IsConflict(err) {
		s.log.Error("recording a cancel", "execution", e.ID, "err", err)
	}
}

// stopRun cancels the run of a dispatched execution with c, and reports
// whether it had one.
func (s *runs) stopRun(id string, c *Cancellation) bool {
	s.liveMu.Lock()
	cancel := s.live[id]
	s.liveMu.Unlock()
	if cancel != nil {
		cancel(c)
	}
	return cancel != nil
}

// storeRetries are the pauses between attempts of a write that must not be
// lost to a transient store error.
var storeRetries = []time.Duration{100 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second, 5 * time.Second}

// retryStore runs write, and again after each of pauses after an error
// that may be transient (SQLite busy past its timeout while the CLI
// writes, a PostgreSQL failover). A refusal (a conflict, an invalid or
// unknown record) is final. what and attrs describe the write in the log.
func retryStore(log *slog.Logger, what string, attrs []any, pauses []time.Duration, write func() error) error {
	for i := 0; ; i++ {
		err := write()
		if err == nil || errdefs.IsConflict(err) || errdefs.IsInvalidArgument(err) || errdefs.IsNotFound(err) || i == len(pauses) {
			return err
		}
		log.Warn(what+" failed; trying again", append(attrs, "err", err)...)
		time.Sleep(pauses[i])
	}
}

// outputChunks passes a run's output on in chunks that end on a character
// boundary: a character split between two reads of the sandbox's output
// would otherwise reach an event stream's JSON as two U+FFFD. The
// incomplete end of a chunk waits for the next chunk of its stream, or for
// flush.
type outputChunks struct {
	publish func(sandbox.Stream, []byte)
	// keep is how much of each stream kept holds.
	keep int64

	mu      sync.Mutex
	pending map[sandbox.Stream][]byte
	kept    map[sandbox.Stream]keptOutput
}

// keptOutput is the start of a stream, as published.
type keptOutput struct {
	data      []byte
	truncated bool
}

func (o *outputChunks) add(st sandbox.Stream, p []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.pending == nil {
		o.pending = map[sandbox.Stream][]byte{}
	}
	b := append(o.pending[st], p...)
	n := len(b)
	// The last character starts at most 3 bytes from the end.
	for i := len(b) - 1; i >= 0 && i >= len(b)-3; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				n = i
			}
			break
		}
	}
	o.pending[st] = append([]byte(nil), b[n:]...)
	if n > 0 {
		o.emit(st, b[:n])
	}
}

// emit publishes p and keeps what fits. Called with mu held.
func (o *outputChunks) emit(st sandbox.Stream, p []byte) {
	if o.kept == nil {
		o.kept = map[sandbox.Stream]keptOutput{}
	}
	k := o.kept[st]
	room := max(o.keep-int64(len(k.data)), 0)
	k.data = append(k.data, p[:min(int64(len(p)), room)]...)
	k.truncated = k.truncated || int64(len(p)) > room
	o.kept[st] = k
	o.publish(st, p)
}

// flush passes on what is left: bytes that never became a character.
func (o *outputChunks) flush() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for st, b := range o.pending {
		if len(b) > 0 {
			o.emit(st, b)
		}
	}
	o.pending = nil
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(errors.New("capability: encoding a value of a fixed shape failed: " + err.Error()))
	}
	return b
}

// cancelWait bounds how long Cancel waits for a running execution's
// sandbox to be destroyed and its end recorded.
const cancelWait = 30 * time.Second

// Cancel cancels execution id of p's workspace, which only the key that
// invoked it or an admin key of the workspace may (ErrPermissionDenied
// otherwise), and returns it as it ended. Awaiting approval or queued, it
// ends cancelled: its reservation is released, its approval request
// closed, nothing charged. Running, its sandbox is destroyed and it ends
// killed, charged as the launched run it was, with the output it had made;
// Cancel waits for that (up to cancelWait). An execution that has already
// ended is returned as it is, unchanged: cancelling is idempotent. The
// cancel is audited (execution.cancelled) with the transition it caused.
func (s *runs) Cancel(ctx context.Context, p Principal, id, reason string) (model.Execution, error) {
	return s.cancelAs(ctx, p, p.WorkspaceID, id, reason)
}

// cancelAs is Cancel of execution id of workspace ws by p, which is the zero
// Principal for the daemon's own.
func (s *runs) cancelAs(ctx context.Context, p Principal, ws, id, reason string) (model.Execution, error) {
	// An execution only moves forward, through at most three states: a
	// cancel that loses a race to another transition looks again.
	var stop *Cancellation
	for tries := 0; stop == nil; tries++ {
		e, err := s.st.GetExecution(ctx, ws, id)
		if err != nil {
			return e, err
		}
		step, err := Transition(GrantOf(e, nil), Cancel{By: p, Reason: reason, At: s.opts.Now()})
		if err != nil {
			return model.Execution{}, err
		}
		if step.Next.Stop == nil {
			return e, nil // it has ended: unchanged
		}
		if step.Write == nil {
			stop = step.Next.Stop // running: its run ends it
			continue
		}
		ex, err := s.st.Apply(ctx, id, *step.Write)
		if errdefs.IsConflict(err) && tries < 3 {
			continue
		}
		if err != nil {
			return model.Execution{}, err
		}
		// A queued execution's run stops waiting for its slot or
		// launching: its start is refused now.
		s.stopRun(id, step.Next.Stop)
		s.notify(step, ex)
		return ex, nil
	}
	if !s.stopRun(id, stop) {
		// Its run ended since it was read, or it runs on no run of this
		// daemon (another daemon serving the same database, against the
		// daemon claim).
		e, err := s.st.GetExecution(ctx, ws, id)
		if err != nil || e.Status.Terminal() {
			return e, err
		}
		return model.Execution{}, errdefs.Publicf("execution %s is running, but not on this daemon; retry: %w", id, errdefs.ErrUnavailable)
	}
	return s.Wait(ctx, Principal{WorkspaceID: ws}, id, cancelWait)
}

// Wait returns the execution once it has ended, or after d, whichever comes
// first (d <= 0 returns at once).
func (s *runs) Wait(ctx context.Context, p Principal, id string, d time.Duration) (model.Execution, error) {
	sub := s.hub.subscribe(id)
	defer s.hub.unsubscribe(id, sub)
	e, err := s.st.GetExecution(ctx, p.WorkspaceID, id)
	if err != nil || e.Status.Terminal() || d <= 0 {
		return e, err
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case _, ok := <-sub:
			if ok {
				continue
			}
		case <-timer.C:
		case <-ctx.Done():
			return e, ctx.Err()
		}
		return s.st.GetExecution(ctx, p.WorkspaceID, id)
	}
}

// Subscribe streams an execution's events (started, stdout, stderr) as they
// happen. The channel is closed when the execution has ended (read it then
// with Wait or the store); call cancel when done.
func (s *runs) Subscribe(id string) (<-chan StreamEvent, func()) {
	sub := s.hub.subscribe(id)
	return sub, func() { s.hub.unsubscribe(id, sub) }
}

// Watch follows the changes of workspace ws's approvals and executions
// (see Change) from now on, for a page that shows them live. The channel is
// closed by cancel, and also when the watcher fell more than a buffer
// behind: it then missed changes, and should read the state it shows from
// the store again and watch anew. Call cancel when done.
func (s *runs) Watch(ws string) (<-chan Change, func()) {
	ch := s.feed.watch(ws)
	return ch, func() { s.feed.drop(ws, ch) }
}

// apply applies step to execution id in the store, in a store write span.
func apply(ctx context.Context, st interface {
	Apply(ctx context.Context, id string, s model.Step) (model.Execution, error)
}, id string, step Step) (ex model.Execution, err error) {
	ctx, sp := telemetry.Start(ctx, telemetry.StoreWrite, telemetry.StoreOp("apply"))
	defer sp.End(&err)
	return st.Apply(ctx, id, *step.Write)
}
