package tools

import (
	"testing"

	"github.com/stockade-sh/stockade/driver/docker"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/sandbox"
)

// drivers are the drivers a daemon passes in Options.Drivers, with what
// each declares (wiring.DriverCapabilities, which tools cannot import).
var drivers = map[string]sandbox.Capabilities{
	"runc":   runc.Capabilities(),
	"gvisor": gvisor.Capabilities(),
	"docker": docker.Capabilities(),
}

// TestDefaultCPUIsTheDrivers checks DefaultCPU, which a record's effective
// limits (and so its Fingerprint) take without a driver at hand, against
// what each driver declares.
func TestDefaultCPUIsTheDrivers(t *testing.T) {
	for name, c := range drivers {
		if got := DefaultCPU(c.Tier); got != c.DefaultCPU {
			t.Errorf("DefaultCPU(%s): got %g, want %g, what driver %s declares", c.Tier, got, c.DefaultCPU, name)
		}
	}
}
