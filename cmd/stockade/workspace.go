package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/store"
)

func init() {
	commands["workspace"] = command{summary: "create and list workspaces (on the database directly)", run: workspaceCmd}
}

func workspaceCmd(ctx context.Context, args []string) int {
	if len(args) == 0 || (args[0] != "create" && args[0] != "list") {
		return fail(usagef("usage: stockade workspace create NAME | stockade workspace list"))
	}
	fs := flag.NewFlagSet("workspace "+args[0], flag.ContinueOnError)
	dbo := dbFlags(fs)
	pos, err := parseArgs(fs, args[1:])
	if err != nil {
		return exitUsage
	}
	if args[0] == "list" && len(pos) > 0 {
		return fail(usagef("usage: stockade workspace list"))
	}
	st, err := openDB(ctx, dbo)
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	if args[0] == "list" {
		wss, err := st.ListWorkspaces(ctx)
		if err != nil {
			return fail(err)
		}
		for _, ws := range wss {
			fmt.Printf("%s\t%s\t%s\n", ws.Name, ws.ID, ws.CreatedAt.Format("2006-01-02T15:04:05Z"))
		}
		return 0
	}
	if len(pos) != 1 {
		return fail(usagef("usage: stockade workspace create NAME"))
	}
	ws, err := st.CreateWorkspace(ctx, pos[0], func(ws store.Workspace) []store.NewEvent {
		return cliEvents(audit.WorkspaceCreated, audit.WorkspaceCreatedCode, "workspace created", map[string]string{"name": ws.Name})
	})
	if err != nil {
		return fail(classify(err))
	}
	st.witnessChain(ctx, ws.ID)
	fmt.Println(ws.ID)
	return 0
}
