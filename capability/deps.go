package capability

import (
	"context"
	"time"

	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
)

// Runner runs sandboxes for the service; *engine.Engine is the one
// implementation. The service validates a request with it before
// deciding, runs an admitted one (told of its start and output), and asks
// it for its drivers' health, its tools and its limits.
type Runner interface {
	// Validate checks a request without running anything and returns the
	// tool, driver and runtime it would use; an error of class
	// ErrPermissionDenied is the tool's record refusing it.
	Validate(engine.Request) (tools.Tool, sandbox.Driver, image.Runtime, error)
	// Run runs a request in a fresh sandbox; its OnStart is called once
	// the sandbox launched, before the code runs.
	Run(context.Context, engine.Request) (*engine.Result, error)
	// Drivers returns the drivers by name, for their health and for the
	// orphans of a crashed daemon.
	Drivers() map[string]sandbox.Driver
	DefaultDriver() string
	// Tools is the set of tools requests run as.
	Tools() *tools.Set
	// Limits is what a sandbox of a tool gets when the request asks for
	// nothing; Ceiling is the most a request may ask for.
	Limits(tools.Tool) sandbox.Limits
	Ceiling() sandbox.Limits
	// EgressAvailable says whether sandboxes can get egress at all.
	EgressAvailable() bool
	// SetEgressObserver and SetBrokerObserver hand the egress proxy's
	// decisions and the broker's calls, with the labels of the sandbox
	// concerned, to f.
	SetEgressObserver(f func(engine.EgressDecision))
	SetBrokerObserver(f func(engine.BrokerEvent))
	// Wait waits for the runs' background clean-ups.
	Wait() error
	// CheckSession, OpenSession and ReattachSessions are the sessions'
	// (see engine.LiveSession).
	CheckSession(engine.SessionSpec) (tools.Tool, sandbox.Driver, image.Runtime, error)
	OpenSession(context.Context, engine.SessionSpec) (*engine.LiveSession, error)
	ReattachSessions(ctx context.Context, match map[string]string, specOf func(sandboxID string) (engine.SessionSpec, bool)) ([]*engine.LiveSession, error)
	// CanPause, PauseSession and ResumeSession pause sessions to
	// checkpoints and resume them (see engine/pause.go).
	CanPause(driver string) error
	PauseSession(ctx context.Context, s *engine.LiveSession, dir string) (int64, error)
	ResumeSession(ctx context.Context, spec engine.SessionSpec, dir string) (*engine.LiveSession, error)
}

var _ Runner = (*engine.Engine)(nil)

// Journal is how the service changes the store: each step of a grant in
// one transaction (store.Journal), and the events of no grant.
type Journal interface {
	Admit(ctx context.Context, e store.NewExecution, s store.Step) (store.Admission, error)
	Apply(ctx context.Context, id string, s store.Step) (store.Execution, error)
	// AppendEvent appends an event of no grant: a denial, an egress
	// refusal, a broker call, a tool's record.
	AppendEvent(ctx context.Context, e store.NewEvent) (store.Event, error)
	AppendBroadcast(ctx context.Context, e store.NewEvent, copyOf func(store.Event) store.NewEvent) (store.Event, error)
}

// Queries are what the service reads.
type Queries interface {
	ReplayExecution(ctx context.Context, e store.NewExecution) (store.Admission, error)
	GetExecution(ctx context.Context, workspaceID, executionID string) (store.Execution, error)
	ListLiveExecutions(ctx context.Context) ([]store.Execution, error)
	GetApproval(ctx context.Context, workspaceID, approvalID string) (store.Approval, error)
	ListApprovals(ctx context.Context, workspaceID string, f store.ApprovalFilter) (store.Page[store.Approval], error)
	ListDueApprovals(ctx context.Context, now time.Time) ([]store.Approval, error)
	GetPolicy(ctx context.Context, workspaceID string) (store.Policy, error)
	LookupAPIKey(ctx context.Context, hash store.KeyHash) (store.APIKey, error)
	ListEvents(ctx context.Context, workspaceID string, f store.EventFilter) (store.Page[store.Event], error)
	// ListWorkspaces and VerifyChainFrom are the witness's
	// (witness.Chains).
	ListWorkspaces(ctx context.Context) ([]store.Workspace, error)
	VerifyChainFrom(ctx context.Context, from store.ChainHead) (store.ChainHead, *store.BrokenLink, error)
}

// Store is what the service needs of the store.
type Store interface {
	Journal
	Queries
	SessionStore
	// RecordKeyUses writes the API keys' last uses, in batches.
	RecordKeyUses(ctx context.Context, uses map[string]time.Time) error
	// ClaimDaemon takes the database's daemon claim for the service's
	// life.
	ClaimDaemon(ctx context.Context) (store.DaemonClaim, error)
}
