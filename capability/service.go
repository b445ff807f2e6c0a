package capability

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/internal/witness"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/wire"
)

// ServiceOptions configure the capability layer. Zero fields take the
// configuration's defaults (package config), which Default declares.
type ServiceOptions struct {
	// CreditsPerInvocation is charged for each invocation that ran; nil
	// means config.DefaultCreditsPerInvocation, and zero means free
	// (nothing is reserved or charged).
	CreditsPerInvocation *int64
	// ApprovalTTL is how long an approval request stays pending; zero
	// means config.DefaultApprovalTTL.
	ApprovalTTL time.Duration
	// MaxConcurrent bounds the sandboxes running at once; zero means
	// config.DefaultMaxConcurrent.
	MaxConcurrent int
	// MaxQueue bounds the invocations waiting for a sandbox slot beyond
	// MaxConcurrent; past it, invocations are refused (429). Zero means
	// config.DefaultMaxQueue(MaxConcurrent); negative means no queue at
	// all.
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
	// Snapshots bound the sessions' snapshots and forks.
	Snapshots SnapshotOptions
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now defaults to time.Now.
	Now func() time.Time
}

// Observer is told about what the service does, for metrics.
type Observer interface {
	Invocation(status model.ExecutionStatus, driver string, ran time.Duration, credits int64)
	ApprovalsPending(delta int)
	// WitnessRefused is told of each audit chain head not witnessed
	// because the chain does not link it to the head witnessed before
	// (witness.NotLinkedError).
	WitnessRefused()
}

// core is what the parts of the service share: its options (their
// defaults filled in), the price of a run, its log, the engine it runs on,
// the fan-outs of its changes (hub, feed) and its own context. It has no
// methods: each part does its own work, and calls another part by name.
type core struct {
	opts   ServiceOptions
	price  int64 // *opts.CreditsPerInvocation
	log    *slog.Logger
	runner *engine.Engine
	hub    *hub
	feed   *feed
	// ctx ends when the service closes (cancel); its loops and runs use
	// it.
	ctx    context.Context
	cancel context.CancelFunc
	// traces keeps each admitted execution's span until it ends, so that
	// its later phases join its trace (telemetry.Links).
	traces telemetry.Links
}

// Service is the capability layer: authentication, the policy decision, the
// approval gate, billing, the audit trail, and running on the engine.
// Each change of a grant is a Transition applied by the Journal. It is safe
// for concurrent use.
//
// It is made of parts, one concern each, which share the core; its methods
// hand each call to the part that does it:
//
//	keys       authentication, and the keys' last uses (keys.go)
//	gate       admission: the one path of one-shots, cells and sessions
//	           (claim.go, admit.go, admission.go)
//	approvals  decisions and expiry of approval requests (approvals.go)
//	runs       dispatch, the run of a one-shot, its end, cancel and waiters
//	           (run.go)
//	sessions   opening, ending, pausing, sweeping and adopting sessions
//	           (sessions.go, sessionopen.go, sessionquota.go, pause.go,
//	           sessionsweep.go)
//	cells      a session's cells (cells.go); files: its files
//	           (sessionfiles.go)
//	egress     the audit of the sandboxes' egress and broker calls
//	           (egressaudit.go)
//	tools      the tools' records and their reviews (drift.go)
//	daemon     the claim on the database, recovery at start and the tick
//	           (daemon.go)
type Service struct {
	*core
	keys      *keyring
	gate      *gate
	approvals *approvals
	runs      *runs
	sessions  *sessionHost
	cells     *cells
	files     *sessionFiles
	egress    *egressAudit
	tools     *toolRecords
	daemon    *daemon
	snapshots *snapshots
}

