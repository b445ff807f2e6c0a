// Package store is the persistence contract of Stockade's capability layer:
// workspaces, API keys, workspace policy, credits, executions with their
// tool_calls and tool_invocations rows, approval requests, and the
// tamper-evident audit trail. It holds interfaces and types only; the
// implementations live in store/sqlite (embedded, the default) and
// store/postgres, and both pass the one suite in store/storetest.
//
// The capability layer (package capability) decides each transition of an
// execution and the Journal applies it in one transaction, so that nothing
// above the store needs a transaction of its own:
//
//	adm, err := st.Admit(ctx, store.NewExecution{WorkspaceID: ws.ID, KeyID: key.ID,
//		Runtime: "python", Tool: "code.execute", Request: req, InputSHA256: sum}, step)
//	if errdefs.IsResourceExhausted(err) { ... answer 402 ... }
//	ex, err := st.Apply(ctx, adm.Execution.ID, next) // ErrConflict: another step won
//
// Consumers declare the few methods they use where they use them; Store
// is the contract every implementation fulfils, which the suite in
// store/storetest checks.
//
// Every error a Store returns wraps one of the classes in errdefs. Stored
// times are UTC with microsecond precision: a time handed to a Store comes
// back truncated to the microsecond. Methods that take a workspace id scope
// their reads to it (another workspace's record is ErrNotFound); list
// methods return an empty page for an unknown workspace.
package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"
)

// Store is the whole persistence layer, as an implementation provides it.
// Implementations are safe for concurrent use by many goroutines and,
// where the backend allows, many processes (the daemon and the admin CLI
// share one database). No consumer takes it whole: each declares the
// methods it uses; only what opens a store (internal/storeopen, and the
// tests' harnesses that wire a daemon as `stockade serve` does) holds it.
type Store interface {
	Workspaces
	Keys
	Policies
	Ledger
	Executions
	Approvals
	Journal
	Sessions
	Audit
	AnalyticsOutbox

	// ClaimDaemon takes the database's daemon claim, held until it is
	// released or the process ends. A database is served by one daemon at
	// a time: a daemon that starts fails the executions it finds running,
	// which would be another daemon's live ones. A claim held elsewhere is
	// ErrConflict. The admin commands, which share the database with the
	// daemon, take no claim.
	ClaimDaemon(ctx context.Context) (DaemonClaim, error)

	// Close releases the database handles. The Store must not be used after.
	Close() error
}

// DaemonClaim is a database's daemon claim (Store.ClaimDaemon).
type DaemonClaim interface {
	// Check reports whether the claim is still held. One that was lost
	// without the daemon releasing it (PostgreSQL's lock lives on a
	// connection, which a server restart or a proxy ends) is taken again;
	// ErrConflict means another daemon took it meanwhile.
	Check(ctx context.Context) error
	// Release gives the claim up.
	Release() error
}

// Workspaces is the tenancy root. Every other record belongs to one.
type Workspaces interface {
	// CreateWorkspace creates a workspace with DefaultPolicy, a zero credit
	// balance and an audit chain that starts with the events audit (if not
	// nil) returns for it, appended in the same transaction. A name already
	// taken is ErrConflict; an empty or over-long name, or an invalid event,
	// is ErrInvalidArgument.
	CreateWorkspace(ctx context.Context, name string, audit func(Workspace) []NewEvent) (Workspace, error)
	// GetWorkspace returns ErrNotFound for an unknown id.
	GetWorkspace(ctx context.Context, id string) (Workspace, error)
	// GetWorkspaceByName returns ErrNotFound for an unknown name.
	GetWorkspaceByName(ctx context.Context, name string) (Workspace, error)
	// ListWorkspaces returns every workspace ordered by name.
	ListWorkspaces(ctx context.Context) ([]Workspace, error)
}

