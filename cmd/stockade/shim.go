package main

import (
	"context"

	"github.com/stockade-sh/stockade/supervisor"
)

func init() {
	commands["shim"] = command{summary: "serve one sandbox's guest channel (the drivers start it, not people)", run: shimCmd}
}

// shimCmd is the supervisor of one detached sandbox: package supervisor
// does everything.
func shimCmd(ctx context.Context, args []string) int {
	fs := newFlags("shim", "usage: stockade shim DIR\n\nServes the sandbox whose record is in DIR (state_dir/<driver>/shims/<id>) until its runtime exits.\nThe drivers start it for each detached sandbox; it is not run by hand.")
	pos, err := parse(fs, args)
	if err != nil {
		return fail(err)
	}
	return supervisor.Main(ctx, pos)
}
