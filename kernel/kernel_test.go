package kernel_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	stdimage "image"
	_ "image/png"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/kernel"
)

// cell is one cell of a kernel's test, run after the cells before it in
// the same kernel.
type cell struct {
	name  string
	code  string
	stdin string
	// interrupt interrupts the cell once it has written its first output.
	interrupt bool
	// value is the cell's text/plain value; empty means none.
	value string
	// stdout is the cell's whole stdout, unless it is "-" (not checked).
	stdout string
	// err is the name of the cell's error; empty means the cell succeeds.
	err string
	// exitCode is the cell's exit status; -1 means none.
	exitCode int
	// check, if set, checks more.
	check func(t *testing.T, out *guest.CellOutput)
	// before, if set, runs before the cell, with no cell running.
	before func(t *testing.T, g *guest.Client)
}

func runCells(t *testing.T, g *guest.Client, k *guest.Kernel, cells []cell) {
	for _, c := range cells {
		t.Run(c.name, func(t *testing.T) {
			if c.before != nil {
				c.before(t, g)
			}
			var stalled func()
			if c.interrupt {
				stalled = func() { logSignalState(t, g, k) }
			}
			out := runCell(t, k, c.code, c.stdin, c.interrupt, stalled)
			r := out.Result
			if c.err == "" && r.Status != guest.CellOK {
				t.Fatalf("got status %s, error %+v, stderr %q; want ok", r.Status, r.Error, out.Stderr)
			}
			if c.err != "" && (r.Status != guest.CellError || r.Error == nil || r.Error.Name != c.err) {
				t.Fatalf("got status %s, error %+v; want error %s", r.Status, r.Error, c.err)
			}
			if got := valueOf(t, r); got != c.value {
				t.Errorf("got value %q, want %q", got, c.value)
			}
			if c.stdout != "-" && string(out.Stdout) != c.stdout {
				t.Errorf("got stdout %q, want %q (stderr %q)", out.Stdout, c.stdout, out.Stderr)
			}
			switch {
			case c.exitCode < 0 && r.ExitCode != nil:
				t.Errorf("got exit code %d, want none", *r.ExitCode)
			case c.exitCode >= 0 && (r.ExitCode == nil || *r.ExitCode != c.exitCode):
				t.Errorf("got exit code %s, want %d", fmtCode(r.ExitCode), c.exitCode)
			}
			if c.check != nil {
				c.check(t, out)
			}
		})
	}
}

// runCell runs code and fails t unless the cell ends with a result. With
// interrupt, stalled (if set) runs when the cell has not ended 10 s after
// the interrupt.
func runCell(t testing.TB, k *guest.Kernel, code, stdin string, interrupt bool, stalled func()) *guest.CellOutput {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts := guest.CellOptions{Stdin: stdin, OutputCap: 1 << 20, MaxDisplays: 8}
	if interrupt {
		var once sync.Once
		opts.OnOutput = func(guest.Stream, []byte) {
			once.Do(func() {
				if err := k.Interrupt(); err != nil {
					t.Errorf("Interrupt: %v", err)
				}
				if stalled != nil {
					timer := time.AfterFunc(10*time.Second, stalled)
					context.AfterFunc(ctx, func() { timer.Stop() })
				}
			})
		}
	}
	out, err := k.Run(ctx, code, opts)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return out
}

// logSignalState logs the signal state of the kernel's threads (pending,
// blocked and caught signals, where each waits) and every process of the
// sandbox (its stat, with its state and parent, and its command line) when
// an interrupted cell has not ended: an interrupt was once lost (a python
// cell's time.sleep ran on; a shell cell's sleep), and this is what would
// tell why. gVisor's /proc shows no signal masks.
func logSignalState(t testing.TB, g *guest.Client, k *guest.Kernel) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	script := fmt.Sprintf(`for d in /proc/%d/task/*; do grep -E '^(Name|State|Sig|ShdPnd)' $d/status; echo "wchan $(cat $d/wchan) syscall $(cat $d/syscall)"; done 2>&1
echo "every process (stat; cmdline):"
for p in /proc/[0-9]*; do echo "$(cat $p/stat); $(tr '\0' ' ' <$p/cmdline)"; done 2>&1`, k.PID())
	ex, err := g.Exec(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, OutputCap: 64 << 10}, guest.ExecOptions{OutputCap: 64 << 10})
	if err != nil {
		t.Logf("the interrupted cell runs on 10 s after its interrupt; reading its threads: %v", err)
		return
	}
	res, err := ex.Wait(ctx)
	if err != nil {
		t.Logf("the interrupted cell runs on 10 s after its interrupt; reading its threads: %v", err)
		return
	}
	t.Logf("the interrupted cell runs on 10 s after its interrupt; the threads of kernel pid %d:\n%s%s", k.PID(), res.Stdout, res.Stderr)
}

