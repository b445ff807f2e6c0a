// Package store is the persistence contract of Stockade's capability layer:
// workspaces, API keys, workspace policy, credits, executions with their
// tool_calls and tool_invocations rows, approval requests, and the
// tamper-evident audit trail. The records themselves are the domain
// model's (package model); store holds the interfaces that persist them
// and the types of their inputs, results and queries (NewExecution,
// Admission, PageRequest, the filters), and the audit chain's hashing.
// The implementations live in store/sqlite (embedded, the default) and
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
	"encoding/json"
	"time"

	"github.com/stockade-sh/stockade/model"
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
	Snapshots
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
	// Release gives the claim up; ctx bounds what that takes (PostgreSQL's
	// unlock).
	Release(ctx context.Context) error
}

// Workspaces is the tenancy root. Every other record belongs to one.
type Workspaces interface {
	// CreateWorkspace creates a workspace with model.DefaultPolicy, a zero
	// credit balance and an audit chain that starts with the events audit
	// (if not nil) returns for it, appended in the same transaction. A name
	// already taken is ErrConflict; an empty or over-long name, or an
	// invalid event, is ErrInvalidArgument.
	CreateWorkspace(ctx context.Context, name string, audit func(model.Workspace) []model.NewEvent) (model.Workspace, error)
	// GetWorkspace returns ErrNotFound for an unknown id.
	GetWorkspace(ctx context.Context, id string) (model.Workspace, error)
	// GetWorkspaceByName returns ErrNotFound for an unknown name.
	GetWorkspaceByName(ctx context.Context, name string) (model.Workspace, error)
	// ListWorkspaces returns every workspace ordered by name.
	ListWorkspaces(ctx context.Context) ([]model.Workspace, error)
}

// Keys stores API keys as SHA-256 hashes; the key itself never reaches the
// store.
type Keys interface {
	// CreateAPIKey records a key's hash. An unknown workspace is ErrNotFound,
	// a hash already recorded is ErrConflict, an unknown role is
	// ErrInvalidArgument.
	CreateAPIKey(ctx context.Context, k NewAPIKey) (model.APIKey, error)
	// LookupAPIKey finds the active key with the given hash. Unknown and
	// revoked keys are both ErrNotFound, so an authenticator cannot
	// accidentally accept a revoked key.
	LookupAPIKey(ctx context.Context, hash model.KeyHash) (model.APIKey, error)
	// GetAPIKey returns the key with the given id, revoked or not. An
	// unknown id is ErrNotFound.
	GetAPIKey(ctx context.Context, keyID string) (model.APIKey, error)
	// ListAPIKeys returns a workspace's keys, revoked ones included, oldest
	// first.
	ListAPIKeys(ctx context.Context, workspaceID string) ([]model.APIKey, error)
	// RevokeAPIKey revokes a key of the workspace and appends the events
	// audit (if not nil) returns for the key as revoked, in the same
	// transaction. Revoking a revoked key succeeds, keeps the first
	// revocation time and appends nothing; an unknown key (or one of
	// another workspace) is ErrNotFound.
	RevokeAPIKey(ctx context.Context, workspaceID, keyID string, audit func(model.APIKey) []model.NewEvent) error
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
	GetPolicy(ctx context.Context, workspaceID string) (model.Policy, error)
	// SetPolicy replaces the workspace's policy whole and returns it as
	// stored (normalised, with UpdatedAt set). Unknown enum values and a
	// negative MaxTimeout are ErrInvalidArgument. audit, when not nil,
	// gives the events to append for the policy as stored, in the same
	// transaction.
	SetPolicy(ctx context.Context, workspaceID string, p model.Policy, audit func(model.Policy) []model.NewEvent) (model.Policy, error)
}

