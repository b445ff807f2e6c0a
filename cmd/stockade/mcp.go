package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/mcp"
)

func init() {
	commands["mcp"] = command{summary: "serve Stockade's MCP tools on stdio, through a daemon", run: mcpCmd}
}

const mcpSynopsis = `usage: stockade mcp [--url URL] [--key KEY] [--approval-wait 60s] [--approval-url TEMPLATE]

Serves Stockade's MCP tools on the standard input and output, for a
desktop agent that starts it. The tools run code through the daemon at
--url (STOCKADE_URL) with the agent key --key (STOCKADE_KEY). An
approval's page is --approval-url with {id} replaced by the approval id,
relative to --url unless absolute.

The tools:
`

// mcpUsage is mcpSynopsis followed by the tools the MCP server serves, as
// it lists them: the help cannot drift from the server.
func mcpUsage(ctx context.Context) string {
	var b strings.Builder
	b.WriteString(mcpSynopsis)
	// The client is never called: only its type says which tools the
	// server offers (a backend with sessions gets the session tools).
	c, err := client.New("http://"+config.DefaultListen, "sk_help")
	if err == nil {
		var list []mcp.ToolSummary
		if list, err = mcp.Tools(ctx, c); err == nil {
			w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
			for _, t := range list {
				fmt.Fprintf(w, "  %s\t%s\n", t.Name, t.Summary)
			}
			err = w.Flush()
		}
	}
	if err != nil {
		fmt.Fprintf(&b, "  (%v)\n", err)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func mcpCmd(ctx context.Context, args []string) int {
	fs := newFlags("mcp", mcpUsage(ctx))
	var r remoteFlags
	r.register(fs, "the daemon's URL, default http://"+config.DefaultListen)
	o := mcp.Options{Version: version}
	fs.DurationVar(&o.ApprovalWait, "approval-wait", config.DefaultMCPApprovalWait, "how long a call waits for an approval when the MCP client cannot show its page")
	fs.StringVar(&o.ApprovalURL, "approval-url", config.DefaultMCPApprovalURL, "the page of approval {id}, relative to --url unless absolute")
	pos, err := parse(fs, args)
	if err != nil {
		return fail(err)
	}
	if len(pos) > 0 {
		return fail(usagef("mcp takes no arguments"))
	}
	r.fromEnv(fs)
	if r.url == "" {
		r.url = "http://" + config.DefaultListen
	}
	if err := o.Validate(); err != nil {
		return fail(usageError{err})
	}
	c, err := r.client()
	if err != nil {
		return fail(err)
	}
	o.BaseURL = c.URL()
	// Stdout is the protocol's: only the protocol is written there.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err := mcp.New(c, o).Run(ctx, &sdk.StdioTransport{}); err != nil && ctx.Err() == nil {
		return fail(err)
	}
	return 0
}
