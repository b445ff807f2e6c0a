package capability

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
)

// recordedEvents is an eventAppender that keeps what it is given.
type recordedEvents struct {
	mu  sync.Mutex
	evs []model.NewEvent
}

func (r *recordedEvents) AppendEvent(_ context.Context, e model.NewEvent) (model.Event, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, e)
	return model.Event{}, nil
}

// TestSessionRefusalsAudited feeds the audit refusals of a session's
// sandbox: each is of the session's workspace and of the cell running,
// or of no execution between cells; past maxRefusalEvents they are
// counted, and the session's end audits the count.
func TestSessionRefusalsAudited(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &testenv.Buffer{}
	st := &recordedEvents{}
	cell := ""
	a := &egressAudit{core: &core{log: slog.New(slog.NewTextHandler(logs, nil)), ctx: ctx}, st: st,
		egressEvents: make(chan audit.Event, 16), runs: map[string]*runAudit{},
		cellOf: func(id string) string {
			if id == "ses_1" {
				return cell
			}
			return ""
		}}
	a.start()
	labels := map[string]string{engine.LabelSession: "ses_1", engine.LabelWorkspace: "ws_1"}
	refuse := func() {
		a.egressDecision(engine.EgressDecision{Decision: egress.Decision{Sandbox: "sbx-1", Tool: "fetch", Protocol: egress.ProtoDNS,
			Name: "other.test", Reason: egress.ReasonNameNotAllowed}, Labels: labels})
	}
	refuse()
	cell = "exe_1"
	for range maxRefusalEvents + 1 {
		refuse()
	}
	a.endSession("ses_1", "ws_1")
	a.close()

	if len(st.evs) != maxRefusalEvents+1 {
		t.Fatalf("events: got %d, want %d refusals and one count", len(st.evs), maxRefusalEvents+1)
	}
	first, second, last := st.evs[0], st.evs[1], st.evs[len(st.evs)-1]
	if first.Type != audit.EgressDenied || first.WorkspaceID != "ws_1" || first.ExecutionID != "" {
		t.Errorf("the refusal between cells: got %s of %q execution %q, want egress.denied of ws_1, no execution", first.Type, first.WorkspaceID, first.ExecutionID)
	}
	if second.Type != audit.EgressDenied || second.WorkspaceID != "ws_1" || second.ExecutionID != "exe_1" {
		t.Errorf("a refusal in a cell: got %s of %q execution %q, want egress.denied of ws_1, exe_1", second.Type, second.WorkspaceID, second.ExecutionID)
	}
	if last.Type != audit.RefusalsSuppressed || last.WorkspaceID != "ws_1" {
		t.Errorf("the last event: got %s of %q, want egress.refusals_suppressed of ws_1", last.Type, last.WorkspaceID)
	}
	if _, ok := a.sessions["ses_1"]; ok {
		t.Errorf("the session's count outlived its end")
	}
}
