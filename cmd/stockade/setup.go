package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/stockade-sh/stockade/internal/fsmode"
	"github.com/stockade-sh/stockade/internal/guestbin"
	"github.com/stockade-sh/stockade/internal/hostsetup"
	"github.com/stockade-sh/stockade/internal/wiring"
)

func init() {
	commands["setup"] = command{summary: "install or verify runc, debootstrap, runsc and the runtime images", run: setupCmd}
}

const setupSynopsis = `usage: stockade setup [--images python,node,shell] [-q]

Installs or verifies runc, debootstrap, runsc and the runtime images, and
installs the guest agent. It is idempotent.`

func setupCmd(ctx context.Context, args []string) int {
	fs := newFlags("setup", setupSynopsis)
	cfg, load := configFlags(fs)
	images := fs.String("images", "python,node,shell", "comma-separated runtime images to build, or none")
	quiet := fs.Bool("q", false, "print only errors")
	pos, err := load(args)
	if err != nil {
		return fail(flagErr(fs, err))
	}
	if len(pos) > 0 {
		return fail(usagef("setup takes no arguments"))
	}
	names := []string{}
	if *images != "none" {
		names = strings.Split(*images, ",")
	}
	o := hostsetup.Options{DataDir: cfg.DataDir, Images: names, Log: os.Stderr}
	if *quiet {
		o.Log = nil
	}
	if err := hostsetup.Run(ctx, o); err != nil {
		return fail(err)
	}
	// Set-up creates the data directory, which the engine does not (so
	// that a mistyped --data-dir fails instead of growing a tree), and the
	// data root below it, from which tools mount their data; sandboxes
	// pass through both (fsmode.Exceptions). It makes what an older
	// install left open private.
	for _, dir := range []string{cfg.DataDir, cfg.MountRoot()} {
		if err := os.MkdirAll(dir, fsmode.Traverse); err != nil {
			return fail(fmt.Errorf("creating %s: %w", dir, err))
		}
	}
	if err := fsmode.Fix(layout(*cfg, "")); err != nil {
		return fail(err)
	}
	// Opening the engine installs the embedded guest and validates the
	// configuration, so a successful setup means `stockade run` can start.
	if _, err := wiring.Engine(*cfg); err != nil {
		return fail(err)
	}
	// Every build installs a guest of its own; the oldest go, with room
	// for the daemons of a few older builds that may still be running.
	current, err := guestbin.Install(cfg.BinDir())
	if err != nil {
		return fail(err)
	}
	removed, err := guestbin.Prune(cfg.BinDir(), current, 3)
	if err != nil {
		return fail(err)
	}
	if len(removed) > 0 && !*quiet {
		fmt.Fprintf(os.Stderr, "removed %d guest agents of older builds from %s\n", len(removed), cfg.BinDir())
	}
	if !*quiet {
		fmt.Fprintln(os.Stderr, "setup complete")
	}
	return 0
}
