package config

import (
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/registry"
	"github.com/stockade-sh/stockade/sandbox"
)

// Validate checks the configuration and returns the first problem as an
// ErrInvalidArgument. It checks what config knows itself; wiring.Validate
// calls it and then checks what only the runtime packages can (the
// sandbox networks, the broker's operations, the ClickHouse sink).
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("config: %s: %w", fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
	}
	switch {
	case !filepath.IsAbs(c.DataDir):
		return bad("data_dir %q must be an absolute path", c.DataDir)
	case !filepath.IsAbs(c.StateDir):
		return bad("state_dir %q must be an absolute path", c.StateDir)
	case !slices.Contains(DriverNames, c.Driver):
		return bad("unknown driver %q (known: %v)", c.Driver, DriverNames)
	case c.Driver == "kubernetes" && c.Kubernetes.Namespace == "":
		return bad("kubernetes.namespace must be set for the kubernetes driver")
	case c.Kubernetes.SeccompDir != "" && !filepath.IsAbs(c.Kubernetes.SeccompDir):
		return bad("kubernetes.seccomp_dir %q must be an absolute path", c.Kubernetes.SeccompDir)
	case c.Defaults.Timeout <= 0 || c.Defaults.Timeout > time.Hour:
		return bad("defaults.timeout %s is out of range (more than 0, at most 1h)", sandbox.FormatDuration(c.Defaults.Timeout))
	case c.MaxConcurrent <= 0:
		return bad("max_concurrent must be positive")
	case c.ApprovalTTL <= 0:
		return bad("approval_ttl must be positive")
	case c.CreditsPerInvocation < 0:
		return bad("credits_per_invocation must not be negative")
	case c.MaxConnections <= 0:
		return bad("max_connections must be positive")
	case c.PoolMaxAge <= 0:
		return bad("pool_max_age must be positive, such as 10m")
	case c.MemoryBudget < 0:
		return bad("memory_budget must not be negative (0: no bound)")
	case !slices.Contains([]string{"", "text", "json"}, c.LogFormat):
		return bad("log_format %q must be text or json", c.LogFormat)
	case !slices.Contains([]string{"", "debug", "info", "warn", "error"}, c.LogLevel):
		return bad("log_level %q must be debug, info, warn or error", c.LogLevel)
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"idle_timeout", c.IdleTimeout}, {"header_timeout", c.HeaderTimeout}, {"body_timeout", c.BodyTimeout}, {"write_timeout", c.WriteTimeout},
		{"analytics.interval", c.Analytics.Interval}, {"analytics.clickhouse.timeout", c.Analytics.ClickHouse.Timeout},
		{"analytics.outbox.max_age", c.Analytics.Outbox.MaxAge}, {"sessions.idle_timeout", c.Sessions.IdleTimeout},
		{"sessions.max_idle_timeout", c.Sessions.MaxIdleTimeout}, {"sessions.ttl", c.Sessions.TTL}, {"sessions.max_ttl", c.Sessions.MaxTTL}} {
		if d.v <= 0 {
			return bad("%s must be positive, such as 30s", d.key)
		}
	}
	switch a := c.Analytics; {
	case a.BatchSize <= 0:
		return bad("analytics.batch_size %d must be positive", a.BatchSize)
	case a.Outbox.MaxRows <= 0:
		return bad("analytics.outbox.max_rows must be positive")
	}
	switch ss := c.Sessions; {
	case ss.IdleTimeout > ss.MaxIdleTimeout:
		return bad("sessions.idle_timeout %s is above sessions.max_idle_timeout %s", sandbox.FormatDuration(ss.IdleTimeout), sandbox.FormatDuration(ss.MaxIdleTimeout))
	case ss.TTL > ss.MaxTTL:
		return bad("sessions.ttl %s is above sessions.max_ttl %s", sandbox.FormatDuration(ss.TTL), sandbox.FormatDuration(ss.MaxTTL))
	case ss.MaxPerWorkspace <= 0:
		return bad("sessions.max_per_workspace must be positive")
	case ss.WorkspaceSize <= 0 || ss.WorkspaceSize > ss.MaxWorkspaceSize:
		return bad("sessions.workspace_size %s must be positive and at most sessions.max_workspace_size %s", ss.WorkspaceSize.String(), ss.MaxWorkspaceSize.String())
	case ss.MaxFileSize <= 0:
		return bad("sessions.max_file_size must be positive")
	case ss.CheckpointDir != "" && !filepath.IsAbs(ss.CheckpointDir):
		return bad("sessions.checkpoint_dir %q must be an absolute path", ss.CheckpointDir)
	case ss.MaxForks < 0 || ss.MaxForks > 100:
		return bad("sessions.max_forks %d out of range: 0 (the default) to 100", ss.MaxForks)
	case ss.SnapshotTTL < 0:
		return bad("sessions.snapshot_ttl %s must not be negative", sandbox.FormatDuration(ss.SnapshotTTL))
	case ss.MaxCheckpointBytes < 0:
		return bad("sessions.max_checkpoint_bytes %s must not be negative", ss.MaxCheckpointBytes.String())
	case ss.PauseAfterIdle < 0:
		return bad("sessions.pause_after_idle %s must not be negative", sandbox.FormatDuration(ss.PauseAfterIdle))
	case ss.CreditsPerSessionHour != 0:
		return bad("sessions.credits_per_session_hour: only 0 is supported: a session's cells are charged, its time is not")
	case ss.OnShutdown != OnShutdownKeep && ss.OnShutdown != OnShutdownEnd:
		return bad("sessions.on_shutdown %q: want %s or %s", ss.OnShutdown, OnShutdownKeep, OnShutdownEnd)
	}
	if c.Kubernetes.Registry != "" {
		if _, err := registry.ParseReference(c.Kubernetes.Registry); err != nil {
			return fmt.Errorf("config: kubernetes.registry: %w", err)
		}
	} else if c.Kubernetes.RegistryInsecure {
		return bad("kubernetes.registry_insecure is set without kubernetes.registry")
	}
	if err := c.checkPools(); err != nil {
		return bad("%v", err)
	}
	if err := c.checkTemplateSources(); err != nil {
		return bad("%v", err)
	}
	if err := c.Defaults.Check(c.Ceiling); err != nil {
		return bad("defaults above the ceiling: %v", err)
	}
	for _, o := range c.Broker.Operations {
		for _, p := range o.Params {
			if p.MaxLength < 0 {
				return bad("broker operation %q: parameter %q: max_length must not be negative", o.Name, p.Name)
			}
		}
	}
	return nil
}

