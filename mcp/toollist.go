package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// ToolsMarkdown is the README's table of the tools New serves over b:
// each tool's name, description, arguments (from its input schema) and
// structured result (from its output schema), as the server lists them,
// so that the README cannot drift from the server (TestREADMETools
// checks it; `go test ./mcp -run TestREADMETools -update` rewrites it).
// b is not called.
func ToolsMarkdown(ctx context.Context, b Backend) (string, error) {
	list, err := servedTools(ctx, b)
	if err != nil {
		return "", err
	}
	var sb strings.Builder
	sb.WriteString("| tool | what it does | arguments | structured result |\n|---|---|---|---|\n")
	for _, t := range list {
		in, err := schemaFields(t.InputSchema, true)
		if err != nil {
			return "", fmt.Errorf("the input schema of %s: %w", t.Name, err)
		}
		out, err := schemaFields(t.OutputSchema, false)
		if err != nil {
			return "", fmt.Errorf("the output schema of %s: %w", t.Name, err)
		}
		fmt.Fprintf(&sb, "| `%s` | %s | %s | %s |\n", t.Name, cell(t.Description), orNone(in), orNone(out))
	}
	return sb.String(), nil
}

// schemaFields names the properties of a JSON schema (as a client
// receives it), in the order of its properties' names, those not
// required marked when mark is set.
func schemaFields(schema any, mark bool) (string, error) {
	if schema == nil {
		return "", nil
	}
	b, err := json.Marshal(schema)
	if err != nil {
		return "", err
	}
	var s struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return "", err
	}
	var names []string
	for n := range s.Properties {
		names = append(names, n)
	}
	slices.Sort(names)
	// Required first.
	slices.SortStableFunc(names, func(a, b string) int {
		ra, rb := slices.Contains(s.Required, a), slices.Contains(s.Required, b)
		switch {
		case ra == rb:
			return 0
		case ra:
			return -1
		}
		return 1
	})
	var parts []string
	for _, n := range names {
		p := "`" + n + "`"
		if mark && !slices.Contains(s.Required, n) {
			p += " (optional)"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", "), nil
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// cell is s fit for a Markdown table's cell.
func cell(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", "\\|"), "\n", " ")
}