func valueOf(t testing.TB, r *guest.CellResult) string {
	t.Helper()
	if r.Value == nil {
		return ""
	}
	if r.Value.MimeType != "text/plain" {
		t.Errorf("got a value of type %s, want text/plain", r.Value.MimeType)
	}
	return string(r.Value.Data)
}

// pngSize checks that d is a PNG and returns its dimensions.
func pngSize(t *testing.T, d guest.Display) (int, int) {
	t.Helper()
	if d.MimeType != "image/png" {
		t.Fatalf("got a display of type %s, want image/png", d.MimeType)
	}
	cfg, format, err := stdimage.DecodeConfig(bytes.NewReader(d.Data))
	if err != nil || format != "png" {
		t.Fatalf("decoding the display: format %q, %v", format, err)
	}
	return cfg.Width, cfg.Height
}

// wantFigures checks that the cell displayed PNGs of these sizes, in order.
func wantFigures(sizes ...[2]int) func(t *testing.T, out *guest.CellOutput) {
	return func(t *testing.T, out *guest.CellOutput) {
		if len(out.Displays) != len(sizes) {
			t.Fatalf("got %d displays, want %d (stderr %q)", len(out.Displays), len(sizes), out.Stderr)
		}
		for i, d := range out.Displays {
			if w, h := pngSize(t, d); w != sizes[i][0] || h != sizes[i][1] {
				t.Errorf("display %d: got a %dx%d PNG, want %dx%d", i, w, h, sizes[i][0], sizes[i][1])
			}
		}
	}
}

func wantTraceback(has []string, hasNot []string) func(t *testing.T, out *guest.CellOutput) {
	return func(t *testing.T, out *guest.CellOutput) {
		tb := out.Result.Error.Traceback
		for _, s := range has {
			if !strings.Contains(tb, s) {
				t.Errorf("traceback %q does not contain %q", tb, s)
			}
		}
		for _, s := range hasNot {
			if strings.Contains(tb, s) {
				t.Errorf("traceback %q contains %q, one of the kernel's own frames", tb, s)
			}
		}
	}
}

func wantStderr(s string) func(t *testing.T, out *guest.CellOutput) {
	return func(t *testing.T, out *guest.CellOutput) {
		if string(out.Stderr) != s {
			t.Errorf("got stderr %q, want %q", out.Stderr, s)
		}
	}
}

