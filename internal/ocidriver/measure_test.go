package ocidriver_test

import (
	"context"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// pythonSandbox creates a sandbox of the python image with memory, by
// build, destroyed when the test ends.
func pythonSandbox(t *testing.T, build func(testing.TB, string, string) (*ocidriver.Driver, error), runtime string, memory int64) sandbox.Sandbox {
	t.Helper()
	testenv.RequiresBinary(t, runtime)
	d, err := build(t, "", testenv.Guest(t))
	if err != nil {
		t.Fatal(err)
	}
	sb, err := d.Create(t.Context(), sandbox.Spec{Image: testenv.Image(t, "python"), Limits: sandbox.Limits{Memory: memory}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Destroy(context.WithoutCancel(t.Context())) })
	return sb
}

// python runs code with the python image's interpreter in sb.
func python(t *testing.T, sb sandbox.Sandbox, code string, timeout time.Duration) *sandbox.Result {
	t.Helper()
	res, err := sandbox.Run(t.Context(), sb, sandbox.ExecRequest{File: sandbox.File{Name: "main.py", Data: []byte(code)},
		Argv: []string{"/usr/bin/python3", "{file}"}, Timeout: timeout})
	if err != nil {
		t.Fatalf("Exec: %v", err)
	}
	return res
}

// TestTimedOutRunIsMeasured checks that a run the wall clock cuts short
// reports the CPU time and memory it used, which its guest, killed with
// it, never reports: here 64 MiB touched and half a second of CPU time
// (counted by the program, so that a loaded host slows it rather than
// cutting it short).
func TestTimedOutRunIsMeasured(t *testing.T) {
	testenv.RequiresRoot(t)
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			sb := pythonSandbox(t, drv.build, drv.runtime, 256<<20)
			res := python(t, sb, `
import time
b = bytearray(64 << 20)
for i in range(0, len(b), 4096):
    b[i] = 1
t = time.process_time()
while time.process_time() - t < 0.5:
    pass
print("busy done", flush=True)
time.sleep(60)
`, 5*time.Second)
			if res.Status != sandbox.StatusTimedOut || string(res.Stdout) != "busy done\n" {
				t.Fatalf("got %s with stdout %q, want timed_out after \"busy done\"", res.Status, res.Stdout)
			}
			// At least the half second of CPU the program counted, where
			// the program's count is the host kernel's (runc). The Sentry
			// counts a task's CPU time by its own clock, which runs ahead
			// of the host's count when the host is loaded (a run at load
			// 15 counted 0.5 s in the guest, 0.437 s on the host): under
			// gVisor the bound is what an unmeasured run, 0, cannot reach.
			least := 450 * time.Millisecond
			if drv.name == "gvisor" {
				least = 50 * time.Millisecond
			}
			if res.CPUTime < least || res.CPUTime > res.Duration+time.Second {
				t.Errorf("CPU time: got %s, want %s to the wall clock %s", res.CPUTime, least, res.Duration)
			}
			if res.PeakMemory < 64<<20 || res.PeakMemory > 256<<20+64<<20 {
				t.Errorf("peak memory: got %d, want 64 MiB to the limit and the runtime's headroom", res.PeakMemory)
			}
		})
	}
}

// TestOOMKillReportsSignal checks that a program killed for going over the
// memory limit reports the signal that ended it, also when the sandbox
// died with it.
func TestOOMKillReportsSignal(t *testing.T) {
	testenv.RequiresRoot(t)
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			sb := pythonSandbox(t, drv.build, drv.runtime, 64<<20)
			// One allocation far over the limit, filled at once: on
			// gVisor the host's OOM killer ends the whole sandbox
			// (the Sentry), so no exit report comes.
			res := python(t, sb, "b = b'x' * (512 << 20)\n", 20*time.Second)
			if res.Status != sandbox.StatusOOMKilled || res.Signal != 9 {
				t.Errorf("got %s with exit %d and signal %d, want oom_killed with signal 9", res.Status, res.ExitCode, res.Signal)
			}
		})
	}
}
