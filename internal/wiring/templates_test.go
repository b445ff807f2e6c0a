package wiring_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/internal/wiring"
)

// TestEngineLoadsTemplates checks that Engine loads the configured
// templates before the tools, so that a tool naming one loads with its
// declaration in its record, and that a bad template refuses the engine.
func TestEngineLoadsTemplates(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg := config.Default()
	cfg.StateDir, cfg.GuestPath, cfg.DataDir = t.TempDir(), testenv.Guest(t), testenv.DataDir()
	cfg.Tools = write("tools.yaml", "tools:\n  - name: analyst\n    input_trust: trusted\n    tier: gvisor\n    template: analytics\n")
	cfg.Templates = write("templates.yaml", "templates:\n  - name: analytics\n    base: python\n    debian_packages: [python3-bs4]\n")
	e, err := wiring.Engine(cfg)
	if err != nil {
		t.Fatalf("Engine: %v", err)
	}
	a, err := e.Tools().Get("analyst")
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := a.TemplateDeclaration(); !ok || d.Name != "analytics" || d.DebianPackages[0] != "python3-bs4" {
		t.Errorf("analyst's template: got %+v (%v)", d, ok)
	}
	cfg.Templates = write("bad.yaml", "templates:\n  - name: analytics\n    base: ruby\n")
	if _, err := wiring.Engine(cfg); err == nil || !strings.Contains(err.Error(), `loading templates: `+cfg.Templates+`:3: template "analytics": templates[0].base: unknown base "ruby"`) {
		t.Errorf("Engine with a bad template: got %v", err)
	}
	cfg.Templates = ""
	if _, err := wiring.Engine(cfg); err == nil || !strings.Contains(err.Error(), `unknown template "analytics"`) {
		t.Errorf("Engine without the template: got %v", err)
	}
}
