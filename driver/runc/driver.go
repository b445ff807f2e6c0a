// Package runc is the `container` tier: sandboxes run by Debian's runc with
// namespaces, cgroups, the tightened seccomp profile and no capabilities.
//
//	d, err := runc.New(runc.Config{StateDir: "/run/stockade/runc", GuestPath: guestPath})
package runc

import (
	"path/filepath"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/internal/hostids"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/sandbox"
)

// Config configures the runc driver.
type Config struct {
	// Binary is the runc executable; empty means config.DefaultRunc
	// ("runc") on PATH.
	Binary string
	// StateDir holds runc's state and the bundles; empty means
	// config.DefaultStateDir/runc.
	StateDir string
	// GuestPath is the host path of the stockade-guest binary. Required.
	GuestPath string
	// Shim is the command that supervises a detached sandbox: `stockade
	// shim`, to which the shim's directory is appended. Nil refuses
	// detached sandboxes.
	Shim []string
	// HostIDs hands out the host ids of the sandboxes' user namespaces;
	// nil means hostids.Default(), shared by every process on the host.
	HostIDs *hostids.Allocator
}

// DefaultCPU is the CPU share of a container-tier sandbox.
const DefaultCPU = 0.5

// New returns the runc driver.
func New(cfg Config) (*ocidriver.Driver, error) {
	return ocidriver.New(ociConfig(cfg))
}

// Capabilities are what the runc driver declares, without building one.
func Capabilities() sandbox.Capabilities { return ociConfig(Config{}).Capabilities() }

func ociConfig(cfg Config) ocidriver.Config {
	if cfg.Binary == "" {
		cfg.Binary = config.DefaultRunc
	}
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join(config.DefaultStateDir, "runc")
	}
	return ocidriver.Config{
		Name:           "runc",
		Tier:           sandbox.TierContainer,
		Boundary:       "Linux namespaces, cgroups, seccomp filter, no capabilities (shared host kernel)",
		Binary:         cfg.Binary,
		StateDir:       cfg.StateDir,
		GuestPath:      cfg.GuestPath,
		Shim:           cfg.Shim,
		Defaults:       sandbox.Limits{CPU: DefaultCPU},
		PeakFromCgroup: true,
		// `runc run` copies the container's stdio through pipes of its
		// own: the guest's frames go around that copy loop.
		ChannelFDs: true,
		// runc needs no flag for either mode: the bundle's network
		// namespace (fresh, or the prepared one by path) decides.
		NetworkArgs: map[sandbox.NetworkMode][]string{sandbox.NetworkNone: nil, sandbox.NetworkEgress: nil},
		InstallHint: "install it with `stockade setup` (Debian package runc)",
		// runc makes a user namespace for each sandbox (docs/design.md §3:
		// one where the tier supports it).
		UserNamespace: true,
		HostIDs:       cfg.HostIDs,
		Lacks: map[string]string{
			// Measured on the hosts Stockade is tested on (CRIU 3.17.1,
			// Debian's, on kernel 6.18): `criu check` fails filling the
			// vdso symbol table, and `criu dump` of a plain process fails
			// the same way, so runc checkpoint cannot work before the
			// profile (a user namespace, seccomp, a read-only root) is
			// tried at all. Hence no Snapshotter on this tier.
			"Snapshots": "runc checkpoints through CRIU, and CRIU (3.17) cannot dump any process on this host's kernel: criu check fails on the vdso (kerndat_vdso_fill_symtable) before any part of the profile (user namespace, seccomp, read-only root) matters",
		},
	}
}
