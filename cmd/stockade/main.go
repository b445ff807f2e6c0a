// Command stockade is the Stockade CLI and daemon. Each subcommand lives in
// its own file and registers itself in commands; the subcommands parse flags
// and call into packages, nothing more. cli.go holds what they share: flag
// sets whose --help prints on stdout, and one way to report an error and
// choose the exit status.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"sort"
	"syscall"
)

// version is the release this binary was built from; the Makefile sets it
// (-ldflags "-X main.version=...") from git describe.
var version = "devel"

// command is one subcommand. run returns the process exit status.
type command struct {
	summary string
	run     func(ctx context.Context, args []string) int
}

// commands is filled by init functions of the subcommand files.
var commands = map[string]command{}

func init() {
	commands["version"] = command{summary: "print the version of this binary", run: versionCmd}
}

func versionCmd(_ context.Context, args []string) int {
	fs := newFlags("version", "usage: stockade version  (or stockade --version)")
	if pos, err := parse(fs, args); err != nil || len(pos) > 0 {
		if err == nil {
			err = usagef("version takes no arguments")
		}
		return fail(err)
	}
	fmt.Printf("stockade %s (%s %s/%s)\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return 0
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: stockade COMMAND [ARGS]  (stockade COMMAND --help for each)\n\ncommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
}

func main() {
	os.Exit(dispatchCommand(os.Args[1:]))
}

// dispatchCommand runs the command args name and returns the exit status.
func dispatchCommand(args []string) int {
	if len(args) == 0 {
		usage(os.Stderr)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help":
		usage(os.Stdout)
		return 0
	case "help":
		// `stockade help run` is `stockade run --help`.
		if len(args) < 2 {
			usage(os.Stdout)
			return 0
		}
		name, args = args[1], []string{args[1], "--help"}
	case "-version", "--version":
		name = "version"
	}
	cmd, ok := commands[name]
	if !ok {
		return fail(usagef("unknown command %q (stockade --help lists them)", name))
	}
	// A signal cancels the command's context: a sandbox it started is
	// destroyed before it exits (with exitInterrupted).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	return cmd.run(ctx, args[1:])
}