// Keys stores API keys as SHA-256 hashes; the key itself never reaches the
// store.
type Keys interface {
	// CreateAPIKey records a key's hash. An unknown workspace is ErrNotFound,
	// a hash already recorded is ErrConflict, an unknown role is
	// ErrInvalidArgument.
	CreateAPIKey(ctx context.Context, k NewAPIKey) (APIKey, error)
	// LookupAPIKey finds the active key with the given hash. Unknown and
	// revoked keys are both ErrNotFound, so an authenticator cannot
	// accidentally accept a revoked key.
	LookupAPIKey(ctx context.Context, hash KeyHash) (APIKey, error)
	// GetAPIKey returns the key with the given id, revoked or not. An
	// unknown id is ErrNotFound.
	GetAPIKey(ctx context.Context, keyID string) (APIKey, error)
	// ListAPIKeys returns a workspace's keys, revoked ones included, oldest
	// first.
	ListAPIKeys(ctx context.Context, workspaceID string) ([]APIKey, error)
	// RevokeAPIKey revokes a key of the workspace and appends the events
	// audit (if not nil) returns for the key as revoked, in the same
	// transaction. Revoking a revoked key succeeds, keeps the first
	// revocation time and appends nothing; an unknown key (or one of
	// another workspace) is ErrNotFound.
	RevokeAPIKey(ctx context.Context, workspaceID, keyID string, audit func(APIKey) []NewEvent) error
	// RecordKeyUses sets the last use of each key in uses (by id) to its
	// time, where that is later than the one stored. Unknown ids are
	// skipped. Uses are recorded after the fact, in batches, so that
	// authenticating writes nothing.
	RecordKeyUses(ctx context.Context, uses map[string]time.Time) error
}

// Policies holds each workspace's policy record. The store keeps what it is
// given; deciding what a policy allows is the policy package's job.
type Policies interface {
	// GetPolicy returns ErrNotFound for an unknown workspace.
	GetPolicy(ctx context.Context, workspaceID string) (Policy, error)
	// SetPolicy replaces the workspace's policy whole and returns it as
	// stored (normalised, with UpdatedAt set). Unknown enum values and a
	// negative MaxTimeout are ErrInvalidArgument. audit, when not nil,
	// gives the events to append for the policy as stored, in the same
	// transaction.
	SetPolicy(ctx context.Context, workspaceID string, p Policy, audit func(Policy) []NewEvent) (Policy, error)
}

// Ledger is the credit account of each workspace. A reservation (taken by
// Journal.Admit) moves credits from Available to Reserved; committing it
// charges them for good, releasing it returns them to Available (both done
// by the Journal.Apply that ends the execution). Available and Reserved can
// never go negative, and every movement is a LedgerEntry, so that at all
// times
//
//	sum(grant) - sum(commit) == Available + Reserved.
type Ledger interface {
	// GrantCredits adds amount (> 0, else ErrInvalidArgument) to the
	// workspace's available credits, and appends the audit events (which
	// may be none) in the same transaction.
	GrantCredits(ctx context.Context, workspaceID string, amount int64, note string, audit []NewEvent) (Credits, error)
	// GetCredits returns ErrNotFound for an unknown workspace.
	GetCredits(ctx context.Context, workspaceID string) (Credits, error)
	// ListLedger pages through a workspace's ledger, newest first.
	ListLedger(ctx context.Context, workspaceID string, p PageRequest) (Page[LedgerEntry], error)
}

// Executions reads invocations of code.execute and their tool_calls and
// tool_invocations rows, which the Journal writes.
type Executions interface {
	// ReplayExecution answers a retried request without admitting anything:
	// when e.IdempotencyKey names an execution the workspace already has, it
	// returns what Admit would for the retry (the execution with its
	// reservation and approval, Replayed set), or ErrConflict if its
	// InputSHA256 or Request differs. It writes nothing and reads only e's
	// WorkspaceID, IdempotencyKey, InputSHA256 and Request; an empty or
	// unknown key is ErrNotFound. A caller checks it before deciding
	// anything, so that a retry is never decided twice; Admit still replays
	// a retry that races with its first request.
	ReplayExecution(ctx context.Context, e NewExecution) (Admission, error)
	// GetExecution returns ErrNotFound for an unknown id or one of another
	// workspace.
	GetExecution(ctx context.Context, workspaceID, executionID string) (Execution, error)
	// ListExecutions pages through a workspace's executions, newest first.
	ListExecutions(ctx context.Context, workspaceID string, f ExecutionFilter) (Page[Execution], error)
	// ListLiveExecutions returns every queued or running execution of
	// every workspace, oldest first: what a daemon that starts finds
	// interrupted by the one before it.
	ListLiveExecutions(ctx context.Context) ([]Execution, error)

	// GetToolCall returns the tool_calls row of an execution, or ErrNotFound.
	GetToolCall(ctx context.Context, workspaceID, executionID string) (ToolCall, error)
	// ListToolCalls pages through a workspace's tool_calls rows, newest first.
	ListToolCalls(ctx context.Context, workspaceID string, f ToolCallFilter) (Page[ToolCall], error)
	// ListToolInvocations pages through a workspace's analytics rows, newest
	// first; f filters on their time and status likewise.
	ListToolInvocations(ctx context.Context, workspaceID string, f ToolCallFilter) (Page[ToolInvocation], error)
}

