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
