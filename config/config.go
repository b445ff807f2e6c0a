// Package config is Stockade's one configuration: defaults, then a file,
// then flags and environment (read by cmd/stockade only), then Validate.
// Packages below cmd/ receive typed values from here and never read the
// environment themselves.
package config

import (
	"path/filepath"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/stockade-sh/stockade/sandbox"
)

// Drivers Stockade can be configured with.
var DriverNames = []string{"runc", "gvisor", "docker", "vercel", "modal", "kubernetes"}

// Config is the whole configuration of a Stockade process. The zero value is
// not valid; start from Default.
type Config struct {
	// DataDir holds images, the database and installed binaries.
	DataDir string `yaml:"data_dir"`
	// StateDir holds runtime state and bundles; it should be on a tmpfs
	// (/run) so that a reboot clears it.
	StateDir string `yaml:"state_dir"`
	// Driver is the default driver for invocations that do not name one.
	Driver string `yaml:"driver"`
	// RuncPath and RunscPath are the runtime executables (names on PATH or
	// absolute paths).
	RuncPath  string `yaml:"runc"`
	RunscPath string `yaml:"runsc"`
	// DockerHost is the Docker Engine the docker driver uses, e.g.
	// "unix:///run/stockade/docker.sock"; empty means the Docker client's
	// default, unix:///var/run/docker.sock. The driver connects on first
	// use, so an unreachable engine affects only the docker driver.
	DockerHost string `yaml:"docker_host"`
	// Vercel configures the vercel driver (Vercel Sandbox microVMs).
	Vercel Vercel `yaml:"vercel"`
	// Modal configures the modal driver (Modal Sandboxes, gVisor).
	Modal Modal `yaml:"modal"`
	// GuestPath overrides the guest agent embedded in the binary (tests).
	GuestPath string `yaml:"guest"`
	// Defaults fill the limits an invocation does not set; Ceiling bounds
	// what it may set. In the file: `defaults:` and `ceiling:` with
	// memory, cpu, pids, timeout, tmp_size and output_cap keys.
	Defaults sandbox.Limits `yaml:"-"`
	Ceiling  sandbox.Limits `yaml:"-"`

	// Tools is a YAML file or a directory of them defining tools and their
	// isolation records; empty means only the built-in default tool, unless
	// ToolsList is set. In the file, `tools:` takes such a path (relative
	// to the file's directory) or the list of tools itself.
	Tools string `yaml:"-"`
	// ToolsList is the list of tools of a configuration file that lists
	// them itself (`tools: [...]`); nil means none. SetTools replaces it.
	ToolsList *ToolsList `yaml:"-"`
	// Templates is a YAML file or a directory of them declaring templates
	// (package templates), which tools name; empty means none, unless
	// TemplatesList is set. In the file, `templates:` takes such a path
	// (relative to the file's directory) or the list itself, as `tools:`.
	Templates string `yaml:"-"`
	// TemplatesList is the list of templates of a configuration file that
	// lists them itself; nil means none. SetTemplates replaces it.
	TemplatesList *TemplatesList `yaml:"-"`
	// TemplateSources are where template builds fetch packages and wheels
	// from; see TemplateSources, and wiring.TemplateSources for the
	// defaults applied.
	TemplateSources TemplateSources `yaml:"template_sources"`
	// DataRoot is the only directory tools may mount data from, and
	// templates copy files from; empty means DataDir/data.
	DataRoot string `yaml:"data_root"`
	// Egress lets sandboxes of tools with an egress allowlist reach it
	// through the host's egress proxy (needs root and nftables; otherwise
	// such tools are refused). Only the daemon may set it: at start it
	// removes every sandbox network on the host that carries Stockade's
	// prefix, which would cut off another process's sandboxes. False (the
	// zero value) means no sandbox gets network. The daemon's flag
	// defaults to true; the configuration file is read only by the
	// daemon and by commands that do not run sandboxes.
	Egress bool `yaml:"egress"`
	// Serving is set by the daemon: its engine refuses, at start, records
	// with egress or credentials that it cannot serve (no egress). The
	// CLI's engines load them, run a tool with egress without network and
	// refuse one that needs the broker, so that one such record does not
	// make every tool of a directory unusable.
	Serving bool `yaml:"-"`
	// EgressRange is the IPv4 range the sandbox networks' addresses come
	// from, a /30 per sandbox with egress; empty means DefaultEgressRange. It
	// must be a range no other network of the host uses.
	EgressRange string `yaml:"egress_range"`
	// EgressPrefix names the host objects of the sandbox networks
	// (namespaces, interfaces, nftables tables), 2-6 lower-case letters;
	// empty means DefaultEgressPrefix. Two daemons on one host need different prefixes
	// and ranges.
	EgressPrefix string `yaml:"egress_prefix"`
	// Broker configures the credential broker: in the file,
	// `broker: {operations: [...]}`. Tools may list only operations named
	// here in their credentials. No operations (the zero value) means no
	// tool with credentials can run.
	Broker Broker `yaml:"broker"`
	// LookupEnv reads the daemon's environment for broker credentials
	// that name a variable. Only cmd/stockade sets it (to os.LookupEnv),
	// since packages never read the environment themselves; it is never
	// read from a file. Nil means no environment: every such credential is
	// missing and its operation answers 503.
	LookupEnv func(string) (string, bool) `yaml:"-"`

	// Listen is the daemon's HTTP address.
	Listen string `yaml:"listen"`
	// The API's connections end. IdleTimeout closes one that has waited
	// this long for its next request; HeaderTimeout one whose request
	// headers have not arrived this long after its first byte (or, on a
	// new connection, after it opened); BodyTimeout a request whose body
	// has not arrived this long after its headers (the wait for the answer,
	// a long poll or an event stream, is not bounded by it); WriteTimeout
	// one whose client has not taken a write of the answer this long after
	// it began. All must be positive.
	IdleTimeout   time.Duration `yaml:"idle_timeout"`
	HeaderTimeout time.Duration `yaml:"header_timeout"`
	BodyTimeout   time.Duration `yaml:"body_timeout"`
	WriteTimeout  time.Duration `yaml:"write_timeout"`
	// MaxConnections caps the API connections open at once; one accepted
	// beyond it is closed at once, unread, and counted in /metrics.
	MaxConnections int `yaml:"max_connections"`
	// BehindTLS says that clients reach the daemon through a proxy that
	// terminates TLS: the approval console then marks its cookies Secure.
	// False marks them Secure only on requests that came over TLS.
	BehindTLS bool `yaml:"behind_tls"`
	// LogFormat is the daemon's log form on stderr: "text" (slog's
	// key=value lines, the default when empty) or "json" (one JSON object
	// a line). LogLevel is the least level logged: debug, info (the
	// default when empty), warn or error.
	LogFormat string `yaml:"log_format"`
	LogLevel  string `yaml:"log_level"`
	// DB is the database URL: sqlite:PATH or postgres://...; empty means
	// sqlite in DataDir.
	DB string `yaml:"db"`
	// AuditWitness is the directory where the daemon witnesses the heads
	// of the audit chains, outside the database (internal/witness); empty
	// means next to a SQLite file, and none for PostgreSQL: name a
	// directory on the daemon's host, out of the database's reach.
	AuditWitness string `yaml:"audit_witness"`
	// MaxConcurrent bounds the sandboxes running at once; the default is
	// DefaultMaxConcurrent, 2 x the number of cores.
	MaxConcurrent int `yaml:"max_concurrent"`
	// MaxQueue bounds invocations waiting for a slot; zero means
	// DefaultMaxQueue(MaxConcurrent), negative means no queue.
	MaxQueue int `yaml:"max_queue"`
	// Pools are the daemon's warm pools (engine's pools): per tool and
	// runtime, sandboxes created ahead with their interpreter started, for
	// one-shot executions (size) and for new sessions (sessions). In the
	// file, `pools:` replaces the whole list; a size or sessions of 0
	// disables that kind, an empty list all of them.
	Pools []Pool `yaml:"pools"`
	// PoolMaxAge is how long a pool sandbox waits at most before it is
	// replaced.
	PoolMaxAge time.Duration `yaml:"pool_max_age"`
	// MemoryBudget bounds the memory limits of the daemon's live and
	// pooled sandboxes on this host together (a remote driver's do not
	// count): past it invocations are refused (429) and pools do not
	// refill. In the file `memory_budget:` takes a size;
	// 0 means no bound. The default is three quarters of the host's
	// memory.
	MemoryBudget int64 `yaml:"-"`
	// ApprovalTTL is how long approval requests stay pending.
	ApprovalTTL time.Duration `yaml:"approval_ttl"`
	// CreditsPerInvocation is the flat price of an invocation; zero means
	// free. Left out of the file, it keeps DefaultCreditsPerInvocation.
	CreditsPerInvocation int64 `yaml:"credits_per_invocation"`
	// MCP configures the tools of the daemon's /mcp endpoint.
	MCP MCP `yaml:"mcp"`
	// Analytics ships the tool_invocations rows to ClickHouse (the daemon
	// only); an empty Analytics.ClickHouse.URL, the default, ships nothing.
	Analytics Analytics `yaml:"analytics"`
	// Sessions bounds the stateful sessions (the daemon only).
	Sessions Sessions `yaml:"sessions"`
	// E2B serves the wire of E2B's SDKs (package e2b); off unless its
	// listen address is set.
	E2B E2B `yaml:"e2b"`
	// Kubernetes configures the kubernetes driver, which runs sandboxes as
	// pods of a cluster; it is built only when Driver is "kubernetes".
	Kubernetes Kubernetes `yaml:"kubernetes"`
}

