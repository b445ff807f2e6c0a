package capability

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/contract"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/witness"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
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
	// Owner is the value of engine.LabelOwner on this daemon's sandboxes; default
	// "stockade".
	Owner string
	// Witness, if set, is where the heads of the audit chains are
	// witnessed, outside the database: every 10 s and at Close.
	Witness witness.Dir
	// Observer receives metrics; nil means none.
	Observer Observer
	// Sessions bound the sessions.
	Sessions SessionOptions
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
// approval gate, billing, the audit trail, and running on the engine.
// Each change of a grant is a Transition applied by the Journal. It is safe
// for concurrent use.
type Service struct {
	runner *engine.Engine
	st     Store
	opts   ServiceOptions
	price  int64 // *opts.CreditsPerInvocation
	log    *slog.Logger
	hub    *hub
	feed   *feed
	slots  *admission

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

	// sessions are the sessions this daemon serves, and trans their
	// transitions' locks (pause.go).
	sessions liveSessions
	trans    transitions
}

// NewService returns the capability layer over the engine r and st. Call Start
// before serving and Close when done.
func NewService(r *engine.Engine, st Store, o ServiceOptions) *Service {
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
	o.Sessions.fill()
	// The service's own context, the parent of its loops and runs: it lives
	// until Close cancels it, not as long as any caller's.
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{
		runner: r, st: st, opts: o, price: *o.CreditsPerInvocation, log: o.Logger, hub: newHub(), feed: newFeed(),
		slots: newAdmission(o.MaxConcurrent, o.MaxQueue), drift: newDrift(),
		ctx: ctx, cancel: cancel,
		egressEvents: make(chan audit.Event, 1024), runs: map[string]*runAudit{}, live: map[string]context.CancelCauseFunc{},
	}
	r.SetEgressObserver(s.egressDecision)
	r.SetBrokerObserver(s.brokerCall)
	return s
}

type nopObserver struct{}

func (nopObserver) Invocation(store.ExecutionStatus, string, time.Duration, int64) {}
func (nopObserver) ApprovalsPending(int)                                           {}
func (nopObserver) WitnessRefused()                                                {}

// Runner returns the engine the service runs on.
func (s *Service) Runner() *engine.Engine { return s.runner }

// Options returns the service's options, with their defaults filled in.
func (s *Service) Options() ServiceOptions { return s.opts }

