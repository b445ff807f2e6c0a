package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// localOnly are run's flags that choose the local sandbox; the daemon's
// tool records choose it with --url.
var localOnly = []string{"driver", "memory", "tools", "templates", "data-dir", "state-dir", "runc", "runsc", "guest", "docker-host"}

// runRemote runs req on the daemon of r (whose fromEnv has run) through
// the client, streaming its output, and exits as a local run would where
// that applies. A flag that chooses the local sandbox is refused, whether
// the daemon came from --url or STOCKADE_URL: the caller would otherwise
// believe it applied.
func runRemote(ctx context.Context, fs *flag.FlagSet, r remoteFlags, req engine.Request, asJSON bool) int {
	for _, name := range localOnly {
		if isSet(fs, name) {
			return report(usagef("--%s does not apply with %s (the daemon at %s): the daemon's tool records choose the sandbox; give --url \"\" to run here instead", name, r.urlFrom, r.url), asJSON)
		}
	}
	c, err := r.client()
	if err != nil {
		return report(err, asJSON)
	}
	signal.Ignore(syscall.SIGPIPE)
	s, err := c.StreamExecution(ctx, client.ExecutionRequest{Runtime: req.Runtime, Tool: req.Tool, Code: string(req.Code),
		Stdin: string(req.Stdin), TimeoutMS: req.Limits.Timeout.Milliseconds()})
	if err != nil {
		return report(remoteErr(ctx, err), asJSON)
	}
	defer s.Close()
	id := ""
	for {
		ev, err := s.Next()
		if err != nil {
			if ctx.Err() != nil && id != "" {
				err = cancelRemote(ctx, c, id, err)
			}
			return report(remoteErr(ctx, err), asJSON)
		}
		switch e := ev.(type) {
		case *client.ApprovalRequired:
			id = e.Card.ExecutionID
			fmt.Fprintf(os.Stderr, "stockade: waiting for an approver to decide on %s (execution %s, expires %s)\n",
				e.Card.ApprovalID, id, e.Card.ExpiresAt.Local().Format("15:04:05"))
		case *client.Started:
			id = e.ExecutionID
		case *client.Output:
			if asJSON {
				continue
			}
			w := os.Stdout
			if e.Stream == "stderr" {
				w = os.Stderr
			}
			if _, err := io.WriteString(w, e.Data); err != nil {
				fmt.Fprintf(os.Stderr, "stockade: writing the program's %s: %v\n", e.Stream, cancelRemote(ctx, c, id, err))
				return exitOutputClosed
			}
		case *client.StreamError:
			return report(fmt.Errorf("the daemon could not read the outcome of execution %s: %s", id, e.Message), asJSON)
		case *client.Ended:
			return finishRemote(&e.Execution, asJSON)
		}
	}
}

// cancelRemote cancels execution id on the daemon, as a local run's
// sandbox is destroyed when the CLI is interrupted or its output goes
// away, and returns why (err) with what became of the execution.
func cancelRemote(ctx context.Context, c *client.Client, id string, why error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	ex, err := c.CancelExecution(ctx, id, "stockade run was interrupted")
	if err != nil {
		return fmt.Errorf("%w; cancelling execution %s: %v: it may go on on the daemon", why, id, err)
	}
	return fmt.Errorf("%w; cancelled execution %s, which is %s on the daemon", why, id, ex.Status)
}

// finishRemote reports an ended execution: its result as a local run's,
// or why it did not run.
func finishRemote(ex *client.Execution, asJSON bool) int {
	r := ex.Result
	switch {
	case ex.Status == client.StatusDenied:
		return report(fmt.Errorf("an approver denied %s; the code did not run", ex.ApprovalID), asJSON)
	case ex.Status == client.StatusApprovalExpired:
		return report(fmt.Errorf("%s expired before an approver decided; the code did not run", ex.ApprovalID), asJSON)
	case r == nil || ex.Status == client.StatusLaunchFailed:
		why := "no result"
		if r != nil {
			why = r.Error
		}
		return report(runError{fmt.Errorf("the daemon could not run the code: %s", why)}, asJSON)
	}
	return finishRun(&engine.Result{Status: sandbox.Status(r.Status), Run: r.Run}, asJSON)
}

// remoteErr classifies a daemon's refusal: what the caller changes on the
// command line (the request, the key, a runtime the policy refuses) is
// bad input; the rest (credits, capacity, a daemon out of reach) is
// Stockade not doing what was asked. An interruption stays one.
func remoteErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%v: %w", err, context.Canceled)
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	if errdefs.IsInvalidArgument(err) || errdefs.IsTooLarge(err) || errdefs.IsPermissionDenied(err) ||
		errdefs.IsUnauthenticated(err) || errdefs.IsNotFound(err) {
		return usageError{err}
	}
	return err
}
