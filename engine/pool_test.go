package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// poolCounts is a PoolObserver that counts.
type poolCounts struct {
	mu                   sync.Mutex
	hits, misses, refill int
}

func (c *poolCounts) PoolSize(string, int) {}
func (c *poolCounts) PoolHit(string)       { c.mu.Lock(); c.hits++; c.mu.Unlock() }
func (c *poolCounts) PoolMiss(string)      { c.mu.Lock(); c.misses++; c.mu.Unlock() }
func (c *poolCounts) PoolRefill(string, time.Duration) {
	c.mu.Lock()
	c.refill++
	c.mu.Unlock()
}

func (c *poolCounts) get() (hits, misses int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses
}

// realDrivers returns runc and gVisor drivers.
func realDrivers(t *testing.T) map[string]sandbox.Driver {
	t.Helper()
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	testenv.RequiresBinary(t, "runsc")
	guest := testenv.Guest(t)
	rc, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: guest})
	if err != nil {
		t.Fatal(err)
	}
	// With a supervisor: a one-shot pool's sandboxes are restored from
	// its checkpoint on gVisor (poolsnap_exec.go), detached.
	gv, err := gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: guest, Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = gv.Reap(context.Background(), nil) })
	return map[string]sandbox.Driver{"runc": rc, "gvisor": gv}
}