// Approvals reads approval requests, which the Journal creates and closes.
type Approvals interface {
	// GetApproval returns ErrNotFound for an unknown id or one of another
	// workspace.
	GetApproval(ctx context.Context, workspaceID, approvalID string) (Approval, error)
	// ListApprovals pages through a workspace's approvals, newest first.
	ListApprovals(ctx context.Context, workspaceID string, f ApprovalFilter) (Page[Approval], error)
	// ListDueApprovals returns every pending approval of every workspace
	// whose ExpiresAt is not after now, the earliest expiry first.
	ListDueApprovals(ctx context.Context, now time.Time) ([]Approval, error)
}

// Journal applies the transitions of executions, each in one transaction:
// the capability layer decides a Step (package capability), the journal
// writes it whole or not at all. It keeps only the integrity of what it
// writes: the compare-and-set on the execution's status, the balance
// check of a reservation, the approval request's being pending when a
// step changes it, and the records a step must leave consistent (a
// tool_calls row that mirrors the execution, a reservation settled when
// the execution ends, a tool_invocations row for every execution that
// ended). Who may do what, and what it costs, is not its business.
type Journal interface {
	// Admit creates an execution and applies its first step s in one
	// transaction: the execution in s.To (queued, or awaiting_approval
	// with the approval request s.Approval creates), its tool_calls row,
	// the reservation s.Credits makes (LedgerReserve, or none) and the
	// events s.Audit. s.From is not read; s.At, when set, is the
	// execution's creation time.
	//
	// A short balance is ErrResourceExhausted and leaves nothing behind.
	// When e.IdempotencyKey names an execution the workspace already has,
	// nothing is written and the existing execution comes back with
	// Replayed set; if its InputSHA256 or Request differs, the retry is
	// ErrConflict. A step that is not an admission is ErrInvalidArgument.
	Admit(ctx context.Context, e NewExecution, s Step) (Admission, error)
	// Apply applies s to execution id in one transaction, provided the
	// execution is still in s.From: otherwise it is ErrConflict and
	// nothing is written, so that of two concurrent transitions of one
	// execution exactly one applies. An unknown execution is ErrNotFound.
	// It moves the execution to s.To, mirrors that on its tool_calls row
	// (with the start, or the end and s.Output), settles its open
	// reservation as s.Credits says (LedgerCommit or LedgerRelease),
	// changes its approval request as s.Approval says (the request must
	// be pending: ErrConflict otherwise), writes s.Invocation as its
	// tool_invocations row (and enqueues it, with the outbox on) when s.To
	// is terminal, and appends s.Audit. A step that would leave a record
	// inconsistent (an end without its tool_invocations row or with its
	// reservation still open, a start without a driver, a reservation or
	// an approval request that is not there) is ErrInvalidArgument.
	Apply(ctx context.Context, id string, s Step) (Execution, error)
}

// Audit is the tamper-evident security event log. Each workspace has its own
// hash chain (the empty workspace id is the chain of events no workspace can
// be attributed to, such as a request with an unknown key). Appends are
// serialised per workspace, so concurrent writers never fork a chain.
type Audit interface {
	// AppendEvent appends one event to e.WorkspaceID's chain and returns it
	// with its Seq and hashes. A non-empty unknown workspace is ErrNotFound.
	AppendEvent(ctx context.Context, e NewEvent) (Event, error)
	// AppendBroadcast appends e to the unattributed chain and, in the same
	// transaction, the event copyOf makes of it (as stored, with its Seq
	// and hashes) to the chain of every workspace there is, and returns
	// the unattributed one. It is for a change of the whole daemon that
	// every workspace must act on (a tool's record changed: its approvers
	// re-approve it), which each workspace then reads among its own
	// events, while each chain still links only its own events.
	// e.WorkspaceID must be empty (ErrInvalidArgument). copyOf runs inside
	// the transaction, so it must be quick and must not use the Store.
	AppendBroadcast(ctx context.Context, e NewEvent, copyOf func(Event) NewEvent) (Event, error)
	// ListEvents pages through a workspace's events, newest (highest Seq)
	// first.
	ListEvents(ctx context.Context, workspaceID string, f EventFilter) (Page[Event], error)
	// ChainHead returns the seq and hash of the last event of the chain
	// (zero for an empty chain). Exporting it elsewhere from time to time
	// anchors the chain against an attacker who rewrites it whole.
	ChainHead(ctx context.Context, workspaceID string) (ChainHead, error)
	// VerifyChain walks the workspace's chain from seq 1 and recomputes every
	// hash. It reports ok, or the first broken link: a row whose contents
	// were updated, a gap left by a deleted row, a row inserted or
	// renumbered, or a chain that disagrees with its recorded head, or with
	// witnessed, a head recorded outside the database (at most one; see
	// ChainVerifier.Witnessed). err is reserved for failing to read the
	// chain.
	VerifyChain(ctx context.Context, workspaceID string, witnessed ...ChainHead) (ok bool, firstBroken *BrokenLink, err error)
	// VerifyChainFrom checks that the chain of from.WorkspaceID still
	// holds from, a head of it witnessed earlier outside the database, and
	// that every later event links to it up to the recorded head, which it
	// returns (see NewChainVerifierFrom). It reads only the events from
	// from.Seq on, so that a witness can move on to a later head every few
	// seconds at the cost of the events since the last; a from with Seq 0
	// walks the whole chain. firstBroken is the first link that does not
	// hold; the head is then zero. err is reserved for failing to read the
	// chain.
	VerifyChainFrom(ctx context.Context, from ChainHead) (head ChainHead, firstBroken *BrokenLink, err error)
}

