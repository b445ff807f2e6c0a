package tools

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// want is one expected problem of a bad fixture, from its "# want: RULE:
// FRAGMENT" lines: a problem with that rule whose line contains the fragment.
type want struct{ rule, fragment string }

func fixtureWants(t *testing.T, path string) []want {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var ws []want
	for _, line := range strings.Split(string(data), "\n") {
		rest, ok := strings.CutPrefix(line, "# want: ")
		if !ok {
			continue
		}
		rule, frag, ok := strings.Cut(rest, ": ")
		if !ok {
			t.Fatalf("%s: malformed want line %q", path, line)
		}
		ws = append(ws, want{rule, frag})
	}
	if len(ws) == 0 {
		t.Fatalf("%s: no \"# want: RULE: FRAGMENT\" line", path)
	}
	return ws
}

// toolless reports whether a problem may name no tool: it belongs to a
// file, to the options, or to a tool without a name.
func toolless(p Problem) bool {
	switch p.Rule {
	case RuleYAMLSyntax, RuleDataRoot, RuleName:
		return true
	}
	return strings.Contains(p.Message, "in the top level") || strings.Contains(p.Message, "a tools file is a mapping")
}

func TestLintRefusesEachBadKind(t *testing.T) {
	files, err := filepath.Glob("testdata/bad/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no bad fixtures: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			set, err := Load(f, Options{Drivers: drivers, DataRoot: t.TempDir()})
			if set != nil {
				t.Errorf("got a set, want none")
			}
			var ps Problems
			if !errors.As(err, &ps) {
				t.Fatalf("got error %v, want Problems", err)
			}
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("got %v, want an ErrInvalidArgument", err)
			}
			for _, w := range fixtureWants(t, f) {
				found := false
				for _, p := range ps {
					found = found || (p.Rule == w.rule && strings.Contains(p.String(), w.fragment))
				}
				if !found {
					t.Errorf("no problem with rule %s containing %q; got:\n%v", w.rule, w.fragment, err)
				}
			}
			for _, p := range ps {
				if !strings.HasPrefix(p.String(), f) {
					t.Errorf("problem %q does not name the file %s", p, f)
				}
				if p.Tool == "" && !toolless(p) {
					t.Errorf("problem %q names no tool", p)
				}
			}
		})
	}
}

func TestLoadGood(t *testing.T) {
	tests := []struct {
		path  string
		names []string
	}{
		{"testdata/good/tools.yaml", []string{DefaultName, "calculator", "sql-reader", "web-summariser"}},
		{"testdata/good/docker.yaml", []string{DefaultName, "dev-notebook"}},
		{"testdata/good/empty.yaml", []string{DefaultName}},
		{"testdata/dir", []string{DefaultName, "calc", "shell"}},
		{"", []string{DefaultName}},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			set, err := Load(tt.path, Options{Drivers: drivers})
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if got := strings.Join(set.Names(), ","); got != strings.Join(tt.names, ",") {
				t.Errorf("got tools %s, want %s", got, strings.Join(tt.names, ","))
			}
		})
	}
}

func TestLoadDecodesEveryField(t *testing.T) {
	set, err := Load("testdata/good/tools.yaml", Options{Drivers: drivers})
	if err != nil {
		t.Fatal(err)
	}
	calc, err := set.Get("calculator")
	if err != nil {
		t.Fatal(err)
	}
	want := sandbox.Limits{Timeout: 5e9, Memory: 128 << 20, CPU: 0.25, Pids: 32, TmpSize: 8 << 20, OutputCap: 64 << 10}
	if calc.Limits != want {
		t.Errorf("got limits %+v, want %+v", calc.Limits, want)
	}
	if calc.InputTrust != Trusted || calc.Tier != sandbox.TierContainer || !calc.Egress.None() || len(calc.Credentials) != 0 {
		t.Errorf("got record %+v", calc)
	}
	if calc.Source != "testdata/good/tools.yaml:4" {
		t.Errorf("got source %q, want testdata/good/tools.yaml:4", calc.Source)
	}
	if !calc.AllowsRuntime("python") || calc.AllowsRuntime("node") {
		t.Errorf("got runtimes %v, want python only", calc.Runtimes)
	}
	sql, _ := set.Get("sql-reader")
	if sql.AcceptRisk == nil || sql.AcceptRisk.By != "alice@example.com" {
		t.Errorf("got accept_risk %+v", sql.AcceptRisk)
	}
	web, _ := set.Get("web-summariser")
	if web.Filesystem.ScratchLifetime != LifetimeInvocation || !web.AllowsRuntime("node") {
		t.Errorf("got %+v", web)
	}
}