// pooledEngine returns an engine over drivers, with the default tool on
// driver, and a python pool of size on it when size > 0. On gVisor the
// pool refills from its checkpoint (poolsnap_exec.go): these tests see
// restored sandboxes there (the counts say how many), cold ones on runc.
func pooledEngine(t *testing.T, drivers map[string]sandbox.Driver, driver string, size int, opts ...Option) (*Engine, *snapCounts) {
	t.Helper()
	opts = append(opts, WithPools(PoolOptions{Pools: []PoolSpec{{Runtime: "python", Size: size}}, CheckpointDir: t.TempDir()}))
	e, err := New(drivers, driver, image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	counts := &snapCounts{}
	e.SetPoolObserver(counts)
	stop, err := e.StartPools(context.Background(), map[string]string{LabelOwner: "pool-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return e, counts
}

// waitReady waits until e's pools hold n sandboxes each.
func waitReady(t *testing.T, e *Engine, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ready := true
		for _, p := range e.pools {
			p.mu.Lock()
			ready = ready && len(p.ready) >= n
			p.mu.Unlock()
		}
		if ready {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pools did not fill to %d within 60s", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPoolRunsAsColdRuns runs a table of programs cold and from a pool, on
// runc and gVisor, and compares what the caller sees.
func TestPoolRunsAsColdRuns(t *testing.T) {
	drivers := realDrivers(t)
	programs := []struct {
		name   string
		code   string
		stdin  string
		limits sandbox.Limits
	}{
		{name: "print", code: "print(1)"},
		{name: "both streams", code: "import sys\nprint('out')\nprint('err', file=sys.stderr)"},
		{name: "exit code", code: "import sys\nprint('x')\nsys.exit(3)"},
		{name: "exit message", code: "import sys\nsys.exit('bye')"},
		{name: "exception", code: "def f():\n    raise ValueError('boom')\n\nf()\n"},
		{name: "chained exception", code: "try:\n    1/0\nexcept ZeroDivisionError as e:\n    raise KeyError('k') from e\n"},
		{name: "syntax error", code: "x = (\n"},
		{name: "exit 256", code: "import sys\nsys.exit(256)"},
		{name: "bare SystemExit", code: "print('a')\nraise SystemExit"},
		{name: "threads and atexit", code: "import atexit, threading, time\natexit.register(print, 'atexit')\nthreading.Thread(target=lambda: (time.sleep(0.3), print('thread'))).start()\nprint('main')"},
		{name: "unflushed output", code: "import sys\nsys.stdout.write('no newline')\nsys.stderr.write('err')"},
		{name: "closed stdout", code: "import os\nprint('x')\nos.close(1)"},
		{name: "keyboard interrupt", code: "import atexit\natexit.register(print, 'atexit')\nraise KeyboardInterrupt"},
		{name: "a forked child ends", code: "import os, sys\nif os.fork() == 0:\n    sys.exit(0)\nos.wait()\nprint('parent')\nsys.exit(3)"},
		{name: "descriptors closed and reopened", code: "import os\nos.closerange(3, 1024)\nf = open('/tmp/a', 'w')\ng = open('/tmp/b', 'w')\nprint(f.fileno(), g.fileno())"},
		{name: "stdin", code: "import sys\nprint(sys.stdin.read().upper())", stdin: "hello\nworld\n"},
		{name: "stdin of a child", code: "import subprocess\nsubprocess.run(['/bin/cat'])", stdin: "through fd 0\n"},
		{name: "argv and file", code: "import os, sys\nprint(sys.argv, __file__, __name__, sys.path[0], os.getcwd(), sys.orig_argv)\nprint(open(__file__).read() == open(sys.argv[0]).read(), oct(os.stat(__file__).st_mode), os.stat(__file__).st_uid)"},
		{name: "globals", code: "print(sorted(globals()), __spec__, __package__, __doc__, __cached__, __loader__.name, __annotations__)"},
		{name: "environment", code: "import os\nprint(sorted(os.environ.items()))"},
		{name: "tmp", code: "import os\nprint(sorted(os.listdir('/tmp')), os.path.exists('/workspace'))"},
		{name: "signal", code: "import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGTERM)"},
		{name: "timeout", code: "import time\nprint('before', flush=True)\ntime.sleep(60)", limits: sandbox.Limits{Timeout: 2 * time.Second}},
		{name: "truncation", code: "import sys\nsys.stdout.write('x' * 3000000)\nsys.stderr.write('y' * 10)"},
		{name: "oom", code: "b = bytearray(700 << 20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\nprint('survived')"},
		{name: "tighter memory", code: "b = bytearray(300 << 20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\nprint('survived')", limits: sandbox.Limits{Memory: 256 << 20}},
	}
	for _, driver := range []string{"runc", "gvisor"} {
		t.Run(driver, func(t *testing.T) {
			cold, _ := pooledEngine(t, drivers, driver, 0)
			warm, counts := pooledEngine(t, drivers, driver, 1)
			for _, pr := range programs {
				t.Run(pr.name, func(t *testing.T) {
					req := Request{Runtime: "python", Code: []byte(pr.code), Stdin: []byte(pr.stdin), Limits: pr.limits}
					want, err := cold.Run(context.Background(), req)
					if err != nil {
						t.Fatalf("cold run: %v", err)
					}
					waitReady(t, warm, 1)
					hits, _ := counts.get()
					got, err := warm.Run(context.Background(), req)
					if err != nil {
						t.Fatalf("pooled run: %v", err)
					}
					if h, _ := counts.get(); h != hits+1 {
						t.Fatalf("got %d pool hits, want %d: the run was not served by the pool", h, hits+1)
					}
					if g, w := seenOf(got), seenOf(want); g != w {
						t.Errorf("pooled run differs from the cold run:\n got %+v\nwant %+v", g.clip(), w.clip())
					}
				})
			}
		})
	}
}

// seen is what a caller sees of a Result, timings and usage aside.
type seen struct {
	Status                   sandbox.Status
	ExitCode, Signal         int
	Stdout, Stderr           string
	StdoutTrunc, StderrTrunc bool
	Driver, Runtime          string
}

func seenOf(r *Result) seen {
	return seen{r.Status, r.ExitCode, r.Signal, r.Stdout, r.Stderr, r.StdoutTruncated, r.StderrTruncated, r.Driver, r.Runtime}
}

// clip shortens long outputs for a failure message.
func (s seen) clip() seen {
	for _, p := range []*string{&s.Stdout, &s.Stderr} {
		if len(*p) > 400 {
			*p = (*p)[:400] + "..."
		}
	}
	return s
}

// lookAround is the end of the bleed tests' python programs that look for
// what an earlier acquirer left: it prints the processes besides the guest
// and itself, then binds the abstract socket the earlier one bound.
const lookAround = `procs = []
for pid in os.listdir('/proc'):
    if pid.isdigit() and int(pid) not in (1, os.getpid()):
        try:
            procs.append(open('/proc/%s/cmdline' % pid, 'rb').read().replace(b'\0', b' ').decode())
        except OSError:
            pass
print('procs', procs)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind('\0stockade-bleed')
print('socket free')
`

// TestPoolNoBleed runs successive programs from one pool, on runc and
// gVisor: what the first one leaves (files, processes, environment,
// interpreter globals, monkeypatched modules, an abstract socket) the
// second must not see, and an unbound pool sandbox holds nothing but its
// interpreter.
func TestPoolNoBleed(t *testing.T) {
	drivers := realDrivers(t)
	const leave = `import builtins, json, os, socket, subprocess
os.makedirs('/tmp/left', exist_ok=True)
open('/tmp/left/secret', 'w').write('tenant A')
os.environ['TENANT'] = 'A'
os.putenv('TENANT', 'A')
builtins.SECRET = 'tenant A'
json.dumps = lambda *a, **k: 'patched'
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind('\0stockade-bleed')
s.listen()
subprocess.Popen(['/bin/sleep', '300'], start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print('left')
`
	const look = `import builtins, json, os, socket
print('tmp', sorted(os.listdir('/tmp')))
print('workspace', os.path.isdir('/workspace') and sorted(os.listdir('/workspace')) or [])
print('env', 'TENANT' in os.environ)
print('builtins', hasattr(builtins, 'SECRET'))
print('json', json.dumps({'a': 1}))
` + lookAround
	const clean = "tmp ['main.py']\nworkspace []\nenv False\nbuiltins False\njson {\"a\": 1}\nprocs []\nsocket free\n"
	for _, driver := range []string{"runc", "gvisor"} {
		t.Run(driver, func(t *testing.T) {
			e, counts := pooledEngine(t, drivers, driver, 1)
			waitReady(t, e, 1)
			// Before it is bound, a pool sandbox holds its empty
			// program file and nothing of anyone's, and carries the
			// pool's labels only.
			p := e.pools[0]
			p.mu.Lock()
			w := p.ready[0]
			p.mu.Unlock()
			if f, ok := w.sb.(sandbox.Files); ok {
				entries, _, err := f.ListDir(context.Background(), "/tmp")
				if err != nil {
					t.Fatal(err)
				}
				if len(entries) != 1 || entries[0].Name != "main.py" || entries[0].Size != 0 {
					t.Errorf("got /tmp of an unbound pool sandbox %+v, want only an empty main.py", entries)
				}
				if entries, _, err := f.ListDir(context.Background(), "/workspace"); len(entries) > 0 || (err != nil && !errdefs.IsNotFound(err)) {
					t.Errorf("got /workspace %+v (%v) in an unbound pool sandbox, want none or an empty one", entries, err)
				}
			} else {
				t.Errorf("the %s driver's sandboxes have no Files; want them, to look into a pool sandbox", driver)
			}
			res, err := e.Run(context.Background(), Request{Runtime: "python", Code: []byte(leave), Labels: map[string]string{LabelExecution: "a"}})
			if err != nil || res.Stdout != "left\n" {
				t.Fatalf("first acquirer: got %+v, %v; want it to leave its traces", res, err)
			}
			for i := range 2 {
				waitReady(t, e, 1)
				res, err = e.Run(context.Background(), Request{Runtime: "python", Code: []byte(look), Labels: map[string]string{LabelExecution: "b"}})
				if err != nil {
					t.Fatal(err)
				}
				if res.Stdout != clean {
					t.Errorf("acquirer %d saw:\n%s\nstderr: %s\nwant:\n%s", i+2, res.Stdout, res.Stderr, clean)
				}
			}
			if hits, misses := counts.get(); hits != 3 || misses != 0 {
				t.Errorf("got %d hits and %d misses, want 3 hits and no miss", hits, misses)
			}
			if restored, _, failed := e.poolObs.(*snapCounts).made(); driver == "gvisor" && (restored < 3 || failed > 0) {
				t.Errorf("got %d restored refills and %d failed restores on gVisor, want the three runs' sandboxes restored", restored, failed)
			}
		})
	}
}

// TestPoolFallsBack checks that requests the pool cannot serve run cold
// (and are counted as misses), with what they asked for.
func TestPoolFallsBack(t *testing.T) {
	drivers := realDrivers(t)
	e, counts := pooledEngine(t, drivers, "runc", 1)
	waitReady(t, e, 1)
	for _, tt := range []struct {
		name   string
		limits sandbox.Limits
		code   string
		want   string
	}{
		{"looser memory", sandbox.Limits{Memory: 1 << 30}, "import sys\nprint('numpy' in sys.modules)", "False\n"},
		{"another output cap", sandbox.Limits{OutputCap: 4}, "print('123456')", "1234"},
		{"another tmp size", sandbox.Limits{TmpSize: 8 << 20}, "import sys\nprint('numpy' in sys.modules)", "False\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, misses := counts.get()
			res, err := e.Run(context.Background(), Request{Runtime: "python", Code: []byte(tt.code), Limits: tt.limits})
			if err != nil {
				t.Fatal(err)
			}
			if res.Stdout != tt.want {
				t.Errorf("got stdout %q, want %q", res.Stdout, tt.want)
			}
			if _, m := counts.get(); m != misses+1 {
				t.Errorf("got %d misses, want %d", m, misses+1)
			}
		})
	}
	// A pooled run's interpreter has numpy and pandas imported already.
	res, err := e.Run(context.Background(), Request{Runtime: "python", Code: []byte("import sys\nprint('numpy' in sys.modules, 'pandas' in sys.modules)")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "True True\n" {
		t.Errorf("got %q from a pooled run, want numpy and pandas imported", res.Stdout)
	}
	if hits, _ := counts.get(); hits != 1 {
		t.Errorf("got %d hits, want 1", hits)
	}
	// The shell runtime has no pool: neither a hit nor a miss.
	if _, err := e.Run(context.Background(), Request{Runtime: "shell", Code: []byte("true")}); err != nil {
		t.Fatal(err)
	}
	if hits, misses := counts.get(); hits != 1 || misses != 3 {
		t.Errorf("got %d hits and %d misses, want 1 and 3", hits, misses)
	}
}

// TestPoolReplacesOldSandboxes checks that a pool sandbox past the
// maximum age is destroyed and replaced.
func TestPoolReplacesOldSandboxes(t *testing.T) {
	drivers := realDrivers(t)
	e, err := New(drivers, "runc", image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
		WithPools(PoolOptions{Pools: []PoolSpec{{Runtime: "python", Size: 1}}, MaxAge: 2 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	stop, err := e.StartPools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	waitReady(t, e, 1)
	p := e.pools[0]
	p.mu.Lock()
	first := p.ready[0].sb.ID()
	p.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		id := ""
		if len(p.ready) > 0 {
			id = p.ready[0].sb.ID()
		}
		p.mu.Unlock()
		if id != "" && id != first {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("the pool still holds sandbox %s (or none) 30s after it was created with a maximum age of 2s", first)
}

// TestMemoryBudget checks that the engine counts its sandboxes' memory,
// pooled and live, and refuses a run that would take it past the budget.
func TestMemoryBudget(t *testing.T) {
	drivers := realDrivers(t)
	mem := sandbox.DefaultLimits().Memory
	// Room for the pool's one sandbox and one run.
	e, _ := pooledEngine(t, drivers, "runc", 1, WithMemoryBudget(2*mem))
	waitReady(t, e, 1)
	hold := Request{Runtime: "shell", Code: []byte("sleep 3")}
	if err := e.Room(hold); err != nil {
		t.Fatalf("Room with one sandbox's memory left: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := e.Run(context.Background(), hold)
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for e.running.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	if err := e.Room(hold); !errdefs.IsResourceExhausted(err) {
		t.Errorf("Room with the budget taken: got %v, want ErrResourceExhausted", err)
	}
	if _, err := e.Run(context.Background(), hold); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "memory_budget") {
		t.Errorf("Run with the budget taken: got %v, want ErrResourceExhausted naming memory_budget", err)
	}
	// The pool's sandbox is counted already: a run it serves has room.
	if err := e.Room(Request{Runtime: "python", Code: []byte("print(1)")}); err != nil {
		t.Errorf("Room for a run the pool serves: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := e.Room(hold); err != nil {
		t.Errorf("Room after the run ended: %v", err)
	}
}

// TestPoolRefillsAfterTheRun checks that a pool replaces a sandbox once
// the run that took it has ended, not while it runs (where creating the
// replacement would take CPU from the run), and then does.
func TestPoolRefillsAfterTheRun(t *testing.T) {
	drivers := realDrivers(t)
	for _, driver := range []string{"runc", "gvisor"} {
		t.Run(driver, func(t *testing.T) {
			e, counts := pooledEngine(t, drivers, driver, 1)
			waitReady(t, e, 1)
			// A pool sandbox is ready once created, its interpreter still
			// importing numpy and pandas (about a second under gVisor),
			// which a run that takes it waits for: let it settle, so that
			// the run lasts what its code does.
			time.Sleep(3 * time.Second)
			refills := func() int {
				counts.mu.Lock()
				defer counts.mu.Unlock()
				return counts.refill
			}
			before := refills()
			// The run lasts half of refillDelay: its sandbox's
			// replacement waits for its end.
			code := fmt.Sprintf("import time\ntime.sleep(%g)\nprint('done')", (refillDelay / 2).Seconds())
			done := make(chan struct{})
			during := make(chan int, 1)
			go func() {
				most := 0
				for {
					select {
					case <-done:
						during <- most
						return
					case <-time.After(5 * time.Millisecond):
						most = max(most, refills()-before)
					}
				}
			}()
			res, err := e.Run(context.Background(), Request{Runtime: "python", Code: []byte(code)})
			close(done)
			if err != nil {
				t.Fatal(err)
			}
			if hits, _ := counts.get(); res.Stdout != "done\n" || hits != 1 {
				t.Fatalf("got stdout %q and %d hits, want a pooled run that printed done", res.Stdout, hits)
			}
			if n := <-during; n != 0 {
				t.Errorf("got %d sandboxes created while the run went on, want none", n)
			}
			waitReady(t, e, 1)
			if n := refills() - before; n != 1 {
				t.Errorf("got %d sandboxes created after the run, want 1", n)
			}
		})
	}
}

// TestPoolCPUCap runs four processes busy for 4 s in a gVisor pool
// sandbox (its CPU limit is 1) and checks the run's cpu_ms against the
// cap and against the sandbox cgroup's count, read from the host from
// just before the run to the busy processes' end. Inside gVisor the
// Sentry counts a throttled task as running, so a count taken there
// exceeds the cap; a pooled run's must be the host's, from its code's
// delivery (not the interpreter's start, long before).
func TestPoolCPUCap(t *testing.T) {
	const (
		busy  = "import os, time\npids = []\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n        end = time.monotonic() + 4\n        while time.monotonic() < end:\n            pass\n        os._exit(0)\n    pids.append(pid)\nfor pid in pids:\n    os.waitpid(pid, 0)\nprint('done', flush=True)\n"
		slack = 1.05 // CFS hands the quota out in slices
		// agree is how far cpu_ms may be from the host's count: the
		// count ends at "done", before the interpreter's exit.
		agree      = 0.10
		agreeFloor = 250 * time.Millisecond
	)
	drivers := realDrivers(t)
	e, counts := pooledEngine(t, drivers, "gvisor", 1)
	waitReady(t, e, 1)
	p := e.pools[0]
	p.mu.Lock()
	id := p.ready[0].sb.ID()
	p.mu.Unlock()
	_, err := os.Stat(filepath.Join(sandboxkit.CgroupRoot, "cgroup.controllers"))
	cg := sandboxkit.Cgroup{V2: err == nil, Path: ocidriver.CgroupParent + "/" + id}
	before := cg.CPUUsage()
	if before == 0 {
		t.Fatalf("the pool sandbox's cgroup %s counts no CPU time", cg.CPUDir())
	}
	var host time.Duration
	var out []byte
	res, err := e.Run(context.Background(), Request{
		Runtime: "python", Code: []byte(busy),
		OnOutput: func(s sandbox.Stream, b []byte) {
			if out = append(out, b...); s == sandbox.Stdout && strings.Contains(string(out), "done\n") && host == 0 {
				host = cg.CPUUsage() - before
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if hits, _ := counts.get(); hits != 1 {
		t.Fatalf("got %d pool hits, want 1: the run was not pooled", hits)
	}
	if res.Status != sandbox.StatusSucceeded || host <= 0 {
		t.Fatalf("got %s with output %q and a host count of %s, want succeeded with \"done\"", res.Status, out, host)
	}
	cpu, dur := time.Duration(res.CPUMS)*time.Millisecond, time.Duration(res.DurationMS)*time.Millisecond
	t.Logf("cpu_ms %d, duration_ms %d, the host counted %s", res.CPUMS, res.DurationMS, host)
	if limit := time.Duration(float64(dur) * slack); cpu > limit {
		t.Errorf("got cpu_ms %d over %d ms (%.3f CPUs), want at most %s", res.CPUMS, res.DurationMS, float64(cpu)/float64(dur), limit)
	}
	if d := max(cpu-host, host-cpu); d > max(time.Duration(float64(host)*agree), agreeFloor) {
		t.Errorf("got cpu_ms %d, want the %s the host counted", res.CPUMS, host)
	}
}