// NewService returns the capability layer over the engine r and st. Call Start
// before serving and Close when done.
func NewService(r *engine.Engine, st store.Store, o ServiceOptions) *Service {
	if o.CreditsPerInvocation == nil {
		o.CreditsPerInvocation = new(int64(config.DefaultCreditsPerInvocation))
	}
	if o.ApprovalTTL == 0 {
		o.ApprovalTTL = config.DefaultApprovalTTL
	}
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = config.DefaultMaxConcurrent()
	}
	switch {
	case o.MaxQueue == 0:
		o.MaxQueue = config.DefaultMaxQueue(o.MaxConcurrent)
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
	c := &core{runner: r, opts: o, price: *o.CreditsPerInvocation, log: o.Logger, hub: newHub(), feed: newFeed(), ctx: ctx, cancel: cancel}
	c.traces.Full = func() {
		c.log.Warn("keeping the spans of too many executions at once; later ones' phases start traces of their own")
	}
	s := &Service{
		core:   c,
		keys:   &keyring{core: c, st: st},
		egress: &egressAudit{core: c, st: st, egressEvents: make(chan audit.Event, 1024), runs: map[string]*runAudit{}},
		tools:  &toolRecords{core: c, st: st, drift: newDrift()},
	}
	s.runs = &runs{core: c, st: st, slots: newAdmission(o.MaxConcurrent, o.MaxQueue), egress: s.egress, live: map[string]context.CancelCauseFunc{}}
	s.gate = &gate{core: c, st: st, runs: s.runs, tools: s.tools}
	s.sessions = &sessionHost{core: c, st: st, runs: s.runs, gate: s.gate, egress: s.egress}
	s.egress.cellOf = s.sessions.runningCell
	s.cells = &cells{core: c, st: st, host: s.sessions, runs: s.runs, gate: s.gate}
	s.files = &sessionFiles{core: c, st: st, host: s.sessions}
	s.approvals = &approvals{core: c, st: st, runs: s.runs, cells: s.cells}
	s.snapshots = &snapshots{core: c, st: st, host: s.sessions}
	s.daemon = &daemon{core: c, st: st, runs: s.runs, sessions: s.sessions, snapshots: s.snapshots, approvals: s.approvals, tools: s.tools, keys: s.keys, egress: s.egress}
	r.SetEgressObserver(s.egress.egressDecision)
	r.SetBrokerObserver(s.egress.brokerCall)
	return s
}

type nopObserver struct{}

func (nopObserver) Invocation(model.ExecutionStatus, string, time.Duration, int64) {}
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
func (s *Service) Start(ctx context.Context) error { return s.daemon.start(ctx) }

// Close ends the sessions whose driver cannot re-attach a sandbox
// (interrupted, with a detail saying so; their sandboxes destroyed: they
// could not outlive the daemon; a destroy unfinished after half the time
// ctx leaves is left to the next start's reap), stops the expiry loop,
// cancels running executions, waits for them to be recorded and for their
// sandbox networks to be removed, then
// ends the sandboxes created ahead for golden restores, makes the
// daemon's last writes (its keys' last uses, the audit chains'
// witness) and releases its claim on the database. ctx bounds the waits
// and the writes; pass one of the caller's own, not a context a signal
// has already ended. When ctx ends before the runs have recorded their
// ends, Close returns its cause and keeps the claim (the runs go on
// recording), and may be called again.
func (s *Service) Close(ctx context.Context) error {
	// Before the runs stop: a cell running in such a session ends with it,
	// killed by the daemon's shutdown. One left active (an error) ends at
	// the next start, as after a crash.
	// They get half the time left (unattachedShare): their sandboxes'
	// destroys must not eat the runs' share.
	if n, err := s.sessions.endUnattached(withDestroyDeadline(ctx, time.Now().Add(unattachedShare(ctx)))); err != nil {
		s.log.Error("ending the sessions whose driver cannot re-attach a sandbox; the next start ends those left", "ended", n, "err", err)
	} else if n > 0 {
		s.log.Info("ended the sessions whose driver cannot re-attach a sandbox", "ended", n)
	}
	if err := s.runs.close(ctx); err != nil {
		return err
	}
	s.daemon.wait()
	// Errors are logged by the engine; a network left behind is removed at
	// the daemon's next start.
	if err := s.runner.Wait(ctx); err != nil && ctx.Err() != nil {
		return err
	}
	// The sandboxes created ahead for golden restores hold no session:
	// they end with the service (a killed daemon's go at the next one's
	// Reattach).
	if err := s.runner.DropReadySlots(ctx); err != nil {
		s.log.Warn("ending the sandboxes created ahead", "err", err)
	}
	// Every run has ended, and its sandbox's proxy and broker with it
	// (Sandbox.Destroy stops them): no event is on its way any more.
	s.egress.close()
	s.daemon.stop(ctx)
	return nil
}

