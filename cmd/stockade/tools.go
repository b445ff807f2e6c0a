package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/tools"
)

func init() {
	commands["tools"] = command{summary: "check tool isolation records, print or list them", run: toolsCmd}
}

const toolsUsage = `usage: stockade tools lint FILE|DIR [--data-root DIR]
       stockade tools record NAME [--config FILE|DIR] [--data-root DIR]
       stockade tools list [--config FILE|DIR] [--data-root DIR]

lint    checks a tools file or directory of *.yaml files with the daemon's
        rules; prints each problem on its own line and exits 1 if any
record  prints a tool's decision record as Markdown (the default tool
        code.execute needs no --config)
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

// toolsFlags registers the flags of the tools commands. The data root
// defaults to $STOCKADE_DATA_DIR/data, or /var/lib/stockade/data.
func toolsFlags(name string, withConfig bool) (fs *flag.FlagSet, configPath, dataRoot *string) {
	fs = newFlags("tools "+name, toolsUsage)
	dataDir := config.Default().DataDir
	if v := os.Getenv("STOCKADE_DATA_DIR"); v != "" {
		dataDir = v
	}
	dataRoot = fs.String("data-root", filepath.Join(dataDir, "data"), "the directory under which every mount source must lie")
	if withConfig {
		configPath = fs.String("config", "", "tools file or directory of *.yaml files (default: only the built-in code.execute)")
	}
	return fs, configPath, dataRoot
}

// loadTools loads the tools as a daemon with egress does (the default of
// `stockade serve` on a host with root and nftables). Problems are printed,
// one per line, and give exit status 1; a path that cannot be read is bad
// input (2).
func loadTools(path, dataRoot string) (*tools.Set, int) {
	set, err := tools.Load(path, tools.Options{DataRoot: dataRoot, EgressSupported: true})
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
	fs, _, dataRoot := toolsFlags("lint", false)
	pos, err := parse(fs, args)
	if err != nil {
		return fail(err)
	}
	if len(pos) != 1 || pos[0] == "" {
		return fail(usagef("tools lint takes one FILE or DIR (stockade tools --help)"))
	}
	set, code := loadTools(pos[0], *dataRoot)
	if set == nil {
		return code
	}
	fmt.Printf("ok: %s\n", plural(set.Len()-1, "tool"))
	return 0
}

func toolsRecord(args []string) int {
	fs, configPath, dataRoot := toolsFlags("record", true)
	pos, err := parse(fs, args)
	if err != nil {
		return fail(err)
	}
	if len(pos) != 1 || pos[0] == "" {
		return fail(usagef("tools record takes one tool NAME (stockade tools --help)"))
	}
	set, code := loadTools(*configPath, *dataRoot)
	if set == nil {
		return code
	}
	t, err := set.Get(pos[0])
	if err != nil {
		return fail(usageError{err})
	}
	fmt.Print(tools.Record(t))
	return 0
}

func toolsList(args []string) int {
	fs, configPath, dataRoot := toolsFlags("list", true)
	pos, err := parse(fs, args)
	if err != nil {
		return fail(err)
	}
	if len(pos) != 0 {
		return fail(usagef("tools list takes no arguments (stockade tools --help)"))
	}
	set, code := loadTools(*configPath, *dataRoot)
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