// Kubernetes configures the kubernetes driver (driver: kubernetes): the
// daemon then runs every sandbox as a pod of the cluster, the gvisor tier
// with GVisorClass, the container tier with ContainerClass, and no local
// tier (docs/kubernetes.md):
//
//	kubernetes: {kubeconfig: /etc/stockade/kubeconfig, namespace: stockade, gvisor_class: gvisor}
type Kubernetes struct {
	// Kubeconfig is the path of a kubeconfig file; empty means the
	// in-cluster configuration (the daemon runs in a pod of the cluster).
	Kubeconfig string `yaml:"kubeconfig"`
	// Namespace holds the sandboxes' pods and their deny-all network
	// policy; DefaultKubeNamespace unless set.
	Namespace string `yaml:"namespace"`
	// GVisorClass is the RuntimeClass of the gvisor tier's pods;
	// DefaultKubeGVisorClass unless set.
	GVisorClass string `yaml:"gvisor_class"`
	// ContainerClass is the RuntimeClass of the container tier's pods;
	// empty means the cluster's default runtime (runc).
	ContainerClass string `yaml:"container_class"`
	// SeccompDir, if set, is the kubelet's seccomp directory
	// (<kubelet root>/seccomp) as the daemon sees it: the daemon writes
	// Stockade's filters there at start and gives pods them as Localhost
	// profiles. Empty means the runtime's default filter (RuntimeDefault).
	SeccompDir string `yaml:"seccomp_dir"`
	// Registry, if set, is where `stockade image push` put the images,
	// host[:port][/prefix] without a scheme: pods then name their image
	// by digest there and the nodes pull it. Empty means the images are
	// imported on each node (docs/kubernetes.md, "Images in the
	// cluster"). The daemon asks it which digest each image's tag
	// names, with the credentials of STOCKADE_REGISTRY_USERNAME and
	// STOCKADE_REGISTRY_PASSWORD, as `stockade image push` does.
	Registry string `yaml:"registry"`
	// RegistryInsecure has the daemon ask Registry over plain http, not
	// https: a registry the nodes' containerd pulls from over http. A
	// password is then refused unless the host is loopback.
	RegistryInsecure bool `yaml:"registry_insecure"`
}

