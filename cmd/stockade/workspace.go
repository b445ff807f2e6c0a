package main

import (
	"context"
	"fmt"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/model"
)

func init() {
	commands["workspace"] = command{summary: "create and list workspaces (on the database directly)", run: workspaceCmd}
}

func workspaceCmd(ctx context.Context, args []string) int {
	return dispatch(ctx, "workspace", map[string]verb{
		"create": {"create a workspace; prints its id", workspaceCreate},
		"list":   {"list the workspaces: name, id, created", workspaceList},
	}, args)
}

func workspaceCreate(ctx context.Context, args []string) int {
	fs := newFlags("workspace create", "usage: stockade workspace create NAME\n\nCreates the workspace NAME with the default policy (approval required) and\nno credits, and prints its id. A name already taken is refused.")
	dbo := dbFlags(fs)
	pos, err := parse(fs, args)
	switch {
	case err != nil:
		return fail(err)
	case len(pos) != 1:
		return fail(usagef("workspace create takes one NAME, got %d arguments", len(pos)))
	}
	st, err := openDB(ctx, dbo)
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	ws, err := st.CreateWorkspace(ctx, pos[0], func(ws model.Workspace) []model.NewEvent {
		return audit.NewEvents(audit.WorkspaceCreatedEvent{Meta: cliMeta("workspace created"), Name: ws.Name})
	})
	if err != nil {
		return fail(classify(err))
	}
	st.witnessChain(ctx, ws.ID)
	fmt.Println(ws.ID)
	return 0
}

func workspaceList(ctx context.Context, args []string) int {
	fs := newFlags("workspace list", "usage: stockade workspace list\n\nLists the workspaces by name: name, id and creation time.")
	dbo := dbFlags(fs)
	pos, err := parse(fs, args)
	switch {
	case err != nil:
		return fail(err)
	case len(pos) > 0:
		return fail(usagef("workspace list takes no arguments, got %q", pos))
	}
	st, err := openDB(ctx, dbo)
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	wss, err := st.ListWorkspaces(ctx)
	if err != nil {
		return fail(err)
	}
	for _, ws := range wss {
		fmt.Printf("%s\t%s\t%s\n", ws.Name, ws.ID, ws.CreatedAt.Format("2006-01-02T15:04:05Z"))
	}
	return 0
}
