package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/wire"
)

func (s *server) createExecution(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	var req capability.InvokeRequest
	if err := s.decodeBody(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	opts := capability.InvokeOptions{IdempotencyKey: r.Header.Get("Idempotency-Key"), ExecutionID: capability.NewExecutionID()}
	if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		s.streamExecution(w, r, p, req, opts)
		return
	}
	inv, err := s.svc.Invoke(r.Context(), p, req, opts)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.answerAdmission(w, r, p, inv, func(e model.Execution) (int, any) {
		v := viewOf(e)
		v.Replayed = inv.Replayed
		return http.StatusOK, v
	})
}

// answerAdmission answers a POST that admitted inv: 202 with its execution
// and approval card while it waits for a decision; otherwise, once it has
// ended or MaxWait has passed, the status and body outcome gives for it.
func (s *server) answerAdmission(w http.ResponseWriter, r *http.Request, p capability.Principal, inv *capability.Invocation, outcome func(model.Execution) (int, any)) {
	if inv.Approval != nil && inv.Execution.Status == model.StatusAwaitingApproval {
		v := viewOf(inv.Execution)
		v.Approval, v.Replayed = card(*inv.Approval), inv.Replayed
		w.Header().Set("Location", "/v1/executions/"+v.ID)
		writeJSON(w, http.StatusAccepted, v)
		return
	}
	e, err := s.svc.Wait(r.Context(), p, inv.Execution.ID, s.opts.MaxWait)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	code, v := outcome(e)
	writeJSON(w, code, v)
}

// streamExecution answers POST /v1/executions with Server-Sent Events:
// the events of executionStream, with keep-alive comments while nothing
// happens.
func (s *server) streamExecution(w http.ResponseWriter, r *http.Request, p capability.Principal, req capability.InvokeRequest, opts capability.InvokeOptions) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		s.writeError(w, r, errdefs.Publicf("streaming is not supported by this connection: %w", errdefs.ErrInvalidArgument))
		return
	}
	es, err := s.openStream(r.Context(), p, req, opts)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer es.close()
	s.writeStream(w, r, flusher, es)
}

// executionStream is an execution's events as POST /v1/executions streams
// them, for the event stream and the in-process MCP backend alike:
// approval_required (when a human must decide), started, stdout and
// stderr chunks, then result, or denied when the approver said no. Call
// close when done; closing does not end the execution.
type executionStream struct {
	s        *server
	p        capability.Principal
	id       string
	replayed bool
	events   <-chan capability.StreamEvent
	cancel   func()
	// queued are events to send before the engine's.
	queued []streamEvent
	// done is set once the engine's events have ended: the outcome is
	// next; over once it has been returned.
	done, over bool
	// result, when set, is the result event's data for the execution as
	// it ended (a session's cell); otherwise its wire.Execution.
	result func(ctx context.Context, e model.Execution) any
}

type streamEvent struct {
	name string
	data []byte
}

// openStream admits req and returns its events. An error is the
// admission's (a policy that refuses, too few credits, at capacity).
func (s *server) openStream(ctx context.Context, p capability.Principal, req capability.InvokeRequest, opts capability.InvokeOptions) (*executionStream, error) {
	return s.openAdmitted(ctx, p, opts.ExecutionID, func() (*capability.Invocation, error) { return s.svc.Invoke(ctx, p, req, opts) })
}

// openAdmitted returns the events of the execution admit admits, whose
// id is id (see capability.InvokeOptions.ExecutionID).
func (s *server) openAdmitted(ctx context.Context, p capability.Principal, id string, admit func() (*capability.Invocation, error)) (*executionStream, error) {
	// Subscribing before admitting means not one event of the run is missed.
	events, cancel := s.svc.Subscribe(id)
	inv, err := admit()
	if err != nil {
		cancel()
		return nil, err
	}
	es := &executionStream{s: s, p: p, id: inv.Execution.ID, replayed: inv.Replayed, events: events, cancel: cancel,
		done: inv.Execution.Status.Terminal()}
	if es.id != id { // an idempotent replay of an earlier execution
		cancel()
		es.events, es.cancel = s.svc.Subscribe(es.id)
		// It may have ended before the new subscription.
		e, err := s.svc.Wait(ctx, p, es.id, 0)
		if err != nil {
			es.cancel()
			return nil, err
		}
		es.done = e.Status.Terminal()
	}
	if inv.Approval != nil && inv.Execution.Status == model.StatusAwaitingApproval {
		b, _ := json.Marshal(card(*inv.Approval))
		es.queued = append(es.queued, streamEvent{wire.EventApprovalRequired, b})
	}
	return es, nil
}