func TestLoadMissingPath(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"), Options{Drivers: drivers})
	var ps Problems
	if errors.As(err, &ps) || !errdefs.IsNotFound(err) {
		t.Errorf("got %v, want an ErrNotFound that is not Problems", err)
	}
}

// Untrusted input on a shared-kernel tier is refused without accept_risk
// and allowed with it.
func TestUntrustedOnSharedKernel(t *testing.T) {
	risk := &AcceptRisk{By: "alice@example.com", Reason: "single-tenant reporting host"}
	tests := []struct {
		name  string
		trust Trust
		tier  sandbox.Tier
		risk  *AcceptRisk
		want  bool // refused
	}{
		{"untrusted container", Untrusted, sandbox.TierContainer, nil, true},
		{"untrusted container accepted", Untrusted, sandbox.TierContainer, risk, false},
		{"untrusted container half accepted", Untrusted, sandbox.TierContainer, &AcceptRisk{By: "alice"}, true},
		{"untrusted docker", Untrusted, sandbox.TierDocker, nil, true},
		{"untrusted docker accepted", Untrusted, sandbox.TierDocker, risk, false},
		{"untrusted gvisor", Untrusted, sandbox.TierGVisor, nil, false},
		{"trusted container", Trusted, sandbox.TierContainer, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tool := Tool{Name: "t", InputTrust: tt.trust, Tier: tt.tier, AcceptRisk: tt.risk}
			got := hasRule(Validate([]Tool{tool}, Options{Drivers: drivers}), RuleUntrustedOnContainer)
			if got != tt.want {
				t.Errorf("got refused=%v, want %v", got, tt.want)
			}
		})
	}
}

func TestLethalTrifecta(t *testing.T) {
	egress := Egress{Allow: []string{"api.github.com"}, Ports: []int{443}}
	creds := []string{"github.read"}
	risk := &AcceptRisk{By: "bob", Reason: "the operation is read-only on public repositories"}
	tests := []struct {
		name  string
		trust Trust
		e     Egress
		creds []string
		risk  *AcceptRisk
		want  bool
	}{
		{"all three", Untrusted, egress, creds, nil, true},
		{"all three accepted", Untrusted, egress, creds, risk, false},
		{"trusted input", Trusted, egress, creds, nil, false},
		{"no egress", Untrusted, Egress{}, creds, nil, false},
		{"no credentials", Untrusted, egress, nil, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tool := Tool{Name: "t", InputTrust: tt.trust, Tier: sandbox.TierGVisor, Egress: tt.e, Credentials: tt.creds, AcceptRisk: tt.risk}
			ps := Validate([]Tool{tool}, Options{Drivers: drivers, EgressSupported: true})
			if got := hasRule(ps, RuleLethalTrifecta); got != tt.want {
				t.Errorf("got refused=%v, want %v (%v)", got, tt.want, ps)
			}
			if !tt.want && len(ps) > 0 {
				t.Errorf("got problems %v, want none", ps)
			}
			// Until the egress proxy exists, egress and credentials are
			// refused as unsupported, and the trifecta is still reported.
			ps = Validate([]Tool{tool}, Options{Drivers: drivers})
			if got := hasRule(ps, RuleLethalTrifecta); got != tt.want {
				t.Errorf("without egress support: got refused=%v, want %v", got, tt.want)
			}
			if !tt.e.None() && !hasRule(ps, RuleEgressUnsupported) {
				t.Errorf("without egress support: got %v, want %s", ps, RuleEgressUnsupported)
			}
			if len(tt.creds) > 0 && !hasRule(ps, RuleCredentialsUnsupported) {
				t.Errorf("without egress support: got %v, want %s", ps, RuleCredentialsUnsupported)
			}
		})
	}
}

