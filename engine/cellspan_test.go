package engine

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/sandbox"
)

// execErrors is the count of exec phases observed with outcome error.
func execErrors(t *testing.T, reg *prometheus.Registry) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if mf.GetName() == "stockade_phase_duration_seconds" && l["phase"] == "exec" && l["outcome"] == "error" {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// TestBusyCellIsNoExec checks that a cell refused because another runs
// is not measured as an exec that failed: no code ran.
func TestBusyCellIsNoExec(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(telemetry.Collectors()...)
	drv := &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor, Sessions: true}
	e, err := New(map[string]sandbox.Driver{drv.ID: drv}, drv.ID, sandboxfake.Images{}, sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		t.Fatal(err)
	}
	s, err := e.OpenSession(t.Context(), SessionSpec{Runtime: "python", Workspace: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	// A cell running: the session's lock held.
	s.cellMu.Lock()
	before := execErrors(t, reg)
	if _, err := s.Cell(t.Context(), CellRequest{Code: "1"}); !errdefs.IsConflict(err) {
		t.Fatalf("a cell while another runs: got %v, want a conflict", err)
	}
	s.cellMu.Unlock()
	if after := execErrors(t, reg); after != before {
		t.Errorf("exec errors: %d before the refused cell, %d after; want no change", before, after)
	}
}