// AnalyticsOutbox holds the tool_invocations rows waiting to be shipped to
// the analytics database. A store opened with its outbox on (the daemon's,
// when analytics is configured) enqueues every tool_invocations row in the
// transaction that writes it, so that a row is enqueued if and only if it
// exists; a shipper reads the oldest, ships them and deletes them. Deleting
// or trimming entries never touches the tool_invocations rows themselves.
type AnalyticsOutbox interface {
	// ListOutbox returns up to limit entries, oldest first (by EnqueuedAt,
	// then invocation id). limit is clamped to (0, MaxOutboxBatch]; zero
	// means DefaultOutboxBatch.
	ListOutbox(ctx context.Context, limit int) ([]OutboxEntry, error)
	// DeleteOutbox removes the entries of the given invocation ids, at most
	// MaxOutboxBatch of them (ErrInvalidArgument beyond), and returns how
	// many it removed; ids not enqueued are skipped.
	DeleteOutbox(ctx context.Context, invocationIDs []string) (int64, error)
	// TrimOutbox bounds the outbox: it removes every entry enqueued before
	// before (the zero time bounds nothing), then the oldest entries beyond
	// maxRows (zero or less bounds nothing), in one transaction, and returns
	// how many it removed.
	TrimOutbox(ctx context.Context, maxRows int64, before time.Time) (int64, error)
	// OutboxStats counts the entries and returns the oldest one's EnqueuedAt
	// (zero when the outbox is empty).
	OutboxStats(ctx context.Context) (OutboxStats, error)
}

// The batch sizes of ListOutbox and DeleteOutbox.
const (
	DefaultOutboxBatch = 1000
	MaxOutboxBatch     = 10000
)

// OutboxEntry is one enqueued tool_invocations row.
type OutboxEntry struct {
	Invocation ToolInvocation
	// EnqueuedAt is the store's clock when the row was written.
	EnqueuedAt time.Time
}

// OutboxStats describes the outbox: how many rows wait, and since when.
type OutboxStats struct {
	Rows int64
	// Oldest is the EnqueuedAt of the oldest entry; zero when Rows is 0.
	Oldest time.Time
}

// Workspace is a tenant.
type Workspace struct {
	ID        string
	Name      string
	CreatedAt time.Time
}

// Role is what an API key may do.
type Role string

// The roles. An agent may invoke but never decide approvals; an approver may
// decide approvals but not invoke; an admin may do both.
const (
	RoleAgent    Role = "agent"
	RoleApprover Role = "approver"
	RoleAdmin    Role = "admin"
)

// Valid reports whether r is one of the roles.
func (r Role) Valid() bool { return r == RoleAgent || r == RoleApprover || r == RoleAdmin }

// KeyHash is the SHA-256 of an API key. Keys are random and long, so a fast
// hash is enough: there is nothing to brute-force.
type KeyHash [sha256.Size]byte

// HashKey returns the hash under which a key is stored and looked up.
func HashKey(key string) KeyHash { return sha256.Sum256([]byte(key)) }

