// Package probeexec delivers the static probe program
// (sandbox/conformance/probe) into a sandbox and runs its subcommands, for
// the driver conformance suite and the blast-radius audit alike.
//
// A static Go program is larger than sandbox.MaxCodeSize, and drivers refuse
// bigger code files, so the probe travels gzip-compressed as the Exec's file
// and is unpacked inside the sandbox by a program of the image (busybox,
// python3 or node). On a driver with sessions it is unpacked once to Path
// and then run directly, with exactly the requested environment and no
// shell in between:
//
//	gz, err := probeexec.Compress(bin)
//	u, _ := probeexec.UnpackerFor("shell")
//	if err := probeexec.Install(ctx, sb, gz, u); err != nil { ... }
//	res, err := sandbox.Run(ctx, sb, probeexec.Request(sandbox.ExecRequest{}, "caps"))
//	var report map[string]any
//	err = probeexec.Decode(res, &report)
package probeexec

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/stockade-sh/stockade/sandbox"
)

// Path is where Install unpacks the probe inside the sandbox.
const Path = "/tmp/probe"

// Compress returns bin gzip-compressed, and an error if even compressed it
// is larger than sandbox.MaxCodeSize.
func Compress(bin []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(bin); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	if buf.Len() > sandbox.MaxCodeSize {
		return nil, fmt.Errorf("the compressed probe is %d bytes, more than sandbox.MaxCodeSize (%d)", buf.Len(), sandbox.MaxCodeSize)
	}
	return buf.Bytes(), nil
}

// Unpacker is how an image unpacks the compressed probe: Argv runs with the
// compressed file at "{file}" (see sandbox.ExecRequest), writes the
// executable to Path with mode 0755, and removes the compressed file.
type Unpacker struct {
	// Runtime is the runtime whose image has the program Argv runs.
	Runtime string
	Argv    []string
}

// The unpackers of the runtimes Stockade ships, in order of preference.
var unpackers = []Unpacker{
	{Runtime: "shell", Argv: []string{"/bin/busybox", "sh", "-c",
		"/bin/busybox gunzip -c {file} > " + Path + " && /bin/busybox chmod 755 " + Path + " && /bin/busybox rm {file}"}},
	{Runtime: "python", Argv: []string{"/usr/bin/python3", "-c",
		"import gzip, os, sys\n" +
			"with gzip.open(sys.argv[1]) as f: data = f.read()\n" +
			"with open(sys.argv[2], 'xb') as f: f.write(data)\n" +
			"os.chmod(sys.argv[2], 0o755)\n" +
			"os.remove(sys.argv[1])\n",
		"{file}", Path}},
	{Runtime: "node", Argv: []string{"/usr/bin/node", "-e",
		"const fs = require('fs'), zlib = require('zlib');" +
			"fs.writeFileSync(process.argv[2], zlib.gunzipSync(fs.readFileSync(process.argv[1])), {mode: 0o755, flag: 'wx'});" +
			"fs.chmodSync(process.argv[2], 0o755); fs.unlinkSync(process.argv[1]);",
		"{file}", Path}},
}

// Busybox is the unpacker of the shell image, which every driver's
// conformance suite uses.
var Busybox = unpackers[0]

// UnpackerFor returns the unpacker of a runtime's image.
func UnpackerFor(runtime string) (Unpacker, bool) {
	for _, u := range unpackers {
		if u.Runtime == runtime {
			return u, true
		}
	}
	return Unpacker{}, false
}

// Runtimes lists the runtimes with an unpacker, in order of preference (the
// smallest image first).
func Runtimes() []string {
	out := make([]string, len(unpackers))
	for i, u := range unpackers {
		out[i] = u.Runtime
	}
	return out
}

// Install unpacks gz (from Compress) to Path in sb with one Exec of u, so
// that later Execs made with Request run the probe directly. sb's driver
// must support sessions.
func Install(ctx context.Context, sb sandbox.Sandbox, gz []byte, u Unpacker) error {
	res, err := sandbox.Run(ctx, sb, sandbox.ExecRequest{
		File: sandbox.File{Name: "probe.gz", Data: gz},
		Argv: u.Argv,
	})
	if err != nil {
		return fmt.Errorf("installing the probe: %w", err)
	}
	if res.Status != sandbox.StatusSucceeded {
		return fmt.Errorf("installing the probe with %s: got status %s (exit code %d), want succeeded; stderr: %q",
			u.Argv[0], res.Status, res.ExitCode, Tail(res.Stderr))
	}
	return nil
}

// Request returns req made to run the installed probe with args. Every Exec
// delivers a file; this one carries the arguments, for the record.
func Request(req sandbox.ExecRequest, args ...string) sandbox.ExecRequest {
	req.File = sandbox.File{Name: "probe-args", Data: []byte(strings.Join(args, " "))}
	req.Argv = append([]string{Path}, args...)
	return req
}

// InlineRequest returns req made to unpack gz with the image's busybox and
// exec the probe with args in the same Exec, for drivers without sessions.
// The shell adds SHLVL, PWD and PATH to the probe's environment.
func InlineRequest(req sandbox.ExecRequest, gz []byte, args ...string) sandbox.ExecRequest {
	req.File = sandbox.File{Name: "probe.gz", Data: gz}
	req.Argv = append([]string{"/bin/busybox", "sh", "-c",
		`p=/tmp/.probe-$$ && /bin/busybox gunzip -c {file} > "$p" && /bin/busybox chmod 755 "$p" && exec "$p" "$@"`,
		"probe"}, args...)
	return req
}

// Decode checks that the probe succeeded and decodes the last line of its
// stdout (its JSON report) into v.
func Decode(res *sandbox.Result, v any) error {
	if res.Status != sandbox.StatusSucceeded {
		return fmt.Errorf("got status %s (exit code %d, signal %d), want succeeded; stderr: %q",
			res.Status, res.ExitCode, res.Signal, Tail(res.Stderr))
	}
	out := bytes.TrimSpace(res.Stdout)
	if i := bytes.LastIndexByte(out, '\n'); i >= 0 {
		out = out[i+1:]
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("decoding its report %q: %w", Tail(out), err)
	}
	return nil
}

// Tail returns the last 2 KiB of b, for error messages.
func Tail(b []byte) string {
	const n = 2048
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
