package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
    - name: echo
      method: GET
      url: http://127.0.0.1:8080/echo
      credential: {file: /etc/stockade/echo-token}
`,
			check: func(t *testing.T, c Config) {
				ops := c.BrokerOperations()
				if len(ops) != 2 {
					t.Fatalf("got %d operations, want 2", len(ops))
				}
				o := ops[0]
				if o.Name != "issues.create" || o.Method != "POST" || !o.JSONBody || o.Credential.Env != "EXAMPLE_TOKEN" || o.Header != "X-Api-Key" || o.Prefix != "Token " {
					t.Errorf("got %+v", o)
				}
				if len(o.Params) != 2 || o.Params[0].Name != "repo" || o.Params[0].Pattern != "[a-z0-9-]+" || !o.Params[0].Required || o.Params[0].MaxLen != 64 || o.Params[1].Required {
					t.Errorf("got params %+v", o.Params)
				}
				if ops[1].Credential.File != "/etc/stockade/echo-token" || ops[1].Credential.Env != "" {
					t.Errorf("got credential %+v, want the file", ops[1].Credential)
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
		{name: "broker unknown key", yaml: "broker:\n  operations:\n    - {name: x, secret: y}\n", wantErr: "field secret not found"},
		{name: "lookup env not from a file", yaml: "lookup_env: x\n", wantErr: "field lookup_env not found"},
		{name: "unknown key", yaml: "lisen: x\n", wantErr: "field lisen not found"},
		{name: "bad size", yaml: "defaults:\n  memory: lots\n", wantErr: "invalid size"},
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
			c.Broker.Operations = []BrokerOperation{{Name: "echo", Method: "GET", URL: "http://example.test/", Credential: BrokerCredential{Env: "A", File: "/b"}}}
		},
		func(c *Config) {
			c.Broker.Operations = []BrokerOperation{{Name: "echo", Method: "GET", URL: "http://{host}/", Params: []BrokerParam{{Name: "host"}}, Credential: BrokerCredential{Env: "A"}}}
		},
		func(c *Config) {
			c.Broker.Operations = []BrokerOperation{{Name: "echo", Method: "GET", URL: "http://example.test/", Params: []BrokerParam{{Name: "q", MaxLength: -1}}, Credential: BrokerCredential{Env: "A"}}}
		},
		func(c *Config) { c.EgressRange = "10.213.0.0" },
		func(c *Config) { c.EgressRange = "10.213.0.0/30" },
		func(c *Config) { c.EgressRange = "fd00::/64" },
		func(c *Config) { c.EgressPrefix = "Stockade" },
	}
	for i, mutate := range bad {
		c := Default()
		mutate(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("case %d: got no error", i)
		}
	}
	for key, mutate := range map[string]func(*Config){
		"idle_timeout":    func(c *Config) { c.IdleTimeout = 0 },
		"header_timeout":  func(c *Config) { c.HeaderTimeout = -time.Second },
		"body_timeout":    func(c *Config) { c.BodyTimeout = 0 },
		"write_timeout":   func(c *Config) { c.WriteTimeout = 0 },
		"max_connections": func(c *Config) { c.MaxConnections = 0 },
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
	if err := Default().Validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
	c := Default()
	c.EgressRange, c.EgressPrefix = "172.30.0.0/20", "stb"
	if err := c.Validate(); err != nil {
		t.Errorf("another egress range and prefix: %v", err)
	}
	if nc, err := c.NetnsConfig(); err != nil || nc.Range.String() != "172.30.0.0/20" || nc.Prefix != "stb" {
		t.Errorf("NetnsConfig: %+v, %v", nc, err)
	}
}