// String returns the hash in lower-case hex, the form stored.
func (h KeyHash) String() string { return hex.EncodeToString(h[:]) }

// NewAPIKey is the input of CreateAPIKey.
type NewAPIKey struct {
	WorkspaceID string
	Role        Role
	Hash        KeyHash
	// Name is a free-form label for people ("ci agent"); it may be empty.
	Name string
	// Audit, when not nil, gives the events to append to the workspace's
	// chain for the key created, in the transaction that creates it.
	Audit func(APIKey) []NewEvent
}

// APIKey is a stored key. RevokedAt is zero while the key is active,
// LastUsedAt until a use of it is recorded (RecordKeyUses).
type APIKey struct {
	ID          string
	WorkspaceID string
	Role        Role
	Hash        KeyHash
	Name        string
	CreatedAt   time.Time
	RevokedAt   time.Time
	LastUsedAt  time.Time
}

// ApprovalMode says whether invocations wait for a human.
type ApprovalMode string

// The approval modes. The zero value is stored as ApprovalRequired.
const (
	ApprovalRequired ApprovalMode = "required"
	ApprovalNone     ApprovalMode = "none"
	// ApprovalPerSession asks for an approval of a session's first cell,
	// which then covers its later cells; a one-shot execution waits for
	// one as under ApprovalRequired.
	ApprovalPerSession ApprovalMode = "per_session"
)

// ToolChangeMode says what a change of a tool's isolation record does.
type ToolChangeMode string

// The tool change modes. The zero value is stored as ToolChangesFlag.
const (
	// ToolChangesFlag audits every change and flags growth of an allowlist
	// review_required; the tool stays enabled.
	ToolChangesFlag ToolChangeMode = "flag"
	// ToolChangesRequireReview also disables a changed tool until an
	// approver re-approves it.
	ToolChangesRequireReview ToolChangeMode = "require_review"
)

// Policy is a workspace's policy record. Its zero value is the most
// restrictive policy: no code execution, approval required, no network, no
// runtime allowed.
type Policy struct {
	// CodeExecution allows code.execute at all; false refuses every
	// invocation.
	CodeExecution bool
	// Approval is ApprovalRequired (also the meaning of ""), ApprovalNone
	// or ApprovalPerSession.
	Approval ApprovalMode
	// NetworkAllowed makes "network: allow" permissible; false denies it.
	NetworkAllowed bool
	// MaxTimeout lowers the server's wall-clock ceiling for this workspace;
	// zero leaves the server's ceiling in force. It never raises it. It is
	// stored in whole milliseconds.
	MaxTimeout time.Duration
	// Runtimes lists the allowed runtimes ("python", "node", "shell"); empty
	// allows none.
	Runtimes []string
	// ToolChanges is ToolChangesFlag (also the meaning of "") or
	// ToolChangesRequireReview.
	ToolChanges ToolChangeMode
	// MaxSessions bounds the workspace's live sessions; zero leaves the
	// server's bound in force. It never raises it.
	MaxSessions int
	// UpdatedAt is set by the store.
	UpdatedAt time.Time
}

// RequiresApproval reports whether invocations must wait for a decision.
func (p Policy) RequiresApproval() bool { return p.Approval != ApprovalNone }

// DefaultPolicy is the policy of a new workspace: code execution enabled,
// approval required, no network, 30 s wall clock, every runtime, tool
// changes flagged.
func DefaultPolicy() Policy {
	return Policy{
		CodeExecution: true,
		Approval:      ApprovalRequired,
		MaxTimeout:    30 * time.Second,
		Runtimes:      []string{"python", "node", "shell"},
		ToolChanges:   ToolChangesFlag,
	}
}

// Credits is a workspace's balance. Available can be reserved; Reserved is
// held by open reservations. Both are never negative.
type Credits struct {
	Available int64
	Reserved  int64
}

// ReservationStatus is the state of a reservation. Open moves to committed
// or released exactly once.
type ReservationStatus string

// The reservation states.
const (
	ReservationOpen      ReservationStatus = "open"
	ReservationCommitted ReservationStatus = "committed"
	ReservationReleased  ReservationStatus = "released"
)

// Reservation holds credits for one execution. SettledAt is zero while open.
type Reservation struct {
	ID          string
	WorkspaceID string
	ExecutionID string
	Amount      int64
	Status      ReservationStatus
	CreatedAt   time.Time
	SettledAt   time.Time
}

// LedgerKind is the kind of a credit movement.
type LedgerKind string