// next returns the next event's name and data, and io.EOF after the
// outcome. It waits for the event until ctx ends; at each tick of tick
// (which may be nil) it returns an empty name, a keep-alive.
func (es *executionStream) next(ctx context.Context, tick <-chan time.Time) (string, []byte, error) {
	if len(es.queued) > 0 {
		ev := es.queued[0]
		es.queued = es.queued[1:]
		return ev.name, ev.data, nil
	}
	if es.over {
		return "", nil, io.EOF
	}
	for !es.done {
		select {
		case ev, ok := <-es.events:
			if !ok {
				es.done = true
				continue
			}
			return ev.Type, ev.Data, nil
		case <-tick:
			return "", nil, nil
		case <-ctx.Done():
			return "", nil, ctx.Err()
		}
	}
	es.over = true
	e, err := es.s.svc.Wait(context.WithoutCancel(ctx), es.p, es.id, 0)
	if err != nil {
		// The stream's answer is the error's, as writeError's would be,
		// and its cause is logged with the request's id.
		_, d := Report(ctx, es.s.log, fmt.Errorf("reading the outcome of execution %s: %w", es.id, err))
		b, _ := json.Marshal(wire.ErrorBody{Error: d})
		return wire.EventError, b, nil
	}
	v := viewOf(e)
	v.Replayed = es.replayed
	b, _ := json.Marshal(v)
	if es.result != nil && e.Status != model.StatusDenied {
		b, _ = json.Marshal(es.result(ctx, e))
	}
	if e.Status == model.StatusDenied {
		return wire.EventDenied, b, nil
	}
	return wire.EventResult, b, nil
}

func (es *executionStream) close() error {
	es.cancel()
	return nil
}

func (s *server) getExecution(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	var wait time.Duration
	if v := r.URL.Query().Get("wait"); v != "" {
		d, err := sandbox.ParseDuration(v)
		if err != nil {
			s.writeError(w, r, errdefs.Publicf("wait: %s: %w", err.Error(), errdefs.ErrInvalidArgument))
			return
		}
		wait = d
	}
	v, err := s.execution(r.Context(), p, r.PathValue("id"), wait)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// execution is GET /v1/executions/{id}?wait=: the execution once it has
// ended or wait (at most MaxWait) has passed, with its approval card.
func (s *server) execution(ctx context.Context, p capability.Principal, id string, wait time.Duration) (wire.Execution, error) {
	e, err := s.svc.Wait(ctx, p, id, min(wait, s.opts.MaxWait))
	if err != nil {
		return wire.Execution{}, err
	}
	v := viewOf(e)
	if e.ApprovalID != "" {
		if a, err := s.st.GetApproval(ctx, p.WorkspaceID, e.ApprovalID); err == nil {
			v.Approval = card(a)
		}
	}
	return v, nil
}

func (s *server) decide(approve bool) func(http.ResponseWriter, *http.Request, capability.Principal) {
	return func(w http.ResponseWriter, r *http.Request, p capability.Principal) {
		var body wire.DecisionRequest
		if r.ContentLength != 0 {
			if err := s.decodeBody(w, r, &body); err != nil {
				s.writeError(w, r, err)
				return
			}
		}
		a, e, err := s.svc.Decide(r.Context(), p, r.PathValue("id"), approve, body.Reason)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, wire.Decision{Approval: approvalView(a), Execution: viewOf(e)})
	}
}
