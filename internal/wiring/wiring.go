// Package wiring builds Stockade's engine from its configuration: the
// sandbox drivers, the runtime images, the egress host (sandbox networks,
// egress proxy, credential broker) and the tools. It is the one place that
// names the concrete drivers, so that the engine knows them only by the
// sandbox.Driver contract. The CLI's commands and the benchmarks use it:
//
//	eng, err := wiring.Engine(cfg)
//	svc := capability.NewService(eng, st, opts) // the store comes from internal/storeopen
package wiring

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/stockade-sh/stockade/broker"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/docker"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/modal"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/driver/vercel"
	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/guestbin"
	"github.com/stockade-sh/stockade/internal/netns"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// Engine validates cfg (Validate) and returns an engine over its drivers (Drivers),
// its image store, its egress host (EgressHost) and its tools, which may
// name the configured templates.
func Engine(cfg config.Config) (*engine.Engine, error) {
	if err := Validate(cfg); err != nil {
		return nil, err
	}
	drivers, err := Drivers(cfg)
	if err != nil {
		return nil, err
	}
	def, ok := drivers[cfg.Driver]
	if !ok {
		return nil, fmt.Errorf("default driver %q is not configured: %w", cfg.Driver, errdefs.ErrInvalidArgument)
	}
	host, err := EgressHost(cfg)
	if err != nil {
		return nil, err
	}
	// Records with egress or credentials load where egress works, and in
	// the CLI's engines (config.Config.Serving); a daemon without egress
	// refuses them at start.
	// Tools name templates: the templates load first, and the tools'
	// records carry their declarations.
	tmpls, err := cfg.LoadTemplates()
	if err != nil {
		return nil, fmt.Errorf("loading templates: %w", err)
	}
	topts := tools.Options{DataRoot: cfg.MountRoot(), Ceiling: cfg.Ceiling, Drivers: tools.CapabilitiesOf(drivers), DefaultTier: def.Capabilities().Tier,
		EgressSupported: host != nil || !cfg.Serving, Templates: tmpls}
	set, err := LoadTools(cfg, topts)
	if err != nil {
		return nil, fmt.Errorf("loading tools: %w", err)
	}
	opts := []engine.Option{engine.WithTools(set, topts), engine.WithEgress(host), engine.WithMemoryBudget(cfg.MemoryBudget)}
	if cfg.Serving {
		// Only the daemon keeps warm pools (Engine.StartPools).
		opts = append(opts, engine.WithPools(PoolOptions(cfg)),
			engine.WithGolden(engine.GoldenOptions{Dir: cfg.GoldenDir(), Workspace: int64(cfg.Sessions.WorkspaceSize)}))
	}
	return engine.New(drivers, cfg.Driver, image.Open(cfg.ImageDir()), cfg.Defaults, cfg.Ceiling, opts...)
}

// DriverCapabilities are what the drivers Engine builds from cfg declare,
// by name, without building them: what `stockade tools` checks records
// against (tools.Options.Drivers) when no engine runs.
func DriverCapabilities(cfg config.Config) map[string]sandbox.Capabilities {
	if cfg.Driver == KubernetesGVisor {
		return KubernetesCapabilities(cfg.Kubernetes)
	}
	return map[string]sandbox.Capabilities{"runc": runc.Capabilities(), "gvisor": gvisor.Capabilities(), "docker": docker.Capabilities(),
		"vercel": vercel.Capabilities(), "modal": modal.Capabilities()}
}