// The ledger kinds. Grant adds to Available; reserve moves Available to
// Reserved; commit removes from Reserved; release moves Reserved back.
const (
	LedgerGrant   LedgerKind = "grant"
	LedgerReserve LedgerKind = "reserve"
	LedgerCommit  LedgerKind = "commit"
	LedgerRelease LedgerKind = "release"
)

// LedgerEntry is one credit movement. Amount is always positive; Kind gives
// its direction. ReservationID and ExecutionID are empty for grants.
type LedgerEntry struct {
	ID            string
	WorkspaceID   string
	Kind          LedgerKind
	Amount        int64
	ReservationID string
	ExecutionID   string
	Note          string
	CreatedAt     time.Time
}

// ExecutionStatus is the lifecycle state of an execution.
type ExecutionStatus string

// The execution states. Queued, awaiting_approval and running are live; all
// others are terminal and final.
const (
	StatusQueued           ExecutionStatus = "queued"
	StatusAwaitingApproval ExecutionStatus = "awaiting_approval"
	StatusRunning          ExecutionStatus = "running"
	StatusSucceeded        ExecutionStatus = "succeeded"
	StatusFailed           ExecutionStatus = "failed"
	StatusTimedOut         ExecutionStatus = "timed_out"
	StatusOOMKilled        ExecutionStatus = "oom_killed"
	StatusKilled           ExecutionStatus = "killed"
	StatusDenied           ExecutionStatus = "denied"
	StatusApprovalExpired  ExecutionStatus = "approval_expired"
	StatusLaunchFailed     ExecutionStatus = "launch_failed"
	// StatusCancelled: the key that invoked (or an admin) cancelled it
	// before it started.
	StatusCancelled ExecutionStatus = "cancelled"
)

// ExecutionStatuses lists every status.
var ExecutionStatuses = []ExecutionStatus{
	StatusQueued, StatusAwaitingApproval, StatusRunning, StatusSucceeded, StatusFailed,
	StatusTimedOut, StatusOOMKilled, StatusKilled, StatusDenied, StatusApprovalExpired,
	StatusLaunchFailed, StatusCancelled,
}

// Valid reports whether s is one of the statuses.
func (s ExecutionStatus) Valid() bool {
	for _, v := range ExecutionStatuses {
		if s == v {
			return true
		}
	}
	return false
}

// Terminal reports whether s is a final status.
func (s ExecutionStatus) Terminal() bool {
	return s.Valid() && s != StatusQueued && s != StatusAwaitingApproval && s != StatusRunning
}

// NewExecution is the record of an execution that Journal.Admit creates.
type NewExecution struct {
	// ID is the execution's id; empty lets the store choose one.
	ID          string
	WorkspaceID string
	// KeyID is the API key that invoked; it must belong to the workspace.
	KeyID   string
	Runtime string
	Tool    string
	// Request is the invocation as received (JSON); required.
	Request json.RawMessage
	// InputSHA256 is the lower-case hex SHA-256 of the runtime and code.
	InputSHA256 string
	// IdempotencyKey makes a retried request return the first execution;
	// empty means none. Unique per workspace.
	IdempotencyKey string
	// SessionID makes the execution a cell of that session of the
	// workspace, which must be active (ErrFailedPrecondition) and have no
	// other cell awaiting approval, queued or running (ErrConflict); the
	// store numbers it (Execution.Cell).
	SessionID string
}

// Admission is the result of Journal.Admit.
type Admission struct {
	Execution Execution
	// Reservation is nil when no credits were reserved.
	Reservation *Reservation
	// Approval is nil when no approval was requested.
	Approval *Approval
	// Replayed is set when the idempotency key matched an earlier execution
	// and nothing new was written.
	Replayed bool
}

// Execution is one invocation. Times not reached yet are zero.
type Execution struct {
	ID             string
	WorkspaceID    string
	KeyID          string
	Status         ExecutionStatus
	Runtime        string
	Tool           string
	Request        json.RawMessage
	Result         json.RawMessage
	IdempotencyKey string
	InputSHA256    string
	// ReservationID and ApprovalID are empty when there is none.
	ReservationID string
	ApprovalID    string
	// Credits is the amount of its reservation, 0 when it has none.
	Credits int64
	// SessionID is the session of a cell, and Cell its number in the
	// session from 1; empty and 0 for a one-shot execution.
	SessionID  string
	Cell       int
	Driver     string
	CreatedAt  time.Time
	StartedAt  time.Time
	FinishedAt time.Time
}

