package tools

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/templates"
)

const wheelSHA = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// templateSet loads the templates YAML text with root as the data root.
func templateSet(t *testing.T, root, text string) *templates.Set {
	t.Helper()
	path := filepath.Join(t.TempDir(), "templates.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	set, err := templates.Load(path, templates.Options{DataRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// loadTools loads the tools YAML text with opts.
func loadTools(t *testing.T, text string, opts Options) (*Set, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return Load(path, opts)
}

const analyticsV1 = `templates:
  - name: analytics
    base: python
    debian_packages: [python3-bs4]
    python_wheels: [{name: "six==1.16.0", sha256: ` + wheelSHA + `}]
    start: "import bs4"
`

const analystTool = `tools:
  - name: analyst
    runtimes: [python]
    input_trust: untrusted
    tier: gvisor
    template: analytics
`

func TestToolTemplateBinding(t *testing.T) {
	tmpls := templateSet(t, "", analyticsV1)
	set, err := loadTools(t, analystTool, Options{Drivers: drivers, Templates: tmpls})
	if err != nil {
		t.Fatal(err)
	}
	a, err := set.Get("analyst")
	if err != nil {
		t.Fatal(err)
	}
	if set.Templates() != tmpls {
		t.Error("the Set does not return the templates it was loaded with")
	}
	d, ok := a.TemplateDeclaration()
	if a.Template != "analytics" || !ok || d.Base != "python" || !slices.Equal(d.DebianPackages, []string{"python3-bs4"}) {
		t.Fatalf("analyst: template %q, declaration %+v (%v)", a.Template, d, ok)
	}
	// The record carries the template's name and declaration.
	rec := string(Canonical(a))
	if !strings.Contains(rec, `"template":{"name":"analytics","declaration":{"name":"analytics","base":"python","debian_packages":["python3-bs4"]`) {
		t.Errorf("canonical record lacks the template: %s", rec)
	}
	// A record without a template has no template key at all: its
	// fingerprint is the one it had before templates existed.
	calc := Default()
	if strings.Contains(string(Canonical(calc)), "template") {
		t.Errorf("a record without a template mentions one: %s", Canonical(calc))
	}
	// A change of the declaration is a change of the record.
	v2 := templateSet(t, "", strings.Replace(analyticsV1, "[python3-bs4]", "[python3-bs4, jq]", 1))
	set2, err := loadTools(t, analystTool, Options{Drivers: drivers, Templates: v2})
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := set2.Get("analyst")
	if Fingerprint(a) == Fingerprint(a2) {
		t.Error("a changed declaration kept the tool's fingerprint")
	}
	// BindTemplate binds a tool built by hand as Load does.
	tmpl, _ := tmpls.Get("analytics")
	hand := BindTemplate(Tool{Name: "analyst", Runtimes: []string{"python"}, InputTrust: Untrusted, Tier: "gvisor"}, tmpl)
	if Fingerprint(hand) != Fingerprint(a) {
		t.Errorf("BindTemplate: got record %s, want %s", Canonical(hand), Canonical(a))
	}
	if ps := Validate([]Tool{hand}, Options{Drivers: drivers, Templates: tmpls}); len(ps) != 0 {
		t.Errorf("Validate of a bound tool: %v", ps)
	}
	if ps := Validate([]Tool{hand}, Options{Drivers: drivers, Templates: v2}); len(ps) != 1 || ps[0].Rule != RuleTemplate || !strings.Contains(ps[0].Message, "other than the configured one") {
		t.Errorf("Validate of a tool bound to another declaration: got %v", ps)
	}
}

func TestToolTemplateRecord(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "m.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	tmpls := templateSet(t, root, analyticsV1+"    files: [{source: "+root+"/m.json, target: /opt/m.json}]\n    golden: true\n")
	set, err := loadTools(t, analystTool, Options{Drivers: drivers, Templates: tmpls, DataRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := set.Get("analyst")
	md := Record(a, Options{Drivers: drivers})
	for _, want := range []string{
		"## Template\n\n`analytics`, on python: Debian packages [`python3-bs4`]; npm packages none (install scripts off); python wheels [`six==1.16.0 sha256:" + wheelSHA + "`]",
		"start code of 10 bytes and no ready check; restores a golden checkpoint where the tier can save one. Declaration `sha256:",
		"`" + root + "/m.json` copied read-only into the image at `/opt/m.json` (template `analytics`)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("record lacks %q:\n%s", want, md)
		}
	}
}

func TestToolTemplateProblems(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "m.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	withEnv := func(env string) string { return analyticsV1 + "    env: {" + env + "}\n" }
	for _, tc := range []struct {
		name, templates, tools string
		noTemplates            bool
		dataRoot               string
		rule, frag             string
	}{
		{"good", analyticsV1, analystTool, false, "", "", ""},
		{"unknown", analyticsV1, strings.Replace(analystTool, "template: analytics", "template: nope", 1), false, "", RuleTemplate, `unknown template "nope" (known: analytics)`},
		{"none configured", analyticsV1, analystTool, true, "", RuleTemplate, `unknown template "analytics": no template is configured`},
		{"runtime excluded", analyticsV1, strings.Replace(analystTool, "[python]", "[node, shell]", 1), false, "", RuleTemplateRuntime, `template "analytics" extends python, which the tool's runtimes (node, shell) leave out`},
		{"secret by name", withEnv("HF_TOKEN: x"), analystTool, false, "", RuleTemplateEnvSecret, "sets HF_TOKEN, which by its name holds a secret"},
		{"secret api key", withEnv("OPENAI_API_KEY: x"), analystTool, false, "", RuleTemplateEnvSecret, "sets OPENAI_API_KEY"},
		{"secret in a URL", withEnv("DB: \"postgres://app:hunter2@db/x\""), analystTool, false, "", RuleTemplateEnvSecret, "sets DB to a URL with a password"},
		{"not a secret", withEnv("TOKENIZERS_PARALLELISM: \"false\", MAX_TOKENS: \"5\", URL: \"https://user@host/x\""), analystTool, false, "", "", ""},
		{"files outside this data root", analyticsV1 + "    files: [{source: " + root + "/m.json, target: /opt/m.json}]\n", analystTool, false, other, RuleTemplateFiles,
			`template "analytics": templates[0].files[0].source: ` + root + "/m.json is outside the data root " + other},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := Options{Drivers: drivers, Templates: templateSet(t, root, tc.templates), DataRoot: tc.dataRoot}
			if tc.noTemplates {
				opts.Templates = nil
			}
			_, err := loadTools(t, tc.tools, opts)
			if tc.rule == "" {
				if err != nil {
					t.Fatalf("got %v, want no problem", err)
				}
				return
			}
			var ps Problems
			if !errors.As(err, &ps) {
				t.Fatalf("got %v, want Problems", err)
			}
			for _, p := range ps {
				if p.Rule == tc.rule && strings.Contains(p.Message, tc.frag) && p.Tool == "analyst" {
					return
				}
			}
			t.Errorf("no problem %s containing %q; got:\n%v", tc.rule, tc.frag, ps)
		})
	}
}

func TestToolTemplateDiff(t *testing.T) {
	tmpls := func(text string) *templates.Set { return templateSet(t, "", text) }
	analyst := func(set *templates.Set, tools string) Tool {
		s, err := loadTools(t, tools, Options{Drivers: drivers, Templates: set})
		if err != nil {
			t.Fatal(err)
		}
		a, _ := s.Get("analyst")
		return a
	}
	plain := strings.Replace(analystTool, "    template: analytics\n", "", 1)
	v1 := analyst(tmpls(analyticsV1), analystTool)
	for _, tc := range []struct {
		name     string
		new      Tool
		review   bool
		growth   []string
		template []string // templates.Change.Lines
	}{
		{"package added", analyst(tmpls(strings.Replace(analyticsV1, "[python3-bs4]", "[python3-bs4, jq]", 1)), analystTool),
			true, []string{"template.debian_packages +jq"}, []string{"debian_packages +jq"}},
		{"package removed", analyst(tmpls(strings.Replace(analyticsV1, "[python3-bs4]", "[]", 1)), analystTool),
			false, nil, []string{"debian_packages -python3-bs4"}},
		{"start changed", analyst(tmpls(strings.Replace(analyticsV1, "import bs4", "import bs4, json", 1)), analystTool),
			false, nil, []string{"start changed"}},
		{"template dropped", analyst(tmpls(analyticsV1), plain), false, nil,
			[]string{"debian_packages -python3-bs4", "python_wheels -six==1.16.0 sha256:" + wheelSHA, "name changed", "base changed", "start changed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, how := range []string{"Diff", "DiffStored"} {
				c := Diff(v1, tc.new)
				if how == "DiffStored" {
					var err error
					if c, err = DiffStored(Canonical(v1), tc.new); err != nil {
						t.Fatal(err)
					}
				}
				if !c.Changed() || c.ReviewRequired != tc.review || !slices.Equal(c.Growth, tc.growth) {
					t.Errorf("%s: changed %v, review %v, growth %q; want review %v, growth %q\n%s", how, c.Changed(), c.ReviewRequired, c.Growth, tc.review, tc.growth, c)
				}
				if c.Template == nil || !slices.Equal(c.Template.Lines(), tc.template) {
					t.Errorf("%s: template change %+v, want %q", how, c.Template, tc.template)
				}
			}
		})
	}
	// Gaining a template is growth: every package of it is new.
	c := Diff(analyst(nil, plain), v1)
	if !c.ReviewRequired || !slices.Contains(c.Growth, "template.debian_packages +python3-bs4") || !strings.Contains(c.String(), "template: none -> analytics") {
		t.Errorf("gaining a template: got %s", c)
	}
	// An unchanged tool has no template change.
	if c := Diff(v1, v1); c.Changed() || c.Template != nil {
		t.Errorf("unchanged: got %s (%+v)", c, c.Template)
	}
}

