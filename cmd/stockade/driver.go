package main

import (
	"context"
	"os"

	"github.com/stockade-sh/stockade/driver/modal"
	"github.com/stockade-sh/stockade/driver/vercel"
	"github.com/stockade-sh/stockade/internal/wiring"
)

func init() {
	commands["driver"] = command{summary: "check a remote driver's provider with this host's credentials", run: driverCmd}
}

func driverCmd(ctx context.Context, args []string) int {
	return dispatch(ctx, "driver", map[string]verb{
		"check": {"try a remote driver's provider (vercel, modal) and report what works", driverCheck},
	}, args)
}

func driverCheck(ctx context.Context, args []string) int {
	fs := newFlags("driver check", `usage: stockade driver check vercel|modal

vercel: tries Vercel Sandbox with the credentials of the environment
(VERCEL_TOKEN, VERCEL_TEAM_ID, VERCEL_PROJECT_ID; STOCKADE_VERCEL_API
moves the API) or the config's vercel: section: the credentials, a
sandbox, a program with its file, stdin, environment and exit code, a
file read back, a timeout, the deny-all network and the sandbox's end,
one line each. It creates one sandbox in the project and deletes it.

modal: tries Modal with the credentials of the environment
(MODAL_TOKEN_ID, MODAL_TOKEN_SECRET, MODAL_ENVIRONMENT; MODAL_SERVER_URL
moves the API) or the config's modal: section: the credentials (an auth
token and the app, created if missing), a sandbox of the shell image, a
program with its file, stdin, environment and exit code, the blocked
network, a timeout and the sandbox's end, one line each. It creates one
sandbox in the app and terminates it.

Exits 1 when a step fails.`)
	cfg, load := configFlags(fs, withConfigFile|withoutSandboxFlags)
	pos, err := load(args)
	switch {
	case err != nil:
		return fail(flagErr(fs, err))
	case len(pos) != 1 || (pos[0] != "vercel" && pos[0] != "modal"):
		return fail(usagef("driver check takes the driver to check: vercel or modal"))
	case pos[0] == "modal":
		d, err := modal.New(wiring.ModalConfig(*cfg))
		if err != nil {
			return fail(err)
		}
		defer d.Close()
		if err := modal.Check(ctx, d, os.Stdout); err != nil {
			return fail(err)
		}
		return 0
	}
	d, err := vercel.New(wiring.VercelConfig(*cfg))
	if err != nil {
		return fail(err)
	}
	if err := vercel.Check(ctx, d, os.Stdout); err != nil {
		return fail(err)
	}
	return 0
}