// E2B configures the E2B-compatible listener: one address serves the
// control plane (E2B_API_URL) and the sandboxes' envd and code
// interpreter (E2B_SANDBOX_URL), routed by the E2b-Sandbox-Id and
// E2b-Sandbox-Port headers.
type E2B struct {
	// Listen is its TCP address, e.g. 127.0.0.1:3000; empty (the
	// default, DefaultE2BListen) serves no E2B wire.
	Listen string `yaml:"listen"`
}

// Sessions bounds the stateful sessions:
//
//	sessions: {idle_timeout: 10m, ttl: 1h, max_per_workspace: 4, workspace_size: 256MiB, max_file_size: 64MiB}
type Sessions struct {
	// IdleTimeout ends a session no cell ran in for so long, and TTL any
	// session after so long; a session may ask for others, up to
	// MaxIdleTimeout and MaxTTL.
	IdleTimeout    time.Duration `yaml:"idle_timeout"`
	MaxIdleTimeout time.Duration `yaml:"max_idle_timeout"`
	TTL            time.Duration `yaml:"ttl"`
	MaxTTL         time.Duration `yaml:"max_ttl"`
	// MaxPerWorkspace bounds a workspace's live sessions; a workspace
	// policy's max_sessions may lower it.
	MaxPerWorkspace int `yaml:"max_per_workspace"`
	// WorkspaceSize is the size of a session's /workspace (a tmpfs, which
	// counts against the session's memory); at most MaxWorkspaceSize.
	WorkspaceSize    ByteSize `yaml:"workspace_size"`
	MaxWorkspaceSize ByteSize `yaml:"max_workspace_size"`
	// MaxFileSize bounds one file moved in or out of a session.
	MaxFileSize ByteSize `yaml:"max_file_size"`
	// PauseAfterIdle, when set, pauses a session no cell ran in for so
	// long instead of ending it at its idle timeout, where its driver can
	// save a sandbox (gvisor; not runc): its checkpoint goes to
	// CheckpointDir and it ends at its ttl. Zero (the default) is off.
	PauseAfterIdle time.Duration `yaml:"pause_after_idle"`
	// CheckpointDir holds the checkpoints of paused sessions; empty means
	// DataDir/checkpoints (see Config.CheckpointDir).
	CheckpointDir string `yaml:"checkpoint_dir"`
	// CreditsPerSessionHour would charge a session's time besides its
	// cells; only 0 (free) is supported.
	CreditsPerSessionHour int64 `yaml:"credits_per_session_hour"`
	// OnShutdown is what the daemon does with its sessions when it stops
	// on SIGTERM, SIGINT or SIGHUP: OnShutdownKeep (the default) leaves their
	// sandboxes running for the next start to serve again, each ending by
	// itself shortly after its ttl if no daemon comes back;
	// OnShutdownEnd ends them all first, audited, as deleting each would.
	// SIGUSR2 stops the daemon as OnShutdownEnd does, whatever this says.
	OnShutdown string `yaml:"on_shutdown"`
	// MaxForks is the most sessions one fork starts (POST
	// /v1/sessions/{id}/fork); zero is DefaultMaxForks.
	MaxForks int `yaml:"max_forks"`
	// SnapshotTTL is how long a session's snapshot is kept unless deleted
	// first; zero is DefaultSnapshotTTL.
	SnapshotTTL time.Duration `yaml:"snapshot_ttl"`
	// MaxCheckpointBytes bounds the disk of a workspace's checkpoints (its
	// snapshots' and its paused sessions', the checkpoint_bytes it is
	// shown): a snapshot or fork is refused (429) while they hold as much;
	// zero is DefaultMaxCheckpointBytes.
	MaxCheckpointBytes ByteSize `yaml:"max_checkpoint_bytes"`
}

