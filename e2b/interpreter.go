package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/wire"
)

// InterpreterOptions tune the code interpreter (port 49999).
type InterpreterOptions struct {
	// KeepAlive is how often an /execute stream with nothing else to say
	// sends a keepalive line; zero is 5s.
	KeepAlive time.Duration
	// ApprovalWait bounds how long an /execute stream follows a cell that
	// awaits a human's approval: past it the stream ends with an
	// ApprovalPending error naming the approval, the cell stays pending
	// and nothing is charged until it runs. Zero is 50s, below the 60s
	// @e2b/code-interpreter gives a stream's body by default (timeoutMs).
	ApprovalWait time.Duration
	// MaxContexts bounds the contexts of one sandbox; zero is 32.
	MaxContexts int
	// QueueWait bounds how long an /execute stream waits for its turn
	// while the sandbox runs another cell or command (E2B's kernel queues
	// executions; a session runs one at a time): past it the stream ends
	// with SandboxBusy, nothing admitted. Zero is 30s.
	QueueWait time.Duration
}

// interpreter serves the code interpreter's HTTP side: POST /execute and
// /contexts, for the sandbox of the request's Target (see TargetFrom).
type interpreter struct {
	svc  Cells
	log  *slog.Logger
	opts InterpreterOptions
	ctxs *ciContexts
	mux  *http.ServeMux
}

// NewInterpreter returns the code interpreter's handler with the default
// options: each runCode is a cell of the Target's session (policy,
// approval, credits, its tool_calls row and audit events), streamed as
// the NDJSON @e2b/code-interpreter reads. The router mounts it on port
// 49999 after resolving the Target.
func NewInterpreter(svc Cells, log *slog.Logger) http.Handler {
	return NewInterpreterWith(svc, log, InterpreterOptions{})
}

