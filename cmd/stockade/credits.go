package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"

	"github.com/stockade-sh/stockade/audit"
)

func init() {
	commands["credits"] = command{summary: "grant and show credits (on the database directly)", run: creditsCmd}
}

func creditsCmd(ctx context.Context, args []string) int {
	const use = "usage: stockade credits grant NAME N | stockade credits show NAME"
	if len(args) == 0 || (args[0] != "grant" && args[0] != "show") {
		return fail(usagef(use))
	}
	fs := flag.NewFlagSet("credits "+args[0], flag.ContinueOnError)
	dbo := dbFlags(fs)
	pos, err := parseArgs(fs, args[1:])
	if err != nil {
		return exitUsage
	}
	want := map[string]int{"grant": 2, "show": 1}[args[0]]
	if len(pos) != want {
		return fail(usagef(use))
	}
	var n int64
	if args[0] == "grant" {
		v, err := strconv.ParseInt(pos[1], 10, 64)
		if err != nil || v <= 0 {
			return fail(usagef("credits: N must be a positive whole number, got %q", pos[1]))
		}
		n = v
	}
	st, err := openDB(ctx, dbo)
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	ws, err := st.GetWorkspaceByName(ctx, pos[0])
	if err != nil {
		return fail(classify(err))
	}
	if args[0] == "grant" {
		if _, err := st.GrantCredits(ctx, ws.ID, n, "granted from the CLI",
			cliEvents(audit.CreditsGranted, audit.CreditsGrantedCode, "credits granted", map[string]int64{"amount": n})); err != nil {
			return fail(classify(err))
		}
		st.witnessChain(ctx, ws.ID)
	}
	c, err := st.GetCredits(ctx, ws.ID)
	if err != nil {
		return fail(err)
	}
	fmt.Printf("available %d\treserved %d\n", c.Available, c.Reserved)
	return 0
}
