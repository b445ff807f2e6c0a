package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
)

func TestLoadFile(t *testing.T) {
	tests := []struct {
		name, yaml string
		check      func(t *testing.T, c Config)
		wantErr    string
	}{
		{
			name: "server and limits",
			yaml: "listen: 127.0.0.1:9000\ndriver: runc\nmax_concurrent: 3\ndefaults:\n  memory: 256MiB\n  timeout: 10s\nceiling:\n  timeout: 2m\n  memory: 1GiB\n",
			check: func(t *testing.T, c Config) {
				if c.Listen != "127.0.0.1:9000" || c.Driver != "runc" || c.MaxConcurrent != 3 {
					t.Errorf("got listen %s driver %s max %d", c.Listen, c.Driver, c.MaxConcurrent)
				}
				if c.Defaults.Memory != 256<<20 || c.Defaults.Timeout != 10*time.Second || c.Defaults.Pids != 128 {
					t.Errorf("defaults: got %+v, want memory 256 MiB, timeout 10s, pids kept at 128", c.Defaults)
				}
				if c.Ceiling.Timeout != 2*time.Minute || c.Ceiling.Memory != 1<<30 {
					t.Errorf("ceiling: got %+v", c.Ceiling)
				}
				if err := c.Validate(); err != nil {
					t.Errorf("Validate: %v", err)
				}
			},
		},
		{
			name: "pools and the memory budget",
			yaml: "pools:\n  - {tool: code.execute, runtime: python, size: 3, sessions: 2}\n  - {runtime: node, size: 0}\nmemory_budget: 6GiB\npool_max_age: 2m\n",
			check: func(t *testing.T, c Config) {
				want := []Pool{{Tool: "code.execute", Runtime: "python", Size: 3, Sessions: 2}, {Runtime: "node"}}
				if !slices.Equal(c.Pools, want) || c.MemoryBudget != 6<<30 || c.PoolMaxAge != 2*time.Minute {
					t.Errorf("got pools %+v, budget %d, max age %s; want %+v, 6 GiB, 2m", c.Pools, c.MemoryBudget, c.PoolMaxAge, want)
				}
				if err := c.Validate(); err != nil {
					t.Errorf("Validate: %v", err)
				}
			},
		},
		{
			name: "no pools",
			yaml: "pools: []\n",
			check: func(t *testing.T, c Config) {
				if len(c.Pools) != 0 {
					t.Errorf("got pools %+v, want none", c.Pools)
				}
			},
		},
		{
			name: "broker operations",
			yaml: `broker:
  operations:
    - name: issues.create
      method: POST
      url: https://api.example.com/v1/repos/{repo}/issues
      params:
        - {name: repo, pattern: "[a-z0-9-]+", required: true, max_length: 64}
        - {name: title}
      json_body: true
      credential: {env: EXAMPLE_TOKEN}
      header: X-Api-Key
      prefix: "Token "
      response_headers: [Etag, X-RateLimit-Remaining]
    - name: echo
      method: GET
      url: http://127.0.0.1:8080/echo
      credential: {file: /etc/stockade/echo-token}
`,
			check: func(t *testing.T, c Config) {
				ops := c.Broker.Operations
				if len(ops) != 2 || ops[0].Name != "issues.create" || len(ops[0].Params) != 2 || ops[0].Params[0].MaxLength != 64 || ops[1].Credential.File != "/etc/stockade/echo-token" {
					t.Fatalf("got operations %+v, want the file's two (their conversion: wiring's TestConfigConversions)", ops)
				}
				if err := c.Validate(); err != nil {
					t.Errorf("Validate: %v", err)
				}
			},
		},
		{
			name: "API connection bounds",
			yaml: "idle_timeout: 90s\nheader_timeout: 5s\nbody_timeout: 1m\nwrite_timeout: 20s\nmax_connections: 64\n",
			check: func(t *testing.T, c Config) {
				if c.IdleTimeout != 90*time.Second || c.HeaderTimeout != 5*time.Second || c.BodyTimeout != time.Minute || c.WriteTimeout != 20*time.Second || c.MaxConnections != 64 {
					t.Errorf("got idle %s, header %s, body %s, write %s, max %d; want 90s, 5s, 1m, 20s, 64",
						c.IdleTimeout, c.HeaderTimeout, c.BodyTimeout, c.WriteTimeout, c.MaxConnections)
				}
				if err := c.Validate(); err != nil {
					t.Errorf("Validate: %v", err)
				}
			},
		},
		{name: "lookup env not from a file", yaml: "lookup_env: x\n", wantErr: `unknown key "lookup_env"`},
		{name: "serving not from a file", yaml: "serving: true\n", wantErr: `unknown key "serving"`},
		{
			name: "every daemon key",
			yaml: "runc: /opt/runc\nrunsc: /opt/runsc\nguest: /opt/guest\negress: false\napproval_ttl: 2 min\ncredits_per_invocation: 0\ndefaults: {timeout: 1m30s, tmp_size: 32m, output_cap: 64KiB, cpu: 0.5, pids: 64}\n",
			check: func(t *testing.T, c Config) {
				if c.RuncPath != "/opt/runc" || c.RunscPath != "/opt/runsc" || c.GuestPath != "/opt/guest" || c.Egress || c.ApprovalTTL != 2*time.Minute || c.CreditsPerInvocation != 0 {
					t.Errorf("got %+v", c)
				}
				if d := c.Defaults; d.Timeout != 90*time.Second || d.TmpSize != 32<<20 || d.OutputCap != 64<<10 || d.CPU != 0.5 || d.Pids != 64 || d.Memory != 512<<20 {
					t.Errorf("defaults: got %+v", d)
				}
			},
		},
		{
			name: "analytics",
			yaml: "analytics:\n  clickhouse: {url: 'http://u:p@127.0.0.1:8123', database: stats, timeout: 3s}\n  batch_size: 500\n  interval: 2s\n  outbox: {max_rows: 5000, max_age: 24h}\n",
			check: func(t *testing.T, c Config) {
				a := c.Analytics
				if !a.Enabled() || a.ClickHouse.URL != "http://u:p@127.0.0.1:8123" || a.ClickHouse.Database != "stats" || a.ClickHouse.Table != "tool_invocations" ||
					a.ClickHouse.Timeout != 3*time.Second || a.BatchSize != 500 || a.Interval != 2*time.Second || a.Outbox.MaxRows != 5000 || a.Outbox.MaxAge != 24*time.Hour {
					t.Errorf("got %+v, want the file's values and the default table", a)
				}
				if err := c.Validate(); err != nil {
					t.Errorf("Validate: %v", err)
				}
			},
		},
		{name: "analytics unknown key", yaml: "analytics:\n  clickhouse: {password: x}\n", wantErr: `unknown key "password"`},
		{name: "empty file", yaml: "", check: func(t *testing.T, c Config) {
			if c.Listen != Default().Listen {
				t.Errorf("an empty file changed listen to %q", c.Listen)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "stockade.yaml")
			if err := os.WriteFile(p, []byte(tt.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			c := Default()
			err := c.LoadFile(p)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

func TestValidate(t *testing.T) {
	bad := []func(*Config){
		func(c *Config) { c.DataDir = "relative" },
		func(c *Config) { c.Driver = "kata" },
		func(c *Config) { c.Defaults.Timeout = 0 },
		func(c *Config) { c.Defaults.Memory = c.Ceiling.Memory + 1 },
		func(c *Config) { c.MaxConcurrent = 0 },
		func(c *Config) { c.ApprovalTTL = 0 },
		func(c *Config) {
			c.Broker.Operations = []BrokerOperation{{Name: "echo", Method: "GET", URL: "http://example.test/", Params: []BrokerParam{{Name: "q", MaxLength: -1}}, Credential: BrokerCredential{Env: "A"}}}
		},
		func(c *Config) { c.Analytics.BatchSize = 0 },
		func(c *Config) { c.Analytics.Outbox.MaxRows = 0 },
		func(c *Config) { c.Pools = []Pool{{Size: 2}} },
		func(c *Config) { c.Pools = []Pool{{Runtime: "python", Size: -1}} },
		func(c *Config) { c.Pools = []Pool{{Runtime: "python", Size: MaxPoolSize + 1}} },
		func(c *Config) { c.Pools = []Pool{{Runtime: "python", Sessions: -1}} },
		func(c *Config) { c.Pools = []Pool{{Runtime: "python", Sessions: MaxPoolSize + 1}} },
		func(c *Config) {
			c.Pools = []Pool{{Tool: "calc", Runtime: "python", Size: 1}, {Tool: "calc", Runtime: "python", Size: 2}}
		},
		func(c *Config) { c.PoolMaxAge = 0 },
		func(c *Config) { c.MemoryBudget = -1 },
		func(c *Config) { c.Driver, c.Kubernetes.Namespace = "kubernetes", "" },
		func(c *Config) { c.Kubernetes.SeccompDir = "relative" },
		func(c *Config) { c.Kubernetes.Registry = "http://10.0.0.1:5000" },
		func(c *Config) { c.Kubernetes.Registry = "r:5000/python@sha256:00" },
		// The registry's own grammar (registry.ParseReference), not only
		// a scheme, "@" or a space.
		func(c *Config) { c.Kubernetes.Registry = "registry.example/Team" },
		func(c *Config) { c.Kubernetes.Registry = "registry_example:5000" },
		func(c *Config) { c.Kubernetes.Registry = "registry.example//a" },
		func(c *Config) { c.Kubernetes.RegistryInsecure = true },
	}
	for i, mutate := range bad {
		c := Default()
		mutate(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("case %d: got no error", i)
		}
	}
	for key, mutate := range map[string]func(*Config){
		"idle_timeout":                 func(c *Config) { c.IdleTimeout = 0 },
		"header_timeout":               func(c *Config) { c.HeaderTimeout = -time.Second },
		"body_timeout":                 func(c *Config) { c.BodyTimeout = 0 },
		"write_timeout":                func(c *Config) { c.WriteTimeout = 0 },
		"max_connections":              func(c *Config) { c.MaxConnections = 0 },
		"analytics.interval":           func(c *Config) { c.Analytics.Interval = 0 },
		"analytics.clickhouse.timeout": func(c *Config) { c.Analytics.ClickHouse.Timeout = 0 },
		"analytics.outbox.max_age":     func(c *Config) { c.Analytics.Outbox.MaxAge = -time.Hour },
	} {
		c := Default()
		mutate(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), key+" must be positive") {
			t.Errorf("%s not positive: got %v, want an error naming it", key, err)
		}
	}
	if d := Default(); d.IdleTimeout > 2*time.Minute || d.BodyTimeout > 30*time.Second {
		t.Errorf("default bounds: got idle %s, body %s; want at most 2m and 30s", d.IdleTimeout, d.BodyTimeout)
	}
	c := Default()
	c.Kubernetes.Registry, c.Kubernetes.RegistryInsecure = "registry.example:5000/team/stockade", true
	if err := c.Validate(); err != nil {
		t.Errorf("kubernetes.registry %s: %v", c.Kubernetes.Registry, err)
	}
	if err := Default().Validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
	if Default().Analytics.Enabled() {
		t.Errorf("analytics is on by default, want off")
	}
}

// TestLoadFileWrongForms has one case per kind of YAML mistake in a
// configuration file: the error names the file and line, the key path and
// the form the key takes, never a Go type.
func TestLoadFileWrongForms(t *testing.T) {
	tests := []struct{ name, yaml, want string }{
		{"list for a string", "listen: [a, b]\n", `:1: listen: want a string, got a list`},
		{"mapping for a string", "db: {url: x}\n", `:1: db: want a string, got a mapping`},
		{"word for an integer", "max_concurrent: lots\n", `:1: max_concurrent: want an integer, got "lots"`},
		{"fraction for an integer", "max_queue: 1.5\n", `:1: max_queue: want an integer, got "1.5"`},
		{"word for a boolean", "egress: maybe\n", `:1: egress: want true or false, got "maybe"`},
		{"duration without a unit", "approval_ttl: 600\n", `:1: approval_ttl: invalid duration "600": a number needs a unit`},
		{"word for a duration", "approval_ttl: later\n", `:1: approval_ttl: invalid duration "later"`},
		{"list for a duration", "defaults:\n  timeout: [1s]\n", `:2: defaults.timeout: want a duration such as 30s or 2m, got a list`},
		{"word for a size", "defaults:\n  memory: lots\n", `:2: defaults.memory: invalid size "lots" (use e.g. 512MiB, 1GiB or 64m)`},
		{"list for a size", "ceiling: {tmp_size: [1]}\n", `:1: ceiling.tmp_size: want a size such as 512MiB, 1GiB or 64m, got a list`},
		{"word for a number", "ceiling: {cpu: lots}\n", `:1: ceiling.cpu: want a number, got "lots"`},
		{"scalar for a mapping", "defaults: small\n", `:1: defaults: want a mapping (keys: memory, cpu, pids, timeout, tmp_size, output_cap), got "small"`},
		{"scalar for a list", "broker: {operations: x}\n", `:1: broker.operations: want a list of mappings, got "x"`},
		{"nested element", "broker:\n  operations:\n    - name: a\n      params:\n        - {name: q, max_length: long}\n", `:5: broker.operations[0].params[0].max_length: want an integer, got "long"`},
		{"mapping for the tools", "tools: {a: b}\n", `:1: tools: want the path of a tools file or directory, or a list of tools, got a mapping`},
		{"unknown pool key", "pools:\n  - {runtime: python, count: 2}\n", `:2: pools[0]: unknown key "count" (known: tool, runtime, size, sessions, max, sessions_max)`},
		{"word for a pool size", "pools: [{runtime: python, size: many}]\n", `:1: pools[0].size: want an integer, got "many"`},
		{"word for the memory budget", "memory_budget: half\n", `:1: memory_budget: invalid size "half"`},
		{"unknown key", "lisen: x\n", `:1: unknown key "lisen" (did you mean listen?)`},
		{"unknown nested key", "broker:\n  operations:\n    - {name: x, secret: y}\n", `:3: broker.operations[0]: unknown key "secret" (known: name, method, url, params, json_body, credential, header, prefix, response_headers)`},
		{"old key", "runc_path: /usr/sbin/runc\n", `:1: unknown key "runc_path" (did you mean runc?)`},
		{"repeated key", "listen: a\nlisten: b\n", `:2: key "listen" is given twice`},
		{"not a mapping", "- listen\n", `:1: a configuration file is a mapping of keys such as listen: and data_dir:`},
		{"syntax", "listen: [a\n", `stockade.yaml:1: did not find expected ',' or ']'`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "stockade.yaml")
			if err := os.WriteFile(p, []byte(tt.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			c := Default()
			err := c.LoadFile(p)
			if err == nil || !strings.Contains(err.Error(), p+tt.want) && !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("got %v, want an ErrInvalidArgument", err)
			}
			for _, goWord := range []string{"!!", "unmarshal", "struct", "int64", "float64", "config.", "time.Duration"} {
				if strings.Contains(err.Error(), goWord) {
					t.Errorf("%q names a Go type (%q)", err, goWord)
				}
			}
		})
	}
}
