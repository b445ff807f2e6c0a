package sandbox

import (
	"fmt"
	"math"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
)

// Limits bound one sandbox. A zero field means "the default" (see
// DefaultLimits), never "unlimited".
type Limits struct {
	Memory    int64         // bytes of memory, swap is always 0; default 512 MiB
	CPU       float64       // cores; default is the driver's (0.5 runc, 1 gvisor)
	Pids      int64         // processes and threads; default 128
	Timeout   time.Duration // wall clock per Exec; default 30 s
	TmpSize   int64         // bytes of the /tmp tmpfs; default 64 MiB
	OutputCap int64         // bytes kept of each of stdout and stderr; default 1 MiB
}

// Bounds that no configuration can move.
const (
	MinMemory   = 16 << 20
	MaxCodeSize = 1 << 20
)

// DefaultLimits are the default limits of the security profile
// (docs/design.md §3). CPU is left zero: each driver fills in its own
// default.
func DefaultLimits() Limits {
	return Limits{
		Memory:    512 << 20,
		Pids:      128,
		Timeout:   30 * time.Second,
		TmpSize:   64 << 20,
		OutputCap: 1 << 20,
	}
}

// DefaultCeiling is the highest any invocation may ask for unless the
// operator configures otherwise.
func DefaultCeiling() Limits {
	return Limits{
		Memory:    4 << 30,
		CPU:       2,
		Pids:      1024,
		Timeout:   10 * time.Minute,
		TmpSize:   1 << 30,
		OutputCap: 16 << 20,
	}
}

// WithDefaults returns l with each zero field taken from d.
func (l Limits) WithDefaults(d Limits) Limits {
	if l.Memory == 0 {
		l.Memory = d.Memory
	}
	if l.CPU == 0 {
		l.CPU = d.CPU
	}
	if l.Pids == 0 {
		l.Pids = d.Pids
	}
	if l.Timeout == 0 {
		l.Timeout = d.Timeout
	}
	if l.TmpSize == 0 {
		l.TmpSize = d.TmpSize
	}
	if l.OutputCap == 0 {
		l.OutputCap = d.OutputCap
	}
	return l
}

// Check reports the first limit of l that is out of range or above ceiling,
// as an ErrInvalidArgument. Zero fields of l are not checked (they take
// defaults); zero fields of ceiling mean "no ceiling".
func (l Limits) Check(ceiling Limits) error {
	bad := func(format string, a ...any) error {
		return errdefs.Publicf("%s: %w", fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
	}
	switch {
	case l.Memory < 0 || (l.Memory > 0 && l.Memory < MinMemory):
		return bad("memory %s is below the minimum of %s", FormatSize(l.Memory), FormatSize(MinMemory))
	case ceiling.Memory > 0 && l.Memory > ceiling.Memory:
		return bad("memory %s is above the ceiling of %s", FormatSize(l.Memory), FormatSize(ceiling.Memory))
	case l.CPU < 0 || math.IsNaN(l.CPU) || math.IsInf(l.CPU, 0):
		// NaN passes every comparison, and runc would turn it into a
		// negative CPU quota: no limit at all.
		return bad("cpu %g must be a positive number", l.CPU)
	case ceiling.CPU > 0 && l.CPU > ceiling.CPU:
		return bad("cpu %g is above the ceiling of %g", l.CPU, ceiling.CPU)
	case l.Pids < 0 || (l.Pids > 0 && l.Pids < 8):
		return bad("pids %d is below the minimum of 8", l.Pids)
	case ceiling.Pids > 0 && l.Pids > ceiling.Pids:
		return bad("pids %d is above the ceiling of %d", l.Pids, ceiling.Pids)
	case l.Timeout < 0:
		return bad("timeout %s must be positive", FormatDuration(l.Timeout))
	case ceiling.Timeout > 0 && l.Timeout > ceiling.Timeout:
		return bad("timeout %s is above the ceiling of %s", FormatDuration(l.Timeout), FormatDuration(ceiling.Timeout))
	case l.TmpSize < 0 || (l.TmpSize > 0 && l.TmpSize < 1<<20):
		return bad("tmp size %s is below the minimum of 1MiB", FormatSize(l.TmpSize))
	case ceiling.TmpSize > 0 && l.TmpSize > ceiling.TmpSize:
		return bad("tmp size %s is above the ceiling of %s", FormatSize(l.TmpSize), FormatSize(ceiling.TmpSize))
	case l.OutputCap < 0:
		return bad("output cap %s must not be negative", FormatSize(l.OutputCap))
	case ceiling.OutputCap > 0 && l.OutputCap > ceiling.OutputCap:
		return bad("output cap %s is above the ceiling of %s", FormatSize(l.OutputCap), FormatSize(ceiling.OutputCap))
	}
	return nil
}
