package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readmeToolsExample returns the README's example tools file, with its
// data root /var/lib/stockade/data moved to dataDir/data.
func readmeToolsExample(t *testing.T, dataDir string) string {
	t.Helper()
	_, rest, ok := strings.Cut(readme(t), "```yaml\ntools:\n")
	if !ok {
		t.Fatal("README.md has no ```yaml block starting with tools:")
	}
	block, _, _ := strings.Cut(rest, "```")
	return strings.ReplaceAll("tools:\n"+block, "/var/lib/stockade", dataDir)
}

// TestToolsFlagEverywhere checks that the tools commands name the tools
// file with --tools, as run, serve and audit blast-radius do, or take the
// daemon's --config with the list in it, and that without either the
// record of a configured tool is an error that says which flag to give.
func TestToolsFlagEverywhere(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "data", "sales"), 0o755); err != nil {
		t.Fatal(err)
	}
	example := readmeToolsExample(t, dir)
	toolsFile := filepath.Join(dir, "tools.yaml")
	configFile := filepath.Join(dir, "stockade.yaml")
	if err := os.WriteFile(toolsFile, []byte(example), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(configFile, []byte("listen: 127.0.0.1:8799\ndata_dir: "+dir+"\n"+example), 0o644); err != nil {
		t.Fatal(err)
	}
	dataDir := []string{"--data-dir", dir}
	for _, tt := range []struct {
		name string
		args []string
		want string // on stdout
	}{
		{"lint FILE", append([]string{"tools", "lint", toolsFile}, dataDir...), "ok: 1 tool"},
		{"lint --config", []string{"tools", "lint", "--config", configFile}, "ok: 1 tool"},
		{"record --tools", append([]string{"tools", "record", "sales-report", "--tools", toolsFile}, dataDir...), "# Tool `sales-report`"},
		{"record --tools first", append([]string{"tools", "record", "--tools", toolsFile, "sales-report"}, dataDir...), "# Tool `sales-report`"},
		{"record --config", []string{"tools", "record", "sales-report", "--config", configFile}, "Defined in " + configFile + ":"},
		{"list --tools", append([]string{"tools", "list", "--tools", toolsFile}, dataDir...), "sales-report"},
		{"list --config", []string{"tools", "list", "--config", configFile}, "sales-report"},
		{"help", []string{"tools", "record", "--help"}, "--tools names a tools file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, nil, tt.args...)
			if code != 0 || !strings.Contains(stdout, tt.want) {
				t.Errorf("got exit %d, stdout %q, stderr %q; want exit 0 and %q", code, stdout, stderr, tt.want)
			}
		})
	}
	code, _, stderr := runCLI(t, nil, append([]string{"tools", "record", "sales-report"}, dataDir...)...)
	if code != 2 || !strings.Contains(stderr, "--tools FILE|DIR") {
		t.Errorf("record without --tools: got exit %d, stderr %q; want exit 2 naming --tools", code, stderr)
	}
	if code, _, stderr := runCLI(t, nil, "tools", "record", "sales-report", "--config", toolsFile+"x"); code != 2 || len(strings.Split(strings.TrimSpace(stderr), "\n")) != 1 {
		t.Errorf("a missing --config file: got exit %d, stderr %q; want exit 2 and one line", code, stderr)
	}
}

// TestToolsWithTemplates checks that the tools commands load the templates
// tools name, from --templates or the configuration (inline or a path),
// and refuse a tool naming an unknown one.
func TestToolsWithTemplates(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	const tmpl = "templates:\n  - name: analytics\n    base: python\n    debian_packages: [python3-bs4]\n"
	const tool = "tools:\n  - name: analyst\n    runtimes: [python]\n    input_trust: untrusted\n    tier: gvisor\n    template: analytics\n"
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	toolsFile, tmplFile := write("tools.yaml", tool), write("templates.yaml", tmpl)
	inline := write("inline.yaml", "data_dir: "+dir+"\n"+tool+tmpl)
	byPath := write("bypath.yaml", "data_dir: "+dir+"\ntools: tools.yaml\ntemplates: templates.yaml\n")
	dataDir := []string{"--data-dir", dir}
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"record --templates", append([]string{"tools", "record", "analyst", "--tools", toolsFile, "--templates", tmplFile}, dataDir...), "## Template\n\n`analytics`, on python: Debian packages [`python3-bs4`]"},
		{"lint inline config", []string{"tools", "lint", "--config", inline}, "ok: 1 tool"},
		{"lint config paths", []string{"tools", "lint", "--config", byPath}, "ok: 1 tool"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, nil, tt.args...)
			if code != 0 || !strings.Contains(stdout, tt.want) {
				t.Errorf("got exit %d, stdout %q, stderr %q; want exit 0 and %q", code, stdout, stderr, tt.want)
			}
		})
	}
	code, _, stderr := runCLI(t, nil, append([]string{"tools", "lint", toolsFile}, dataDir...)...)
	if code != 1 || !strings.Contains(stderr, `rule template: unknown template "analytics": no template is configured`) {
		t.Errorf("lint without templates: got exit %d, stderr %q; want exit 1 naming the unknown template", code, stderr)
	}
	bad := write("bad.yaml", "templates:\n  - name: analytics\n    base: ruby\n")
	code, _, stderr = runCLI(t, nil, append([]string{"tools", "lint", toolsFile, "--templates", bad}, dataDir...)...)
	if code != 1 || !strings.Contains(stderr, bad+`:3: template "analytics": templates[0].base: unknown base "ruby"`) {
		t.Errorf("lint with a bad template: got exit %d, stderr %q; want exit 1 naming its line", code, stderr)
	}
}
