package capability

import (
	"github.com/stockade-sh/stockade/driver/docker"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/sandbox"
)

// DriverCapabilities are what the real drivers declare, for the tests'
// tool records (tools.Options.Drivers).
func DriverCapabilities() map[string]sandbox.Capabilities {
	return map[string]sandbox.Capabilities{"runc": runc.Capabilities(), "gvisor": gvisor.Capabilities(), "docker": docker.Capabilities()}
}