// Drivers returns the drivers of cfg by name: runc, gvisor and docker,
// and vercel and modal each when it is the default driver or has a
// token (its New names the credentials it lacks; modal, when it is not
// the default, is left out with a warning instead); or, when cfg.Driver is
// "kubernetes", only the cluster's (KubernetesDrivers). It installs the
// embedded guest agent unless cfg.GuestPath is set.
func Drivers(cfg config.Config) (map[string]sandbox.Driver, error) {
	guestPath := cfg.GuestPath
	if guestPath == "" {
		p, err := guestbin.Install(cfg.BinDir())
		if err != nil {
			return nil, err
		}
		guestPath = p
	}
	if cfg.Driver == KubernetesGVisor {
		return KubernetesDrivers(cfg.Kubernetes, guestPath)
	}
	// Detached sandboxes are supervised by this very binary's `stockade
	// shim`.
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding this executable, the shim of detached sandboxes: %w", err)
	}
	shim := []string{exe, "shim"}
	rc, err := runc.New(runc.Config{Binary: cfg.RuncPath, StateDir: cfg.StateDir + "/runc", GuestPath: guestPath, Shim: shim})
	if err != nil {
		return nil, err
	}
	gv, err := gvisor.New(gvisor.Config{Binary: cfg.RunscPath, StateDir: cfg.StateDir + "/gvisor", GuestPath: guestPath, Shim: shim})
	if err != nil {
		return nil, err
	}
	// The docker driver connects lazily: an engine that is unreachable
	// fails only its own Health and Create, never runc or gvisor.
	dk, err := docker.New(docker.Config{Host: cfg.DockerHost, GuestPath: guestPath})
	if err != nil {
		return nil, err
	}
	drivers := map[string]sandbox.Driver{"runc": rc, "gvisor": gv, "docker": dk}
	if cfg.Driver == "vercel" || cfg.Vercel.Token != "" {
		// No I/O here either: bad credentials fail its Health and Create.
		v, err := vercel.New(VercelConfig(cfg))
		switch {
		case err == nil:
			drivers["vercel"] = v
		case cfg.Driver == "vercel":
			return nil, err
		default:
			// Not the default: as modal's below (docs/vercel.md).
			slog.Warn("the vercel driver is left out", "err", err)
		}
	}
	if cfg.Driver == "modal" || cfg.Modal.TokenID != "" {
		// No I/O here either: bad credentials fail its Health and Create.
		m, err := modal.New(ModalConfig(cfg))
		switch {
		case err == nil:
			drivers["modal"] = m
		case cfg.Driver == "modal":
			return nil, err
		default:
			// Not the default: the daemon runs without it rather than
			// refuse to start over a half-given token (docs/modal.md).
			slog.Warn("the modal driver is left out", "err", err)
		}
	}
	return drivers, nil
}

// ModalConfig is the modal driver's configuration of cfg.
func ModalConfig(cfg config.Config) modal.Config {
	return modal.Config{TokenID: cfg.Modal.TokenID, TokenSecret: cfg.Modal.TokenSecret, ServerURL: cfg.Modal.API,
		Environment: cfg.Modal.Environment, App: cfg.Modal.App, Defaults: cfg.Defaults}
}

// VercelConfig is the vercel driver's configuration of cfg.
func VercelConfig(cfg config.Config) vercel.Config {
	return vercel.Config{Token: cfg.Vercel.Token, TeamID: cfg.Vercel.TeamID, ProjectID: cfg.Vercel.ProjectID, BaseURL: cfg.Vercel.API, Defaults: cfg.Defaults}
}

// EgressHost returns the egress host of cfg, or nil when cfg does not
// enable egress or the host cannot give it (not root, no nftables): then
// tools with egress are refused when they are loaded. It removes the
// sandbox networks a crashed daemon left.
func EgressHost(cfg config.Config) (*engine.EgressHost, error) {
	if !cfg.Egress {
		return nil, nil
	}
	log := slog.Default()
	if os.Geteuid() != 0 {
		log.Warn("egress disabled: sandbox networks need root; tools with egress are refused")
		return nil, nil
	}
	nc, err := NetnsConfig(cfg)
	if err != nil {
		return nil, err
	}
	nets, err := netns.NewManager(nc)
	if err != nil {
		return nil, err
	}
	removed, err := nets.CleanupStale()
	if err != nil {
		log.Warn("egress disabled: cleaning up sandbox networks failed (is nftables available?); tools with egress are refused", "err", err)
		return nil, nil
	}
	if len(removed) > 0 {
		log.Info("removed sandbox networks left by a previous daemon", "count", len(removed))
	}
	// The broker exists even without operations, so that a tool listing
	// one is refused by name when the engine is built.
	return engine.NewEgressHost(nets, egress.Config{Logger: log.With("component", "egress")},
		&broker.Config{Operations: BrokerOperations(cfg), LookupEnv: cfg.LookupEnv, Logger: log.With("component", "broker")})
}