func TestDefaultToolPassesValidation(t *testing.T) {
	d := Default()
	d.Name = "copy-of-default"
	if ps := Validate([]Tool{d}, Options{Drivers: drivers}); len(ps) > 0 {
		t.Errorf("got %v, want no problem", ps)
	}
}

// TestDriversOption checks that a record's tier must be one of the
// drivers', and that the tier rules read the tier's facts from what its
// driver declares: change a declaration and the rule follows.
func TestDriversOption(t *testing.T) {
	untrusted := Tool{Name: "t", InputTrust: Untrusted, Tier: sandbox.TierContainer}
	fetch := Tool{Name: "t", InputTrust: Trusted, Tier: sandbox.TierContainer, Egress: Egress{Allow: []string{"pypi.org"}, Ports: []int{443}}}
	only := func(name string, edit func(*sandbox.Capabilities)) map[string]sandbox.Capabilities {
		c := drivers[name]
		if edit != nil {
			edit(&c)
		}
		return map[string]sandbox.Capabilities{name: c}
	}
	tests := []struct {
		name    string
		tool    Tool
		drivers map[string]sandbox.Capabilities
		rule    string // the one problem; "" for none
		message string
	}{
		{"no driver", untrusted, nil, RuleTierUnavailable, "tier container is not available on this host (available: none)"},
		{"another tier's driver", untrusted, only("gvisor", nil), RuleTierUnavailable, "tier container is not available on this host (available: gvisor)"},
		{"shared kernel", untrusted, only("runc", nil), RuleUntrustedOnContainer, "untrusted input on the container tier needs accept_risk"},
		{"a kernel of its own", untrusted, only("runc", func(c *sandbox.Capabilities) { c.SharedKernel = false }), "", ""},
		{"a driver with egress", fetch, only("runc", nil), "", ""},
		{"a driver without egress", fetch, map[string]sandbox.Capabilities{"runc": func() sandbox.Capabilities {
			c := drivers["runc"]
			c.NetworkModes = []sandbox.NetworkMode{sandbox.NetworkNone}
			return c
		}(), "gvisor": drivers["gvisor"]}, RuleEgress, "the container tier gives a sandbox no network at all, so neither egress nor credentials; use tier gvisor"},
		{"docker's declaration", Tool{Name: "t", InputTrust: Trusted, Tier: sandbox.TierDocker, Egress: fetch.Egress}, drivers, RuleEgress,
			"the docker tier gives a sandbox no network at all, so neither egress nor credentials; use tier container or gvisor"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps := Validate([]Tool{tt.tool}, Options{Drivers: tt.drivers, EgressSupported: true})
			switch {
			case tt.rule == "" && len(ps) > 0:
				t.Errorf("got %v, want no problem", ps)
			case tt.rule != "" && (len(ps) != 1 || ps[0].Rule != tt.rule || !strings.Contains(ps[0].Message, tt.message)):
				t.Errorf("got %v, want one problem of rule %s saying %q", ps, tt.rule, tt.message)
			}
		})
	}
}