// The values of Sessions.OnShutdown.
const (
	OnShutdownKeep = "keep"
	OnShutdownEnd  = "end"
)

// MCP configures the MCP tools; the mcp package checks the values (the
// daemon refuses to start on a bad one).
type MCP struct {
	// ApprovalWait bounds a tool call's wait for an approver's decision
	// when the MCP client cannot show the approval page; zero is
	// DefaultMCPApprovalWait.
	ApprovalWait time.Duration `yaml:"approval_wait"`
	// ApprovalURL is the page of an approval request, with "{id}" for its
	// id, relative to the URL a client reached the daemon by unless
	// absolute; empty is DefaultMCPApprovalURL, the approval console's.
	ApprovalURL string `yaml:"approval_url"`
	// MaxSessionsPerKey bounds the MCP sessions of /mcp that one key keeps
	// open at once (one more ends the key's oldest), and its stateless
	// requests in flight (one more is refused); zero is
	// DefaultMCPMaxSessionsPerKey.
	MaxSessionsPerKey int `yaml:"max_sessions_per_key"`
}

// Pool is one warm pool: Size sandboxes of Tool with Runtime for one-shot
// executions, and Sessions sandboxes for new sessions (detached, with a
// /workspace of sessions.workspace_size and the runtime's kernel started).
// Omitted, Sessions is 0: a session pool sandbox costs a supervisor
// process and a kernel besides the interpreter, so it is asked for.
type Pool struct {
	// Tool names the pool's tool; empty means the default tool
	// (code.execute).
	Tool     string `yaml:"tool"`
	Runtime  string `yaml:"runtime"`
	Size     int    `yaml:"size"`
	Sessions int    `yaml:"sessions"`
	// Max and SessionsMax are the ceilings the pools grow toward while
	// runs (sessions) find them empty or wait for a refill, Size and
	// Sessions being the floors they shrink back to when idle; zero is
	// DefaultPoolGrowth times the floor. Below the floor is the floor.
	Max         int `yaml:"max"`
	SessionsMax int `yaml:"sessions_max"`
}

