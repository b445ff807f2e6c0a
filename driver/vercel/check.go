package vercel

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	"github.com/stockade-sh/stockade/sandbox"
)

// Check tries the provider with d's credentials, step by step, as
// `stockade driver check vercel` does: the API and the credentials, a
// sandbox of the shell runtime, a program with its code file, stdin,
// environment, output and exit code, a file read back, a timeout and an
// Exec after it, the deny-all network, and the sandbox's end. It writes
// one line per step to w and returns an error naming the steps that
// failed; a step that needs an earlier one is not tried without it.
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
		return fmt.Errorf("vercel: the API refused: see above")
	}
	sb, err := d.Create(ctx, sandbox.Spec{Image: sandbox.Image{Name: "shell"}, Limits: sandbox.Limits{Timeout: 30 * time.Second}, Labels: map[string]string{"stockade.check": "driver"}})
	if !step("create", err) {
		return fmt.Errorf("vercel: failed: %v", failed)
	}
	vs := sb.(*Sandbox)
	const code = "read line; echo \"$line $X\"; echo err >&2; exit 3"
	res, err := sandbox.Run(ctx, sb, sandbox.ExecRequest{File: sandbox.File{Name: "main.sh", Data: []byte(code)},
		Argv: []string{"/bin/sh", "{file}"}, Env: []string{"X=y"}, Stdin: []byte("in\n")})
	step("run", expect(res, err, sandbox.StatusFailed, 3, "in y\n", "err\n"))

	res, err = sandbox.Run(ctx, sb, sandbox.ExecRequest{Argv: []string{"/usr/bin/env"}, Env: []string{"A=1"}})
	step("environment", expect(res, err, sandbox.StatusSucceeded, 0, "A=1\n", ""))

	data, err := vs.ReadFile(ctx, "/tmp/main.sh", 1<<10)
	if err == nil && string(data) != code {
		err = fmt.Errorf("read back %q, want the code file", data)
	}
	step("read file", err)

	start := time.Now()
	res, err = sandbox.Run(ctx, sb, sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo started; sleep 60"}, Timeout: 3 * time.Second})
	if err == nil && (res.Status != sandbox.StatusTimedOut || string(res.Stdout) != "started\n") {
		err = fmt.Errorf("got %s with stdout %q after %v, want timed out with started", res.Status, res.Stdout, time.Since(start).Round(time.Millisecond))
	}
	if step("timeout", err) {
		res, err = sandbox.Run(ctx, sb, sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo next"}})
		step("after timeout", expect(res, err, sandbox.StatusSucceeded, 0, "next\n", ""))
	}

	// bash's /dev/tcp (the node24 image's /bin/sh is bash): a connection
	// out must fail under the deny-all policy.
	res, err = sandbox.Run(ctx, sb, sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c",
		"if (exec 3<>/dev/tcp/1.1.1.1/443) 2>/dev/null; then echo reached; else echo refused; fi"}, Timeout: 20 * time.Second})
	if err == nil && !bytes.Equal(res.Stdout, []byte("refused\n")) {
		err = fmt.Errorf("a connection to 1.1.1.1:443: got %q (%s), want refused", res.Stdout, res.Status)
	}
	step("no network", err)

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
		return fmt.Errorf("vercel: failed: %v", failed)
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