// TestToolTemplateNPMScripts: turning a template's npm install scripts on
// runs packages' code at build that did not run: growth, to review as an
// added package is; turning them off is not.
func TestToolTemplateNPMScripts(t *testing.T) {
	const web = `templates:
  - name: web
    base: node
    npm_packages: [left-pad@1.3.0]
`
	const builder = `tools:
  - name: builder
    runtimes: [node]
    input_trust: untrusted
    tier: gvisor
    template: web
`
	load := func(scripts bool) Tool {
		text := web
		if scripts {
			text += "    npm_scripts: true\n"
		}
		s, err := loadTools(t, builder, Options{Drivers: drivers, Templates: templateSet(t, "", text)})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := s.Get("builder")
		return b
	}
	off, on := load(false), load(true)
	for _, tc := range []struct {
		name     string
		old, new Tool
		review   bool
		growth   []string
	}{
		{"turned on", off, on, true, []string{"template.npm_scripts false -> true"}},
		{"turned off", on, off, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, how := range []string{"Diff", "DiffStored"} {
				c := Diff(tc.old, tc.new)
				if how == "DiffStored" {
					var err error
					if c, err = DiffStored(Canonical(tc.old), tc.new); err != nil {
						t.Fatal(err)
					}
				}
				if !c.Changed() || c.ReviewRequired != tc.review || !slices.Equal(c.Growth, tc.growth) {
					t.Errorf("%s: changed %v, review %v, growth %q; want review %v, growth %q\n%s", how, c.Changed(), c.ReviewRequired, c.Growth, tc.review, tc.growth, c)
				}
				if c.Template == nil || c.Template.Grows() != tc.review || !slices.Equal(c.Template.Lines(), []string{"npm_scripts changed"}) {
					t.Errorf("%s: template change %+v, want npm_scripts changed, growing %v", how, c.Template, tc.review)
				}
			}
		})
	}
	// A tool that gains a template with scripts on gains them too.
	s, err := loadTools(t, strings.Replace(builder, "    template: web\n", "", 1), Options{Drivers: drivers})
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := s.Get("builder")
	if c := Diff(plain, on); !slices.Contains(c.Growth, "template.npm_scripts none -> true") {
		t.Errorf("gaining a template with scripts on: got growth %q", c.Growth)
	}
}

func TestSecretName(t *testing.T) {
	for name, want := range map[string]bool{
		"HF_TOKEN": true, "GITHUB_TOKEN": true, "AWS_SECRET_ACCESS_KEY": true, "AWS_ACCESS_KEY_ID": true, "DB_PASSWORD": true,
		"OPENAI_API_KEY": true, "APIKEY": true, "ssh_private_key": true, "GOOGLE_APPLICATION_CREDENTIALS": true,
		"TOKENIZERS_PARALLELISM": false, "MAX_TOKENS": false, "KEYBOARD": false, "SORT_KEY": false, "LANG": false,
	} {
		if got := secretName(name); got != want {
			t.Errorf("secretName(%s) = %v, want %v", name, got, want)
		}
	}
}
