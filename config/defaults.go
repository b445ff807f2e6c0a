package config

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/sandbox"
)

// The defaults of the configuration's keys, declared here only: Default
// sets them, and a package that takes one of these values and fills a zero
// field of its options (capability, engine, api, mcp, analytics, image)
// reads it here.
const (
	DefaultDataDir  = "/var/lib/stockade"
	DefaultStateDir = "/run/stockade"
	DefaultDriver   = "gvisor"
	DefaultRunc     = "runc"
	DefaultRunsc    = "runsc"

	DefaultListen         = "127.0.0.1:8700"
	DefaultIdleTimeout    = time.Minute
	DefaultHeaderTimeout  = 10 * time.Second
	DefaultBodyTimeout    = 30 * time.Second
	DefaultWriteTimeout   = 30 * time.Second
	DefaultMaxConnections = 1024

	// The sandbox networks' (package netns).
	DefaultEgressRange  = "10.213.0.0/16"
	DefaultEgressPrefix = "stk"

	DefaultApprovalTTL          = 10 * time.Minute
	DefaultCreditsPerInvocation = 2
	DefaultPoolMaxAge           = 10 * time.Minute
	// DefaultPoolGrowth is a pool's ceiling (pools' max, sessions_max)
	// as a multiple of its floor (size, sessions) when none is set.
	DefaultPoolGrowth = 2

	// DefaultMirror is the Debian mirror of the runtime images and of the
	// templates' debian_packages.
	DefaultMirror = "http://deb.debian.org/debian"
	// DefaultNPMRegistry is the npm registry templates' npm packages come
	// from when template_sources names none.
	DefaultNPMRegistry = "https://registry.npmjs.org"

	// The defaults of analytics: (package analytics).
	DefaultClickHouseDatabase = "stockade"
	DefaultClickHouseTable    = "tool_invocations"
	DefaultClickHouseTimeout  = 10 * time.Second
	DefaultAnalyticsBatchSize = 1000
	DefaultAnalyticsInterval  = time.Second
	DefaultOutboxMaxRows      = 1_000_000
	DefaultOutboxMaxAge       = 7 * 24 * time.Hour

	// The defaults of mcp: (package mcp, and api's /mcp). The approval URL
	// is the approval console's page of request {id}, relative to the
	// daemon's URL.
	DefaultMCPApprovalWait      = 60 * time.Second
	DefaultMCPApprovalURL       = "/ui/approvals/{id}"
	DefaultMCPMaxSessionsPerKey = 16
)

// DefaultMaxConcurrent is max_concurrent's default: 2 x the number of
// cores.
func DefaultMaxConcurrent() int { return 2 * runtime.NumCPU() }

// DefaultMaxQueue is max_queue's default for a max_concurrent of
// maxConcurrent: twice as many invocations wait as run.
func DefaultMaxQueue(maxConcurrent int) int { return 2 * maxConcurrent }

// DefaultSessions are the bounds of the sessions of the default
// configuration (`sessions:`).
func DefaultSessions() Sessions {
	return Sessions{IdleTimeout: 10 * time.Minute, MaxIdleTimeout: time.Hour, TTL: time.Hour, MaxTTL: 24 * time.Hour,
		MaxPerWorkspace: 4, WorkspaceSize: 256 << 20, MaxWorkspaceSize: 1 << 30, MaxFileSize: 64 << 20, OnShutdown: OnShutdownKeep}
}

// DefaultPools are the pools of the default configuration: a small python
// pool of the default tool, on its tier: two sandboxes for one-shot
// executions and one for a new session.
func DefaultPools() []Pool {
	return []Pool{{Runtime: "python", Size: 2, Sessions: 1}}
}

// DefaultTemplateSources are the sources of the default configuration.
func DefaultTemplateSources() TemplateSources {
	return TemplateSources{Mirror: DefaultMirror, NPMRegistry: DefaultNPMRegistry}
}

// DefaultMemoryBudget is memory_budget's default: three quarters of the
// host's memory (MemTotal); 0, no bound, when it is unknown.
func DefaultMemoryBudget() int64 { return hostMemory() / 4 * 3 }

// hostMemory is the host's memory in bytes (MemTotal), 0 when unknown.
func hostMemory() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		var kb int64
		if _, err := fmt.Sscanf(line, "MemTotal: %d kB", &kb); err == nil {
			return kb << 10
		}
	}
	return 0
}

// Default returns the embedded defaults.
func Default() Config {
	return Config{
		DataDir:   DefaultDataDir,
		StateDir:  DefaultStateDir,
		Driver:    DefaultDriver,
		RuncPath:  DefaultRunc,
		RunscPath: DefaultRunsc,
		Defaults:  sandbox.DefaultLimits(),
		Ceiling:   sandbox.DefaultCeiling(),

		EgressRange:  DefaultEgressRange,
		EgressPrefix: DefaultEgressPrefix,

		Listen:               DefaultListen,
		IdleTimeout:          DefaultIdleTimeout,
		HeaderTimeout:        DefaultHeaderTimeout,
		BodyTimeout:          DefaultBodyTimeout,
		WriteTimeout:         DefaultWriteTimeout,
		MaxConnections:       DefaultMaxConnections,
		MaxConcurrent:        DefaultMaxConcurrent(),
		ApprovalTTL:          DefaultApprovalTTL,
		CreditsPerInvocation: DefaultCreditsPerInvocation,
		Pools:                DefaultPools(),
		Kubernetes:           Kubernetes{Namespace: DefaultKubeNamespace, GVisorClass: DefaultKubeGVisorClass},
		TemplateSources:      DefaultTemplateSources(),
		PoolMaxAge:           DefaultPoolMaxAge,
		MemoryBudget:         DefaultMemoryBudget(),
		MCP:                  MCP{ApprovalWait: DefaultMCPApprovalWait, ApprovalURL: DefaultMCPApprovalURL, MaxSessionsPerKey: DefaultMCPMaxSessionsPerKey},
		Analytics: Analytics{
			ClickHouse: ClickHouse{Database: DefaultClickHouseDatabase, Table: DefaultClickHouseTable, Timeout: DefaultClickHouseTimeout},
			BatchSize:  DefaultAnalyticsBatchSize,
			Interval:   DefaultAnalyticsInterval,
			Outbox:     Outbox{MaxRows: DefaultOutboxMaxRows, MaxAge: DefaultOutboxMaxAge},
		},
		Sessions: DefaultSessions(),
	}
}

// DefaultMaxForks is sessions.max_forks's default: the most sessions one
// fork (POST /v1/sessions/{id}/fork) starts.
const DefaultMaxForks = 16

// DefaultMaxCheckpointBytes is sessions.max_checkpoint_bytes's default:
// the disk a workspace's snapshots and paused sessions' checkpoints may
// hold before its snapshots and forks are refused, some 25 snapshots of a
// python session.
const DefaultMaxCheckpointBytes = 4 << 30

// DefaultSnapshotTTL is sessions.snapshot_ttl's default: how long a
// session's snapshot is kept unless it is deleted first.
const DefaultSnapshotTTL = 24 * time.Hour

// The kubernetes driver's namespace and gVisor RuntimeClass by default.
const (
	DefaultKubeNamespace   = "stockade"
	DefaultKubeGVisorClass = "gvisor"
)

// DefaultE2BListen is the E2B listener's address by default: none (the
// E2B wire is off).
const DefaultE2BListen = ""
