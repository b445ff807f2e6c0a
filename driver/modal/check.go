package modal

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	"github.com/stockade-sh/stockade/sandbox"
)

// Check tries the provider with d's credentials, step by step, as
// `stockade driver check modal` does: the API and the credentials (an
// auth token and the app), a sandbox of the shell runtime, a program with
// its code file, stdin, environment, output and exit code, a second
// program after it, the blocked network, a timeout, and the sandbox's
// end. It writes one line per step to w and returns an error naming the
// steps that failed; a step that needs an earlier one is not tried
// without it.
func Check(ctx context.Context, d *Driver, w io.Writer) error {
	var failed []string
	step := func(name string, err error) bool {
		if err != nil {
			fmt.Fprintf(w, "FAIL  %-12s %v\n", name, err)
			failed = append(failed, name)
			return false
		}
		fmt.Fprintf(w, "ok    %s\n", name)
		return true
	}
	if !step("credentials", d.checkHealth(ctx)) {
		return fmt.Errorf("modal: the API refused: see above")
	}
	sb, err := d.Create(ctx, sandbox.Spec{Image: sandbox.Image{Name: "shell"}, Limits: sandbox.Limits{Timeout: 30 * time.Second}})
	if !step("create", err) {
		return fmt.Errorf("modal: failed: %v", failed)
	}
	const code = "read line; echo \"$line $X\"; echo err >&2; exit 3"
	res, err := sandbox.Run(ctx, sb, sandbox.ExecRequest{File: sandbox.File{Name: "main.sh", Data: []byte(code)},
		Argv: []string{"/bin/sh", "{file}"}, Env: []string{"X=y"}, Stdin: []byte("in\n")})
	step("run", expect(res, err, sandbox.StatusFailed, 3, "in y\n", "err\n"))

	res, err = sandbox.Run(ctx, sb, sandbox.ExecRequest{Argv: []string{"/usr/bin/env"}, Env: []string{"A=1"}})
	step("environment", expect(res, err, sandbox.StatusSucceeded, 0, "A=1\n", ""))

	// bash is not in the image: a connection out by getent's DNS lookup
	// must fail in a blocked network.
	res, err = sandbox.Run(ctx, sb, sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c",
		"if getent hosts example.com >/dev/null 2>&1; then echo reached; else echo refused; fi"}, Timeout: 20 * time.Second})
	if err == nil && !bytes.Equal(res.Stdout, []byte("refused\n")) {
		err = fmt.Errorf("resolving example.com: got %q (%s), want refused", res.Stdout, res.Status)
	}
	step("no network", err)

	start := time.Now()
	res, err = sandbox.Run(ctx, sb, sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo started; sleep 60"}, Timeout: 3 * time.Second})
	if err == nil && (res.Status != sandbox.StatusTimedOut || string(res.Stdout) != "started\n") {
		err = fmt.Errorf("got %s with stdout %q after %v, want timed out with started", res.Status, res.Stdout, time.Since(start).Round(time.Millisecond))
	}
	step("timeout", err)

	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	err = sb.Destroy(dctx)
	if err == nil {
		if left := d.Leftovers(dctx, sb.ID()); len(left) > 0 {
			err = fmt.Errorf("still there after Destroy: %v", left)
		}
	}
	step("destroy", err)
	if len(failed) > 0 {
		return fmt.Errorf("modal: failed: %v", failed)
	}
	return nil
}

// expect checks a result.
func expect(res *sandbox.Result, err error, status sandbox.Status, code int, stdout, stderr string) error {
	switch {
	case err != nil:
		return err
	case res.Status != status || res.ExitCode != code || string(res.Stdout) != stdout || string(res.Stderr) != stderr:
		return fmt.Errorf("got %s exit %d stdout %q stderr %q, want %s exit %d stdout %q stderr %q",
			res.Status, res.ExitCode, res.Stdout, res.Stderr, status, code, stdout, stderr)
	}
	return nil
}
