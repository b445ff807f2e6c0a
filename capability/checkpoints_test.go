package capability

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/stockade-sh/stockade/model"
)

// checkpointStore answers the workspaces and their checkpoint bytes; the
// rest of daemonStore is not used.
type checkpointStore struct {
	daemonStore
	bytes  map[string]int64
	paused map[string]int
	fail   bool
}

func (s checkpointStore) ListWorkspaces(context.Context) ([]model.Workspace, error) {
	return []model.Workspace{{ID: "ws_a"}, {ID: "ws_b"}}, nil
}

func (s checkpointStore) CheckpointBytes(_ context.Context, ws string) (int64, int, error) {
	if s.fail {
		return 0, 0, errors.New("database down")
	}
	return s.bytes[ws], s.paused[ws], nil
}

// checkpointObserver is an Observer that is a CheckpointObserver.
type checkpointObserver struct {
	countingObserver
	bytes, paused, calls int
}

func (o *checkpointObserver) Checkpoints(bytes int64, paused int) {
	o.bytes, o.paused = int(bytes), paused
	o.calls++
}

func TestObserveCheckpointsSumsWorkspaces(t *testing.T) {
	obs := &checkpointObserver{}
	st := checkpointStore{bytes: map[string]int64{"ws_a": 100, "ws_b": 23}, paused: map[string]int{"ws_a": 1, "ws_b": 2}}
	d := &daemon{core: &core{opts: ServiceOptions{Observer: obs}, log: slog.New(slog.DiscardHandler)}, st: st}
	d.observeCheckpoints(t.Context())
	if obs.calls != 1 || obs.bytes != 123 || obs.paused != 3 {
		t.Errorf("observed %d calls, %d bytes, %d paused; want 1, 123, 3", obs.calls, obs.bytes, obs.paused)
	}
	st.fail = true
	d.st = st
	d.observeCheckpoints(t.Context())
	if obs.calls != 1 {
		t.Errorf("a failing store was observed: %d calls, want still 1", obs.calls)
	}
}