// NewInterpreterWith is NewInterpreter with options o.
func NewInterpreterWith(svc Cells, log *slog.Logger, o InterpreterOptions) http.Handler {
	if o.KeepAlive <= 0 {
		o.KeepAlive = 5 * time.Second
	}
	if o.ApprovalWait <= 0 {
		o.ApprovalWait = 50 * time.Second
	}
	if o.MaxContexts <= 0 {
		o.MaxContexts = 32
	}
	if o.QueueWait <= 0 {
		o.QueueWait = 30 * time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	in := &interpreter{svc: svc, log: log, opts: o, ctxs: newCIContexts(o.MaxContexts), mux: http.NewServeMux()}
	in.mux.HandleFunc("POST /execute", in.execute)
	in.mux.HandleFunc("GET /contexts", in.listContexts)
	in.mux.HandleFunc("POST /contexts", in.createContext)
	in.mux.HandleFunc("DELETE /contexts/{id}", in.removeContext)
	in.mux.HandleFunc("POST /contexts/{id}/restart", in.restartContext)
	in.mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	return in
}

// ServeHTTP serves r. A sandbox URL given with a trailing slash makes
// the SDK ask for //execute, which ServeMux would answer with a 307
// redirect, a round trip more: repeated slashes are one here.
func (in *interpreter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.Contains(r.URL.Path, "//") {
		r = r.Clone(r.Context())
		for strings.Contains(r.URL.Path, "//") {
			r.URL.Path = strings.ReplaceAll(r.URL.Path, "//", "/")
		}
		r.URL.RawPath = ""
	}
	in.mux.ServeHTTP(w, r)
}

// ciError answers err as the code interpreter does: a status and a plain
// text body, which the SDK shows for a 404 (NotFoundError) and, with
// diagnostics, for others. A message that is not public is hidden.
func (in *interpreter) ciError(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusInternalServerError
	switch {
	case errdefs.IsInvalidArgument(err):
		status = http.StatusBadRequest
	case errdefs.IsNotFound(err):
		status = http.StatusNotFound
	case errdefs.IsUnauthenticated(err):
		status = http.StatusUnauthorized
	case errdefs.IsPermissionDenied(err):
		status = http.StatusForbidden
	case errdefs.IsConflict(err):
		status = http.StatusConflict
	case errdefs.IsTooLarge(err):
		status = http.StatusRequestEntityTooLarge
	case errdefs.IsResourceExhausted(err), errdefs.IsPaymentRequired(err):
		status = http.StatusTooManyRequests
	case errdefs.IsFailedPrecondition(err), errdefs.IsGone(err):
		status = http.StatusBadGateway
	case errdefs.IsUnavailable(err):
		status = http.StatusServiceUnavailable
	}
	msg, ok := errdefs.PublicMessage(err)
	if !ok {
		msg = http.StatusText(status)
		in.log.Error("e2b interpreter", "path", r.URL.Path, "err", err)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg)
}

// target is the request's Target, which the router must have set.
func (in *interpreter) target(r *http.Request) (Target, error) {
	t, ok := TargetFrom(r.Context())
	if !ok || t.SessionID == "" {
		return Target{}, errors.New("the code interpreter was reached without a sandbox (the router sets it)")
	}
	return t, nil
}

// execute answers POST /execute: the cell's NDJSON stream (see
// ciStream). The response's headers go out as soon as the cell is
// admitted: the SDK's request timeout covers only the wait for them.
func (in *interpreter) execute(w http.ResponseWriter, r *http.Request) {
	t, err := in.target(r)
	if err != nil {
		in.ciError(w, r, err)
		return
	}
	req, err := ciDecodeExecute(http.MaxBytesReader(w, r.Body, ciMaxExecuteBody))
	if err != nil {
		in.ciError(w, r, err)
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		in.ciError(w, r, errdefs.Publicf("streaming is not supported by this connection: %w", errdefs.ErrInvalidArgument))
		return
	}
	plan, err := in.ctxs.plan(t, req)
	if err != nil {
		var un *ciUnsupportedError
		if errors.As(err, &un) {
			// Nothing ran and nothing is charged: the SDK shows the
			// reason as the execution's error.
			s := newCIStream(w, flusher)
			s.start()
			s.send(ciErrorMsg(un.name, un.msg, ""))
			s.send(ciMsg{"type": "end_of_execution"})
			return
		}
		in.ciError(w, r, err)
		return
	}
	if in.reattach(w, r, flusher, t, plan) {
		return
	}
	a, err := in.admit(r.Context(), t, plan)
	var s *ciStream
	if errdefs.IsConflict(err) {
		// The sandbox runs another cell or command: as E2B's kernel
		// queues executions, the stream waits for its turn.
		s = newCIStream(w, flusher)
		s.start()
		a, plan, err = in.queue(r.Context(), s, t, req)
		if err != nil {
			s.send(ciErrorMsg(ciErrorName(err), publicOr(err, "the cell could not be admitted"), ""))
			s.send(ciMsg{"type": "end_of_execution"})
			return
		}
	}
	if err != nil {
		in.ciError(w, r, err)
		return
	}
	defer a.unsubscribe()
	if s == nil {
		s = newCIStream(w, flusher)
		s.start()
	}
	status := in.follow(r.Context(), s, t, plan.code, a.inv, a.events)
	if ciRanNothing(status) {
		// Denied, expired or cancelled: the restart and removals it
		// carried are the next cell's again.
		in.ctxs.requeue(t, plan)
	}
	ciRefused(status)
}

// ciRefused cuts the response of a cell whose approval was denied or
// expired, after its error line: the SDK raises only when a request
// fails, and once the headers are out a cut stream is the one failure
// left to say it with (runCode rejects; its onError has seen the
// reason).
func ciRefused(status model.ExecutionStatus) {
	if status == model.StatusDenied || status == model.StatusApprovalExpired {
		panic(http.ErrAbortHandler)
	}
}

// ciAdmitted is a cell admitted by admit, and its events.
type ciAdmitted struct {
	inv         *capability.Invocation
	events      <-chan capability.StreamEvent
	unsubscribe func()
}

// admit admits plan's cell in t's session, subscribed to its events
// from the start.
func (in *interpreter) admit(ctx context.Context, t Target, plan ciPlan) (ciAdmitted, error) {
	id := capability.NewExecutionID()
	events, unsubscribe := in.svc.Subscribe(id)
	inv, err := in.svc.ExecCell(ctx, t.Principal, t.SessionID, capability.CellRequest{Code: plan.code}, capability.InvokeOptions{ExecutionID: id})
	if err != nil {
		unsubscribe()
		return ciAdmitted{}, err
	}
	in.ctxs.admitted(t, plan)
	if inv.Execution.ID != id {
		// Not a replay (no idempotency key is sent): the store chose.
		unsubscribe()
		events, unsubscribe = in.svc.Subscribe(inv.Execution.ID)
	}
	return ciAdmitted{inv: inv, events: events, unsubscribe: unsubscribe}, nil
}

// ciQueuePoll is how often a queued cell asks for its turn.
const ciQueuePoll = 50 * time.Millisecond

// queue admits req's cell once t's session is free, within QueueWait,
// sending keepalives to s meanwhile. The plan is made again at each try:
// a cell admitted meanwhile may have done its context's restart.
func (in *interpreter) queue(ctx context.Context, s *ciStream, t Target, req ciExecuteRequest) (ciAdmitted, ciPlan, error) {
	deadline := time.NewTimer(in.opts.QueueWait)
	defer deadline.Stop()
	poll := time.NewTicker(ciQueuePoll)
	defer poll.Stop()
	keep := time.NewTicker(in.opts.KeepAlive)
	defer keep.Stop()
	for {
		select {
		case <-ctx.Done():
			return ciAdmitted{}, ciPlan{}, ctx.Err()
		case <-deadline.C:
			return ciAdmitted{}, ciPlan{}, errdefs.Publicf("sandbox %s has run another cell or command for %s, and runs one at a time: nothing ran, nothing is charged: %w",
				t.SandboxID, in.opts.QueueWait, errdefs.ErrConflict)
		case <-keep.C:
			s.send(ciMsg{"type": "keepalive"})
		case <-poll.C:
			plan, err := in.ctxs.plan(t, req)
			if err != nil {
				return ciAdmitted{}, ciPlan{}, err
			}
			a, err := in.admit(ctx, t, plan)
			if !errdefs.IsConflict(err) {
				return a, plan, err
			}
		}
	}
}

// ciErrorName names the error line of an admission refused once the
// stream started.
func ciErrorName(err error) string {
	switch {
	case errdefs.IsConflict(err):
		return "SandboxBusy"
	case errdefs.IsPaymentRequired(err), errdefs.IsResourceExhausted(err):
		return "ResourceExhausted"
	case errdefs.IsPermissionDenied(err):
		return "PermissionDenied"
	case errdefs.IsNotFound(err), errdefs.IsGone(err), errdefs.IsFailedPrecondition(err):
		return "SandboxUnavailable"
	}
	return wire.StockadeError
}

// reattach answers an /execute of t's sandbox while a cell whose stream
// ended ApprovalPending has not been followed to its end, and reports
// whether it did: the same code follows that cell (waiting on, or its
// outcome if it ran meanwhile: it runs once, charged once), other code
// is refused while that cell awaits approval or runs. A cell that ended
// no one asked for again is forgotten, and the request runs anew.
func (in *interpreter) reattach(w http.ResponseWriter, r *http.Request, flusher http.Flusher, t Target, plan ciPlan) bool {
	p, ok := in.ctxs.pendingOf(t)
	if !ok {
		return false
	}
	events, unsubscribe := in.svc.Subscribe(p.id)
	defer unsubscribe()
	e, err := in.svc.Wait(r.Context(), t.Principal, p.id, 0)
	same := p.code == plan.code
	if err != nil || (e.Status.Terminal() && !same) {
		in.ctxs.clearPending(t, p.id)
		return false
	}
	s := newCIStream(w, flusher)
	s.start()
	if !same {
		s.send(ciErrorMsg("SandboxBusy", fmt.Sprintf(
			"cell %s of sandbox %s awaits approval %s or runs, and the sandbox runs one cell at a time: nothing ran, nothing is charged. "+
				"Run that cell's code again to follow it, have it decided (the console, or POST /v1/approvals/%s/approve or /deny on Stockade's API), "+
				"or cancel it (POST /v1/executions/%s/cancel)", e.ID, t.SandboxID, e.ApprovalID, e.ApprovalID, e.ID), ""))
		s.send(ciMsg{"type": "end_of_execution"})
		return true
	}
	in.ctxs.clearPending(t, p.id)
	if e.Status.Terminal() {
		for _, m := range ciOutcome(e, 0) {
			s.send(m)
		}
		ciRefused(e.Status)
		return true
	}
	ciRefused(in.follow(r.Context(), s, t, p.code, &capability.Invocation{Execution: e}, events))
	return true
}

// follow streams cell inv's events to s until it ends, then its outcome,
// and returns its status as far as it knows it: how it ended,
// awaiting_approval when the stream gave up waiting (ApprovalPending),
// cancelled when its client went away while it awaited approval, empty
// otherwise. A client that goes away interrupts the cell (or cancels it
// while it awaits approval).
func (in *interpreter) follow(ctx context.Context, s *ciStream, t Target, code string, inv *capability.Invocation, events <-chan capability.StreamEvent) model.ExecutionStatus {
	id := inv.Execution.ID
	bg := context.WithoutCancel(ctx)
	keep := time.NewTicker(in.opts.KeepAlive)
	defer keep.Stop()
	var approvalDeadline <-chan time.Time
	awaiting := inv.Execution.Status == model.StatusAwaitingApproval
	if awaiting {
		// The SDK ignores this line; a client that reads the stream
		// learns which approval to ask for.
		s.send(ciMsg{"type": "approval_required", "approval_id": inv.Execution.ApprovalID, "execution_id": id})
		timer := time.NewTimer(in.opts.ApprovalWait)
		defer timer.Stop()
		approvalDeadline = timer.C
	}
	displays := 0
	for done := inv.Execution.Status.Terminal(); !done; {
		select {
		case ev, ok := <-events:
			if !ok {
				done = true
				continue
			}
			switch ev.Type {
			case "started":
				awaiting, approvalDeadline = false, nil
			case "stdout", "stderr":
				var chunk struct {
					Data string `json:"data"`
				}
				if json.Unmarshal(ev.Data, &chunk) == nil && chunk.Data != "" {
					s.send(ciMsg{"type": ev.Type, "text": chunk.Data, "timestamp": time.Now().UnixMicro()})
				}
			case "output":
				var o ciOutput
				if json.Unmarshal(ev.Data, &o) == nil {
					s.send(ciResult(o, false))
					displays++
				}
			}
		case <-keep.C:
			s.send(ciMsg{"type": "keepalive"})
		case <-approvalDeadline:
			e, err := in.svc.Wait(bg, t.Principal, id, 0)
			if err != nil || e.Status != model.StatusAwaitingApproval {
				approvalDeadline = nil
				continue
			}
			in.ctxs.setPending(t, ciPending{id: id, code: code})
			s.send(ciErrorMsg("ApprovalPending", fmt.Sprintf(
				"cell %s of sandbox %s still awaits approval %s after %s: nothing ran, and nothing is charged unless it is approved. "+
					"To wait for it, run the same code again: the stream follows this cell (it runs once), and other code is refused until it ends. "+
					"Have it decided in the console or with POST /v1/approvals/%s/approve on Stockade's API, "+
					"follow it there with GET /v1/executions/%s?wait=60s, or cancel it (POST /v1/executions/%s/cancel)",
				id, t.SandboxID, e.ApprovalID, in.opts.ApprovalWait, e.ApprovalID, id, id), ""))
			s.send(ciMsg{"type": "end_of_execution"})
			return model.StatusAwaitingApproval
		case <-ctx.Done():
			if in.clientGone(bg, t, id, awaiting) {
				return model.StatusCancelled
			}
			return ""
		}
	}
	e, err := in.svc.Wait(bg, t.Principal, id, 0)
	if err != nil {
		in.log.Error("e2b interpreter: reading a cell's outcome", "execution", id, "err", err)
		s.send(ciErrorMsg("StockadeError", "the cell's outcome could not be read: "+publicOr(err, "internal error"), ""))
		s.send(ciMsg{"type": "end_of_execution"})
		return ""
	}
	for _, m := range ciOutcome(e, displays) {
		s.send(m)
	}
	return e.Status
}

// ciRanNothing says whether a cell that ended status ran none of its
// code.
func ciRanNothing(status model.ExecutionStatus) bool {
	switch status {
	case model.StatusDenied, model.StatusApprovalExpired, model.StatusCancelled, model.StatusLaunchFailed:
		return true
	}
	return false
}

// clientGone ends cell id of t whose client went away: a running cell is
// interrupted (the kernel keeps its state), one awaiting approval is
// cancelled, uncharged. It reports whether the cell ran nothing.
func (in *interpreter) clientGone(ctx context.Context, t Target, id string, awaiting bool) bool {
	e, err := in.svc.Wait(ctx, t.Principal, id, 0)
	if err == nil {
		awaiting = e.Status == model.StatusAwaitingApproval
		if e.Status.Terminal() {
			return ciRanNothing(e.Status)
		}
	}
	if awaiting {
		if _, err := in.svc.Cancel(ctx, t.Principal, id, "the E2B client went away"); err != nil {
			in.log.Warn("e2b interpreter: cancelling a cell whose client went away", "execution", id, "err", err)
			return false
		}
		return true
	}
	if _, err := in.svc.InterruptCell(ctx, t.Principal, t.SessionID); err != nil {
		in.log.Warn("e2b interpreter: interrupting a cell whose client went away", "execution", id, "err", err)
	}
	return false
}

// publicOr is err's public message, or fallback.
func publicOr(err error, fallback string) string {
	if msg, ok := errdefs.PublicMessage(err); ok {
		return msg
	}
	return fallback
}