// PreviewLimit is the most bytes of each output stream a tool_calls row
// keeps; the store truncates longer previews and sets the truncation flag.
const PreviewLimit = 4096

// Step is one transition of an execution, as Journal.Admit and
// Journal.Apply write it. Its fields say what the transition changes;
// zero fields change nothing.
type Step struct {
	// From is the status the execution must be in for the step to apply
	// (Apply's compare-and-set); Admit does not read it.
	From ExecutionStatus
	// To is the status the execution moves to; it differs from From.
	To ExecutionStatus
	// At is when the step happened: the execution's creation, start or
	// end, the decision on its approval request. Zero means the store's
	// clock.
	At time.Time
	// Credits is the step's movement of credits.
	Credits CreditMove
	// Approval is the step's change of the execution's approval request.
	Approval ApprovalChange
	// Driver is the driver the execution starts on (required when To is
	// running), or ended on (when To is terminal; empty keeps the one
	// recorded at the start).
	Driver string
	// Result is the result document of an execution that ends (JSON); it
	// may be nil.
	Result json.RawMessage
	// Output is what the tool_calls row keeps of a run that ended.
	Output Output
	// Invocation is the tool_invocations row of an execution that ends,
	// set exactly when To is terminal. Its Status must be To and its
	// Credits what the step charges (the reservation's amount when it
	// commits it, else 0); the store sets its ID, ExecutionID,
	// WorkspaceID and CreatedAt (At).
	Invocation *ToolInvocation
	// Audit events are appended in the same transaction, with WorkspaceID
	// and ExecutionID set to the execution's.
	Audit []NewEvent
	// CoverSession makes the approval this step approves cover the rest of
	// the cells of the execution's session (ApprovalPerSession): the
	// session records it and the deciding key.
	CoverSession bool
}

// CreditMove is a step's movement of credits. Its zero value moves none.
type CreditMove struct {
	// Kind is LedgerReserve (Admit only: Amount > 0 becomes the
	// execution's reservation), LedgerCommit or LedgerRelease (Apply
	// only: the execution's open reservation is charged or returned), or
	// empty for none.
	Kind LedgerKind
	// Amount is what LedgerReserve holds; a settlement moves the
	// reservation's own amount and ignores it.
	Amount int64
}

// ApprovalChange is a step's change of its execution's approval request.
// Its zero value changes none.
type ApprovalChange struct {
	// To is ApprovalPending (Admit only: the request is created), or
	// ApprovalApproved, ApprovalDenied, ApprovalExpired or
	// ApprovalCancelled (Apply only: the pending request is closed so),
	// or empty for none.
	To ApprovalStatus
	// Card and ExpiresAt describe a request created; both are required.
	Card      json.RawMessage
	ExpiresAt time.Time
	// DecidedBy is the deciding key of an approved or denied request;
	// the step's At is its DecidedAt.
	DecidedBy string
	// Reason is kept on the closed request.
	Reason string
}

// Output is what a tool_calls row keeps of a run that ended.
type Output struct {
	// ExitCode is nil when no process exit was observed.
	ExitCode *int
	// Stdout and Stderr are previews; bytes past PreviewLimit are dropped.
	Stdout, Stderr []byte
	// StdoutTruncated and StderrTruncated say the producer already cut the
	// stream; the store also sets them when it truncates a preview.
	StdoutTruncated, StderrTruncated bool
}

// ToolCall is the audit row of one invocation, created with the execution
// and completed when it ends. Status mirrors the execution's.
type ToolCall struct {
	ID              string
	ExecutionID     string
	WorkspaceID     string
	Tool            string
	Runtime         string
	InputSHA256     string
	Status          ExecutionStatus
	ExitCode        *int
	StdoutPreview   []byte
	StderrPreview   []byte
	StdoutTruncated bool
	StderrTruncated bool
	Driver          string
	CreditsCharged  int64
	CreatedAt       time.Time
	StartedAt       time.Time
	FinishedAt      time.Time
}

// ToolInvocation is the analytics row written once when an execution ends.
type ToolInvocation struct {
	ID          string
	ExecutionID string
	WorkspaceID string
	Tool        string
	Runtime     string
	Status      ExecutionStatus
	Driver      string
	// Queued is from creation to start (or end, if it never started); Ran is
	// from start to end, zero if it never started.
	Queued  time.Duration
	Ran     time.Duration
	Credits int64
	// CreatedAt is when the execution ended.
	CreatedAt time.Time
}

// ApprovalStatus is the state of an approval request.
type ApprovalStatus string

