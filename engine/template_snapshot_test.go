package engine

import (
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
)

// TestTemplateSnapshotNeedsGolden: a template tool's sessions are
// snapshotted (and forked) only when the template opts into checkpoints
// (golden: true), as its pools and golden checkpoints are; otherwise
// CanSnapshot is a public ErrFailedPrecondition saying why.
func TestTemplateSnapshotNeedsGolden(t *testing.T) {
	tm := goldTemplate()
	if err := goldenEngine(t, t.TempDir(), tm).CanSnapshot("gvisor", "python", "gold"); err != nil {
		t.Errorf("CanSnapshot of a golden template's tool: %v", err)
	}
	tm.Golden = false
	err := goldenEngine(t, t.TempDir(), tm).CanSnapshot("gvisor", "python", "gold")
	if msg, ok := errdefs.PublicMessage(err); !errdefs.IsFailedPrecondition(err) || !ok || !strings.Contains(msg, "golden: true") {
		t.Errorf("CanSnapshot of a template's tool without golden: got %v, want a public ErrFailedPrecondition naming golden: true", err)
	}
}
