package capability

import (
	"context"
	"fmt"
	"sync"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/clip"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/tools"
)

// egressAudit writes the audit events of the executions' sandboxes: the
// egress proxy's refusals and the broker's calls, from the engine's
// observers, through a queue of its own.
type egressAudit struct {
	*core
	st eventAppender
	// egressEvents carries the egress proxy's refusals and the broker's
	// calls to auditEgress, which writes them until close closes it once
	// no run, and so no proxy or broker, is left (auditClosed, under
	// auditMu, turns later events into log lines).
	egressEvents chan audit.Event
	auditMu      sync.RWMutex
	auditClosed  bool
	auditWriter  sync.WaitGroup
	// runs are the executions running now, by id, for the proxy's and the
	// broker's events.
	runsMu sync.Mutex
	runs   map[string]*runAudit
	// sessions counts the refusals of each session's sandbox, by session
	// id, under runsMu: a session's sandbox lives across its cells, and
	// refuses between them too. cellOf is the cell running in a session,
	// "" when none (sessionHost.runningCell).
	sessions map[string]int
	cellOf   func(session string) string
	// spans counts the egress and broker spans of each session's sandbox,
	// by session id, under runsMu, as runAudit.spans an execution's.
	spans map[string]int
}

// eventAppender appends an event of no grant: a denial, an egress
// refusal, a broker call, a file transfer.
type eventAppender interface {
	AppendEvent(ctx context.Context, e model.NewEvent) (model.Event, error)
}

// start starts the writer of the queued events.
func (s *egressAudit) start() {
	s.auditWriter.Add(1)
	go s.auditEgress()
}

// close closes the queue, once no run is left to add to it, and waits
// until the writer has written what it holds.
func (s *egressAudit) close() {
	s.auditMu.Lock()
	if !s.auditClosed {
		s.auditClosed = true
		close(s.egressEvents)
	}
	s.auditMu.Unlock()
	s.auditWriter.Wait()
}

// runAudit is what the service knows of a running execution for the
// events of its sandbox.
type runAudit struct {
	workspace string
	tier      string // its driver's, for the tier label of its sandbox's decisions
	// refusals counts the execution's refusals (egress proxy and broker);
	// past maxRefusalEvents they are only counted.
	refusals int
	// spans counts its sandbox's egress and broker decisions; past
	// maxDecisionSpans they are only counted (and measured).
	spans int
}

// maxDecisionSpans is how many egress and broker decisions of one
// execution (or session's sandbox) get a span each: a sandbox makes them
// as fast as it resolves names and opens connections, and each span
// carries names the sandbox chose. The rest are measured
// (stockade_phase_duration_seconds) and counted.
const maxDecisionSpans = maxRefusalEvents

// maxRefusalEvents is how many refusals of one execution are audited one
// by one; the rest are counted and audited in one RefusalsSuppressed event
// when the execution ends. A sandbox makes refusals as fast as it opens
// connections, and each would otherwise be a row of the append-only chain
// and a place in the queue every sandbox's events share.
const maxRefusalEvents = 100

// runOf returns the workspace of the running execution exec, and whether
// an event of it is to be audited: refusal says the event is a refusal,
// which counts against maxRefusalEvents.
func (s *egressAudit) runOf(exec string, refusal bool) (workspace string, audited bool) {
	s.runsMu.Lock()
	defer s.runsMu.Unlock()
	r := s.runs[exec]
	if r == nil {
		return "", false
	}
	if refusal {
		r.refusals++
		if r.refusals > maxRefusalEvents {
			return r.workspace, false
		}
	}
	return r.workspace, true
}

// subjectOf returns the execution and the workspace the event of a
// sandbox with labels concerns, and whether it is to be audited (see
// runOf). A session's sandbox (LabelSession) is its workspace's; its
// event is its running cell's, or of no execution between cells, and its
// refusals are counted per session.
func (s *egressAudit) subjectOf(labels map[string]string, refusal bool) (exec, workspace string, audited bool) {
	exec = labels[engine.LabelExecution]
	sid := labels[engine.LabelSession]
	if exec != "" || sid == "" {
		workspace, audited = s.runOf(exec, refusal)
		return exec, workspace, audited
	}
	if s.cellOf != nil {
		exec = s.cellOf(sid)
	}
	workspace = labels[engine.LabelWorkspace]
	if !refusal {
		return exec, workspace, workspace != ""
	}
	s.runsMu.Lock()
	defer s.runsMu.Unlock()
	if s.sessions == nil {
		s.sessions = map[string]int{}
	}
	s.sessions[sid]++
	return exec, workspace, workspace != "" && s.sessions[sid] <= maxRefusalEvents
}

