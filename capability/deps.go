package capability

import (
	"context"

	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// Journal is how the service changes the store: each step of a grant in
// one transaction (store.Journal), and the events of no grant.
type Journal interface {
	Admit(ctx context.Context, e store.NewExecution, s model.Step) (store.Admission, error)
	Apply(ctx context.Context, id string, s model.Step) (model.Execution, error)
	// AppendEvent appends an event of no grant: a denial, an egress
	// refusal, a broker call, a tool's record.
	AppendEvent(ctx context.Context, e model.NewEvent) (model.Event, error)
	AppendBroadcast(ctx context.Context, e model.NewEvent, copyOf func(model.Event) model.NewEvent) (model.Event, error)
}
