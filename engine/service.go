package engine

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/contract"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/clip"
	"github.com/stockade-sh/stockade/internal/witness"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
)

// Labels put on every sandbox the service starts, so that a restarted
// daemon can find the orphans of a crashed one.
const (
	LabelOwner     = "stockade.owner"
	LabelExecution = "stockade.execution"
)

// ServiceOptions configure the capability layer. Zero fields take the
// documented defaults.
type ServiceOptions struct {
	// CreditsPerInvocation is charged for each invocation that ran; nil
	// means 2, and zero means free (nothing is reserved or charged).
	CreditsPerInvocation *int64
	// ApprovalTTL is how long an approval request stays pending; default 10 min.
	ApprovalTTL time.Duration
	// MaxConcurrent bounds the sandboxes running at once; default 4.
	MaxConcurrent int
	// MaxQueue bounds the invocations waiting for a sandbox slot beyond
	// MaxConcurrent; past it, invocations are refused (429). Zero means
	// 2 x MaxConcurrent; negative means no queue at all.
	MaxQueue int
	// Owner is the value of LabelOwner on this daemon's sandboxes; default
	// "stockade".
	Owner string
	// Witness, if set, is where the heads of the audit chains are
	// witnessed, outside the database: every 10 s and at Close.
	Witness witness.Dir
	// Observer receives metrics; nil means none.
	Observer Observer
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now defaults to time.Now.
	Now func() time.Time
}

// Observer is told about what the service does, for metrics.
type Observer interface {
	Invocation(status store.ExecutionStatus, driver string, ran time.Duration, credits int64)
	ApprovalsPending(delta int)
	// WitnessRefused is told of each audit chain head not witnessed
	// because the chain does not link it to the head witnessed before
	// (witness.NotLinkedError).
	WitnessRefused()
}

// Service is the capability layer: authentication, the policy decision, the
// approval gate, billing, the audit trail, and running through the engine.
// It is safe for concurrent use.
type Service struct {
	eng   *Engine
	st    store.Store
	opts  ServiceOptions
	price int64 // *opts.CreditsPerInvocation
	log   *slog.Logger
	hub   *hub
	feed  *feed
	slots *admission

	drift drift

	closeMu sync.Mutex // orders dispatch's wg.Add before Close's wg.Wait
	closed  bool

	ctx    context.Context // ends when the service closes; runs use it
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// egressEvents carries the egress proxy's refusals and the broker's
	// calls to auditEgress, which writes them until Close closes it once
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
	// live maps each dispatched execution, until its run has ended, to the
	// cancel of its run's context, which Cancel calls with a cancellation.
	liveMu sync.Mutex
	live   map[string]context.CancelCauseFunc

	// claim is the store's daemon claim, taken by Start.
	claim store.DaemonClaim

	// keyUses are the API keys' uses not yet written to the store.
	keyUses keyUses
}

// NewService returns the capability layer over eng and st. Call Start
// before serving and Close when done.
func NewService(eng *Engine, st store.Store, o ServiceOptions) *Service {
	if o.CreditsPerInvocation == nil {
		o.CreditsPerInvocation = new(int64(2))
	}
	if o.ApprovalTTL == 0 {
		o.ApprovalTTL = 10 * time.Minute
	}
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = 4
	}
	switch {
	case o.MaxQueue == 0:
		o.MaxQueue = 2 * o.MaxConcurrent
	case o.MaxQueue < 0:
		o.MaxQueue = 0
	}
	if o.Owner == "" {
		o.Owner = "stockade"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{
		eng: eng, st: st, opts: o, price: *o.CreditsPerInvocation, log: o.Logger, hub: newHub(), feed: newFeed(),
		slots: newAdmission(o.MaxConcurrent, o.MaxQueue), drift: newDrift(),
		ctx: ctx, cancel: cancel,
		egressEvents: make(chan audit.Event, 1024), runs: map[string]*runAudit{}, live: map[string]context.CancelCauseFunc{},
	}
	eng.SetEgressObserver(s.egressDecision)
	eng.SetBrokerObserver(s.brokerCall)
	return s
}

// runAudit is what the service knows of a running execution for the
// events of its sandbox.
type runAudit struct {
	workspace string
	// refusals counts the execution's refusals (egress proxy and broker);
	// past maxRefusalEvents they are only counted.
	refusals int
}

// maxRefusalEvents is how many refusals of one execution are audited one
// by one; the rest are counted and audited in one RefusalsSuppressed event
// when the execution ends. A sandbox makes refusals as fast as it opens
// connections, and each would otherwise be a row of the append-only chain
// and a place in the queue every sandbox's events share.
const maxRefusalEvents = 100

