package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/mcp"
)

// TestMCPTools checks that `stockade mcp --help` and the README's MCP
// table name every tool the MCP server serves, and no other.
func TestMCPTools(t *testing.T) {
	c, err := client.New("http://127.0.0.1:8700", "sk_test")
	if err != nil {
		t.Fatal(err)
	}
	list, err := mcp.Tools(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	var served []string
	for _, tl := range list {
		served = append(served, tl.Name)
	}
	if len(served) < 9 {
		t.Fatalf("mcp.Tools: got %v, want the nine tools at least", served)
	}
	code, help, _ := cli(t, "mcp", "--help")
	if code != 0 {
		t.Fatalf("mcp --help: exit %d", code)
	}
	_, tools, _ := strings.Cut(help, "The tools:\n")
	tools, _, _ = strings.Cut(tools, "\n\n")
	var inHelp []string
	for _, l := range strings.Split(tools, "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			inHelp = append(inHelp, f[0])
		}
	}
	if !slices.Equal(inHelp, served) {
		t.Errorf("mcp --help lists %v, want the served %v", inHelp, served)
	}

	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(b), "\n## MCP")
	section, _, _ = strings.Cut(section, "\n## ")
	var inReadme []string
	for _, m := range regexp.MustCompile("(?m)^\\| (`[^|]+)\\|").FindAllStringSubmatch(section, -1) {
		for _, n := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(m[1], -1) {
			inReadme = append(inReadme, n[1])
		}
	}
	slices.Sort(inReadme)
	want := slices.Sorted(slices.Values(served))
	if !slices.Equal(inReadme, want) {
		t.Errorf("the README's MCP table names %v, want the served %v", inReadme, want)
	}
}