// MaxPoolSize bounds one pool's size.
const MaxPoolSize = 64

// ToolsList is a list of tools written in a configuration file.
type ToolsList struct {
	// File names the configuration file, in the problems found in the list.
	File string
	// Node is the YAML sequence of the tools, with its positions.
	Node *yaml.Node
}

// SetTools makes path the tools file or directory, replacing a list of
// tools the configuration file gave.
func (c *Config) SetTools(path string) { c.Tools, c.ToolsList = path, nil }

// Analytics configures the shipping of tool_invocations rows through the
// database's outbox to ClickHouse (package analytics):
//
//	analytics:
//	  clickhouse: {url: http://127.0.0.1:8123, database: stockade, table: tool_invocations, timeout: 10s}
//	  batch_size: 1000
//	  interval: 1s
//	  outbox: {max_rows: 1000000, max_age: 168h}
type Analytics struct {
	ClickHouse ClickHouse `yaml:"clickhouse"`
	// BatchSize is the most rows sent at once, 1 to the store's
	// MaxOutboxBatch (checked by wiring.Validate).
	BatchSize int `yaml:"batch_size"`
	// Interval is the pause between two rounds of shipping.
	Interval time.Duration `yaml:"interval"`
	Outbox   Outbox        `yaml:"outbox"`
}

// ClickHouse is the server the rows go to (analytics.ClickHouseConfig).
type ClickHouse struct {
	// URL is its HTTP interface, user information allowed
	// (http://user:password@host:8123); empty ships nothing.
	URL string `yaml:"url"`
	// Database and Table are created if missing.
	Database string `yaml:"database"`
	Table    string `yaml:"table"`
	// Timeout bounds each request.
	Timeout time.Duration `yaml:"timeout"`
}

// Outbox bounds the rows waiting to be shipped: past MaxRows rows, or
// MaxAge, the oldest are dropped (and counted): they never reach
// ClickHouse.
type Outbox struct {
	MaxRows int64         `yaml:"max_rows"`
	MaxAge  time.Duration `yaml:"max_age"`
}

// Enabled reports whether rows are shipped.
func (a Analytics) Enabled() bool { return a.ClickHouse.URL != "" }

// Broker is the credential broker's configuration.
type Broker struct {
	Operations []BrokerOperation `yaml:"operations"`
}