// phaseContext is the context of a decision of the sandbox with labels,
// of tool: under its execution's span (Links), with the tier of its run
// (of tool's record for a session's sandbox) whether tracing is on or
// not; under no span past maxDecisionSpans of the execution (or session)
// (telemetry.Record then only measures it).
func (s *egressAudit) phaseContext(labels map[string]string, tool string) context.Context {
	exec := s.execOf(labels)
	ctx := s.traces.Context(s.ctx, exec)
	s.runsMu.Lock()
	var n int
	if r := s.runs[exec]; r != nil {
		ctx = telemetry.WithTier(ctx, r.tier)
		r.spans++
		n = r.spans
	} else if sid := labels[engine.LabelSession]; sid != "" && labels[engine.LabelExecution] == "" {
		if t, ok := s.toolOf(tool); ok {
			ctx = telemetry.WithTier(ctx, string(t.Tier))
		}
		if s.spans == nil {
			s.spans = map[string]int{}
		}
		s.spans[sid]++
		n = s.spans[sid]
	}
	s.runsMu.Unlock()
	if n > maxDecisionSpans {
		return telemetry.Unlinked(ctx)
	}
	return ctx
}

// execOf is the execution an event of a sandbox with labels belongs to
// (as subjectOf says, without counting it), or "".
func (s *egressAudit) execOf(labels map[string]string) string {
	if exec := labels[engine.LabelExecution]; exec != "" {
		return exec
	}
	if sid := labels[engine.LabelSession]; sid != "" && s.cellOf != nil {
		return s.cellOf(sid)
	}
	return ""
}

// endSession forgets the refusals of session id, of workspace ws, and
// audits those that were only counted, as endRun does for an execution.
func (s *egressAudit) endSession(id, ws string) {
	s.runsMu.Lock()
	n := s.sessions[id] - maxRefusalEvents
	delete(s.sessions, id)
	spans := s.spans[id] - maxDecisionSpans
	delete(s.spans, id)
	s.runsMu.Unlock()
	if spans > 0 {
		s.log.Debug("egress and broker decisions past the traced ones", "session", id, "count", spans)
	}
	if n <= 0 {
		return
	}
	s.log.Info("refusals past the audited ones", "session", id, "count", n)
	s.queueAudit(audit.RefusalsSuppressedEvent{
		Meta: audit.Meta{WorkspaceID: ws, Actor: "system",
			Reason: fmt.Sprintf("%d more refusals of the egress proxy or the broker in session %s, past the first %d, counted but not audited one by one", n, id, maxRefusalEvents)},
		Suppressed: n, Audited: maxRefusalEvents,
	})
}

// egressDecision turns a refusal of the egress proxy into an audit event
// of the execution whose sandbox it concerns (for a session's sandbox:
// its running cell, or none between cells).
func (s *egressAudit) egressDecision(d engine.EgressDecision) {
	outcome := "refused"
	if d.Allowed {
		outcome = "allowed"
	}
	telemetry.Record(s.phaseContext(d.Labels, d.Tool), telemetry.EgressDecision, d.Time, d.Duration, outcome,
		telemetry.Egress(string(d.Protocol), d.Name, d.Port, d.Reason)...)
	if d.Allowed {
		return
	}
	telemetry.EgressRefused(d.Reason)
	exec, ws, audited := s.subjectOf(d.Labels, true)
	if !audited {
		if ws == "" {
			s.log.Info("egress refused outside any running execution", "execution", exec, "sandbox", d.Sandbox,
				"name", clip.String(d.Name, clip.Name), "reason", d.Reason)
		}
		return
	}
	ev := audit.EgressDeniedEvent{
		Meta:    audit.Meta{WorkspaceID: ws, Actor: "system", ExecutionID: exec, Reason: clip.String(d.Reason, clip.Reason)},
		Sandbox: d.Sandbox, Tool: d.Tool, Protocol: string(d.Protocol), Name: clip.String(d.Name, clip.Name), Port: d.Port,
		Detail: clip.String(d.Detail, clip.Detail),
	}
	attrs := []any{"execution", exec, "sandbox", d.Sandbox, "tool", d.Tool, "protocol", d.Protocol, "client", d.Client,
		"name", ev.Name, "port", d.Port, "reason", d.Reason, "detail", ev.Detail}
	if d.Addr.IsValid() {
		ev.Addr = d.Addr.String()
		attrs = append(attrs, "addr", ev.Addr)
	}
	// This is the daemon's one log line per refusal (the proxy's are
	// Debug), bounded per execution as the audit events are.
	s.log.Info("egress refused", attrs...)
	s.queueAudit(ev)
}

// startRun records exec, of workspace ws, running on tier, as running:
// the events of its sandbox are audited from now on.
func (s *egressAudit) startRun(exec, ws, tier string) {
	s.runsMu.Lock()
	s.runs[exec] = &runAudit{workspace: ws, tier: tier}
	s.runsMu.Unlock()
}

