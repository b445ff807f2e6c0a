package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/internal/wiring"
	"github.com/stockade-sh/stockade/templates"
	"github.com/stockade-sh/stockade/tools"
)

func init() {
	commands["tools"] = command{summary: "check tool isolation records, print or list them", run: toolsCmd}
}

const toolsUsage = `usage: stockade tools lint FILE|DIR [--data-dir DIR] [--data-root DIR]
       stockade tools lint --config FILE
       stockade tools record NAME [--tools FILE|DIR | --config FILE] [--data-dir DIR] [--data-root DIR]
       stockade tools list [--tools FILE|DIR | --config FILE] [--data-dir DIR] [--data-root DIR]

--tools names a tools file or a directory of *.yaml files, as it does for
run, serve and audit blast-radius; --config names the daemon's configuration
file, whose tools (a path or the list itself), data_dir and data_root are
used. Without either only the built-in code.execute exists. Mount sources
must lie below the data root, DATA_DIR/data unless --data-root says
otherwise (DATA_DIR: --data-dir, env STOCKADE_DATA_DIR, /var/lib/stockade).

lint    checks the tools with the daemon's rules; prints each problem on its
        own line and exits 1 if any
record  prints a tool's decision record as Markdown
list    lists the tools and their records in one line each
`

func toolsCmd(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, toolsUsage)
		return exitUsage
	}
	switch args[0] {
	case "lint":
		return toolsLint(args[1:])
	case "record":
		return toolsRecord(args[1:])
	case "list":
		return toolsList(args[1:])
	case "-h", "-help", "--help", "help":
		fmt.Fprint(os.Stdout, toolsUsage)
		return 0
	}
	return fail(usagef("unknown tools command %q; want lint, record or list (stockade tools --help)", args[0]))
}

// toolsFlags registers the flags of the tools commands: --tools, --config,
// --data-dir and --data-root. Call load with the arguments; it returns the
// positional ones.
func toolsFlags(name string) (*flag.FlagSet, *config.Config, func([]string) ([]string, error)) {
	fs := newFlags("tools "+name, toolsUsage)
	cfg, load := configFlags(fs, withConfigFile, withoutSandboxFlags)
	toolsFlag(fs, cfg)
	templatesFlag(fs, cfg)
	fs.StringVar(&cfg.DataRoot, "data-root", cfg.DataRoot, "the directory under which every mount source must lie (default DATA_DIR/data)")
	return fs, cfg, load
}

// toolOptions are the options a daemon with egress (the default of
// `stockade serve` on a host with root and nftables) loads cfg's tools
// with, its drivers among them.
func toolOptions(cfg *config.Config) tools.Options {
	return tools.Options{DataRoot: cfg.MountRoot(), Drivers: wiring.DriverCapabilities(*cfg), EgressSupported: true}
}

// loadTools loads the configured tools as a daemon with egress does (see
// toolOptions). Problems are printed, one per line, and give exit status
// 1; a path that cannot be read is bad input (2).
func loadTools(cfg *config.Config) (*tools.Set, int) {
	tmpls, err := cfg.LoadTemplates()
	var tps templates.Problems
	if errors.As(err, &tps) {
		for _, p := range tps {
			fmt.Fprintln(os.Stderr, p)
		}
		fmt.Fprintf(os.Stderr, "stockade: templates refused: %s\n", plural(len(tps), "problem"))
		return nil, 1
	}
	if err != nil {
		return nil, fail(usageError{err})
	}
	opts := toolOptions(cfg)
	opts.Templates = tmpls
	set, err := wiring.LoadTools(*cfg, opts)
	var ps tools.Problems
	if errors.As(err, &ps) {
		for _, p := range ps {
			fmt.Fprintln(os.Stderr, p)
		}
		fmt.Fprintf(os.Stderr, "stockade: tools refused: %s\n", plural(len(ps), "problem"))
		return nil, 1
	}
	if err != nil {
		return nil, fail(usageError{err})
	}
	return set, 0
}

func toolsLint(args []string) int {
	fs, cfg, load := toolsFlags("lint")
	pos, err := load(args)
	if err != nil {
		return fail(flagErr(fs, err))
	}
	switch {
	case len(pos) == 1 && pos[0] != "":
		cfg.SetTools(pos[0])
	case len(pos) > 1 || (cfg.Tools == "" && cfg.ToolsList == nil):
		return fail(usagef("tools lint takes one FILE or DIR, or the --config FILE that names them (stockade tools --help)"))
	}
	set, code := loadTools(cfg)
	if set == nil {
		return code
	}
	fmt.Printf("ok: %s\n", plural(set.Len()-1, "tool"))
	return 0
}

func toolsRecord(args []string) int {
	fs, cfg, load := toolsFlags("record")
	pos, err := load(args)
	if err != nil {
		return fail(flagErr(fs, err))
	}
	if len(pos) != 1 || pos[0] == "" {
		return fail(usagef("tools record takes one tool NAME (stockade tools --help)"))
	}
	set, code := loadTools(cfg)
	if set == nil {
		return code
	}
	t, err := set.Get(pos[0])
	if err != nil {
		if cfg.Tools == "" && cfg.ToolsList == nil {
			err = fmt.Errorf("%w; name the tools file with --tools FILE|DIR or --config FILE", err)
		}
		return fail(usageError{err})
	}
	fmt.Print(tools.Record(t, toolOptions(cfg)))
	return 0
}

func toolsList(args []string) int {
	fs, cfg, load := toolsFlags("list")
	pos, err := load(args)
	if err != nil {
		return fail(flagErr(fs, err))
	}
	if len(pos) != 0 {
		return fail(usagef("tools list takes no arguments (stockade tools --help)"))
	}
	set, code := loadTools(cfg)
	if set == nil {
		return code
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tINPUT\tTIER\tMOUNTS\tEGRESS\tCREDENTIALS\tRISK ACCEPTED\tSOURCE")
	for _, t := range set.Tools() {
		egress := "none"
		if !t.Egress.None() {
			egress = strings.Join(t.Egress.Allow, ",")
		}
		creds := "none"
		if len(t.Credentials) > 0 {
			creds = strings.Join(t.Credentials, ",")
		}
		risk := "-"
		if t.AcceptRisk != nil {
			risk = t.AcceptRisk.By
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", t.Name, t.InputTrust, t.Tier, len(t.Filesystem.Mounts), egress, creds, risk, t.Source)
	}
	if err := w.Flush(); err != nil {
		return fail(err)
	}
	return 0
}

func plural(n int, noun string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