// Ledger is the credit account of each workspace. A reservation (taken by
// Journal.Admit) moves credits from Available to Reserved; committing it
// charges them for good, releasing it returns them to Available (both done
// by the Journal.Apply that ends the execution). Available and Reserved can
// never go negative, and every movement is a model.LedgerEntry, so that at
// all times
//
//	sum(grant) - sum(commit) == Available + Reserved.
type Ledger interface {
	// GrantCredits adds amount (> 0, else ErrInvalidArgument) to the
	// workspace's available credits, and appends the audit events (which
	// may be none) in the same transaction.
	GrantCredits(ctx context.Context, workspaceID string, amount int64, note string, audit []model.NewEvent) (model.Credits, error)
	// GetCredits returns ErrNotFound for an unknown workspace.
	GetCredits(ctx context.Context, workspaceID string) (model.Credits, error)
	// ListLedger pages through a workspace's ledger, newest first.
	ListLedger(ctx context.Context, workspaceID string, p PageRequest) (Page[model.LedgerEntry], error)
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
	GetExecution(ctx context.Context, workspaceID, executionID string) (model.Execution, error)
	// ListExecutions pages through a workspace's executions, newest first.
	ListExecutions(ctx context.Context, workspaceID string, f ExecutionFilter) (Page[model.Execution], error)
	// ListLiveExecutions returns every queued or running execution of
	// every workspace, oldest first: what a daemon that starts finds
	// interrupted by the one before it.
	ListLiveExecutions(ctx context.Context) ([]model.Execution, error)

	// GetToolCall returns the tool_calls row of an execution, or ErrNotFound.
	GetToolCall(ctx context.Context, workspaceID, executionID string) (model.ToolCall, error)
	// ListToolCalls pages through a workspace's tool_calls rows, newest first.
	ListToolCalls(ctx context.Context, workspaceID string, f ToolCallFilter) (Page[model.ToolCall], error)
	// ListToolInvocations pages through a workspace's analytics rows, newest
	// first; f filters on their time and status likewise.
	ListToolInvocations(ctx context.Context, workspaceID string, f ToolCallFilter) (Page[model.ToolInvocation], error)
}

// Approvals reads approval requests, which the Journal creates and closes.
type Approvals interface {
	// GetApproval returns ErrNotFound for an unknown id or one of another
	// workspace.
	GetApproval(ctx context.Context, workspaceID, approvalID string) (model.Approval, error)
	// ListApprovals pages through a workspace's approvals, newest first.
	ListApprovals(ctx context.Context, workspaceID string, f ApprovalFilter) (Page[model.Approval], error)
	// ListDueApprovals returns every pending approval of every workspace
	// whose ExpiresAt is not after now, the earliest expiry first.
	ListDueApprovals(ctx context.Context, now time.Time) ([]model.Approval, error)
}

// Journal applies the transitions of executions, each in one transaction:
// the capability layer decides a model.Step (package capability), the
// journal writes it whole or not at all. It keeps only the integrity of
// what it writes: the compare-and-set on the execution's status, the
// balance check of a reservation, the approval request's being pending
// when a step changes it, and the records a step must leave consistent
// (a tool_calls row that mirrors the execution, a reservation settled
// when the execution ends, a tool_invocations row for every execution
// that ended). Who may do what, and what it costs, is not its business.
type Journal interface {
	// Admit creates an execution and applies its first step s in one
	// transaction: the execution in s.To (queued, or awaiting_approval
	// with the approval request s.Approval creates), its tool_calls row,
	// the reservation s.Credits makes (model.LedgerReserve, or none) and the
	// events s.Audit. s.From is not read; s.At, when set, is the
	// execution's creation time.
	//
	// A short balance is ErrResourceExhausted and leaves nothing behind.
	// When e.IdempotencyKey names an execution the workspace already has,
	// nothing is written and the existing execution comes back with
	// Replayed set; if its InputSHA256 or Request differs, the retry is
	// ErrConflict. A step that is not an admission is ErrInvalidArgument.
	Admit(ctx context.Context, e NewExecution, s model.Step) (Admission, error)
	// Apply applies s to execution id in one transaction, provided the
	// execution is still in s.From: otherwise it is ErrConflict and
	// nothing is written, so that of two concurrent transitions of one
	// execution exactly one applies. An unknown execution is ErrNotFound.
	// It moves the execution to s.To, mirrors that on its tool_calls row
	// (with the start, or the end and s.Output), settles its open
	// reservation as s.Credits says (model.LedgerCommit or LedgerRelease),
	// changes its approval request as s.Approval says (the request must
	// be pending: ErrConflict otherwise), writes s.Invocation as its
	// tool_invocations row (and enqueues it, with the outbox on) when s.To
	// is terminal, and appends s.Audit. A step that would leave a record
	// inconsistent (an end without its tool_invocations row or with its
	// reservation still open, a start without a driver, a reservation or
	// an approval request that is not there) is ErrInvalidArgument.
	Apply(ctx context.Context, id string, s model.Step) (model.Execution, error)
}