// endRun forgets the running execution exec and audits the refusals of it
// that were only counted. Every event of its sandbox has been decided by
// then (Session.Destroy stops its proxy and broker before Run returns).
func (s *egressAudit) endRun(exec string) {
	s.runsMu.Lock()
	r := s.runs[exec]
	delete(s.runs, exec)
	s.runsMu.Unlock()
	if r != nil && r.spans > maxDecisionSpans {
		s.log.Debug("egress and broker decisions past the traced ones", "execution", exec, "count", r.spans-maxDecisionSpans)
	}
	if r == nil || r.refusals <= maxRefusalEvents {
		return
	}
	n := r.refusals - maxRefusalEvents
	s.log.Info("refusals past the audited ones", "execution", exec, "count", n)
	s.queueAudit(audit.RefusalsSuppressedEvent{
		Meta: audit.Meta{WorkspaceID: r.workspace, Actor: "system", ExecutionID: exec,
			Reason: fmt.Sprintf("%d more refusals of the egress proxy or the broker, past the first %d, counted but not audited one by one", n, maxRefusalEvents)},
		Suppressed: n, Audited: maxRefusalEvents,
	})
}

// queueAudit hands ev to the goroutine that writes the proxy's and the
// broker's events. When the queue is full it waits: dropping would let a
// sandbox flood refusals to hide a later broker call from the audit trail,
// and waiting slows down only the connections of sandboxes being refused
// or calling the broker, which the proxy serves one goroutine each. The
// writer runs until every run has ended, so the events of a run cut short
// by Close are written too; after Close an event is only logged.
func (s *egressAudit) queueAudit(ev audit.Event) {
	s.auditMu.RLock()
	defer s.auditMu.RUnlock()
	if s.auditClosed {
		m := ev.Metadata()
		s.log.Warn("service closed; audit event logged only", "type", ev.Type(), "execution", m.ExecutionID, "reason", m.Reason)
		return
	}
	s.egressEvents <- ev
}

// brokerCall turns a call of the credential broker into an audit event of
// the execution that made it: the operation, the hash of its parameters
// (never the parameters or the secret), and the upstream status or the
// reason of the refusal.
func (s *egressAudit) brokerCall(b engine.BrokerEvent) {
	outcome := "refused"
	if b.Allowed {
		outcome = "allowed"
	}
	telemetry.Record(s.phaseContext(b.Labels, b.Tool), telemetry.BrokerCall, b.Time, b.Duration, outcome,
		telemetry.Broker(b.Operation, b.Status)...)
	exec, ws, audited := s.subjectOf(b.Labels, !b.Allowed)
	if !audited {
		if ws == "" {
			s.log.Info("broker call outside any running execution", "execution", exec, "sandbox", b.Sandbox,
				"operation", clip.String(b.Operation, clip.Name), "allowed", b.Allowed)
		}
		return
	}
	op := clip.String(b.Operation, clip.Name)
	s.log.Info("broker call", "execution", exec, "sandbox", b.Sandbox, "tool", b.Tool, "operation", op,
		"allowed", b.Allowed, "status", b.Status, "reason", clip.String(b.Reason, clip.Reason))
	call := audit.BrokerCallEvent{
		Meta:      audit.Meta{WorkspaceID: ws, Actor: "system", ExecutionID: exec, Reason: fmt.Sprintf("operation %s answered %d", op, b.Status)},
		Operation: op, ParamsSHA256: b.ParamsSHA256, Sandbox: b.Sandbox, Status: b.Status, Tool: b.Tool,
	}
	if !b.Allowed {
		// The reason quotes what the sandbox sent (an operation, a
		// parameter); unbounded, it would be too long for the store, and
		// the refusal would go unaudited.
		call.Reason = clip.String(b.Reason, clip.Reason)
		s.queueAudit(audit.BrokerDeniedEvent(call))
		return
	}
	s.queueAudit(call)
}

// auditEgress writes the proxy's and the broker's events until Close
// closes their queue.
func (s *egressAudit) auditEgress() {
	defer s.auditWriter.Done()
	// down is set once an event failed every attempt: the store is down,
	// not busy, and until an event is written again each gets one attempt,
	// or the queue every sandbox shares would crawl (and Close with it).
	down := false
	for e := range s.egressEvents {
		ev := audit.NewEvent(e)
		// A broker call is a use of the operator's credential: its event
		// must not be lost to a store that is busy for a moment.
		pauses := storeRetries
		if down {
			pauses = nil
		}
		err := retryStore(s.log, "auditing egress or broker event", []any{"type", ev.Type, "execution", ev.ExecutionID}, pauses, func() error {
			_, err := s.st.AppendEvent(context.WithoutCancel(s.ctx), ev)
			return err
		})
		// A refusal (an invalid event, say) is the store answering.
		down = err != nil && !errdefs.IsConflict(err) && !errdefs.IsInvalidArgument(err) && !errdefs.IsNotFound(err)
		if err != nil {
			s.log.Error("auditing egress or broker event", "type", ev.Type, "execution", ev.ExecutionID, "err", err)
		}
	}
}

// toolOf is the record of tool, when the audit has an engine to ask (an
// audit tested alone has none).
func (s *egressAudit) toolOf(tool string) (tools.Tool, bool) {
	if s.runner == nil {
		return tools.Tool{}, false
	}
	t, err := s.runner.Tools().Get(tool)
	return t, err == nil
}
