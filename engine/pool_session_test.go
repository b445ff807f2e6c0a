package engine

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// poolWorkspace is the /workspace of the sessions of these tests, and
// poolOwner the owner label of their sandboxes.
const (
	poolWorkspace = 32 << 20
	poolOwner     = "pool-session-test"
)

// sessionPoolEngine returns an engine over drivers, with the default tool
// on driver and a python session pool of n on it when n > 0 (no one-shot
// pool).
func sessionPoolEngine(t *testing.T, drivers map[string]sandbox.Driver, driver string, n int) (*Engine, *poolCounts) {
	t.Helper()
	e, err := New(drivers, driver, image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
		// gVisor's session pools refill from a checkpoint (poolsnap.go):
		// these tests see restored sandboxes there, cold ones on runc.
		WithPools(PoolOptions{Pools: []PoolSpec{{Runtime: "python", Sessions: n}}, SessionWorkspace: poolWorkspace,
			CheckpointDir: t.TempDir()}))
	if err != nil {
		t.Fatal(err)
	}
	counts := &poolCounts{}
	e.SetPoolObserver(counts)
	stop, err := e.StartPools(context.Background(), map[string]string{LabelOwner: poolOwner})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return e, counts
}

// openPython opens a python session of e on driver with a /workspace of
// size, closed at the end of t.
func openPython(t *testing.T, e *Engine, driver string, size int64, limits sandbox.Limits) *Session {
	t.Helper()
	s, err := e.OpenSession(t.Context(), SessionSpec{Runtime: "python", Driver: driver, Workspace: size, Limits: limits,
		Labels: map[string]string{LabelOwner: poolOwner, LabelSession: "ses_" + strings.ReplaceAll(t.Name(), "/", "_")}})
	if err != nil {
		t.Fatalf("OpenSession: %v", err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// pooled opens a python session of e, which must come from its pool (a hit).
func pooled(t *testing.T, e *Engine, counts *poolCounts, driver string) *Session {
	t.Helper()
	waitReady(t, e, 1)
	hits, _ := counts.get()
	s := openPython(t, e, driver, poolWorkspace, sandbox.Limits{})
	if h, _ := counts.get(); h != hits+1 {
		t.Fatalf("got %d pool hits, want %d: the session was not served by the pool", h, hits+1)
	}
	return s
}

// pyCell runs a cell, which must run (it may raise), and returns its
// result without its duration.
func pyCell(t *testing.T, s *Session, code string) *CellResult {
	t.Helper()
	r, err := s.Cell(t.Context(), CellRequest{Code: code, Timeout: time.Minute})
	if err != nil {
		t.Fatalf("Cell(%q): %v", code, err)
	}
	r.DurationMS = 0
	return r
}

// TestPoolSessionAsColdSession runs a table of cells in a session from a
// session pool and in a cold one, on runc and gVisor, and compares what
// the caller sees: the kernel's state at the start (its namespace, argv,
// environment, working directory) is a fresh kernel's, numpy and pandas
// imported aside, cells, files, DataFrames and figures work alike, and a
// kernel restarted after it died is a cold one.
func TestPoolSessionAsColdSession(t *testing.T) {
	drivers, _ := shimDrivers(t, nil)
	cells := []struct{ name, code string }{
		{"fresh namespace", "import os, sys\n(sorted(dir()), sys.argv, sys.orig_argv, os.getcwd(), sorted(os.environ.items()), sys.stdin.read())"},
		{"preimported modules", "import sys\nsorted(m for m in ('numpy', 'pandas') if m in sys.modules)"},
		{"the modules once imported", "import numpy, pandas, sys\nsorted(sys.modules)"},
		{"namespace after an import", "sorted(dir())"},
		{"streams", "import sys\nprint('out')\nprint('err', file=sys.stderr)"},
		{"exception", "def f():\n    raise ValueError('boom')\n\nf()"},
		{"a file of the workspace", "open('/workspace/in.csv').read()"},
		{"DataFrame", "import pandas as pd\ndf = pd.read_csv('in.csv')\ndf.describe()"},
		{"state kept", "int(df.a.sum())"},
		{"figure", "import matplotlib.pyplot as plt\nfig = plt.figure(figsize=(2, 1), dpi=50)\nplt.plot([1, 2, 3])\nplt.show()"},
		{"write a file", "df.to_csv('out.csv', index=False)"},
		{"tmp and workspace", "import os\n(sorted(os.listdir('/tmp')), sorted(os.listdir('/workspace')))"},
		{"the kernel dies", "import os\nos._exit(3)"},
		{"a restarted kernel is a cold one", "import sys\n('numpy' in sys.modules, sorted(dir()))"},
	}
	for _, driver := range []string{"runc", "gvisor"} {
		t.Run(driver, func(t *testing.T) {
			cold, _ := sessionPoolEngine(t, drivers, driver, 0)
			warm, counts := sessionPoolEngine(t, drivers, driver, 1)
			c := openPython(t, cold, driver, poolWorkspace, sandbox.Limits{})
			w := pooled(t, warm, counts, driver)
			for _, s := range []*Session{c, w} {
				if _, _, err := s.WriteFile(t.Context(), "in.csv", strings.NewReader("a,b\n1,x\n2,y\n3,z\n"), 1<<20); err != nil {
					t.Fatal(err)
				}
			}
			for _, cl := range cells {
				t.Run(cl.name, func(t *testing.T) {
					want, got := pyCell(t, c, cl.code), pyCell(t, w, cl.code)
					if cl.name == "preimported modules" {
						if v := valueOf(got); v != "['numpy', 'pandas']" {
							t.Errorf("got %s preimported in the pooled session, want numpy and pandas", v)
						}
						if v := valueOf(want); v != "[]" {
							t.Errorf("got %s imported in a cold session, want none", v)
						}
						return
					}
					if want.Status != sandbox.StatusSucceeded && cl.name != "exception" && cl.name != "the kernel dies" {
						t.Fatalf("the cold session's cell: got %+v", want)
					}
					if !reflect.DeepEqual(got, want) {
						t.Errorf("the pooled session's cell differs from the cold one's:\n got %s\nwant %s", clipCell(got), clipCell(want))
					}
				})
			}
			out, _, err := w.ReadFile(t.Context(), "out.csv", 1<<20)
			if err != nil || string(out) != "a,b\n1,x\n2,y\n3,z\n" {
				t.Errorf("the pooled session's file: got %q, %v", out, err)
			}
		})
	}
}

// valueOf is a cell's value, the text of its last output.
func valueOf(r *CellResult) string {
	if len(r.Outputs) == 0 {
		return ""
	}
	return r.Outputs[len(r.Outputs)-1].Data
}

// clipCell shows a cell's result shortly, for a failure message.
func clipCell(r *CellResult) string {
	var b strings.Builder
	b.WriteString(string(r.Status) + " stdout=" + clip(r.Stdout) + " stderr=" + clip(r.Stderr))
	for _, o := range r.Outputs {
		b.WriteString(" " + o.MimeType + "=" + clip(o.Data))
	}
	if r.Error != nil {
		b.WriteString(" error=" + r.Error.Name + ": " + r.Error.Value)
	}
	return b.String()
}

func clip(s string) string {
	if len(s) > 600 {
		return s[:600] + "..."
	}
	return s
}

// TestPoolSessionNoBleed opens successive sessions from one session pool,
// on runc and gVisor: what the first one leaves (files in /tmp and
// /workspace, a process, environment, kernel globals, monkeypatched
// modules, an abstract socket) the next ones must not see, and an unbound
// pool sandbox holds no workspace data.
func TestPoolSessionNoBleed(t *testing.T) {
	drivers, _ := shimDrivers(t, nil)
	const leave = `import builtins, csv, os, socket, subprocess
os.makedirs('/tmp/left', exist_ok=True)
open('/tmp/left/secret', 'w').write('tenant A')
open('/workspace/secret.csv', 'w').write('tenant A')
os.environ['TENANT'] = 'A'
os.putenv('TENANT', 'A')
builtins.SECRET = 'tenant A'
csv.list_dialects = lambda: ['patched']
import numpy, pandas
numpy.sum = lambda *a, **k: 'patched'
pandas.SECRET = 'tenant A'
secret = 'tenant A'
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind('\0stockade-bleed')
s.listen()
subprocess.Popen(['/bin/sleep', '300'], start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print('left')
`
	const look = `import builtins, csv, numpy, os, socket, sys
print('tmp', sorted(os.listdir('/tmp')))
print('workspace', sorted(os.listdir('/workspace')))
print('env', 'TENANT' in os.environ)
print('builtins', hasattr(builtins, 'SECRET'))
print('patched', csv.list_dialects() == ['patched'], numpy.sum([1, 2]))
print('pandas', hasattr(sys.modules['pandas'], 'SECRET'))
print('globals', [n for n in dir() if not n.startswith('_')])
` + lookAround
	const clean = "tmp []\nworkspace []\nenv False\nbuiltins False\npatched False 3\npandas False\n" +
		"globals ['builtins', 'csv', 'numpy', 'os', 'socket', 'sys']\nprocs []\nsocket free\n"
	for _, driver := range []string{"runc", "gvisor"} {
		t.Run(driver, func(t *testing.T) {
			e, counts := sessionPoolEngine(t, drivers, driver, 1)
			waitReady(t, e, 1)
			// Before it is bound, a session pool sandbox holds nothing of
			// anyone's in /tmp and /workspace.
			p := e.pools[0]
			p.mu.Lock()
			w := p.ready[0]
			p.mu.Unlock()
			f := w.sb.(sandbox.Files)
			for _, dir := range []string{"/tmp", "/workspace"} {
				entries, _, err := f.ListDir(t.Context(), dir)
				if err != nil || len(entries) != 0 {
					t.Errorf("got %s of an unbound session pool sandbox %+v (%v), want it empty", dir, entries, err)
				}
			}
			a := pooled(t, e, counts, driver)
			if r := pyCell(t, a, leave); r.Stdout != "left\n" {
				t.Fatalf("first session: got %s; want it to leave its traces", clipCell(r))
			}
			// The first session stays open while the next ones look: the
			// pool's next sandbox is another one.
			for i := range 2 {
				b := pooled(t, e, counts, driver)
				if b.SandboxID() == a.SandboxID() {
					t.Fatalf("session %d got the sandbox %s of the first", i+2, a.SandboxID())
				}
				if r := pyCell(t, b, look); r.Stdout != clean {
					t.Errorf("session %d saw:\n%s\nerror: %+v\nwant:\n%s", i+2, r.Stdout, r.Error, clean)
				}
				if i == 0 {
					_ = a.Close(t.Context())
				}
			}
			if hits, misses := counts.get(); hits != 3 || misses != 0 {
				t.Errorf("got %d hits and %d misses, want 3 hits and no miss", hits, misses)
			}
		})
	}
}

// TestPoolSessionReattach re-attaches a session from a session pool as a
// restarted daemon does (new driver values over the same state): the
// session keeps its kernel's state and its files, and the pool's unbound
// sandbox, which no session names, is destroyed.
func TestPoolSessionReattach(t *testing.T) {
	for _, driver := range []string{"runc", "gvisor"} {
		t.Run(driver, func(t *testing.T) {
			drivers, states := shimDrivers(t, nil)
			e, counts := sessionPoolEngine(t, drivers, driver, 1)
			s := pooled(t, e, counts, driver)
			pyCell(t, s, "import pandas as pd\ndf = pd.DataFrame({'a': range(10)})")
			if _, _, err := s.WriteFile(t.Context(), "kept.txt", strings.NewReader("kept"), 1<<10); err != nil {
				t.Fatal(err)
			}
			waitReady(t, e, 1) // the refill, unbound
			e.pools[0].mu.Lock()
			unbound := e.pools[0].ready[0].sb
			e.pools[0].mu.Unlock()
			// A restarted daemon: drivers over the same state directories.
			again, _ := shimDrivers(t, states)
			restarted, err := New(again, driver, image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling())
			if err != nil {
				t.Fatal(err)
			}
			got, err := restarted.ReattachSessions(t.Context(), map[string]string{LabelOwner: poolOwner}, func(id string) (SessionSpec, bool) {
				return SessionSpec{Runtime: "python"}, id == s.SandboxID()
			})
			if err != nil || len(got) != 1 || got[0].SandboxID() != s.SandboxID() {
				t.Fatalf("ReattachSessions: got %d sessions, %v; want the pooled one, %s", len(got), err, s.SandboxID())
			}
			defer got[0].Close(context.Background())
			if r := pyCell(t, got[0], "int(df.a.sum())"); valueOf(r) != "45" {
				t.Errorf("after the re-attach: got %s, want the DataFrame's sum 45", clipCell(r))
			}
			if b, _, err := got[0].ReadFile(t.Context(), "kept.txt", 1<<10); err != nil || string(b) != "kept" {
				t.Errorf("the workspace after the re-attach: got %q, %v", b, err)
			}
			if _, _, err := unbound.(sandbox.Files).ListDir(t.Context(), "/tmp"); err == nil {
				t.Errorf("the pool's unbound sandbox %s still answers after the re-attach", unbound.ID())
			}
		})
	}
}

// TestPoolSessionFallsBack checks that sessions the pool cannot serve
// open cold (counted as misses) with what they asked for: another
// /workspace size, looser limits, another driver, and an empty pool.
// (A session cannot ask for network: CreateSession refuses it.)
func TestPoolSessionFallsBack(t *testing.T) {
	drivers, _ := shimDrivers(t, nil)
	e, counts := sessionPoolEngine(t, drivers, "runc", 1)
	waitReady(t, e, 1)
	const probe = "import os, sys\n('numpy' in sys.modules, os.statvfs('/workspace').f_blocks * os.statvfs('/workspace').f_frsize)"
	for _, tt := range []struct {
		name      string
		driver    string
		workspace int64
		limits    sandbox.Limits
	}{
		{"another workspace size", "runc", 16 << 20, sandbox.Limits{}},
		{"looser memory", "runc", poolWorkspace, sandbox.Limits{Memory: 1 << 30}},
		{"another driver", "gvisor", poolWorkspace, sandbox.Limits{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, misses := counts.get()
			s := openPython(t, e, tt.driver, tt.workspace, tt.limits)
			if got, want := valueOf(pyCell(t, s, probe)), "(False, "+itoa(tt.workspace)+")"; got != want {
				t.Errorf("got %s, want %s: a cold kernel and a /workspace of %d", got, want, tt.workspace)
			}
			if s.Driver != tt.driver || (tt.limits.Memory > 0 && s.Limits.Memory != tt.limits.Memory) {
				t.Errorf("got a session on %s with limits %+v, want %s and %+v", s.Driver, s.Limits, tt.driver, tt.limits)
			}
			if _, m := counts.get(); m != misses+1 {
				t.Errorf("got %d misses, want %d", m, misses+1)
			}
		})
	}
	// The pool's one sandbox serves one session; the next ones wait for
	// the refill when it is about to end (awaitRefill, within
	// sessionWaitBound) or open cold, and the pool grows on that demand:
	// whether a session is a hit or a miss is timing, so each must be a
	// hit with numpy imported or a miss with a cold kernel, and the first
	// a hit. (The subtests above hold that a session the pool cannot
	// serve misses.)
	t.Run("an empty pool", func(t *testing.T) {
		for i := range 5 {
			hits, misses := counts.get()
			s := openPython(t, e, "runc", poolWorkspace, sandbox.Limits{})
			h, m := counts.get()
			got, pooled := valueOf(pyCell(t, s, probe)), "(True, "+itoa(poolWorkspace)+")"
			switch {
			case h == hits+1 && m == misses && got == pooled:
			case m == misses+1 && h == hits && got == "(False, "+itoa(poolWorkspace)+")":
				if i == 0 {
					t.Fatalf("the first session missed the filled pool")
				}
				return
			default:
				t.Fatalf("session %d: got %d hits and %d misses after %d and %d, and %s; want a hit with numpy imported or a miss without", i, h, m, hits, misses, got)
			}
		}
		t.Logf("5 sessions opened one after the other all came from a pool of 1 and its refills")
	})
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// shimDrivers returns runc and gVisor drivers with a supervisor (for
// detached sandboxes) over the state directories states (by driver), new
// ones when states is nil, and the directories. Whatever they leave is
// reaped when t ends.
func shimDrivers(t testing.TB, states map[string]string) (map[string]sandbox.Driver, map[string]string) {
	t.Helper()
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	testenv.RequiresBinary(t, "runsc")
	if states == nil {
		states = map[string]string{"runc": t.TempDir(), "gvisor": t.TempDir()}
	}
	guest, shim := testenv.Guest(t), testenv.Shim(t)
	rc, err := runc.New(runc.Config{StateDir: states["runc"], GuestPath: guest, Shim: shim})
	if err != nil {
		t.Fatal(err)
	}
	gv, err := gvisor.New(gvisor.Config{StateDir: states["gvisor"], GuestPath: guest, Shim: shim})
	if err != nil {
		t.Fatal(err)
	}
	drivers := map[string]sandbox.Driver{"runc": rc, "gvisor": gv}
	t.Cleanup(func() {
		for _, d := range drivers {
			_, _ = d.(sandbox.Reaper).Reap(context.Background(), nil)
		}
	})
	return drivers, states
}