// runOf returns the workspace of the running execution exec, and whether
// an event of it is to be audited: refusal says the event is a refusal,
// which counts against maxRefusalEvents.
func (s *Service) runOf(exec string, refusal bool) (workspace string, audited bool) {
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

// egressDecision turns a refusal of the egress proxy into an audit event
// of the execution whose sandbox it concerns.
func (s *Service) egressDecision(d EgressDecision) {
	if d.Allowed {
		return
	}
	exec := d.Labels[LabelExecution]
	ws, audited := s.runOf(exec, true)
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

// startRun records exec, of workspace ws, as running: the events of its
// sandbox are audited from now on.
func (s *Service) startRun(exec, ws string) {
	s.runsMu.Lock()
	s.runs[exec] = &runAudit{workspace: ws}
	s.runsMu.Unlock()
}

// endRun forgets the running execution exec and audits the refusals of it
// that were only counted. Every event of its sandbox has been decided by
// then (Session.Destroy stops its proxy and broker before Run returns).
func (s *Service) endRun(exec string) {
	s.runsMu.Lock()
	r := s.runs[exec]
	delete(s.runs, exec)
	s.runsMu.Unlock()
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
func (s *Service) queueAudit(ev audit.Event) {
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
func (s *Service) brokerCall(b BrokerEvent) {
	exec := b.Labels[LabelExecution]
	ws, audited := s.runOf(exec, !b.Allowed)
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
func (s *Service) auditEgress() {
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
		err := s.retryStore("auditing egress or broker event", []any{"type", ev.Type, "execution", ev.ExecutionID}, pauses, func() error {
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

type nopObserver struct{}

func (nopObserver) Invocation(store.ExecutionStatus, string, time.Duration, int64) {}
func (nopObserver) ApprovalsPending(int)                                           {}
func (nopObserver) WitnessRefused()                                                {}

// Engine returns the engine the service runs on.
func (s *Service) Engine() *Engine { return s.eng }

// Start claims the store for this daemon (ErrConflict while another daemon
// holds it; Close releases it), recovers from a previous daemon's crash and
// starts the approval expiry loop. Executions left queued or running are
// marked failed with their reservations released, and every sandbox
// labelled with this service's owner is destroyed.
func (s *Service) Start(ctx context.Context) (err error) {
	// Recovery fails every execution it finds running: it must not run
	// while another daemon serves the same database.
	claim, err := s.st.ClaimDaemon(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			claim.Release()
		}
	}()
	result, _ := json.Marshal(map[string]string{"error": "interrupted: the daemon stopped before the execution finished"})
	// Each recovery is audited in its own transaction: no crash can leave
	// one unaudited.
	recovered, err := s.st.RecoverInterrupted(ctx, result, func(store.Execution) []store.NewEvent {
		return audit.NewEvents(audit.ExecutionRecoveredEvent{
			Meta: audit.Meta{Actor: "system", Reason: "execution interrupted by a daemon stop; marked failed, credits released"}})
	})
	if err != nil {
		return fmt.Errorf("recovering interrupted executions: %w", err)
	}
	for name, d := range s.eng.Drivers() {
		r, ok := d.(sandbox.Reaper)
		if !ok {
			continue
		}
		ids, err := r.Reap(ctx, map[string]string{LabelOwner: s.opts.Owner})
		if errdefs.IsUnavailable(err) {
			// A driver whose backend is down has no sandboxes to reap now;
			// it is reaped at the next start that finds it up.
			s.log.Warn("driver unavailable; orphaned sandboxes not reaped", "driver", name, "err", err)
			continue
		}
		if err != nil {
			return fmt.Errorf("destroying orphaned %s sandboxes: %w", name, err)
		}
		if len(ids) > 0 {
			s.log.Info("destroyed orphaned sandboxes", "driver", name, "count", len(ids))
		}
	}
	if len(recovered) > 0 {
		s.log.Info("recovered interrupted executions", "count", len(recovered))
	}
	if err := s.recordTools(ctx); err != nil {
		return err
	}
	if err := s.countPending(ctx); err != nil {
		return err
	}
	s.claim = claim // before expireLoop reads it
	s.wg.Add(1)
	go s.expireLoop()
	s.auditWriter.Add(1)
	go s.auditEgress()
	return nil
}

func (s *Service) countPending(ctx context.Context) error {
	wss, err := s.st.ListWorkspaces(ctx)
	if err != nil {
		return fmt.Errorf("listing workspaces: %w", err)
	}
	n := 0
	for _, ws := range wss {
		req := store.PageRequest{Limit: store.MaxPageLimit}
		for {
			page, err := s.st.ListApprovals(ctx, ws.ID, store.ApprovalFilter{PageRequest: req, Statuses: []store.ApprovalStatus{store.ApprovalPending}})
			if err != nil {
				return fmt.Errorf("counting pending approvals: %w", err)
			}
			n += len(page.Items)
			if page.Next == "" {
				break
			}
			req.Cursor = page.Next
		}
	}
	s.opts.Observer.ApprovalsPending(n)
	return nil
}

// Close stops the expiry loop, cancels running executions, waits for
// them to be recorded and for their sandbox networks to be removed.
func (s *Service) Close() {
	s.closeMu.Lock()
	s.closed = true
	s.closeMu.Unlock()
	s.cancel()
	s.wg.Wait()
	// Errors are logged by the engine; a network left behind is removed at
	// the daemon's next start.
	_ = s.eng.Wait()
	// Every run has ended, and its sandbox's proxy and broker with it
	// (Session.Destroy stops them): no event is on its way any more.
	s.auditMu.Lock()
	if !s.auditClosed {
		s.auditClosed = true
		close(s.egressEvents)
	}
	s.auditMu.Unlock()
	s.auditWriter.Wait()
	s.flushKeyUses(context.Background())
	if s.claim != nil {
		// The last events of this daemon are witnessed too.
		s.witnessChains(context.Background())
		if err := s.claim.Release(); err != nil {
			s.log.Warn("releasing the database's daemon claim", "err", err)
		}
		s.claim = nil // Close may be called again
	}
}

// witnessEvery is how many ticks of expireLoop pass between witnesses of
// the audit chains' heads.
const witnessEvery = 10

func (s *Service) expireLoop() {
	defer s.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for tick := 1; ; tick++ {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			s.expireApprovals(s.ctx)
			s.flushKeyUses(s.ctx)
			if tick%witnessEvery == 0 {
				s.witnessChains(s.ctx)
				s.checkClaim(s.ctx)
			}
		}
	}
}

// checkClaim makes sure the daemon still holds the store's claim, taking it
// again if it was lost, and says so loudly if another daemon took it: that
// daemon's start failed this one's running executions.
func (s *Service) checkClaim(ctx context.Context) {
	if err := s.claim.Check(ctx); err != nil && ctx.Err() == nil {
		s.log.Error("the database's daemon claim is lost: another stockade daemon may serve this database; stop one of them", "err", err)
	}
}

// witnessChains records the head of every audit chain in the witness
// directory. A failure is logged: the chains are witnessed again later. A
// head the chain does not link to the witnessed one is not recorded; it
// is logged and counted at every attempt, for as long as the chain stays
// so: the database was tampered with, or lost commits.
func (s *Service) witnessChains(ctx context.Context) {
	refused, err := s.opts.Witness.RecordAll(ctx, s.st)
	for _, r := range refused {
		s.opts.Observer.WitnessRefused()
		s.log.Error("audit chain not witnessed", "workspace", r.Witnessed.WorkspaceID,
			"witnessed_seq", r.Witnessed.Seq, "broken_seq", r.Broken.Seq, "err", r)
	}
	if err != nil {
		s.log.Error("witnessing the audit chains", "dir", string(s.opts.Witness), "err", err)
	}
}

// expireApprovals ends the approvals whose time is up. The store writes
// each one's approval.expired event in the transaction that expires it, so
// that no crash can leave an expiry unaudited.
func (s *Service) expireApprovals(ctx context.Context) {
	expired, err := s.st.ExpireApprovals(ctx, s.opts.Now(), expiryEvents)
	if err != nil && ctx.Err() == nil {
		s.log.Error("expiring approvals", "err", err)
	}
	// The approvals returned expired for good, even when a later one failed.
	for _, a := range expired {
		s.opts.Observer.ApprovalsPending(-1)
		s.opts.Observer.Invocation(store.StatusApprovalExpired, "", 0, 0)
		s.hub.finish(a.ExecutionID)
		s.feed.publish(Change{Kind: ApprovalExpired, WorkspaceID: a.WorkspaceID, ApprovalID: a.ID, ExecutionID: a.ExecutionID})
	}
}

// expiryEvents is the audit trail of one approval's expiry; the store sets
// the workspace and execution ids.
func expiryEvents(a store.Approval) []store.NewEvent {
	return audit.NewEvents(audit.ApprovalExpiredEvent{
		Meta: audit.Meta{Actor: "system", Reason: "no decision before the approval expired"}, ApprovalID: a.ID})
}

// Principal is an authenticated API key.
type Principal struct {
	KeyID       string
	WorkspaceID string
	Role        store.Role
}

// Authenticate resolves a bearer key. Unknown and revoked keys are
// ErrUnauthenticated.
func (s *Service) Authenticate(ctx context.Context, key string) (Principal, error) {
	if key == "" {
		return Principal{}, fmt.Errorf("missing API key (send Authorization: Bearer KEY): %w", errdefs.ErrUnauthenticated)
	}
	k, err := s.st.LookupAPIKey(ctx, store.HashKey(key))
	if errdefs.IsNotFound(err) {
		return Principal{}, fmt.Errorf("invalid or revoked API key: %w", errdefs.ErrUnauthenticated)
	}
	if err != nil {
		// Anyone may send a key: the answer says nothing of the database
		// (a connection error names its host, user and database).
		s.log.Error("looking up an API key", "err", err)
		if errdefs.IsUnavailable(err) {
			return Principal{}, fmt.Errorf("the API key could not be checked; retry later: %w", errdefs.ErrUnavailable)
		}
		return Principal{}, errors.New("the API key could not be checked")
	}
	s.keyUses.note(k.ID, s.opts.Now())
	return Principal{KeyID: k.ID, WorkspaceID: k.WorkspaceID, Role: k.Role}, nil
}

// InvokeRequest is the body of POST /v1/executions.
type InvokeRequest struct {
	Runtime   string `json:"runtime"`
	Code      string `json:"code"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
	// Network is "deny" (the default) or "allow" (policy.ParseNetwork,
	// which also takes the older "denied" and "allowed").
	Network string `json:"network,omitempty"`
	Stdin   string `json:"stdin,omitempty"`
	// Tool names the tool to run as; empty means the default tool.
	Tool string `json:"tool,omitempty"`
}

// ApprovalCard is what an approver is shown.
type ApprovalCard struct {
	ApprovalID  string `json:"approval_id"`
	ExecutionID string `json:"execution_id"`
	Capability  string `json:"capability"`
	RiskLevel   string `json:"risk_level"`
	Runtime     string `json:"runtime"`
	Code        string `json:"code"`
	// Stdin is what the program reads on its standard input.
	Stdin string `json:"stdin,omitempty"`
	// Network is what the invocation asked for, in the request's words:
	// "allow" or "deny".
	Network string `json:"network"`
	// Tool is the tool the code runs as; EgressAllow and EgressPorts its
	// record's egress allowlist, which an approved network request may
	// reach (empty without network).
	Tool        string   `json:"tool,omitempty"`
	EgressAllow []string `json:"egress_allow,omitempty"`
	EgressPorts []int    `json:"egress_ports,omitempty"`
	// ToolFingerprint identifies the tool's record as the approver sees
	// it; approving is refused once the record has changed.
	ToolFingerprint string    `json:"tool_fingerprint,omitempty"`
	TimeoutMS       int64     `json:"timeout_ms"`
	RequestedBy     string    `json:"requested_by"`
	ExpiresAt       time.Time `json:"expires_at"`
}

// UnmarshalJSON reads a card, also one stored before the card named
// network with the request's words ("network_requested": true).
func (c *ApprovalCard) UnmarshalJSON(b []byte) error {
	type plain ApprovalCard
	var v struct {
		plain
		NetworkRequested *bool `json:"network_requested"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*c = ApprovalCard(v.plain)
	if c.Network == "" && v.NetworkRequested != nil {
		c.Network = policy.NetworkWord(*v.NetworkRequested)
	}
	return nil
}

// Invocation is the outcome of Invoke: the execution as admitted.
type Invocation struct {
	Execution store.Execution
	// Approval is set when the execution waits for a decision.
	Approval *store.Approval
	// Replayed is set when an Idempotency-Key matched an earlier request.
	Replayed bool
}

// InvokeOptions are the parts of an invocation that are not its request body.
type InvokeOptions struct {
	// IdempotencyKey makes a retried request return the first execution;
	// empty means none.
	IdempotencyKey string
	// ExecutionID is the id to give the execution (see NewExecutionID), so
	// that the caller can Subscribe before the run starts; empty lets the
	// store choose one.
	ExecutionID string
}

// NewExecutionID returns a fresh execution id.
func NewExecutionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "ex_" + hex.EncodeToString(b[:])
}

// Invoke admits an invocation: the policy decision (recorded as exactly one
// capability.invoke_allowed or capability.invoke_denied event), the credit
// reservation and tool_calls row (one transaction), and then either the
// approval request or the run, which proceeds in the background. Use Wait
// or Subscribe for the outcome. A retry of an admitted request (the same
// IdempotencyKey and body) is the same request: it returns the first
// execution, Replayed, and is neither decided nor recorded again.
func (s *Service) Invoke(ctx context.Context, p Principal, req InvokeRequest, o InvokeOptions) (*Invocation, error) {
	network, err := policy.ParseNetwork(req.Network)
	if err != nil {
		return nil, err
	}
	if req.TimeoutMS < 0 || req.TimeoutMS > math.MaxInt64/int64(time.Millisecond) {
		return nil, fmt.Errorf("timeout_ms %d is out of range: %w", req.TimeoutMS, errdefs.ErrInvalidArgument)
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	// Shape errors (unknown runtime, empty or oversized code) are the
	// caller's mistakes, not decisions, and are answered before the policy.
	// A tool's record refusing the runtime is a decision (recorded below);
	// other validation errors (a timeout above the tool's limit too) are the
	// caller's mistakes.
	tool, drv, _, verr := s.eng.Validate(Request{Runtime: req.Runtime, Tool: req.Tool, Code: []byte(req.Code), Stdin: []byte(req.Stdin),
		Limits: sandbox.Limits{Timeout: timeout}})
	if verr != nil && !errdefs.IsPermissionDenied(verr) {
		return nil, verr
	}
	// The decision's event fingerprints what was asked to run: a row
	// changed later no longer matches its chain.
	asked := audit.Invocation{Capability: contract.CodeExecute.Name, Runtime: req.Runtime, TimeoutMS: req.TimeoutMS, Network: policy.NetworkWord(network),
		InputSHA256: InputHash(req.Runtime, req.Code), StdinSHA256: sha256Hex([]byte(req.Stdin))}
	deny := func(code, reason string, class error) (*Invocation, error) {
		if _, err := s.st.AppendEvent(ctx, audit.NewEvent(audit.InvokeDeniedEvent{
			Meta: audit.Meta{WorkspaceID: p.WorkspaceID, Actor: p.KeyID, Reason: reason}, Decision: code, Request: asked,
		})); err != nil {
			return nil, fmt.Errorf("recording denial: %w", err)
		}
		return nil, fmt.Errorf("%s: %w", reason, class)
	}
	// The decision is computed here but acted on, and recorded, only once
	// the request is known not to be a retry.
	pol, err := s.st.GetPolicy(ctx, p.WorkspaceID)
	if err != nil {
		return nil, fmt.Errorf("loading workspace policy: %w", err)
	}
	d := policy.Decide(pol, policy.Request{Capability: contract.CodeExecute, Runtime: req.Runtime, Timeout: timeout, Network: network}, s.eng.Ceiling().Timeout)
	if timeout == 0 {
		timeout = min(s.eng.Limits(tool).Timeout, d.MaxTimeout)
	}
	// The request is stored as it came, which a retry must match: the
	// timeout the policy gives one that names none is the approval card's
	// and the run's, and would make a retry under a changed policy look
	// like another request.
	ne := store.NewExecution{
		ID: o.ExecutionID, WorkspaceID: p.WorkspaceID, KeyID: p.KeyID, Runtime: req.Runtime, Tool: tool.Name,
		Request: mustJSON(req), InputSHA256: InputHash(req.Runtime, req.Code), IdempotencyKey: o.IdempotencyKey,
		Credits: s.price,
	}
	if o.IdempotencyKey != "" {
		// A retry was decided with its first request: it must not be
		// refused now (for capacity, or a policy changed since) nor write
		// a second decision event. The same key on another body is a
		// conflict. CreateExecution below still catches a retry that races
		// with its first request.
		adm, err := s.st.ReplayExecution(ctx, ne)
		if err == nil {
			return &Invocation{Execution: adm.Execution, Approval: adm.Approval, Replayed: true}, nil
		}
		if !errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("looking up the idempotency key: %w", err)
		}
	}

	if verr != nil {
		return deny("tool_runtime_not_allowed", strings.TrimSuffix(verr.Error(), ": "+errdefs.ErrPermissionDenied.Error()), errdefs.ErrPermissionDenied)
	}
	if p.Role == store.RoleApprover {
		return deny("role_cannot_invoke", "approver keys cannot invoke capabilities", errdefs.ErrPermissionDenied)
	}
	if !d.Allowed {
		return deny(d.Code, d.Reason, errdefs.ErrPermissionDenied)
	}
	if pol.ToolChanges == store.ToolChangesRequireReview {
		why, err := s.reviewBlocks(ctx, p.WorkspaceID, tool.Name)
		if err != nil {
			return nil, err
		}
		if why != "" {
			return deny("tool_review_required", why, errdefs.ErrPermissionDenied)
		}
	}
	if network {
		// The policy permits network; the tool's record must name where
		// to, this server must be able to enforce it, and a human must
		// approve this invocation whatever the approval default.
		if tool.Egress.None() {
			return deny(policy.DenyNetworkNotPermitted, fmt.Sprintf("network access needs a tool whose record has an egress allowlist; tool %q has none", tool.Name), errdefs.ErrPermissionDenied)
		}
		if !s.eng.EgressAvailable() {
			return deny(policy.DenyNetworkNotPermitted, "network access is not available on this server (egress needs root and nftables)", errdefs.ErrPermissionDenied)
		}
		d.ApprovalRequired = true
	}

	var ticket *ticket
	if !d.ApprovalRequired {
		// A driver that cannot run sandboxes now is a refusal (recorded,
		// nothing reserved), not an execution that fails to launch. (A request waiting for approval meets the driver when it
		// is approved.)
		if hc, ok := drv.(sandbox.HealthChecker); ok {
			if err := hc.Health(ctx); err != nil {
				s.log.Warn("driver unavailable", "driver", drv.Name(), "err", err)
				return deny("driver_unavailable", fmt.Sprintf("the %s sandbox driver is unavailable; retry later", drv.Name()), errdefs.ErrUnavailable)
			}
		}
		if ticket = s.slots.reserve(); ticket == nil {
			return deny("server_at_capacity", fmt.Sprintf("the server is at capacity (%d running, %d queued); retry later", s.opts.MaxConcurrent, s.opts.MaxQueue), errdefs.ErrResourceExhausted)
		}
	}
	events := []audit.Event{audit.InvokeAllowedEvent{Meta: audit.Meta{Actor: p.KeyID, Reason: "allowed by workspace policy"},
		ApprovalRequired: d.ApprovalRequired, Request: asked}}
	if d.ApprovalRequired {
		card := ApprovalCard{
			Capability: contract.CodeExecute.Name, RiskLevel: string(contract.CodeExecute.Risk), Runtime: req.Runtime,
			Code: req.Code, Stdin: req.Stdin, Network: policy.NetworkWord(network), TimeoutMS: timeout.Milliseconds(), RequestedBy: p.KeyID,
			ExpiresAt: s.opts.Now().Add(s.opts.ApprovalTTL).UTC().Truncate(time.Microsecond), Tool: tool.Name,
			ToolFingerprint: tools.Fingerprint(tool),
		}
		why := "high-risk capability needs a human decision"
		if network {
			card.EgressAllow, card.EgressPorts = tool.Egress.Allow, tool.Egress.Ports
			why = "network access needs a human decision"
		}
		ne.Approval = &store.NewApproval{Card: mustJSON(card), ExpiresAt: card.ExpiresAt}
		events = append(events, audit.ApprovalRequestedEvent{Meta: audit.Meta{Actor: p.KeyID, Reason: why}})
	}
	ne.Audit = audit.NewEvents(events...)
	adm, err := s.st.CreateExecution(ctx, ne)
	if err != nil && errdefs.IsUnavailable(err) && ne.ID != "" {
		adm, err = s.admittedAnyway(ctx, p.WorkspaceID, ne.ID, err)
	}
	if err != nil {
		ticket.release()
		if errdefs.IsResourceExhausted(err) {
			return deny("insufficient_credits", fmt.Sprintf("insufficient credits: an invocation costs %d", s.price), errdefs.ErrPaymentRequired)
		}
		return nil, fmt.Errorf("admitting execution: %w", err)
	}
	inv := &Invocation{Execution: adm.Execution, Approval: adm.Approval, Replayed: adm.Replayed}
	switch {
	case adm.Replayed:
		ticket.release()
	case adm.Approval != nil:
		s.opts.Observer.ApprovalsPending(1)
		s.feed.publish(Change{Kind: ApprovalRequested, WorkspaceID: p.WorkspaceID, ApprovalID: adm.Approval.ID, ExecutionID: adm.Execution.ID})
	default:
		s.dispatch(adm.Execution, timeout, ticket)
	}
	return inv, nil
}

// InputHash is the tool_calls input hash: SHA-256 over the runtime and the
// code, separated by a NUL byte.
func InputHash(runtime, code string) string {
	h := sha256.New()
	h.Write([]byte(runtime))
	h.Write([]byte{0})
	h.Write([]byte(code))
	return hex.EncodeToString(h.Sum(nil))
}

// dispatch runs an admitted execution in the background. t is its
// admission ticket; nil takes one that waits for a slot.
func (s *Service) dispatch(e store.Execution, timeout time.Duration, t *ticket) {
	if t == nil {
		t = s.slots.enqueue()
	}
	// After Close nothing starts: the execution stays queued and the next
	// start of the daemon ends it failed, uncharged.
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		t.release()
		return
	}
	ctx, cancel := context.WithCancelCause(s.ctx)
	s.liveMu.Lock()
	s.live[e.ID] = cancel
	s.liveMu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer t.release()
		defer func() {
			s.liveMu.Lock()
			delete(s.live, e.ID)
			s.liveMu.Unlock()
			cancel(nil)
		}()
		s.run(ctx, e, timeout, t)
	}()
}

// run executes one admitted execution, with the timeout it was admitted
// with, and records its outcome. ctx ends when the service closes or the
// execution is cancelled (its cause is then a *cancellation).
func (s *Service) run(ctx context.Context, e store.Execution, timeout time.Duration, t *ticket) {
	finish := func(o store.Outcome) {
		o.ExecutionID = e.ID
		o.Audit = append(o.Audit, audit.NewEvent(s.finishedEvent(o)))
		// Recording must happen even when the service is closing.
		fin, err := s.finishExecution(context.WithoutCancel(ctx), o)
		if err != nil {
			s.log.Error("recording execution outcome", "execution", e.ID, "err", err)
		} else {
			var ran time.Duration
			if !fin.StartedAt.IsZero() {
				ran = fin.FinishedAt.Sub(fin.StartedAt)
			}
			credits := int64(0)
			if o.Status.Charged() && !fin.StartedAt.IsZero() {
				credits = s.price
			}
			s.opts.Observer.Invocation(o.Status, fin.Driver, ran, credits)
		}
		s.hub.finish(e.ID)
		s.feed.publish(Change{Kind: ExecutionFinished, WorkspaceID: e.WorkspaceID, ApprovalID: e.ApprovalID, ExecutionID: e.ID})
	}
	var req InvokeRequest
	if err := json.Unmarshal(e.Request, &req); err != nil {
		finish(store.Outcome{Status: store.StatusLaunchFailed, Result: errorResult(fmt.Errorf("decoding stored request: %w", err))})
		return
	}
	if err := t.wait(ctx); err != nil {
		if c := cancellationOf(ctx); c != nil {
			s.endUnstarted(e, c)
			return
		}
		finish(store.Outcome{Status: store.StatusLaunchFailed, Result: errorResult(err)})
		return
	}
	network, _ := policy.ParseNetwork(req.Network) // checked by Invoke
	s.startRun(e.ID, e.WorkspaceID)
	defer s.endRun(e.ID)
	out := outputChunks{keep: sandbox.DefaultLimits().OutputCap, publish: func(st sandbox.Stream, p []byte) {
		s.hub.publish(e.ID, StreamEvent{Type: st.String(), Data: mustJSON(map[string]string{"data": string(p)})})
	}}
	var (
		driver  string // once the run has started
		started time.Time
	)
	res, err := s.eng.Run(ctx, Request{
		Runtime: req.Runtime, Tool: req.Tool, Code: []byte(req.Code), Stdin: []byte(req.Stdin), Network: network,
		Limits: sandbox.Limits{Timeout: timeout},
		Labels: map[string]string{LabelOwner: s.opts.Owner, LabelExecution: e.ID},
		// Code runs only once its start is recorded: an execution whose
		// start is not in the store would end uncharged.
		OnStart: func(d string) error {
			if _, err := s.st.StartExecution(ctx, e.ID, d); err != nil {
				return err
			}
			driver, started = d, time.Now()
			s.hub.publish(e.ID, StreamEvent{Type: "started", Data: mustJSON(map[string]string{"execution_id": e.ID, "driver": d})})
			s.feed.publish(Change{Kind: ExecutionStarted, WorkspaceID: e.WorkspaceID, ApprovalID: e.ApprovalID, ExecutionID: e.ID})
			return nil
		},
		OnOutput: out.add,
	})
	out.flush()
	c := cancellationOf(ctx)
	if err != nil && driver != "" && ctx.Err() != nil {
		// The daemon stopped, or the execution was cancelled, while the
		// code ran: the run was killed after it launched, and is charged as
		// any launched run, with the output it had made. No exit and no
		// signal was observed: the sandbox was destroyed under the program,
		// which EndedBy says.
		stdout, stderr := out.kept[sandbox.Stdout], out.kept[sandbox.Stderr]
		r := Result{Status: sandbox.StatusKilled, ExitCode: -1, Stdout: string(stdout.data), Stderr: string(stderr.data),
			StdoutTruncated: stdout.truncated, StderrTruncated: stderr.truncated, DurationMS: time.Since(started).Milliseconds(),
			Driver: driver, Runtime: req.Runtime, EndedBy: EndedByShutdown}
		why := "killed: the daemon stopped during the run"
		o := store.Outcome{Status: store.StatusKilled, Driver: driver,
			Stdout: stdout.data, Stderr: stderr.data, StdoutTruncated: stdout.truncated, StderrTruncated: stderr.truncated}
		if c != nil {
			r.EndedBy, why = EndedByCancel, "killed: "+c.Error()
			o.Audit = audit.NewEvents(cancelledEvent(c, store.StatusRunning, store.StatusKilled, s.price, ""))
		}
		o.Result = mustJSON(struct {
			Result
			Error string `json:"error"`
		}{r, why})
		finish(o)
		return
	}
	if err != nil && driver == "" && (c != nil || errdefs.IsConflict(err)) {
		// Cancelled before the code ran: CancelExecution ended it (its
		// start was refused), or ends it now.
		s.endUnstarted(e, c)
		return
	}
	if err != nil {
		// The sandbox did not launch or could not run the code: nothing is
		// charged (the reservation is released).
		finish(store.Outcome{Status: store.StatusLaunchFailed, Result: errorResult(err)})
		return
	}
	exit := res.ExitCode
	o := store.Outcome{
		Status: store.ExecutionStatus(res.Status), Result: mustJSON(res), Driver: res.Driver,
		Stdout: []byte(res.Stdout), Stderr: []byte(res.Stderr),
		StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
	}
	if exit >= 0 {
		o.ExitCode = &exit
	}
	finish(o)
}

// cancellation is the cause of a run's context when its execution is
// cancelled.
type cancellation struct {
	by     string // the cancelling key's id
	reason string
}

func (c *cancellation) Error() string {
	if c.reason == "" {
		return "cancelled by key " + c.by
	}
	return fmt.Sprintf("cancelled by key %s: %s", c.by, c.reason)
}

// cancellationOf returns the cancellation that ended ctx, or nil.
func cancellationOf(ctx context.Context) *cancellation {
	var c *cancellation
	if errors.As(context.Cause(ctx), &c) {
		return c
	}
	return nil
}

// cancelledEvent is the audit event of a cancel of an execution in from,
// which ends in to and is charged credits.
func cancelledEvent(c *cancellation, from, to store.ExecutionStatus, credits int64, approvalID string) audit.ExecutionCancelledEvent {
	return audit.ExecutionCancelledEvent{Meta: audit.Meta{Actor: c.by, Reason: c.Error()},
		From: from, To: to, Credits: credits, ApprovalID: approvalID}
}

// endUnstarted ends an execution whose run stopped before its code ran
// because it was cancelled (c, or nil when its start found it ended).
// CancelExecution has normally ended it already; if its start was recorded
// meanwhile, it ends cancelled here, charged nothing, since no code ran.
func (s *Service) endUnstarted(e store.Execution, c *cancellation) {
	defer s.hub.finish(e.ID)
	ctx := context.WithoutCancel(s.ctx)
	cur, err := s.st.GetExecution(ctx, e.WorkspaceID, e.ID)
	if err != nil || cur.Status.Terminal() || c == nil {
		return
	}
	_, err = s.finishExecution(ctx, store.Outcome{ExecutionID: e.ID, Status: store.StatusCancelled, Result: errorResult(c),
		Audit: audit.NewEvents(cancelledEvent(c, cur.Status, store.StatusCancelled, 0, ""))})
	if err != nil && !errdefs.IsConflict(err) {
		s.log.Error("recording a cancel", "execution", e.ID, "err", err)
		return
	}
	s.opts.Observer.Invocation(store.StatusCancelled, "", 0, 0)
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
func (s *Service) Cancel(ctx context.Context, p Principal, id, reason string) (store.Execution, error) {
	e, err := s.st.GetExecution(ctx, p.WorkspaceID, id)
	if err != nil {
		return e, err
	}
	if e.KeyID != p.KeyID && p.Role != store.RoleAdmin {
		return store.Execution{}, fmt.Errorf("only the key that invoked an execution or an admin key may cancel it: %w", errdefs.ErrPermissionDenied)
	}
	c := &cancellation{by: p.KeyID, reason: reason}
	to, live := e.Status.Cancel()
	if !live {
		return e, nil
	}
	if to == store.StatusCancelled {
		var from store.ExecutionStatus // as the cancel found it
		ex, err := s.st.CancelExecution(ctx, store.Cancellation{WorkspaceID: p.WorkspaceID, ExecutionID: id, By: p.KeyID,
			Reason: reason, Result: errorResult(c), Audit: func(f store.Execution) []store.NewEvent {
				from = f.Status
				closes := "" // the approval request the cancel closes
				if from == store.StatusAwaitingApproval {
					closes = f.ApprovalID
				}
				return audit.NewEvents(cancelledEvent(c, from, store.StatusCancelled, 0, closes))
			}})
		switch {
		case err == nil:
			// A queued execution's run stops waiting for its slot or
			// launching: its start is refused now.
			s.stopRun(id, c)
			if from == store.StatusAwaitingApproval {
				s.opts.Observer.ApprovalsPending(-1)
			}
			s.opts.Observer.Invocation(store.StatusCancelled, "", 0, 0)
			s.hub.finish(id)
			s.feed.publish(Change{Kind: ExecutionFinished, WorkspaceID: p.WorkspaceID, ApprovalID: ex.ApprovalID, ExecutionID: id})
			return ex, nil
		case errdefs.IsConflict(err):
			// It ended meanwhile (decided, expired, cancelled, run).
			return s.st.GetExecution(ctx, p.WorkspaceID, id)
		case !errdefs.IsFailedPrecondition(err):
			return store.Execution{}, err
		}
		// It started meanwhile: it is killed as a running one.
	}
	if !s.stopRun(id, c) {
		// Its run ended since it was read, or it runs on no run of this
		// daemon (another daemon serving the same database, against the
		// daemon claim).
		if e, err = s.st.GetExecution(ctx, p.WorkspaceID, id); err != nil || e.Status.Terminal() {
			return e, err
		}
		return store.Execution{}, fmt.Errorf("execution %s is running, but not on this daemon; retry: %w", id, errdefs.ErrUnavailable)
	}
	return s.Wait(ctx, p, id, cancelWait)
}

// stopRun cancels the run of a dispatched execution with c, and reports
// whether it had one.
func (s *Service) stopRun(id string, c *cancellation) bool {
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
func (s *Service) retryStore(what string, attrs []any, pauses []time.Duration, write func() error) error {
	for i := 0; ; i++ {
		err := write()
		if err == nil || errdefs.IsConflict(err) || errdefs.IsInvalidArgument(err) || errdefs.IsNotFound(err) || i == len(pauses) {
			return err
		}
		s.log.Warn(what+" failed; trying again", append(attrs, "err", err)...)
		time.Sleep(pauses[i])
	}
}

// finishExecution records an outcome, trying again after a transient store
// error: a run whose outcome is not recorded stays "running" with its
// credits reserved until the next start, which then ends it uncharged
// although it ran.
func (s *Service) finishExecution(ctx context.Context, o store.Outcome) (fin store.Execution, err error) {
	err = s.retryStore("recording execution outcome", []any{"execution", o.ExecutionID}, storeRetries, func() error {
		fin, err = s.st.FinishExecution(ctx, o)
		return err
	})
	return fin, err
}

// finishedEvent is the audit event of an execution's end, written with
// it: how it ended, what it was charged, and a fingerprint of the result
// document (which holds the program's output), so that a result changed in
// the database no longer matches the chain.
func (s *Service) finishedEvent(o store.Outcome) audit.ExecutionFinishedEvent {
	ev := audit.ExecutionFinishedEvent{Meta: audit.Meta{Actor: "system", Reason: "execution ended " + string(o.Status)},
		Status: o.Status, Driver: o.Driver, ResultSHA256: sha256Hex(o.Result), ExitCode: o.ExitCode}
	if o.Status.Charged() {
		ev.Credits = s.price
	}
	return ev
}

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func errorResult(err error) json.RawMessage {
	return mustJSON(map[string]string{"error": err.Error()})
}

// Wait returns the execution once it has ended, or after d, whichever comes
// first (d <= 0 returns at once).
func (s *Service) Wait(ctx context.Context, p Principal, id string, d time.Duration) (store.Execution, error) {
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
func (s *Service) Subscribe(id string) (<-chan StreamEvent, func()) {
	sub := s.hub.subscribe(id)
	return sub, func() { s.hub.unsubscribe(id, sub) }
}

// Watch follows the changes of workspace ws's approvals and executions
// (see Change) from now on, for a page that shows them live. The channel is
// closed by cancel, and also when the watcher fell more than a buffer
// behind: it then missed changes, and should read the state it shows from
// the store again and watch anew. Call cancel when done.
func (s *Service) Watch(ws string) (<-chan Change, func()) {
	ch := s.feed.watch(ws)
	return ch, func() { s.feed.drop(ws, ch) }
}

// Decide records an approver's decision. Approving queues the execution to
// run; denying ends it, uncharged. Agent keys get ErrPermissionDenied.
func (s *Service) Decide(ctx context.Context, p Principal, approvalID string, approve bool, reason string) (store.Approval, store.Execution, error) {
	if p.Role != store.RoleApprover && p.Role != store.RoleAdmin {
		return store.Approval{}, store.Execution{}, fmt.Errorf("only approver or admin keys may decide approvals: %w", errdefs.ErrPermissionDenied)
	}
	meta := audit.Meta{Actor: p.KeyID, Reason: reason}
	var decided audit.Event = audit.ApprovalDeniedEvent{Meta: meta, ApprovalID: approvalID}
	var card ApprovalCard // what is approved: read before the decision is made
	if approve {
		decided = audit.ApprovalApprovedEvent{Meta: meta, ApprovalID: approvalID}
		var err error
		if card, err = s.checkStillAllowed(ctx, p, approvalID); err != nil {
			return store.Approval{}, store.Execution{}, err
		}
	}
	a, e, err := s.st.DecideApproval(ctx, store.Decision{
		WorkspaceID: p.WorkspaceID, ApprovalID: approvalID, Approve: approve, DecidedBy: p.KeyID, Reason: reason,
		Audit: audit.NewEvents(decided),
	})
	if err != nil {
		return a, e, err
	}
	s.opts.Observer.ApprovalsPending(-1)
	s.feed.publish(Change{Kind: ApprovalDecided, WorkspaceID: p.WorkspaceID, ApprovalID: a.ID, ExecutionID: e.ID})
	if approve {
		s.dispatch(e, time.Duration(card.TimeoutMS)*time.Millisecond, nil)
	} else {
		s.opts.Observer.Invocation(store.StatusDenied, "", 0, 0)
		s.hub.finish(e.ID)
	}
	return a, e, nil
}

// admittedAnyway looks up execution id after its admission failed with
// err, a store that was unavailable: a commit whose answer was lost (the
// connection cut after COMMIT) admitted it all the same, and it must run
// or wait for its approval, not stay queued with its credits reserved until
// the next start. It returns err when the execution is not there.
func (s *Service) admittedAnyway(ctx context.Context, ws, id string, err error) (store.Admission, error) {
	ex, gerr := s.st.GetExecution(ctx, ws, id)
	if gerr != nil {
		return store.Admission{}, err
	}
	s.log.Warn("admitting an execution failed, but it was admitted", "execution", id, "err", err)
	adm := store.Admission{Execution: ex}
	if ex.ApprovalID != "" {
		a, gerr := s.st.GetApproval(ctx, ws, ex.ApprovalID)
		if gerr != nil {
			return store.Admission{}, err
		}
		adm.Approval = &a
	}
	return adm, nil
}

// checkStillAllowed returns the approval's card, and refuses to approve a
// request that the workspace's policy no longer allows (it changed while
// the request waited), or whose tool record changed since the card was
// made: the approver would approve what no longer runs. Denying such a
// request stays possible.
func (s *Service) checkStillAllowed(ctx context.Context, p Principal, approvalID string) (ApprovalCard, error) {
	var card ApprovalCard
	a, err := s.st.GetApproval(ctx, p.WorkspaceID, approvalID)
	if err != nil {
		return card, err
	}
	if err := json.Unmarshal(a.Card, &card); err != nil {
		return card, fmt.Errorf("reading approval card: %w", err)
	}
	pol, err := s.st.GetPolicy(ctx, p.WorkspaceID)
	if err != nil {
		return card, fmt.Errorf("loading workspace policy: %w", err)
	}
	d := policy.Decide(pol, policy.Request{Capability: contract.CodeExecute, Runtime: card.Runtime,
		Timeout: time.Duration(card.TimeoutMS) * time.Millisecond, Network: card.Network == policy.NetworkAllow}, s.eng.Ceiling().Timeout)
	if !d.Allowed {
		return card, fmt.Errorf("the workspace policy no longer allows this request (%s); deny it: %w", d.Reason, errdefs.ErrConflict)
	}
	if card.ToolFingerprint == "" {
		return card, nil // a card from before fingerprints: nothing to compare
	}
	t, err := s.eng.Tools().Get(card.Tool)
	if err != nil || tools.Fingerprint(t) != card.ToolFingerprint {
		return card, fmt.Errorf("tool %q changed since this request was made; deny it and invoke again: %w", card.Tool, errdefs.ErrConflict)
	}
	return card, nil
}

// Store returns the service's store, for read-only queries.
func (s *Service) Store() store.Store { return s.st }

// Health reports each driver's health: nil for healthy.
func (s *Service) Health(ctx context.Context) map[string]error {
	out := map[string]error{}
	for name, d := range s.eng.Drivers() {
		var err error
		if hc, ok := d.(sandbox.HealthChecker); ok {
			err = hc.Health(ctx)
		}
		out[name] = err
	}
	return out
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
		panic(errors.New("engine: encoding a value of a fixed shape failed: " + err.Error()))
	}
	return b
}