// The approval states. Pending moves to one of the others exactly once.
const (
	ApprovalPending  ApprovalStatus = "pending"
	ApprovalApproved ApprovalStatus = "approved"
	ApprovalDenied   ApprovalStatus = "denied"
	ApprovalExpired  ApprovalStatus = "expired"
	// ApprovalCancelled: its execution was cancelled before anyone
	// decided; Reason is the cancel's.
	ApprovalCancelled ApprovalStatus = "cancelled"
)

// Valid reports whether s is one of the approval states.
func (s ApprovalStatus) Valid() bool {
	switch s {
	case ApprovalPending, ApprovalApproved, ApprovalDenied, ApprovalExpired, ApprovalCancelled:
		return true
	}
	return false
}

// Approval is one approval request. DecidedBy and DecidedAt are empty while
// pending and for expired and cancelled requests.
type Approval struct {
	ID          string
	ExecutionID string
	WorkspaceID string
	Status      ApprovalStatus
	Card        json.RawMessage
	RequestedAt time.Time
	ExpiresAt   time.Time
	DecidedBy   string
	DecidedAt   time.Time
	Reason      string
}

// NewEvent is the input of AppendEvent. Outside the store's own tests it
// comes from audit.NewEvent, which encodes an event's struct as its Data.
type NewEvent struct {
	// WorkspaceID names the chain; empty is the unattributed chain.
	WorkspaceID string
	// Type is the event's name, e.g. "capability.invoke_denied"; required.
	Type string
	// Code is the event's stable code, e.g. "CAP002W".
	Code string
	// Actor is who caused the event: an API key id, "system" or "cli".
	Actor       string
	Reason      string
	ExecutionID string
	// Data is the event's typed payload (JSON); it may be nil. Its bytes are
	// stored and hashed exactly as given.
	Data json.RawMessage
	// Time defaults to the store's clock.
	Time time.Time
}

// Event is a stored audit event, a link of its workspace's hash chain.
type Event struct {
	ID          string
	WorkspaceID string
	// Seq numbers the chain from 1 without gaps.
	Seq         int64
	Type        string
	Code        string
	Actor       string
	Reason      string
	ExecutionID string
	Data        json.RawMessage
	Time        time.Time
	// PrevHash is the Hash of event Seq-1, empty for Seq 1.
	PrevHash string
	// Hash is ChainHash of this event, lower-case hex.
	Hash string
}

// ChainHead is the last link of a chain.
type ChainHead struct {
	WorkspaceID string
	Seq         int64
	Hash        string
}

// BrokenLink locates the first place where a chain does not verify.
type BrokenLink struct {
	WorkspaceID string
	// Seq is the sequence number where the chain breaks: the first row that
	// does not verify, or the first missing one.
	Seq int64
	// EventID is the row found at Seq, empty when the row is missing.
	EventID string
	// Reason says what does not match, e.g. "hash mismatch".
	Reason string
}

// PageRequest asks for one page of a list. The zero value asks for the first
// page of DefaultPageLimit items.
type PageRequest struct {
	// Limit is clamped to (0, MaxPageLimit]; zero means DefaultPageLimit.
	Limit int
	// Cursor is a previous page's Next; empty starts from the newest.
	Cursor string
}

// The page sizes.
const (
	DefaultPageLimit = 50
	MaxPageLimit     = 500
)

// Page is one page of a list. Next is empty on the last page; otherwise it
// is the opaque cursor of the following page.
type Page[T any] struct {
	Items []T
	Next  string
}

// ExecutionFilter selects executions. Zero fields do not filter.
type ExecutionFilter struct {
	PageRequest
	Statuses []ExecutionStatus
	// Since and Until bound CreatedAt: Since <= CreatedAt < Until.
	Since, Until time.Time
}

// ToolCallFilter selects tool_calls or tool_invocations rows. Zero fields do
// not filter.
type ToolCallFilter struct {
	PageRequest
	Statuses []ExecutionStatus
	// Since and Until bound CreatedAt: Since <= CreatedAt < Until.
	Since, Until time.Time
}

// ApprovalFilter selects approvals. Zero fields do not filter.
type ApprovalFilter struct {
	PageRequest
	Statuses []ApprovalStatus
}

// EventFilter selects audit events. Zero fields do not filter.
type EventFilter struct {
	PageRequest
	Types       []string
	ExecutionID string
	// Since and Until bound Time: Since <= Time < Until.
	Since, Until time.Time
}
