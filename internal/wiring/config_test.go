package wiring_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/internal/wiring"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// loadConfig returns the defaults with the file of body applied.
func loadConfig(t *testing.T, body string) config.Config {
	t.Helper()
	p := filepath.Join(t.TempDir(), "stockade.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	c := config.Default()
	if err := c.LoadFile(p); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestConfigConversions checks the configuration's conversions into the
// runtime packages' types: the broker's operations, analytics and the
// sandbox networks.
func TestConfigConversions(t *testing.T) {
	c := config.Default()
	c.Broker.Operations = []config.BrokerOperation{
		{Name: "issues.create", Method: "POST", URL: "https://api.example.com/v1/repos/{repo}/issues",
			Params:   []config.BrokerParam{{Name: "repo", Pattern: "[a-z0-9-]+", Required: true, MaxLength: 64}, {Name: "title"}},
			JSONBody: true, Credential: config.BrokerCredential{Env: "EXAMPLE_TOKEN"}, Header: "X-Api-Key", Prefix: "Token ",
			ResponseHeaders: []string{"Etag", "X-RateLimit-Remaining"}},
		{Name: "echo", Method: "GET", URL: "http://127.0.0.1:8080/echo", Credential: config.BrokerCredential{File: "/etc/stockade/echo-token"}},
	}
	c.Analytics.ClickHouse.URL, c.Analytics.ClickHouse.Database, c.Analytics.ClickHouse.Timeout = "http://u:p@127.0.0.1:8123", "stats", 3*time.Second
	c.Analytics.BatchSize = 500
	c.EgressRange, c.EgressPrefix = "172.30.0.0/20", "stb"
	ops := wiring.BrokerOperations(c)
	if len(ops) != 2 {
		t.Fatalf("got %d operations, want 2", len(ops))
	}
	o := ops[0]
	if o.Name != "issues.create" || o.Method != "POST" || !o.JSONBody || o.Credential.Env != "EXAMPLE_TOKEN" || o.Header != "X-Api-Key" || o.Prefix != "Token " ||
		strings.Join(o.ResponseHeaders, ",") != "Etag,X-RateLimit-Remaining" {
		t.Errorf("got %+v", o)
	}
	if len(o.Params) != 2 || o.Params[0].Name != "repo" || o.Params[0].Pattern != "[a-z0-9-]+" || !o.Params[0].Required || o.Params[0].MaxLen != 64 || o.Params[1].Required {
		t.Errorf("got params %+v", o.Params)
	}
	if ops[1].Credential.File != "/etc/stockade/echo-token" || ops[1].Credential.Env != "" {
		t.Errorf("got credential %+v, want the file", ops[1].Credential)
	}
	if ch := wiring.ClickHouseConfig(c.Analytics); ch.URL != "http://u:p@127.0.0.1:8123" || ch.Database != "stats" || ch.Table != config.DefaultClickHouseTable || ch.Timeout.String() != "3s" {
		t.Errorf("ClickHouseConfig: got %+v", ch)
	}
	if so := wiring.ShipperOptions(c.Analytics); so.BatchSize != 500 || so.MaxRows != config.DefaultOutboxMaxRows {
		t.Errorf("ShipperOptions: got %+v", so)
	}
	if nc, err := wiring.NetnsConfig(c); err != nil || nc.Range.String() != "172.30.0.0/20" || nc.Prefix != "stb" {
		t.Errorf("NetnsConfig: %+v, %v", nc, err)
	}
	if err := wiring.Validate(c); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

// TestValidate checks that Validate refuses what only the runtime
// packages can check, and what config.Config.Validate refuses.
func TestValidate(t *testing.T) {
	bad := map[string]func(*config.Config){
		"config's own": func(c *config.Config) { c.DataDir = "relative" },
		"two credentials": func(c *config.Config) {
			c.Broker.Operations = []config.BrokerOperation{{Name: "echo", Method: "GET", URL: "http://example.test/", Credential: config.BrokerCredential{Env: "A", File: "/b"}}}
		},
		"a parameter for host": func(c *config.Config) {
			c.Broker.Operations = []config.BrokerOperation{{Name: "echo", Method: "GET", URL: "http://{host}/", Params: []config.BrokerParam{{Name: "host"}}, Credential: config.BrokerCredential{Env: "A"}}}
		},
		"range without bits": func(c *config.Config) { c.EgressRange = "10.213.0.0" },
		"range too small":    func(c *config.Config) { c.EgressRange = "10.213.0.0/30" },
		"IPv6 range":         func(c *config.Config) { c.EgressRange = "fd00::/64" },
		"prefix":             func(c *config.Config) { c.EgressPrefix = "Stockade" },
		"ClickHouse URL":     func(c *config.Config) { c.Analytics.ClickHouse.URL = "127.0.0.1:8123" },
		"ClickHouse table": func(c *config.Config) {
			c.Analytics.ClickHouse.URL, c.Analytics.ClickHouse.Table = "http://127.0.0.1:8123", "t;x"
		},
		"batch size": func(c *config.Config) { c.Analytics.BatchSize = 10001 },
		"default tool's pool twice": func(c *config.Config) {
			c.Pools = []config.Pool{{Runtime: "python", Size: 1}, {Tool: tools.DefaultName, Runtime: "python", Size: 2}}
		},
	}
	for name, mutate := range bad {
		c := config.Default()
		mutate(&c)
		if err := wiring.Validate(c); err == nil {
			t.Errorf("%s: got no error", name)
		}
	}
	if err := wiring.Validate(config.Default()); err != nil {
		t.Errorf("the defaults: %v", err)
	}
}

// TestTemplateSources checks the template builds' sources: the defaults,
// and the file's values with the wheelhouse below its data directory.
func TestTemplateSources(t *testing.T) {
	s := wiring.TemplateSources(config.Default())
	if s.Mirror != config.DefaultMirror || s.NPMRegistry != config.DefaultNPMRegistry || s.Wheelhouse != "/var/lib/stockade/wheelhouse" || s.PythonIndex != "" {
		t.Errorf("default sources: got %+v", s)
	}
	c := loadConfig(t, "data_dir: /srv/stk\ntemplate_sources:\n  python_index: https://pypi.example/simple\n  npm_registry: http://127.0.0.1:4873\n")
	if s := wiring.TemplateSources(c); s.PythonIndex != "https://pypi.example/simple" || s.NPMRegistry != "http://127.0.0.1:4873" || s.Mirror != config.DefaultMirror || s.Wheelhouse != "/srv/stk/wheelhouse" {
		t.Errorf("sources from the file: got %+v", s)
	}
	c.TemplateSources.Mirror, c.TemplateSources.NPMRegistry = "", ""
	if s := wiring.TemplateSources(c); s.Mirror != config.DefaultMirror || s.NPMRegistry != config.DefaultNPMRegistry {
		t.Errorf("sources without mirror and registry: got %+v", s)
	}
}

// TestLoadTools checks both forms of tools: a list in the file itself
// and a path, relative to the file's directory; a later SetTools (a flag)
// replaces either.
func TestLoadTools(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "stockade.yaml")
	write := func(s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("listen: 127.0.0.1:9000\ntools:\n  - name: calc\n    input_trust: trusted\n    tier: gvisor\n")
	c := config.Default()
	if err := c.LoadFile(p); err != nil {
		t.Fatal(err)
	}
	gv := tools.Options{Drivers: map[string]sandbox.Capabilities{"gvisor": gvisor.Capabilities()}}
	set, err := wiring.LoadTools(c, gv)
	if err != nil {
		t.Fatal(err)
	}
	if calc, err := set.Get("calc"); err != nil || calc.Source != p+":3" {
		t.Errorf("got %+v, %v, want tool calc defined at %s:3", calc, err, p)
	}

	write("tools: tools.d\n")
	c = config.Default()
	if err := c.LoadFile(p); err != nil {
		t.Fatal(err)
	}
	if c.Tools != filepath.Join(dir, "tools.d") || c.ToolsList != nil {
		t.Errorf("got tools %q (list %v), want %s", c.Tools, c.ToolsList, filepath.Join(dir, "tools.d"))
	}
	write("tools: [{name: calc, input_trust: trusted, tier: gvisor}]\n")
	if err := c.LoadFile(p); err != nil {
		t.Fatal(err)
	}
	c.SetTools("")
	if set, err := wiring.LoadTools(c, gv); err != nil || set.Len() != 1 {
		t.Errorf("after SetTools(\"\"): got %v, %v, want the default tool alone", set, err)
	}
}