// releaseBackground lets the background process of a cell (see
// backgroundPython and backgroundShell) print while no cell runs, and
// waits until it has.
func releaseBackground(t *testing.T, g *guest.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := g.WriteFile(ctx, "/tmp/bg-go", 0o644, strings.NewReader(""), 0); err != nil {
		t.Fatalf("writing /tmp/bg-go: %v", err)
	}
	for {
		if _, err := g.Stat(ctx, "/tmp/bg-done"); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("the background process did not print")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// The background processes wait for /tmp/bg-go, print "late" and create
// /tmp/bg-done.
const (
	backgroundPython = "import subprocess\n" +
		"bg = subprocess.Popen(['/bin/sh', '-c', 'while [ ! -e /tmp/bg-go ]; do sleep 0.01; done; echo late; echo late >&2; touch /tmp/bg-done'])"
	backgroundShell = "(while [ ! -e /tmp/bg-go ]; do sleep 0.01; done; echo late; echo late >&2; touch /tmp/bg-done) &"
)

// csvData is a table of n rows (id, group a-e, value) and, as Python
// prints it, the dict of each group's sum of values.
func csvData(n int) ([]byte, string) {
	var b bytes.Buffer
	b.WriteString("id,group,value\n")
	sums := make([]int, 5)
	for i := range n {
		g, v := i%5, (i*7)%1000
		sums[g] += v
		fmt.Fprintf(&b, "%d,%c,%d\n", i, 'a'+g, v)
	}
	var d []string
	for g, s := range sums {
		d = append(d, fmt.Sprintf("'%c': %d", 'a'+g, s))
	}
	return b.Bytes(), "{" + strings.Join(d, ", ") + "}"
}

func TestPython(t *testing.T) {
	for _, tier := range tiers {
		t.Run(tier, func(t *testing.T) {
			g, k := startKernel(t, newDriver(t, tier), kernel.Python, "python")
			data, sums := csvData(100_000)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := g.WriteFile(ctx, "/tmp/data.csv", 0o644, bytes.NewReader(data), int64(len(data))); err != nil {
				t.Fatalf("writing the CSV: %v", err)
			}
			noKernelFrames := []string{`"<string>"`, "_cell_result", "_run"}
			runCells(t, g, k, []cell{
				{name: "assignment has no value", code: "x = 1", exitCode: -1},
				{name: "state carries over", code: "x + 1", value: "2", exitCode: -1},
				{name: "None is no value", code: "print(x)\nNone", stdout: "1\n", exitCode: -1},
				{name: "a trailing semicolon hides the value", code: "x;", exitCode: -1},
				{name: "output before the value", code: "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.stdout.write('no newline')\n7",
					value: "7", stdout: "out\nno newline", exitCode: -1, check: wantStderr("err\n")},
				{name: "read the CSV", code: "import pandas as pd\ndf = pd.read_csv('/tmp/data.csv')\nlen(df)", value: "100000", exitCode: -1},
				{name: "aggregate", code: "{g: int(v) for g, v in df.groupby('group')['value'].sum().items()}", value: sums, exitCode: -1},
				{name: "plot and show", code: "import matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(4, 3), dpi=50)\n" +
					"df.groupby('group')['value'].sum().plot.bar(ax=ax)\nplt.show()",
					exitCode: -1, check: wantFigures([2]int{200, 150})},
				{name: "a figure left open", code: "plt.figure(figsize=(3, 2), dpi=40)\nplt.plot([1, 3, 2]);",
					exitCode: -1, check: wantFigures([2]int{120, 80})},
				{name: "figures are closed after their cell", code: "plt.get_fignums()", value: "[]", exitCode: -1},
				{name: "exception", code: "def f(n):\n    return 10 / n\nf(0)", err: "ZeroDivisionError", exitCode: -1,
					check: func(t *testing.T, out *guest.CellOutput) {
						if v := out.Result.Error.Value; v != "division by zero" {
							t.Errorf("got error value %q, want %q", v, "division by zero")
						}
						wantTraceback([]string{"Traceback (most recent call last)", `File "<cell-`, "return 10 / n", "ZeroDivisionError: division by zero"}, noKernelFrames)(t, out)
					}},
				{name: "syntax error", code: "x = (", err: "SyntaxError", exitCode: -1,
					check: wantTraceback([]string{`File "<cell-`, "x = ("}, append(noKernelFrames, "ast.py"))},
				{name: "interrupt", code: "print('spinning')\nwhile True:\n    pass", interrupt: true, err: "KeyboardInterrupt", stdout: "spinning\n", exitCode: -1,
					check: wantTraceback([]string{`File "<cell-`, "KeyboardInterrupt"}, append(noKernelFrames, "_on_sigint"))},
				{name: "interrupt of a sleep", code: "import time\nprint('sleeping')\ntime.sleep(60)", interrupt: true, err: "KeyboardInterrupt", stdout: "sleeping\n", exitCode: -1},
				{name: "the kernel stays usable", code: "x", value: "1", exitCode: -1},
				{name: "the wire's modules replaced", code: "import json, binascii\njson.dumps = json.loads = binascii.b2a_base64 = None\nx", value: "1", exitCode: -1},
				{name: "the kernel still answers", code: "x + 1", value: "2", exitCode: -1},
				{name: "stdin", code: "import sys\nsys.stdin.read().upper()", stdin: "hello", value: "'HELLO'", exitCode: -1},
				{name: "stdin by input", code: "input() + '!'", stdin: "bob\nalice\n", value: "'bob!'", exitCode: -1},
				{name: "no stdin", code: "sys.stdin.read()", value: "''", exitCode: -1},
				{name: "sys.exit is an error", code: "sys.exit(3)", err: "SystemExit", exitCode: -1},
				{name: "the wire is not inherited", code: "import subprocess\nsubprocess.run(['/bin/sh', '-c', 'ls /proc/self/fd'], capture_output=True, text=True, close_fds=False).stdout.split()",
					value: "['0', '1', '2', '3']", exitCode: -1},
				{name: "a background process", code: backgroundPython, exitCode: -1},
				{name: "its output between cells is no cell's", before: releaseBackground, code: "print('now')\nbg.wait()",
					value: "0", stdout: "now\n", exitCode: -1, check: wantStderr("")},
			})
		})
	}
}

func TestNode(t *testing.T) {
	for _, tier := range tiers {
		t.Run(tier, func(t *testing.T) {
			g, k := startKernel(t, newDriver(t, tier), kernel.Node, "node")
			runCells(t, g, k, []cell{
				{name: "let", code: "let n = 1; n + 1", value: "2", exitCode: -1},
				{name: "let carries over", code: "n + 1", value: "2", exitCode: -1},
				{name: "const and function", code: "const c = 5\nfunction sq(v) { return v * v }", exitCode: -1},
				{name: "declarations carry over", code: "sq(c)", value: "25", exitCode: -1},
				{name: "declared again", code: "const c = 6; c", value: "6", exitCode: -1},
				{name: "top-level await", code: "await new Promise(r => setTimeout(() => r(42), 10))", value: "42", exitCode: -1},
				{name: "await in a declaration", code: "const later = await Promise.resolve('done')", exitCode: -1},
				{name: "awaited declaration carries over", code: "later", value: "'done'", exitCode: -1},
				{name: "last value", code: "console.log('hi'); [1, {a: 'b'}]", value: "[ 1, { a: 'b' } ]", stdout: "hi\n", exitCode: -1},
				{name: "undefined is no value", code: "undefined", exitCode: -1},
				{name: "error", code: "function boom() { null.x }\nboom()", err: "TypeError", exitCode: -1,
					check: func(t *testing.T, out *guest.CellOutput) {
						if v := out.Result.Error.Value; !strings.Contains(v, "null") {
							t.Errorf("got error value %q, want it to name null", v)
						}
						wantTraceback([]string{"TypeError:", "at boom (cell-", "cell-"}, []string{"node:inspector", "[eval]"})(t, out)
					}},
				{name: "a rejected await", code: "await Promise.reject(new RangeError('no'))", err: "RangeError", exitCode: -1},
				{name: "syntax error", code: "let = ;", err: "SyntaxError", exitCode: -1, check: wantTraceback([]string{"cell-"}, []string{"node:inspector"})},
				{name: "interrupt", code: "console.log('spinning'); while (true) {}", interrupt: true, err: "KeyboardInterrupt", stdout: "spinning\n", exitCode: -1},
				{name: "output after an interrupt", code: "console.log('after'); n", value: "1", stdout: "after\n", exitCode: -1},
				// An interrupt that ends a write of the cell's output half
				// way must not hold back the output of the next cells.
				{name: "output after interrupts of writes", code: "console.log('after'); n", value: "1", stdout: "after\n", exitCode: -1,
					before: func(t *testing.T, _ *guest.Client) {
						for range 20 {
							out := runCell(t, k, "while (true) { console.log('spinning') }", "", true, nil)
							if r := out.Result; r.Error == nil || r.Error.Name != "KeyboardInterrupt" {
								t.Fatalf("got %+v, want a KeyboardInterrupt", r)
							}
						}
					}},
				// The cell prints once it waits (see node.js on an interrupt
				// as the synchronous part ends).
				{name: "interrupt of an await", code: "await new Promise(r => setTimeout(r, 0)); console.log('waiting'); await new Promise(() => {})",
					interrupt: true, err: "KeyboardInterrupt", stdout: "waiting\n", exitCode: -1},
				{name: "the kernel stays usable", code: "n", value: "1", exitCode: -1},
				{name: "stdin", code: "let s = ''; for await (const b of process.stdin) s += b; s.toUpperCase()", stdin: "hello", value: "'HELLO'", exitCode: -1},
				{name: "a stray rejection does not end the kernel", code: "Promise.reject(new Error('stray')); await new Promise(r => setTimeout(r, 20)); n", value: "1", stdout: "-", exitCode: -1},
			})
		})
	}
}

func TestShell(t *testing.T) {
	cells := []cell{
		{name: "cd and a variable", code: "cd /tmp; X=5", exitCode: 0},
		{name: "they carry over", code: "pwd; echo $X", stdout: "/tmp\n5\n", exitCode: 0},
		// The kernel's prompt once named the cell by this variable.
		{name: "a cell sets the kernel's old variable", code: "__stockade_n=99; echo one", stdout: "one\n", exitCode: 0},
		{name: "the next cell runs", code: "echo two", stdout: "two\n", exitCode: 0},
		{name: "a function carries over", code: "greet() { echo \"hi $1\"; }", exitCode: 0},
		{name: "exit status", code: "greet you\nfalse", stdout: "hi you\n", err: "ExitStatus", exitCode: 1},
		{name: "exit status of the last command", code: "false; true", exitCode: 0},
		{name: "stdin", code: "read a; read b; echo \"$b $a\"", stdin: "one\ntwo\n", stdout: "two one\n", exitCode: 0},
		{name: "no stdin", code: "cat", exitCode: 0},
		{name: "syntax error", code: "if then", err: "SyntaxError", exitCode: -1, check: func(t *testing.T, out *guest.CellOutput) {
			if v := out.Result.Error.Value; !strings.Contains(v, "cell-") || strings.Contains(v, ".stockade-shell") {
				t.Errorf("got error value %q, want it to name the cell, not the kernel's file", v)
			}
		}},
		{name: "interrupt", code: "echo sleeping; sleep 60; echo not reached", interrupt: true, err: "KeyboardInterrupt", stdout: "sleeping\n", exitCode: 130},
		{name: "interrupt of a loop", code: "echo spinning; while :; do :; done", interrupt: true, err: "KeyboardInterrupt", stdout: "spinning\n", exitCode: 130},
		{name: "an error of a special built-in", code: ". /nonexistent; echo not reached", err: "ExitStatus", exitCode: 2},
		{name: "the prompt is the kernel's", code: "PS1=x", err: "ExitStatus", exitCode: 2},
		{name: "the shell stays", code: "echo $X; pwd", stdout: "5\n/tmp\n", exitCode: 0},
		{name: "the wire is not inherited", code: "ls /proc/self/fd", stdout: "0\n1\n2\n3\n", exitCode: 0},
		{name: "exit ends the kernel", code: "echo bye; exit 3", stdout: "bye\n", err: "ShellExited", exitCode: 3},
	}
	for _, tier := range tiers {
		t.Run(tier, func(t *testing.T) {
			d := newDriver(t, tier)
			// busybox sh in the shell image, dash in the others.
			for _, img := range []string{"shell", "python"} {
				t.Run(img, func(t *testing.T) {
					g, k := startKernel(t, d, kernel.Shell, img)
					runCells(t, g, k, cells)
					select {
					case <-k.Done():
					case <-time.After(time.Minute):
						t.Fatal("the kernel did not end after its shell exited")
					}
					if x := k.Exit(); x == nil || x.ExitCode != 3 {
						t.Errorf("got kernel exit %+v, want exit code 3", x)
					}
					_, err := k.Run(context.Background(), "echo", guest.CellOptions{OutputCap: 1})
					var gerr *guest.Error
					if !errors.As(err, &gerr) || gerr.Code != guest.ErrorKernelGone {
						t.Errorf("a cell after the kernel ended: got %v, want %s", err, guest.ErrorKernelGone)
					}
				})
			}
		})
	}
}

func TestRequest(t *testing.T) {
	tests := []struct {
		name, image string
		wantArgv0   string
		wantErr     error
	}{
		{"python", "", "/usr/bin/python3", nil},
		{"node", "node", "/usr/bin/node", nil},
		{"shell", "shell", "/.stockade/guest", nil},
		{"shell", "python", "/.stockade/guest", nil},
		{"python", "node", "", errdefs.ErrInvalidArgument},
		{"ruby", "", "", errdefs.ErrInvalidArgument},
		{"shell", "windows", "", errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name+" in "+tt.image, func(t *testing.T) {
			req, err := kernel.Request(tt.name, kernel.Options{Image: tt.image})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("got error %v, want %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if req.Argv[0] != tt.wantArgv0 || req.Cwd != "/tmp" || len(req.Env) == 0 {
				t.Errorf("got argv[0] %q, cwd %q, env %q; want %q, /tmp and the profile's", req.Argv[0], req.Cwd, req.Env, tt.wantArgv0)
			}
		})
	}
}

// TestRequestPreimport checks that the python kernel takes the modules
// to import as its arguments, after its source, and that the other
// kernels refuse them.
func TestRequestPreimport(t *testing.T) {
	req, err := kernel.Request(kernel.Python, kernel.Options{Preimport: []string{"numpy", "pandas"}})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(req.Argv); n != 5 || req.Argv[1] != "-c" || req.Argv[3] != "numpy" || req.Argv[4] != "pandas" {
		t.Errorf("got argv %q (without the source), want python3 -c SOURCE numpy pandas", append(req.Argv[:2:2], req.Argv[min(3, n):]...))
	}
	for _, name := range []string{kernel.Node, kernel.Shell} {
		if _, err := kernel.Request(name, kernel.Options{Preimport: []string{"os"}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s kernel with Preimport: got %v, want ErrInvalidArgument", name, err)
		}
	}
}

func fmtCode(p *int) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(*p)
}