// checkPools checks the pools' shape; wiring.Validate that the default
// tool has one pool per runtime whether it is named or not, and the engine,
// when the daemon starts, that each pool's tool and runtime can be pooled.
func (c Config) checkPools() error {
	seen := map[[2]string]bool{}
	for i, p := range c.Pools {
		tool := p.Tool
		switch {
		case p.Runtime == "":
			return fmt.Errorf("pools[%d]: runtime is missing (pools: [{runtime: python, size: 2, sessions: 1}])", i)
		case p.Size < 0 || p.Size > MaxPoolSize:
			return fmt.Errorf("pools[%d]: size %d out of range: 0 (disabled) to %d", i, p.Size, MaxPoolSize)
		case p.Sessions < 0 || p.Sessions > MaxPoolSize:
			return fmt.Errorf("pools[%d]: sessions %d out of range: 0 (disabled) to %d", i, p.Sessions, MaxPoolSize)
		case p.Max < 0 || p.Max > MaxPoolSize || p.SessionsMax < 0 || p.SessionsMax > MaxPoolSize:
			return fmt.Errorf("pools[%d]: max %d or sessions_max %d out of range: 0 (the default) to %d", i, p.Max, p.SessionsMax, MaxPoolSize)
		case seen[[2]string{tool, p.Runtime}]:
			return fmt.Errorf("pools[%d]: tool %q with runtime %q has a pool already", i, tool, p.Runtime)
		}
		seen[[2]string{tool, p.Runtime}] = true
	}
	return nil
}
