// Package conformance is the suite every sandbox.Driver must pass. It proves
// the security profile (sandbox/profile, whose facts it reads and does not
// restate) by attack: a probe program (./probe)
// is delivered into sandboxes like user code, tries what hostile code would
// try and reports what it could see and do, and the suite asserts on those
// reports from the host. A driver's test runs it:
//
//	func TestConformance(t *testing.T) {
//		d, err := runc.New(...)
//		...
//		conformance.Run(t, conformance.Harness{Driver: d, Image: img})
//	}
//
// The suite needs the `go` command (it builds the probe) and an image with
// /bin/busybox (see probeGzip and internal/probeexec, which delivers it).
package conformance

import (
	"context"
	"slices"
	"testing"

	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// Harness is what a driver's test gives the suite.
type Harness struct {
	Driver sandbox.Driver
	// Image is the `shell` runtime image (Debian minbase with busybox). The
	// probe is static, but it is unpacked with the image's /bin/busybox.
	Image sandbox.Image
	// Kernel reads the kernel of a running sandbox, for tiers whose
	// sandboxed processes are not host processes (gVisor's are tasks of
	// the Sentry): the suite needs it there to see them from the host
	// (see daemon). Nil on the shared-kernel tiers, whose processes the
	// suite finds on the host itself.
	Kernel func(ctx context.Context, id string) (SandboxKernel, error)
	// Restart returns a new driver value over the same state as Driver,
	// as a restarted daemon builds one: the suite re-attaches Driver's
	// detached sandboxes with it. Required when the driver declares
	// Reattach.
	Restart func() sandbox.Driver
	// Remote says the driver's sandboxes run on a provider's machines,
	// through its API and without Stockade's guest (driver/vercel): the
	// suite runs only the checks of the driver's own work (RemoteChecks).
	// The others attack the security profile of a sandbox the host runs,
	// which the provider's machine does not have and the host cannot
	// see: that boundary is the provider's to prove.
	Remote bool
}

// RemoteChecks are the checks a Remote driver runs: what it does with
// the requests, the output and the limits it is given.
var RemoteChecks = []string{"Abilities", "ExitCode", "Stdin", "Environment", "Sessions", "Execs", "Kernels", "Files",
	"Reattach", "Deadline", "Bind", "Snapshot", "Timeout", "OutputFlood", "ConcurrentIsolation", "NoPersistence"}

// SandboxKernel is the kernel of a sandbox that has one of its own, as the
// host sees it.
type SandboxKernel struct {
	// HostPID is the host process that runs it (gVisor's Sentry): no task
	// of the sandbox outlives it.
	HostPID int
	// Tasks are the pids of its processes, as the sandbox numbers them.
	Tasks []int
}

// Limits the checks use where the defaults would make them slow.
const (
	tmpSize   = 8 << 20
	pidsLimit = 64
	memLimit  = 256 << 20
	outputCap = 1 << 20
)

// Run runs every check against h.Driver, each as a subtest with sandboxes
// of its own. Every sandbox is destroyed (also when a check fails) and then
// the driver's Leftovers (sandbox.Leftovers, which the suite needs) must
// report nothing for it.
func Run(t *testing.T, h Harness) {
	if h.Driver == nil {
		t.Fatal("conformance.Harness needs a Driver")
	}
	lo, ok := h.Driver.(sandbox.Leftovers)
	if !ok {
		t.Fatalf("driver %s does not implement sandbox.Leftovers, which the suite checks after every Destroy", h.Driver.Name())
	}
	s := &suite{h: h, caps: h.Driver.Capabilities(), p: profile.Default(), probe: probeGzip(t), leftovers: lo.Leftovers}
	s.on = profile.On{Driver: h.Driver.Name(), Tier: s.caps.Tier}
	t.Logf("driver %s, tier %s: %s", h.Driver.Name(), s.caps.Tier, s.caps.Boundary)
	var left []string
	for _, c := range []struct {
		name string
		fn   func(*suite, *testing.T)
	}{
		{"Abilities", (*suite).abilities},
		{"ExitCode", (*suite).exitCode},
		{"Stdin", (*suite).stdin},
		{"Environment", (*suite).environment},
		{"Sessions", (*suite).sessions},
		{"Execs", (*suite).execs},
		{"Kernels", (*suite).kernels},
		{"Files", (*suite).files},
		{"Reattach", (*suite).reattach},
		{"Deadline", (*suite).deadline},
		{"Bind", (*suite).bind},
		{"Snapshot", (*suite).snapshot},
		{"Credentials", (*suite).credentials},
		{"Filesystem", (*suite).filesystem},
		{"Network", (*suite).network},
		{"HostEnvironment", (*suite).hostEnvironment},
		{"HostPIDs", (*suite).hostPIDs},
		{"Descriptors", (*suite).descriptors},
		{"GuestSignals", (*suite).guestSignals},
		{"Syscalls", (*suite).syscalls},
		{"ForkBomb", (*suite).forkBomb},
		{"OOM", (*suite).oom},
		{"Timeout", (*suite).timeout},
		{"CPUCap", (*suite).cpuCap},
		{"Daemon", (*suite).daemon},
		{"OutputFlood", (*suite).outputFlood},
		{"ConcurrentIsolation", (*suite).concurrentIsolation},
		{"NoPersistence", (*suite).noPersistence},
	} {
		if h.Remote && !slices.Contains(RemoteChecks, c.name) {
			left = append(left, c.name)
			continue
		}
		t.Run(c.name, func(t *testing.T) { c.fn(s, t) })
	}
	if len(left) > 0 {
		t.Logf("a remote driver: not run, the provider's boundary: %v", left)
	}
}

type suite struct {
	h         Harness
	caps      sandbox.Capabilities
	leftovers func(ctx context.Context, id string) []string
	// p is the profile the suite asserts: Stockade's.
	p profile.Profile
	// on is where the suite's sandboxes run: the differences declared
	// there are the ones it asserts.
	on    profile.On
	probe []byte // gzip-compressed
}

// sharedKernel reports whether the driver declares that the sandboxed
// program talks to the host kernel directly. There the seccomp filter,
// read-only mounts and cgroups are the boundary, and the program's
// processes are host processes; otherwise (gVisor) the program talks to a
// kernel of the sandbox's own, whose processes the host sees through
// Harness.Kernel, and which presents a few facts of the profile otherwise
// (profile.Profile.Differences).
func (s *suite) sharedKernel() bool { return s.caps.SharedKernel }

// difference returns the profile's difference id declared for the suite's
// driver and tier.
func (s *suite) difference(id string) (profile.Difference, bool) {
	return s.p.Difference(s.on, id)
}

// expect asserts that the profile's fact holds (holds true), unless the tier
// declares difference id: then it asserts the declared fact instead (holds
// false), so that a difference that no longer holds is noticed. A check
// consults the declared differences and nothing else: none skips or
// relaxes an assertion for a tier on its own.
func (s *suite) expect(t *testing.T, id string, holds bool, format string, args ...any) {
	t.Helper()
	d, declared := s.difference(id)
	switch {
	case !declared && !holds:
		t.Errorf(format, args...)
	case declared && holds:
		t.Errorf("%s: the declared difference %q (%s) no longer holds: remove it from the profile's Differences (sandbox/profile)", d.Where(), d.ID, d.Fact)
	}
}
