package capability

import (
	"context"
	"fmt"
	"testing"

	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/sandboxfake"
	"github.com/stockade-sh/stockade/sandbox"
)

// reapFails is a fake driver whose Reap fails with err.
type reapFails struct {
	*sandboxfake.Driver
	err error
}

func (d reapFails) Reap(context.Context, map[string]string) ([]string, error) { return nil, d.err }

// TestStartReapFailure checks that a driver's failure to reap its orphans
// at the daemon's start stops the start only for the default driver: a
// non-default one (a remote driver whose token the provider refuses)
// leaves the daemon to serve the others.
func TestStartReapFailure(t *testing.T) {
	refused := fmt.Errorf("listing sandboxes: 401: %w", errdefs.ErrUnauthenticated)
	start := func(defaultDriver string) error {
		drivers := map[string]sandbox.Driver{
			"gvisor": &sandboxfake.Driver{ID: "gvisor", Tier: sandbox.TierGVisor},
			"vercel": reapFails{&sandboxfake.Driver{ID: "vercel", Tier: sandbox.TierMicroVM}, refused},
		}
		eng, err := engine.New(drivers, defaultDriver, sandboxfake.Images{}, sandbox.DefaultLimits(), sandbox.DefaultCeiling())
		if err != nil {
			t.Fatal(err)
		}
		svc := NewService(eng, openSQLite(t), ServiceOptions{})
		err = svc.Start(t.Context())
		if err == nil {
			svc.Close(context.Background())
		}
		return err
	}
	if err := start("vercel"); !errdefs.IsUnauthenticated(err) {
		t.Errorf("the default driver's reap refused: Start got %v, want ErrUnauthenticated", err)
	}
	if err := start("gvisor"); err != nil {
		t.Errorf("a non-default driver's reap refused: Start got %v, want nil", err)
	}
}