func TestDriverFor(t *testing.T) {
	two := map[string]sandbox.Capabilities{"runc-b": drivers["runc"], "runc-a": drivers["runc"], "gvisor": drivers["gvisor"]}
	for _, tt := range []struct {
		tier sandbox.Tier
		want string
		ok   bool
	}{
		{sandbox.TierContainer, "runc-a", true}, // the first by name
		{sandbox.TierGVisor, "gvisor", true},
		{sandbox.TierDocker, "", false},
	} {
		name, c, ok := DriverFor(two, tt.tier)
		if name != tt.want || ok != tt.ok || (ok && c.Tier != tt.tier) {
			t.Errorf("DriverFor(%s): got %q (tier %s), %t; want %q, %t", tt.tier, name, c.Tier, ok, tt.want, tt.ok)
		}
	}
}

func TestSetGet(t *testing.T) {
	var nilSet *Set
	for _, s := range []*Set{nilSet, newSet([]Tool{{Name: "calc"}}, Default())} {
		d, err := s.Get("")
		if err != nil || d.Name != DefaultName {
			t.Errorf("Get(\"\"): got %q, %v, want the default tool", d.Name, err)
		}
		if _, err := s.Get("nope"); !errdefs.IsNotFound(err) {
			t.Errorf("Get(nope): got %v, want ErrNotFound", err)
		}
	}
}

func hasRule(ps Problems, rule string) bool {
	for _, p := range ps {
		if p.Rule == rule {
			return true
		}
	}
	return false
}