// Audit is the tamper-evident security event log. Each workspace has its own
// hash chain (the empty workspace id is the chain of events no workspace can
// be attributed to, such as a request with an unknown key). Appends are
// serialised per workspace, so concurrent writers never fork a chain.
type Audit interface {
	// AppendEvent appends one event to e.WorkspaceID's chain and returns it
	// with its Seq and hashes. A non-empty unknown workspace is ErrNotFound.
	AppendEvent(ctx context.Context, e model.NewEvent) (model.Event, error)
	// AppendBroadcast appends e to the unattributed chain and, in the same
	// transaction, the event copyOf makes of it (as stored, with its Seq
	// and hashes) to the chain of every workspace there is, and returns
	// the unattributed one. It is for a change of the whole daemon that
	// every workspace must act on (a tool's record changed: its approvers
	// re-approve it), which each workspace then reads among its own
	// events, while each chain still links only its own events.
	// e.WorkspaceID must be empty (ErrInvalidArgument). copyOf runs inside
	// the transaction, so it must be quick and must not use the Store.
	AppendBroadcast(ctx context.Context, e model.NewEvent, copyOf func(model.Event) model.NewEvent) (model.Event, error)
	// ListEvents pages through a workspace's events, newest (highest Seq)
	// first.
	ListEvents(ctx context.Context, workspaceID string, f EventFilter) (Page[model.Event], error)
	// ChainHead returns the seq and hash of the last event of the chain
	// (zero for an empty chain). Exporting it elsewhere from time to time
	// anchors the chain against an attacker who rewrites it whole.
	ChainHead(ctx context.Context, workspaceID string) (model.ChainHead, error)
	// VerifyChain walks the workspace's chain from seq 1 and recomputes every
	// hash. It reports ok, or the first broken link: a row whose contents
	// were updated, a gap left by a deleted row, a row inserted or
	// renumbered, or a chain that disagrees with its recorded head, or with
	// witnessed, a head recorded outside the database (at most one; see
	// ChainVerifier.Witnessed). err is reserved for failing to read the
	// chain.
	VerifyChain(ctx context.Context, workspaceID string, witnessed ...model.ChainHead) (ok bool, firstBroken *model.BrokenLink, err error)
	// VerifyChainFrom checks that the chain of from.WorkspaceID still
	// holds from, a head of it witnessed earlier outside the database, and
	// that every later event links to it up to the recorded head, which it
	// returns (see NewChainVerifierFrom). It reads only the events from
	// from.Seq on, so that a witness can move on to a later head every few
	// seconds at the cost of the events since the last; a from with Seq 0
	// walks the whole chain. firstBroken is the first link that does not
	// hold; the head is then zero. err is reserved for failing to read the
	// chain.
	VerifyChainFrom(ctx context.Context, from model.ChainHead) (head model.ChainHead, firstBroken *model.BrokenLink, err error)
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
	Invocation model.ToolInvocation
	// EnqueuedAt is the store's clock when the row was written.
	EnqueuedAt time.Time
}

// OutboxStats describes the outbox: how many rows wait, and since when.
type OutboxStats struct {
	Rows int64
	// Oldest is the EnqueuedAt of the oldest entry; zero when Rows is 0.
	Oldest time.Time
}

// NewAPIKey is the input of CreateAPIKey.
type NewAPIKey struct {
	WorkspaceID string
	Role        model.Role
	Hash        model.KeyHash
	// Name is a free-form label for people ("ci agent"); it may be empty.
	Name string
	// Audit, when not nil, gives the events to append to the workspace's
	// chain for the key created, in the transaction that creates it.
	Audit func(model.APIKey) []model.NewEvent
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
	// store numbers it (model.Execution.Cell).
	SessionID string
}

// Admission is the result of Journal.Admit.
type Admission struct {
	Execution model.Execution
	// Reservation is nil when no credits were reserved.
	Reservation *model.Reservation
	// Approval is nil when no approval was requested.
	Approval *model.Approval
	// Replayed is set when the idempotency key matched an earlier execution
	// and nothing new was written.
	Replayed bool
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
	Statuses []model.ExecutionStatus
	// Since and Until bound CreatedAt: Since <= CreatedAt < Until.
	Since, Until time.Time
}

// ToolCallFilter selects tool_calls or tool_invocations rows. Zero fields do
// not filter.
type ToolCallFilter struct {
	PageRequest
	Statuses []model.ExecutionStatus
	// Since and Until bound CreatedAt: Since <= CreatedAt < Until.
	Since, Until time.Time
}

// ApprovalFilter selects approvals. Zero fields do not filter.
type ApprovalFilter struct {
	PageRequest
	Statuses []model.ApprovalStatus
}

// EventFilter selects audit events. Zero fields do not filter.
type EventFilter struct {
	PageRequest
	Types       []string
	ExecutionID string
	// Since and Until bound Time: Since <= Time < Until.
	Since, Until time.Time
}