// BrokerOperation is one named upstream call of the broker, the YAML form
// of broker.Operation (see there for each field's meaning):
//
//	broker:
//	  operations:
//	    - name: issues.create
//	      method: POST
//	      url: https://api.example.com/v1/repos/{repo}/issues
//	      params:
//	        - {name: repo, pattern: "[a-z0-9-]+", required: true, max_length: 64}
//	        - {name: title, required: true}
//	      json_body: true
//	      credential: {env: EXAMPLE_TOKEN}   # or {file: /etc/stockade/example-token}
//	      header: Authorization
//	      prefix: "Bearer "
//	      response_headers: [Etag, Link, X-RateLimit-Remaining]
type BrokerOperation struct {
	Name            string           `yaml:"name"`
	Method          string           `yaml:"method"`
	URL             string           `yaml:"url"`
	Params          []BrokerParam    `yaml:"params"`
	JSONBody        bool             `yaml:"json_body"`
	Credential      BrokerCredential `yaml:"credential"`
	Header          string           `yaml:"header"`
	Prefix          string           `yaml:"prefix"`
	ResponseHeaders []string         `yaml:"response_headers"`
}

// BrokerParam is a parameter of a BrokerOperation (broker.Param).
type BrokerParam struct {
	Name      string `yaml:"name"`
	Pattern   string `yaml:"pattern"`
	Required  bool   `yaml:"required"`
	MaxLength int    `yaml:"max_length"`
}

// BrokerCredential names where an operation's secret comes from: exactly
// one of an environment variable of the daemon and a file.
type BrokerCredential struct {
	Env  string `yaml:"env"`
	File string `yaml:"file"`
}

// ImageDir is the image store's root.
func (c Config) ImageDir() string { return c.DataDir }

// MountRoot is the directory tools may mount data from.
func (c Config) MountRoot() string {
	if c.DataRoot != "" {
		return c.DataRoot
	}
	return filepath.Join(c.DataDir, "data")
}

// BinDir is where Stockade installs the binaries it manages (the guest).
func (c Config) BinDir() string { return filepath.Join(c.DataDir, "bin") }

// Wheelhouse is the directory of the wheels templates name by file:
// template_sources.wheelhouse, by default below DataDir.
func (c Config) Wheelhouse() string {
	if c.TemplateSources.Wheelhouse != "" {
		return c.TemplateSources.Wheelhouse
	}
	return filepath.Join(c.DataDir, "wheelhouse")
}

// GoldenDir holds the templates' golden checkpoints, on disk below
// DataDir.
func (c Config) GoldenDir() string { return filepath.Join(c.DataDir, "golden") }

// PoolCheckpointDir holds the warm pools' checkpoints (engine's
// poolsnap.go), on disk below DataDir.
func (c Config) PoolCheckpointDir() string { return filepath.Join(c.DataDir, "pools") }

// CheckpointDir holds the checkpoints of paused sessions:
// sessions.checkpoint_dir, by default on disk below DataDir (the state
// directory may be a tmpfs, and a checkpoint outlives a reboot of the
// daemon).
func (c Config) CheckpointDir() string {
	if c.Sessions.CheckpointDir != "" {
		return c.Sessions.CheckpointDir
	}
	return filepath.Join(c.DataDir, "checkpoints")
}

// Modal is where the modal driver's sandboxes run: an app of a Modal
// workspace, in one of its environments, and the workspace's token,
// which comes from the environment only (MODAL_TOKEN_ID,
// MODAL_TOKEN_SECRET), never from a file. The driver is built when it is
// the default driver or a token is given.
type Modal struct {
	// Environment is the Modal environment; empty means the workspace's
	// default.
	Environment string `yaml:"environment"`
	// App names the app the sandboxes belong to; empty means "stockade".
	App string `yaml:"app"`
	// API is the API's address; empty means Modal's.
	API         string `yaml:"api"`
	TokenID     string `yaml:"-"`
	TokenSecret string `yaml:"-"`
}

// Vercel is where the vercel driver's sandboxes run: a team and a project
// of Vercel, and the team's access token, which comes from the
// environment only (VERCEL_TOKEN), never from a file. The driver is built
// when it is the default driver or a token is given.
type Vercel struct {
	TeamID    string `yaml:"team_id"`
	ProjectID string `yaml:"project_id"`
	// API is the API's address; empty means Vercel's.
	API   string `yaml:"api"`
	Token string `yaml:"-"`
}