// Start claims the store for this daemon (ErrConflict while another daemon
// holds it; Close releases it), recovers from a previous daemon's crash and
// starts the approval expiry loop. Executions left queued or running end
// failed with their reservations released, and every sandbox labelled
// with this service's owner is destroyed.
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
	recovered, err := s.recover(ctx)
	if err != nil {
		return fmt.Errorf("recovering interrupted executions: %w", err)
	}
	// Sessions are re-attached before the orphans are reaped: Reap spares
	// the sandboxes Reattach returned.
	if err := s.adoptSessions(ctx); err != nil {
		return err
	}
	for name, d := range s.runner.Drivers() {
		r, ok := d.(sandbox.Reaper)
		if !ok {
			continue
		}
		ids, err := r.Reap(ctx, map[string]string{engine.LabelOwner: s.opts.Owner})
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
	if recovered > 0 {
		s.log.Info("recovered interrupted executions", "count", recovered)
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

// recover ends every execution a previous daemon left queued or running,
// each in a transaction of its own with its execution.recovered event, so
// that no crash can leave a recovery unaudited, and returns how many it
// ended. Executions awaiting approval are left alone: their approval
// requests stay valid across a restart.
func (s *Service) recover(ctx context.Context) (int, error) {
	live, err := s.st.ListLiveExecutions(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range live {
		step, err := Transition(GrantOf(e, nil), Interrupt{At: s.opts.Now()})
		if err != nil {
			return n, err
		}
		if _, err := s.st.Apply(ctx, e.ID, *step.Write); errdefs.IsConflict(err) {
			continue // it ended meanwhile
		} else if err != nil {
			return n, fmt.Errorf("recovering execution %s: %w", e.ID, err)
		}
		n++
	}
	return n, nil
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
	_ = s.runner.Wait()
	// Every run has ended, and its sandbox's proxy and broker with it
	// (Session.Destroy stops them): no event is on its way any more.
	s.auditMu.Lock()
	if !s.auditClosed {
		s.auditClosed = true
		close(s.egressEvents)
	}
	s.auditMu.Unlock()
	s.auditWriter.Wait()
	// Close takes no ctx, and the service's own is cancelled above: the
	// last writes of this daemon (key uses, the chains' witness) run
	// without a bound until Close takes one.
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
			s.sweepSessions(s.ctx)
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

// expireApprovals ends the approvals whose time is up, each with its
// approval.expired event in the transaction that expires it, so that no
// crash can leave an expiry unaudited.
func (s *Service) expireApprovals(ctx context.Context) {
	now := s.opts.Now()
	due, err := s.st.ListDueApprovals(ctx, now)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("expiring approvals", "err", err)
		}
		return
	}
	for _, a := range due {
		err := s.expire(ctx, a, now)
		if err != nil && ctx.Err() == nil {
			s.log.Error("expiring approvals", "approval", a.ID, "err", err)
		}
		if err != nil {
			return
		}
	}
}

// expire ends the execution of approval a, due at now. One that was
// decided or cancelled since it was listed is left alone.
func (s *Service) expire(ctx context.Context, a store.Approval, now time.Time) error {
	e, err := s.st.GetExecution(ctx, a.WorkspaceID, a.ExecutionID)
	if err != nil {
		return err
	}
	step, err := Transition(GrantOf(e, &a), Expire{At: now})
	if errdefs.IsConflict(err) {
		return nil
	}
	if err != nil {
		return err
	}
	ex, err := s.st.Apply(ctx, e.ID, *step.Write)
	if errdefs.IsConflict(err) {
		return nil
	}
	if err != nil {
		return err
	}
	s.notify(step, ex)
	return nil
}

// Authenticate resolves a bearer key. Unknown and revoked keys are
// ErrUnauthenticated.
func (s *Service) Authenticate(ctx context.Context, key string) (Principal, error) {
	if key == "" {
		return Principal{}, errdefs.Publicf("missing API key (send Authorization: Bearer KEY): %w", errdefs.ErrUnauthenticated)
	}
	k, err := s.st.LookupAPIKey(ctx, store.HashKey(key))
	if errdefs.IsNotFound(err) {
		return Principal{}, errdefs.Publicf("invalid or revoked API key: %w", errdefs.ErrUnauthenticated)
	}
	if err != nil {
		// Anyone may send a key: the answer says nothing of the database
		// (a connection error names its host, user and database). The
		// message is not public: the API answers its class's sentence and
		// logs it.
		return Principal{}, fmt.Errorf("looking up an API key: %w", err)
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
	ToolFingerprint string `json:"tool_fingerprint,omitempty"`
	// SessionID and Cell name a session's cell; CoversSession says that
	// approving it approves the session's later cells too (per_session).
	SessionID     string    `json:"session_id,omitempty"`
	Cell          int       `json:"cell,omitempty"`
	CoversSession bool      `json:"covers_session,omitempty"`
	TimeoutMS     int64     `json:"timeout_ms"`
	RequestedBy   string    `json:"requested_by"`
	ExpiresAt     time.Time `json:"expires_at"`
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
		return nil, errdefs.Publicf("timeout_ms %d is out of range: %w", req.TimeoutMS, errdefs.ErrInvalidArgument)
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	// Shape errors (unknown runtime, empty or oversized code) are the
	// caller's mistakes, not decisions, and are answered before the policy.
	// A tool's record refusing the runtime is a decision (recorded below);
	// other validation errors (a timeout above the tool's limit too) are the
	// caller's mistakes.
	tool, drv, _, verr := s.runner.Validate(engine.Request{Runtime: req.Runtime, Tool: req.Tool, Code: []byte(req.Code), Stdin: []byte(req.Stdin),
		Limits: sandbox.Limits{Timeout: timeout}})
	if verr != nil && !errdefs.IsPermissionDenied(verr) {
		return nil, verr
	}
	// The decision is computed here but acted on, and recorded, only once
	// the request is known not to be a retry.
	pol, err := s.st.GetPolicy(ctx, p.WorkspaceID)
	if err != nil {
		return nil, fmt.Errorf("loading workspace policy: %w", err)
	}
	d := policy.Decide(pol, policy.Request{Capability: contract.CodeExecute, Runtime: req.Runtime, Timeout: timeout, Network: network}, s.runner.Ceiling().Timeout)
	if timeout == 0 {
		timeout = min(s.runner.Limits(tool).Timeout, d.MaxTimeout)
	}
	// The request is stored as it came, which a retry must match: the
	// timeout the policy gives one that names none is the approval card's
	// and the run's, and would make a retry under a changed policy look
	// like another request.
	ne := store.NewExecution{
		ID: o.ExecutionID, WorkspaceID: p.WorkspaceID, KeyID: p.KeyID, Runtime: req.Runtime, Tool: tool.Name,
		Request: mustJSON(req), InputSHA256: InputHash(req.Runtime, req.Code), IdempotencyKey: o.IdempotencyKey,
	}
	if o.IdempotencyKey != "" && mayInvoke(p) {
		// A retry was decided with its first request: it must not be
		// refused now (for capacity, or a policy changed since) nor write
		// a second decision event. The same key on another body is a
		// conflict. Admit below still catches a retry that races with its
		// first request. Idempotency keys are the API key's own (the
		// store's scope), and a key whose role may not invoke is refused
		// below before any replay.
		adm, err := s.st.ReplayExecution(ctx, ne)
		if err == nil {
			return &Invocation{Execution: adm.Execution, Approval: adm.Approval, Replayed: true}, nil
		}
		if !errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("looking up the idempotency key: %w", err)
		}
	}

	in := Admit{By: p, Policy: d, Network: network, Tool: tool.Name, ToolEgress: !tool.Egress.None(),
		EgressAvailable: s.runner.EgressAvailable(), Price: s.price, At: s.opts.Now(),
		// The decision's event fingerprints what was asked to run: a row
		// changed later no longer matches its chain.
		Asked: audit.Invocation{Capability: contract.CodeExecute.Name, Runtime: req.Runtime, TimeoutMS: req.TimeoutMS,
			Network: policy.NetworkWord(network), InputSHA256: ne.InputSHA256, StdinSHA256: sha256Hex([]byte(req.Stdin))}}
	if verr != nil {
		in.ToolRefusal = strings.TrimSuffix(verr.Error(), ": "+errdefs.ErrPermissionDenied.Error())
	}
	if pol.ToolChanges == store.ToolChangesRequireReview {
		if in.ReviewPending, err = s.reviewBlocks(ctx, p.WorkspaceID, tool.Name); err != nil {
			return nil, err
		}
	}
	if d.ApprovalRequired || network {
		card := ApprovalCard{
			Capability: contract.CodeExecute.Name, RiskLevel: string(contract.CodeExecute.Risk), Runtime: req.Runtime,
			Code: req.Code, Stdin: req.Stdin, Network: policy.NetworkWord(network), TimeoutMS: timeout.Milliseconds(), RequestedBy: p.KeyID,
			ExpiresAt: in.At.Add(s.opts.ApprovalTTL).UTC().Truncate(time.Microsecond), Tool: tool.Name,
			ToolFingerprint: tools.Fingerprint(tool),
		}
		if network {
			card.EgressAllow, card.EgressPorts = tool.Egress.Allow, tool.Egress.Ports
		}
		in.Card, in.ExpiresAt = mustJSON(card), card.ExpiresAt
	}
	step, err := Transition(Grant{Kind: OneShot}, in)
	if err != nil {
		return nil, err
	}
	if step.Write == nil {
		return s.deny(ctx, step)
	}
	var t *ticket
	if step.To == Approved {
		// A driver that cannot run sandboxes now is a refusal (recorded,
		// nothing reserved), not an execution that fails to launch. (A
		// request waiting for approval meets the driver when it is
		// approved.)
		if hc, ok := drv.(sandbox.HealthChecker); ok {
			if err := hc.Health(ctx); err != nil {
				s.log.Warn("driver unavailable", "driver", drv.Name(), "err", err)
				return s.refuse(ctx, in, "driver_unavailable", fmt.Sprintf("the %s sandbox driver is unavailable; retry later", drv.Name()), errdefs.ErrUnavailable)
			}
		}
		// Before the host runs out of memory, rather than let its OOM
		// killer choose.
		mem, err := s.reserveMemory(engine.Request{Runtime: req.Runtime, Tool: req.Tool, Network: network, Limits: sandbox.Limits{Timeout: timeout}})
		if err != nil {
			s.log.Warn("memory budget taken", "err", err)
			return s.refuse(ctx, in, "memory_exhausted", "the server's sandboxes hold all the memory it may give them (memory_budget); retry later", errdefs.ErrResourceExhausted)
		}
		if t = s.slots.reserve(); t == nil {
			mem.Release()
			return s.refuse(ctx, in, "server_at_capacity", fmt.Sprintf("the server is at capacity (%d running, %d queued); retry later", s.opts.MaxConcurrent, s.opts.MaxQueue), errdefs.ErrResourceExhausted)
		}
		t.mem = mem
	}
	adm, err := s.st.Admit(ctx, ne, *step.Write)
	if err != nil && errdefs.IsUnavailable(err) && ne.ID != "" {
		adm, err = s.admittedAnyway(ctx, p.WorkspaceID, ne.ID, err)
	}
	if err != nil {
		t.release()
		if errdefs.IsResourceExhausted(err) {
			return s.refuse(ctx, in, "insufficient_credits", fmt.Sprintf("insufficient credits: an invocation costs %d", s.price), errdefs.ErrPaymentRequired)
		}
		return nil, fmt.Errorf("admitting execution: %w", err)
	}
	inv := &Invocation{Execution: adm.Execution, Approval: adm.Approval, Replayed: adm.Replayed}
	switch {
	case adm.Replayed:
		t.release()
	case step.Next.Dispatch:
		s.dispatch(adm.Execution, timeout, t)
	default:
		s.notify(step, adm.Execution)
	}
	return inv, nil
}

// refuse denies the request in, which the rules allowed, for a refusal
// the service met carrying its admission out.
func (s *Service) refuse(ctx context.Context, in Admit, code, reason string, class error) (*Invocation, error) {
	in.Refusal = &Refusal{Code: code, Reason: reason, Class: class}
	step, err := Transition(Grant{Kind: OneShot}, in)
	if err != nil {
		return nil, err
	}
	return s.deny(ctx, step)
}

// deny records the denial step and answers with its refusal.
func (s *Service) deny(ctx context.Context, step Step) (*Invocation, error) {
	for _, ev := range step.Events {
		if _, err := s.st.AppendEvent(ctx, audit.NewEvent(ev)); err != nil {
			return nil, fmt.Errorf("recording denial: %w", err)
		}
	}
	return nil, step.Refusal
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
	return s.cancelAs(ctx, p, p.WorkspaceID, id, reason)
}

// cancelAs is Cancel of execution id of workspace ws by p, which is the zero
// Principal for the daemon's own.
func (s *Service) cancelAs(ctx context.Context, p Principal, ws, id, reason string) (store.Execution, error) {
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
			return store.Execution{}, err
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
			return store.Execution{}, err
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
		return store.Execution{}, errdefs.Publicf("execution %s is running, but not on this daemon; retry: %w", id, errdefs.ErrUnavailable)
	}
	return s.Wait(ctx, Principal{WorkspaceID: ws}, id, cancelWait)
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
	// An agent key is refused before anything is read.
	if err := mayDecide(p); err != nil {
		return store.Approval{}, store.Execution{}, err
	}
	a, err := s.st.GetApproval(ctx, p.WorkspaceID, approvalID)
	if err != nil {
		return a, store.Execution{}, err
	}
	var in Input = Deny{By: p, Reason: reason, At: s.opts.Now()}
	var card ApprovalCard // what is approved: read before the decision is made
	if approve {
		var stale string
		if card, stale, err = s.stillAllowed(ctx, p, a); err != nil {
			return store.Approval{}, store.Execution{}, err
		}
		in = Approve{By: p, Reason: reason, Stale: stale, At: s.opts.Now()}
	}
	e, err := s.st.GetExecution(ctx, p.WorkspaceID, a.ExecutionID)
	if err != nil {
		return a, e, err
	}
	g := GrantOf(e, &a)
	if e.SessionID != "" {
		// A cell: its session's mode says whether approving it covers the
		// session's later cells.
		ss, err := s.st.GetSession(ctx, p.WorkspaceID, e.SessionID)
		if err != nil {
			return a, e, err
		}
		g = GrantOfCell(e, &a, ss)
	}
	step, err := Transition(g, in)
	if err != nil {
		return store.Approval{}, store.Execution{}, err
	}
	if e, err = s.st.Apply(ctx, e.ID, *step.Write); err != nil {
		return store.Approval{}, store.Execution{}, err
	}
	if a, err = s.st.GetApproval(ctx, p.WorkspaceID, approvalID); err != nil {
		return a, e, err
	}
	s.notify(step, e)
	if step.Next.Dispatch {
		s.dispatchApproved(ctx, e, time.Duration(card.TimeoutMS)*time.Millisecond)
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

// stillAllowed returns approval a's card and, when it can no longer be
// approved, why: the workspace's policy no longer allows the request (it
// changed while the request waited), or the tool's record changed since
// the card was made, so that the approver would approve what no longer
// runs. Denying such a request stays possible.
func (s *Service) stillAllowed(ctx context.Context, p Principal, a store.Approval) (ApprovalCard, string, error) {
	var card ApprovalCard
	if err := json.Unmarshal(a.Card, &card); err != nil {
		return card, "", fmt.Errorf("reading approval card: %w", err)
	}
	pol, err := s.st.GetPolicy(ctx, p.WorkspaceID)
	if err != nil {
		return card, "", fmt.Errorf("loading workspace policy: %w", err)
	}
	d := policy.Decide(pol, policy.Request{Capability: contract.CodeExecute, Runtime: card.Runtime,
		Timeout: time.Duration(card.TimeoutMS) * time.Millisecond, Network: card.Network == policy.NetworkAllow}, s.runner.Ceiling().Timeout)
	if !d.Allowed {
		return card, fmt.Sprintf("the workspace policy no longer allows this request (%s); deny it", d.Reason), nil
	}
	if card.ToolFingerprint == "" {
		return card, "", nil // a card from before fingerprints: nothing to compare
	}
	t, err := s.runner.Tools().Get(card.Tool)
	if err != nil || tools.Fingerprint(t) != card.ToolFingerprint {
		return card, fmt.Sprintf("tool %q changed since this request was made; deny it and invoke again", card.Tool), nil
	}
	return card, "", nil
}

// Health reports each driver's health: nil for healthy.
func (s *Service) Health(ctx context.Context) map[string]error {
	out := map[string]error{}
	for name, d := range s.runner.Drivers() {
		var err error
		if hc, ok := d.(sandbox.HealthChecker); ok {
			err = hc.Health(ctx)
		}
		out[name] = err
	}
	return out
}
