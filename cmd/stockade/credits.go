package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/stockade-sh/stockade/audit"
)

func init() {
	commands["credits"] = command{summary: "grant and show credits (on the database directly)", run: creditsCmd}
}

func creditsCmd(ctx context.Context, args []string) int {
	return dispatch(ctx, "credits", map[string]verb{
		"grant": {"add N credits to a workspace's balance", creditsGrant},
		"show":  {"print a workspace's available and reserved credits", creditsShow},
	}, args)
}

func creditsGrant(ctx context.Context, args []string) int {
	fs := newFlags("credits grant", "usage: stockade credits grant NAME N\n\nAdds N (a positive whole number) credits to the workspace NAME and prints\nthe balance.")
	dbo := dbFlags(fs)
	pos, err := parse(fs, args)
	switch {
	case err != nil:
		return fail(err)
	case len(pos) != 2:
		return fail(usagef("credits grant takes a workspace NAME and a number N, got %d arguments (stockade credits grant --help)", len(pos)))
	}
	n, err := strconv.ParseInt(pos[1], 10, 64)
	if err != nil || n <= 0 {
		return fail(usagef("credits grant: N must be a positive whole number, got %q", pos[1]))
	}
	return credits(ctx, dbo, pos[0], n)
}

func creditsShow(ctx context.Context, args []string) int {
	fs := newFlags("credits show", "usage: stockade credits show NAME\n\nPrints the workspace's available and reserved credits.")
	dbo := dbFlags(fs)
	pos, err := parse(fs, args)
	switch {
	case err != nil:
		return fail(err)
	case len(pos) != 1:
		return fail(usagef("credits show takes one workspace NAME, got %d arguments", len(pos)))
	}
	return credits(ctx, dbo, pos[0], 0)
}

// credits grants n credits to the workspace name, if n > 0, and prints its
// balance.
func credits(ctx context.Context, dbo dbOptions, name string, n int64) int {
	st, ws, err := openWorkspace(ctx, dbo, name)
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	if n > 0 {
		if _, err := st.GrantCredits(ctx, ws.ID, n, "granted from the CLI",
			audit.NewEvents(audit.CreditsGrantedEvent{Meta: cliMeta("credits granted"), Amount: n})); err != nil {
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