// TestNameLengths pins the length limits, which are checked apart from
// the name patterns.
func TestNameLengths(t *testing.T) {
	load := func(name, domain string) error {
		f := filepath.Join(t.TempDir(), "tools.yaml")
		rec := fmt.Sprintf("tools:\n  - name: %s\n    input_trust: trusted\n    tier: gvisor\n    egress:\n      allow: [%s.example.com]\n      ports: [443]\n", name, domain)
		if err := os.WriteFile(f, []byte(rec), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(f, Options{Drivers: drivers, DataRoot: t.TempDir(), EgressSupported: true})
		return err
	}
	if err := load(strings.Repeat("n", 64), strings.Repeat("d", 63)); err != nil {
		t.Errorf("a 64-character name and a 63-character label were refused: %v", err)
	}
	if err := load(strings.Repeat("n", 65), "api"); err == nil || !strings.Contains(err.Error(), "name must be 1-64") {
		t.Errorf("a 65-character name: got %v", err)
	}
	if err := load("n", strings.Repeat("d", 64)); err == nil || !strings.Contains(err.Error(), "not a valid lower-case domain name") {
		t.Errorf("a 64-character label: got %v", err)
	}
}

// TestParseWrongForms has one case per kind of value of the wrong form in
// a tool record: each problem names the tool, the key path from the tool
// and the form the key takes, never a Go type.
func TestParseWrongForms(t *testing.T) {
	const head = "tools:\n  - name: calc\n    input_trust: trusted\n    tier: gvisor\n"
	tests := []struct {
		name, yaml, rule, want string
	}{
		{"list for a string", "    capability: [a]\n", RuleYAMLType, `capability: want a string, got a list`},
		{"scalar for a list", "    runtimes: python\n", RuleYAMLType, `runtimes: want a list of strings, got "python"`},
		{"mapping in a list of strings", "    runtimes: [{a: b}]\n", RuleYAMLType, `runtimes[0]: want a string, got a mapping`},
		{"word for a number", "    limits: {cpu: fast}\n", RuleYAMLType, `limits.cpu: want a number, got "fast"`},
		{"fraction for an integer", "    limits: {pids: 1.5}\n", RuleYAMLType, `limits.pids: want an integer, got "1.5"`},
		{"duration without a unit", "    limits: {timeout: 10}\n", RuleLimits, `limits.timeout: invalid duration "10": a number needs a unit`},
		{"negative duration", "    limits: {timeout: -1s}\n", RuleLimits, `limits.timeout: duration "-1s" must not be negative`},
		{"word for a size", "    limits: {memory: lots}\n", RuleLimits, `limits.memory: invalid size "lots"`},
		{"scalar for limits", "    limits: small\n", RuleYAMLType, `limits: want a mapping (keys: timeout, memory, cpu, pids, tmp_size, output_cap), got "small"`},
		{"scalar for mounts", "    filesystem: {mounts: /srv}\n", RuleYAMLType, `filesystem.mounts: want a list of mappings, got "/srv"`},
		{"scalar mount", "    filesystem:\n      mounts: [/srv]\n", RuleYAMLType, `filesystem.mounts[0]: want a mapping (keys: source, target), got "/srv"`},
		{"word for a scratch size", "    filesystem: {scratch: {size: big}}\n", RuleLimits, `filesystem.scratch.size: invalid size "big"`},
		{"scalar for accept_risk", "    accept_risk: yes\n", RuleYAMLType, `accept_risk: want a mapping (keys: by, reason), got "yes"`},
		{"scalar for egress.allow", "    egress: {allow: example.com, ports: [443]}\n", RuleEgress, `egress.allow: want a list of strings, got "example.com"`},
		{"word for a port", "    egress: {allow: [example.com], ports: [https]}\n", RuleEgress, `egress.ports[0]: want an integer, got "https"`},
		{"list for egress", "    egress: [example.com]\n", RuleEgress, `egress: want none or {allow: [domains], ports: [ports]}, got a list`},
		{"mapping for credentials", "    credentials: {a: b}\n", RuleCredentials, `credentials: want none or a list of broker operation names, got a mapping`},
		{"mapping in credentials", "    credentials: [{a: b}]\n", RuleCredentials, `credentials[0]: want a string, got a mapping`},
		{"unknown key in egress", "    egress: {allow: [example.com], ports: [443], via: proxy}\n", RuleUnknownField, `unknown field "via" in egress (known: allow, ports)`},
		{"repeated key", "    tier: container\n", RuleYAMLType, `key "tier" is given twice`},
		{"scalar for the tools", "", RuleYAMLType, `tools: want a list of mappings, got "calc"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := head + tt.yaml
			if tt.yaml == "" {
				src = "tools: calc\n"
			}
			_, ps := Parse("t.yaml", []byte(src))
			found := false
			for _, p := range ps {
				found = found || (p.Rule == tt.rule && strings.Contains(p.Message, tt.want))
				for _, goWord := range []string{"!!", "unmarshal", "struct", "int64", "float64", "[]string", "tools.", "time.Duration"} {
					if strings.Contains(p.Message, goWord) {
						t.Errorf("%q names a Go type (%q)", p.Message, goWord)
					}
				}
				if tt.yaml != "" && p.Tool != "calc" {
					t.Errorf("%q names tool %q, want calc", p, p.Tool)
				}
			}
			if !found {
				t.Errorf("got %v, want a problem with rule %s containing %q", ps, tt.rule, tt.want)
			}
		})
	}
}

// TestLoadList loads tools listed in another YAML file, the tools: key of
// a configuration file, with problems naming that file and its lines.
func TestLoadList(t *testing.T) {
	src := "listen: 127.0.0.1:8700\ntools:\n  - name: calc\n    input_trust: trusted\n    tier: gvisor\n  - name: bad\n    input_trust: trusted\n    tier: gvisor\n    limits: {cpu: fast}\n"
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	list := doc.Content[0].Content[3]
	_, err := LoadList("stockade.yaml", list, Options{Drivers: drivers})
	var ps Problems
	if !errors.As(err, &ps) || len(ps) != 1 || ps[0].Source != "stockade.yaml:9" || ps[0].Tool != "bad" {
		t.Fatalf("got %v, want one problem of tool bad at stockade.yaml:9", err)
	}
	list.Content = list.Content[:1]
	set, err := LoadList("stockade.yaml", list, Options{Drivers: drivers})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(set.Names(), ","); got != DefaultName+",calc" {
		t.Errorf("got tools %s, want %s,calc", got, DefaultName)
	}
	if c, _ := set.Get("calc"); c.Source != "stockade.yaml:3" {
		t.Errorf("got source %q, want stockade.yaml:3", c.Source)
	}
}
