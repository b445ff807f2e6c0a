package wiring

import (
	"fmt"
	"net/netip"

	"github.com/stockade-sh/stockade/analytics"
	"github.com/stockade-sh/stockade/broker"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/netns"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
)

// This file converts the configuration (package config, which imports no
// runtime package) into the runtime packages' own types: the sandbox
// networks (netns), the credential broker, analytics, the engine's pools,
// the template builds' sources (image) and the tools.

// Validate checks cfg: config.Config.Validate, then what the runtime
// packages check when they are built (the sandbox networks' range and
// prefix, the broker's operations, the ClickHouse sink, the outbox's batch
// bound, the default tool's pools), so that a mistake is reported before
// anything starts. Every problem is an ErrInvalidArgument.
func Validate(cfg config.Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("config: %s: %w", fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
	}
	if n := cfg.Analytics.BatchSize; n > store.MaxOutboxBatch {
		return bad("analytics.batch_size %d out of range: 1 to %d", n, store.MaxOutboxBatch)
	}
	// The sink checks the URL and the names; building one contacts nothing.
	if cfg.Analytics.Enabled() {
		if _, err := analytics.NewClickHouse(ClickHouseConfig(cfg.Analytics)); err != nil {
			return fmt.Errorf("config: analytics.clickhouse: %w", err)
		}
	}
	// An empty pool tool is the default tool: one pool each.
	seen := map[[2]string]bool{}
	for i, p := range cfg.Pools {
		tool := p.Tool
		if tool == "" {
			tool = tools.DefaultName
		}
		if seen[[2]string{tool, p.Runtime}] {
			return bad("pools[%d]: tool %q with runtime %q has a pool already", i, tool, p.Runtime)
		}
		seen[[2]string{tool, p.Runtime}] = true
	}
	if _, err := NetnsConfig(cfg); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	// The broker checks its operations (names, methods, URL templates,
	// patterns, credentials) when it is built; building one here reports
	// a mistake before anything starts.
	if len(cfg.Broker.Operations) > 0 {
		if _, err := broker.New(broker.Config{Operations: BrokerOperations(cfg)}); err != nil {
			return fmt.Errorf("config: %w", err)
		}
	}
	return nil
}

// NetnsConfig returns the configuration of the sandbox networks, checked.
func NetnsConfig(cfg config.Config) (netns.Config, error) {
	nc := netns.Config{Prefix: cfg.EgressPrefix}
	if cfg.EgressRange != "" {
		r, err := netip.ParsePrefix(cfg.EgressRange)
		if err != nil {
			return netns.Config{}, fmt.Errorf("egress_range %q: %v: %w", cfg.EgressRange, err, errdefs.ErrInvalidArgument)
		}
		nc.Range = r
	}
	// The manager checks the prefix and the range; building one touches
	// nothing on the host.
	if _, err := netns.NewManager(nc); err != nil {
		return netns.Config{}, err
	}
	return nc, nil
}

// BrokerOperations returns the configured broker operations in the
// broker's types.
func BrokerOperations(cfg config.Config) []broker.Operation {
	var ops []broker.Operation
	for _, o := range cfg.Broker.Operations {
		op := broker.Operation{Name: o.Name, Method: o.Method, URL: o.URL, JSONBody: o.JSONBody,
			Credential: broker.Credential{Env: o.Credential.Env, File: o.Credential.File}, Header: o.Header, Prefix: o.Prefix,
			ResponseHeaders: o.ResponseHeaders}
		for _, p := range o.Params {
			op.Params = append(op.Params, broker.Param{Name: p.Name, Pattern: p.Pattern, Required: p.Required, MaxLen: p.MaxLength})
		}
		ops = append(ops, op)
	}
	return ops
}

// ClickHouseConfig returns the analytics sink's configuration.
func ClickHouseConfig(a config.Analytics) analytics.ClickHouseConfig {
	c := a.ClickHouse
	return analytics.ClickHouseConfig{URL: c.URL, Database: c.Database, Table: c.Table, Timeout: c.Timeout}
}

// ShipperOptions returns the analytics shipper's options of a, without
// its observer and logger.
func ShipperOptions(a config.Analytics) analytics.Options {
	return analytics.Options{BatchSize: a.BatchSize, Interval: a.Interval, MaxRows: a.Outbox.MaxRows, MaxAge: a.Outbox.MaxAge}
}

// PoolOptions are the engine's pools of cfg.
func PoolOptions(cfg config.Config) engine.PoolOptions {
	o := engine.PoolOptions{MaxAge: cfg.PoolMaxAge, MaxConcurrent: cfg.MaxConcurrent, SessionWorkspace: int64(cfg.Sessions.WorkspaceSize),
		CheckpointDir: cfg.PoolCheckpointDir()}
	for _, p := range cfg.Pools {
		o.Pools = append(o.Pools, engine.PoolSpec{Tool: p.Tool, Runtime: p.Runtime, Size: p.Size, Sessions: p.Sessions,
			Max: p.Max, SessionsMax: p.SessionsMax})
	}
	return o
}

// TemplateSources returns where template builds fetch from, every default
// applied: the wheelhouse below the data directory unless one is set.
func TemplateSources(cfg config.Config) image.TemplateSources {
	s := cfg.TemplateSources
	if s.Wheelhouse == "" {
		s.Wheelhouse = cfg.Wheelhouse()
	}
	if s.Mirror == "" {
		s.Mirror = config.DefaultMirror
	}
	if s.NPMRegistry == "" {
		s.NPMRegistry = config.DefaultNPMRegistry
	}
	return image.TemplateSources{Mirror: s.Mirror, Wheelhouse: s.Wheelhouse, PythonIndex: s.PythonIndex, NPMRegistry: s.NPMRegistry,
		DataRoot: cfg.MountRoot()}
}

// LoadTools loads the configured tools (the configuration file's list, or
// the Tools path) with opts; see tools.Load.
func LoadTools(cfg config.Config, opts tools.Options) (*tools.Set, error) {
	if cfg.ToolsList != nil {
		return tools.LoadList(cfg.ToolsList.File, cfg.ToolsList.Node, opts)
	}
	return tools.Load(cfg.Tools, opts)
}
