// Package gvisor is the `gvisor` tier: sandboxes run by runsc, gVisor's OCI
// runtime, so that the sandboxed program talks to a user-space kernel (the
// Sentry) instead of the host kernel.
//
//	d, err := gvisor.New(gvisor.Config{StateDir: "/run/stockade/gvisor", GuestPath: guestPath})
package gvisor

import (
	"path/filepath"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/internal/oci"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/sandbox"
)

// Version is the gVisor pseudo-version Stockade is tested with. runsc must
// be built static (CGO_ENABLED=0): the default dynamic build fails on hosts
// like ours with "error executing umounter".
//
// It is the first build of gVisor's go branch with the three changes that
// let an idle Sentry sleep (gVisor pull requests 13470 and 13534, and
// commit bb939c6 "kernel: park Timekeeper when idle"): before them, systrap's
// fast-path monitor woke every 400 µs and the Timekeeper and watchdog on a
// timer for the sandbox's whole life, so that each pooled sandbox, doing
// nothing, used about 3% of a core (1.75 CPU-seconds a minute) against
// 0.003% with this build (BENCHMARKS.md, "Warm path under load"; issue 32).
// This build also implements the ambient capability set (CapAmb), which
// the Sentry before it lacked.
const Version = "v0.0.0-20260715073107-67db8f16ca32"

// Config configures the gVisor driver.
type Config struct {
	// Binary is the runsc executable; empty means config.DefaultRunsc
	// ("runsc") on PATH.
	Binary string
	// StateDir holds runsc's state and the bundles; empty means
	// config.DefaultStateDir/gvisor.
	StateDir string
	// GuestPath is the host path of the stockade-guest binary. Required.
	GuestPath string
	// Shim is the command that supervises a detached sandbox: `stockade
	// shim`, to which the shim's directory is appended. Nil refuses
	// detached sandboxes.
	Shim []string
	// Platform is runsc's platform; empty means systrap (kvm does not work
	// on nested hosts such as ours).
	Platform string
}

// DefaultCPU is the CPU share of a gvisor-tier sandbox.
const DefaultCPU = 1

// New returns the gVisor driver, which saves and restores sandboxes with
// runsc checkpoint and restore (ocidriver.Snapshotting).
func New(cfg Config) (*ocidriver.Snapshotting, error) {
	return ocidriver.NewSnapshotting(ociConfig(cfg))
}

// Capabilities are what the gVisor driver declares, without building one.
func Capabilities() sandbox.Capabilities { return ociConfig(Config{}).Capabilities() }

func ociConfig(cfg Config) ocidriver.Config {
	if cfg.Binary == "" {
		cfg.Binary = config.DefaultRunsc
	}
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join(config.DefaultStateDir, "gvisor")
	}
	if cfg.Platform == "" {
		cfg.Platform = "systrap"
	}
	return ocidriver.Config{
		Name:     "gvisor",
		Tier:     sandbox.TierGVisor,
		Boundary: "gVisor user-space kernel (Sentry) behind seccomp and namespaces; the host kernel is not reachable directly",
		Binary:   cfg.Binary,
		GlobalArgs: []string{
			"--platform=" + cfg.Platform,
			// Apply the OCI seccomp profile to the sandboxed program inside
			// the Sentry too, so both tiers refuse the same system calls.
			"--oci-seccomp",
			// The root filesystem is the shared read-only image; no overlay
			// may make it look writable.
			"--overlay2=none",
			"--host-uds=none",
		},
		NetworkArgs: map[sandbox.NetworkMode][]string{
			// No network stack at all: the sandbox sees only loopback.
			sandbox.NetworkNone: {"--network=none"},
			// The Sentry's own network stack on the interfaces of the
			// prepared namespace the sandbox joins (internal/netns),
			// whose host-side rules let through only DNS and the proxy.
			sandbox.NetworkEgress: {"--network=sandbox"},
		},
		Kernel:               oci.UserSpaceKernel,
		Snapshots:            true,
		PrivateRootForMounts: true,
		StateDir:             cfg.StateDir,
		GuestPath:            cfg.GuestPath,
		Shim:                 cfg.Shim,
		Defaults:             sandbox.Limits{CPU: DefaultCPU},
		// The Sentry counts a task's time in the program as CPU time
		// while the host throttles it at the quota: the host's count is
		// the one the cap holds to.
		CPUFromCgroup: true,
		Lacks: map[string]string{
			// runsc --network=sandbox hands the namespace's interfaces to
			// the Sentry's netstack once, when the sandbox starts.
			"BindEgress": "gVisor's netstack takes the network namespace's interfaces when the sandbox starts and never sees one added later: egress is given at create only",
		},
		InstallHint: "build it with `stockade setup` (CGO_ENABLED=0 go install gvisor.dev/gvisor/runsc@" + Version + ")",
	}
}