// unattachedBudget bounds the sandbox destroys of the sessions Close ends
// when ctx has no deadline.
const unattachedBudget = 30 * time.Second

// unattachedShare is how long Close lets the sessions it ends destroy
// their sandboxes: half the time ctx leaves, or unattachedBudget.
func unattachedShare(ctx context.Context) time.Duration {
	if by, ok := ctx.Deadline(); ok {
		return time.Until(by) / 2
	}
	return unattachedBudget
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

// Authenticate resolves a bearer key (see keyring.Authenticate).
func (s *Service) Authenticate(ctx context.Context, key string) (Principal, error) {
	return s.keys.Authenticate(ctx, key)
}

// Invoke admits a one-shot invocation, which runs in the background (see
// gate.Invoke).
func (s *Service) Invoke(ctx context.Context, p Principal, req InvokeRequest, o InvokeOptions) (*Invocation, error) {
	return s.gate.Invoke(ctx, p, req, o)
}

// Cancel cancels execution id of p's workspace and returns it as it ended
// (see runs.Cancel).
func (s *Service) Cancel(ctx context.Context, p Principal, id, reason string) (model.Execution, error) {
	return s.runs.Cancel(ctx, p, id, reason)
}

// Wait returns the execution once it has ended, or after d, whichever comes
// first (d <= 0 returns at once).
func (s *Service) Wait(ctx context.Context, p Principal, id string, d time.Duration) (model.Execution, error) {
	return s.runs.Wait(ctx, p, id, d)
}

// Subscribe streams an execution's events as they happen (see
// runs.Subscribe); call cancel when done.
func (s *Service) Subscribe(id string) (<-chan StreamEvent, func()) { return s.runs.Subscribe(id) }

// Watch follows the changes of workspace ws's approvals and executions
// (see runs.Watch); call cancel when done.
func (s *Service) Watch(ws string) (<-chan Change, func()) { return s.runs.Watch(ws) }

// Decide records an approver's decision (see approvals.Decide).
func (s *Service) Decide(ctx context.Context, p Principal, approvalID string, approve bool, reason string) (model.Approval, model.Execution, error) {
	return s.approvals.Decide(ctx, p, approvalID, approve, reason)
}

// Tools lists the tools with their review state for p's workspace.
func (s *Service) Tools(ctx context.Context, p Principal) ([]ToolStatus, error) {
	return s.tools.Tools(ctx, p)
}

// ApproveTool records that p's workspace re-approved a changed tool as it
// is now (see toolRecords.ApproveTool).
func (s *Service) ApproveTool(ctx context.Context, p Principal, name, reason string) (ToolStatus, error) {
	return s.tools.ApproveTool(ctx, p, name, reason)
}

// CreateSession opens a session for p (see sessionHost.CreateSession).
func (s *Service) CreateSession(ctx context.Context, p Principal, req CreateSessionRequest, o CreateSessionOptions) (*Created, error) {
	if req.Snapshot != "" {
		return s.snapshots.StartFromSnapshot(ctx, p, req, o)
	}
	return s.sessions.CreateSession(ctx, p, req, o)
}

// GetSession returns session id of p's workspace: another workspace's
// is ErrNotFound.
func (s *Service) GetSession(ctx context.Context, p Principal, id string) (model.Session, error) {
	return s.sessions.GetSession(ctx, p, id)
}

// ListSessions lists the sessions of p's workspace, newest first.
func (s *Service) ListSessions(ctx context.Context, p Principal, f store.SessionFilter) (store.Page[model.Session], error) {
	return s.sessions.ListSessions(ctx, p, f)
}

// CloseSession ends session id for p (reason closed) and destroys its
// sandbox (see sessionHost.CloseSession).
func (s *Service) CloseSession(ctx context.Context, p Principal, id string) (model.Session, error) {
	return s.sessions.CloseSession(ctx, p, id)
}

// PauseSession pauses session id for p to a checkpoint on disk (see
// sessionHost.PauseSession).
func (s *Service) PauseSession(ctx context.Context, p Principal, id string) (model.Session, error) {
	return s.sessions.PauseSession(ctx, p, id)
}

// ResumeSession resumes paused session id for p from its checkpoint (see
// sessionHost.ResumeSession).
func (s *Service) ResumeSession(ctx context.Context, p Principal, id string) (model.Session, error) {
	return s.sessions.ResumeSession(ctx, p, id)
}

// EndSessions ends every session of the daemon, for a daemon stopped for
// good, and returns how many it ended (see sessionHost.EndSessions).
func (s *Service) EndSessions(ctx context.Context) (int, error) { return s.sessions.EndSessions(ctx) }

// ExecCell admits a cell of session id, which runs in the session's kernel
// in the background (see cells.ExecCell).
func (s *Service) ExecCell(ctx context.Context, p Principal, id string, req CellRequest, o InvokeOptions) (*Invocation, error) {
	return s.cells.ExecCell(ctx, p, id, req, o)
}

// InterruptCell interrupts the running cell of session id and reports
// whether one ran (see cells.InterruptCell).
func (s *Service) InterruptCell(ctx context.Context, p Principal, id string) (bool, error) {
	return s.cells.InterruptCell(ctx, p, id)
}

// PutFile writes what r yields to path in session id's /workspace (see
// sessionFiles.PutFile).
func (s *Service) PutFile(ctx context.Context, p Principal, id, path string, r io.Reader) (FileInfo, error) {
	return s.files.PutFile(ctx, p, id, path, r)
}

// GetFile reads the regular file at path in session id's /workspace (see
// sessionFiles.GetFile).
func (s *Service) GetFile(ctx context.Context, p Principal, id, path string) ([]byte, FileInfo, error) {
	return s.files.GetFile(ctx, p, id, path)
}

// ListFiles lists the directory at path in session id's /workspace.
func (s *Service) ListFiles(ctx context.Context, p Principal, id, path string) ([]sandbox.FileInfo, bool, error) {
	return s.files.ListFiles(ctx, p, id, path)
}

// RemoveFile removes the file, symlink or empty directory at path in
// session id's /workspace, audited (see sessionFiles.RemoveFile).
func (s *Service) RemoveFile(ctx context.Context, p Principal, id, path string) error {
	return s.files.RemoveFile(ctx, p, id, path)
}

// SnapshotSession takes a snapshot of session id for p, leaving it running
// (see snapshots.SnapshotSession), and returns it with the session's
// stall.
func (s *Service) SnapshotSession(ctx context.Context, p Principal, id string, req wire.SnapshotRequest) (model.Snapshot, time.Duration, error) {
	return s.snapshots.SnapshotSession(ctx, p, id, req)
}

// ListSnapshots lists the live snapshots of session id of p's workspace.
func (s *Service) ListSnapshots(ctx context.Context, p Principal, id string) ([]model.Snapshot, error) {
	return s.snapshots.ListSnapshots(ctx, p, id)
}

// DeleteSnapshot deletes snapshot id of p's workspace with its files.
func (s *Service) DeleteSnapshot(ctx context.Context, p Principal, id string) error {
	return s.snapshots.DeleteSnapshot(ctx, p, id)
}

// ForkSession starts req.Count sessions from a snapshot of session id, all
// or none (see snapshots.Fork).
func (s *Service) ForkSession(ctx context.Context, p Principal, id string, req wire.ForkRequest) (*Forked, error) {
	return s.snapshots.Fork(ctx, p, id, req)
}
