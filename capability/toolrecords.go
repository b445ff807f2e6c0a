package capability

import (
	"context"

	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// toolRecords audits the tools' records as they change and keeps the
// reviews a change needs (drift.go).
type toolRecords struct {
	*core
	st    toolStore
	drift drift
}

// eventLister pages through an audit chain's events.
type eventLister interface {
	ListEvents(ctx context.Context, workspaceID string, f store.EventFilter) (store.Page[model.Event], error)
}

// toolStore is what toolRecords needs of the store.
type toolStore interface {
	eventLister
	eventAppender
	// AppendBroadcast appends a tool's change to the unattributed chain
	// and a copy of it to every workspace's.
	AppendBroadcast(ctx context.Context, e model.NewEvent, copyOf func(model.Event) model.NewEvent) (model.Event, error)
}
