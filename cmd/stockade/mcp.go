package main

import (
	"context"
	"log/slog"
	"os"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/stockade-sh/stockade/mcp"
)

func init() {
	commands["mcp"] = command{summary: "serve Stockade's MCP tools on stdio, through a daemon", run: mcpCmd}
}

const mcpSynopsis = `usage: stockade mcp [--url URL] [--key KEY] [--approval-wait 60s] [--approval-url TEMPLATE]

Serves Stockade's MCP tools (run_code, wait_for_approval) on the standard
input and output, for a desktop agent that starts it. The tools run code
through the daemon at --url (STOCKADE_URL) with the agent key --key
(STOCKADE_KEY). An approval's page is --approval-url with {id} replaced by
the approval id, relative to --url unless absolute.`

func mcpCmd(ctx context.Context, args []string) int {
	fs := newFlags("mcp", mcpSynopsis)
	var r remoteFlags
	r.register(fs, "the daemon's URL, default http://127.0.0.1:8700")
	o := mcp.Options{Version: version}
	fs.DurationVar(&o.ApprovalWait, "approval-wait", mcp.DefaultApprovalWait, "how long a call waits for an approval when the MCP client cannot show its page")
	fs.StringVar(&o.ApprovalURL, "approval-url", mcp.DefaultApprovalURL, "the page of approval {id}, relative to --url unless absolute")
	pos, err := parse(fs, args)
	if err != nil {
		return fail(err)
	}
	if len(pos) > 0 {
		return fail(usagef("mcp takes no arguments"))
	}
	r.fromEnv(fs)
	if r.url == "" {
		r.url = "http://127.0.0.1:8700"
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
