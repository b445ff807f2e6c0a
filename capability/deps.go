package capability

import (
	"context"
	"time"

	"github.com/stockade-sh/stockade/store"
)

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
