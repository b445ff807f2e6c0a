// Command stockade is the Stockade CLI and daemon. Each subcommand lives in
// its own file and registers itself in commands; the subcommands parse flags
// and call into packages, nothing more.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand. run returns the process exit status.
type command struct {
	summary string
	run     func(ctx context.Context, args []string) int
}

// commands is filled by init functions of the subcommand files.
var commands = map[string]command{}

// exitUsage is the exit status for bad input.
const exitUsage = 2

// usageError marks an error caused by the caller's input (exit status 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// fail prints err on one line and returns the exit status it deserves:
// 2 for bad input, 1 otherwise.
func fail(err error) int {
	fmt.Fprintf(os.Stderr, "stockade: %v\n", err)
	var u usageError
	if errors.As(err, &u) {
		return exitUsage
	}
	return 1
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: stockade COMMAND [ARGS]\n\ncommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", n, commands[n].summary)
	}
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(exitUsage)
	}
	name := os.Args[1]
	if name == "-h" || name == "--help" || name == "help" {
		usage()
		return
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "stockade: unknown command %q\n", name)
		usage()
		os.Exit(exitUsage)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cmd.run(ctx, os.Args[2:])
	stop()
	os.Exit(code)
}
