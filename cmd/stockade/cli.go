package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/wire"
)

// The exit statuses of the CLI's own outcomes; `stockade run` exits with the
// program's status otherwise (the README's table of exit codes lists them
// all).
const (
	// exitFailure: Stockade could not do what was asked (a database that
	// cannot be reached, a driver that fails, a check that found problems).
	exitFailure = 1
	// exitUsage: bad input, which the caller fixes by changing the
	// command line: an unknown flag or name, a value out of range, a
	// runtime the tool does not allow, a name already taken.
	exitUsage = 2
	// exitRunFailure: `stockade run` could not run the code (a driver or
	// runtime failure, a missing image). Not 1, which is the program's own.
	exitRunFailure = 125
	// exitInterrupted: SIGINT, SIGTERM or SIGHUP stopped the command; a
	// sandbox it had started is destroyed first.
	exitInterrupted = 130
	// exitOutputClosed: the reader of `stockade run`'s output went away
	// (`| head -1`), as a shell reports a process that SIGPIPE ended; the
	// sandbox is destroyed first.
	exitOutputClosed = 141
)

// usageError marks an error caused by the caller's input (exit status 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// runError marks a failure of `stockade run` to run the code at all
// (exitRunFailure).
type runError struct{ err error }

func (e runError) Error() string { return e.err.Error() }
func (e runError) Unwrap() error { return e.err }

// helpError is a request for a command's help: fail prints its usage on
// stdout and the exit status is 0.
type helpError struct{ fs *flag.FlagSet }

func (helpError) Error() string { return "help requested" }

// newFlags returns a subcommand's flag set. It prints nothing while it
// parses: fail prints a parse error on one line, and --help as usage (the
// synopsis, then the flags) on stdout.
func newFlags(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintln(w, strings.TrimRight(synopsis, "\n"))
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintln(w, "\nflags:")
			fs.PrintDefaults()
		}
	}
	return fs
}

// parse parses args with fs, flags before, between or after the positional
// arguments (see parseArgs), and returns the positional arguments or the
// error fail reports: help, or bad input naming the command.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	pos, err := parseArgs(fs, args)
	return pos, flagErr(fs, err)
}

// flagErr turns an error of parsing fs's flags into help or bad input.
func flagErr(fs *flag.FlagSet, err error) error {
	var u usageError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		return helpError{fs}
	case errors.As(err, &u):
		return err
	}
	return usagef("%s: %v (stockade %s --help lists the flags)", fs.Name(), err, fs.Name())
}

// verb is one verb of a command with verbs (`stockade key create`).
type verb struct {
	summary string
	run     func(ctx context.Context, args []string) int
}

// dispatch runs the verb args[0] of the command name. No verb is bad
// input; help, -h and --help print the verbs on stdout.
func dispatch(ctx context.Context, name string, verbs map[string]verb, args []string) int {
	if len(args) > 0 {
		if v, ok := verbs[args[0]]; ok {
			return v.run(ctx, args[1:])
		}
	}
	names := make([]string, 0, len(verbs))
	for n := range verbs {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	fmt.Fprintf(&b, "usage: stockade %s VERB [ARGS]  (stockade %s VERB --help for each)\n\nverbs:\n", name, name)
	for _, n := range names {
		fmt.Fprintf(&b, "  %-13s %s\n", n, verbs[n].summary)
	}
	switch {
	case len(args) == 0:
		fmt.Fprint(os.Stderr, b.String())
		return exitUsage
	case args[0] == "help" || args[0] == "-h" || args[0] == "--help" || args[0] == "-help":
		fmt.Print(b.String())
		return 0
	}
	return fail(usagef("unknown %s verb %q (want %s; stockade %s --help)", name, args[0], strings.Join(names, ", "), name))
}

// fail reports err for people, on one line on stderr, and returns the exit
// status it deserves.
func fail(err error) int { return report(err, false) }

// report reports err on one line on stderr or, with asJSON, as the API's
// error object ({"error":{"code","message"}}) on stdout, and returns its
// exit status; help is printed on stdout either way.
func report(err error, asJSON bool) int {
	var h helpError
	if errors.As(err, &h) {
		h.fs.SetOutput(os.Stdout)
		h.fs.Usage()
		return 0
	}
	d := describe(err)
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(wire.ErrorBody{Error: d})
	} else {
		fmt.Fprintf(os.Stderr, "stockade: %s\n", d.Message)
	}
	return exitStatus(err)
}

// exitStatus is the exit status of a command that failed with err.
func exitStatus(err error) int {
	var (
		u usageError
		r runError
	)
	switch {
	case errors.Is(err, context.Canceled):
		return exitInterrupted
	case errors.As(err, &u):
		return exitUsage
	case errors.As(err, &r):
		return exitRunFailure
	}
	return exitFailure
}

// describe is err as the API would answer it: a stable code and a sentence
// without the class name that wrapping appends. Bad input without a class
// is invalid_argument, an interruption is interrupted.
func describe(err error) wire.ErrorDetail {
	if errors.Is(err, context.Canceled) {
		return wire.ErrorDetail{Code: "interrupted", Message: "interrupted: " + strings.TrimSuffix(err.Error(), ": "+context.Canceled.Error())}
	}
	d := api.Describe(err)
	if d.Code == "internal" && errors.As(err, new(usageError)) {
		d.Code = "invalid_argument"
	}
	return d
}

// classify marks the store's errors that the caller fixes by changing the
// command line as bad input: an invalid or too large value, a name that is
// unknown or already taken.
func classify(err error) error {
	if errdefs.IsInvalidArgument(err) || errdefs.IsTooLarge(err) || errdefs.IsNotFound(err) || errdefs.IsConflict(err) {
		return usageError{err}
	}
	return err
}

// classifyEngine marks the engine's errors that are bad input: an invalid
// or too large request, a runtime the tool does not allow. A missing image
// or runtime binary and a driver that fails are not: the host needs fixing.
func classifyEngine(err error) error {
	if errdefs.IsInvalidArgument(err) || errdefs.IsTooLarge(err) || errdefs.IsPermissionDenied(err) {
		return usageError{err}
	}
	return err
}
