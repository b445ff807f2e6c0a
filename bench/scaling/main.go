// Command scaling measures how sessions scale with their number on one
// host: for each size (1, 8 and 32 by default) and on runc and gVisor, it
// opens that many python sessions at once through the whole capability
// layer over HTTP on loopback (approval none, SQLite, the sessions'
// sandboxes created cold: no warm pool), imports pandas in them, untimed
// and -import-concurrency at a time (on 2 cores, 32 gVisor sessions
// importing at once run past the 30 s cell timeout), runs cells in all
// of them at once for a bounded number of rounds (`x = x + 1` and a
// small pandas cell), and reads the memory of their sandboxes' cgroups,
// of their host processes outside them (shims, runtime) and of the
// daemon. The sizes run one after the other, each on every driver in
// turn, and each ends its sessions (and sees their sandboxes gone)
// before the next starts. A size that fails, or runs past -size-timeout,
// is a row of the table with its reason; its sessions are ended all the
// same.
//
// Then it measures what a paused session takes on disk: a gVisor sandbox
// with an idle python kernel, and one that imported pandas, saved with
// the driver's Snapshotter (runsc checkpoint), the checkpoint directory's
// allocated and apparent size, and the sessions that fit a GiB; each
// checkpoint is restored and its kernel's state checked. The saved
// sandboxes have no /workspace by default (-snapshot-workspace): the
// driver's Restore does not mount one again yet. runc cannot save a
// sandbox on this host (its driver says why).
//
// It needs root, runc, runsc and the images (`make setup`); it builds the
// stockade binary for the shims of the sessions' sandboxes, installs the
// guest in a temporary directory, keeps its state in a temporary
// directory under -state-dir and its SQLite stores and checkpoints in
// another, listens on 127.0.0.1 only and stops by itself.
//
//	CGO_ENABLED=0 go run ./bench/scaling [-sizes 1,8,32] [-rounds 10] [-snapshots 3]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/bench/internal/daemon"
	"github.com/stockade-sh/stockade/bench/internal/python"
	"github.com/stockade-sh/stockade/bench/internal/table"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/sandbox"
)

func main() {
	sizes := flag.String("sizes", "1,8,32", "numbers of concurrent sessions, comma-separated")
	rounds := flag.Int("rounds", 10, "rounds of cells: each runs `x = x + 1` in every session at once, then the pandas cell")
	timeout := flag.Duration("size-timeout", 5*time.Minute, "bound of one size on one driver (opening, cells, memory); past it the size fails and its sessions are ended")
	snapWS := flag.String("snapshot-workspace", "0", "size of the /workspace of the saved sandboxes (0: none, the kernel in /tmp); the driver's Restore does not mount a /workspace again yet, so a restore of one with a /workspace fails")
	imports := flag.Int("import-concurrency", runtime.NumCPU(), "sessions importing pandas at once before the rounds (untimed; 0: all at once)")
	snaps := flag.Int("snapshots", 3, "checkpoints of each kernel state with gVisor's Snapshotter (0: none)")
	dataDir := flag.String("data-dir", config.Default().DataDir, "image store")
	stateDir := flag.String("state-dir", "/run", "parent of the temporary state directory")
	flag.Parse()
	ns, err := parseSizes(*sizes)
	if err == nil && *rounds < 1 {
		err = fmt.Errorf("-rounds must be at least 1")
	}
	var ws int64
	if err == nil {
		ws, err = sandbox.ParseSize(*snapWS)
	}
	if err == nil {
		err = run(ns, *rounds, *timeout, *imports, *snaps, ws, *dataDir, *stateDir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/scaling:", err)
		os.Exit(1)
	}
}

func parseSizes(s string) ([]int, error) {
	var ns []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-sizes: %q is not a positive number", f)
		}
		ns = append(ns, n)
	}
	return ns, nil
}

// The cells of a round: counter prints the session's count of rounds
// (each session's own, which checks that no cell reached another
// session's kernel), and the pandas cell uses pandas imported by setup.
const (
	setup   = python.PandasImport + "\nx = 0"
	counter = "x = x + 1\nprint(x)"
)

// tier is one driver with its daemon.
type tier struct {
	d        sandbox.Driver
	c        daemon.Client
	stateDir string // the driver's own
}

// bounds is what the benchmark's daemon is configured to allow, beyond
// the defaults, so that the largest size fits: the sessions of one
// workspace, and the sandboxes' memory budget (counted by their memory
// limits). They are printed with the tables.
type bounds struct {
	sessions int
	budget   int64
}

// serve starts a daemon on d alone (daemon.ServeWith) with no warm
// pool, a session quota and a memory budget of b, its SQLite store in
// dir, and the credits given. Sessions still open when it stops stay
// running (as a daemon leaves them for its restart), so the caller ends
// them first.
func serve(ctx context.Context, d sandbox.Driver, images engine.Images, dir string, b bounds, credits int64) (daemon.Client, func(), error) {
	eng, err := engine.New(map[string]sandbox.Driver{d.Name(): d}, d.Name(), images, sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
		engine.WithMemoryBudget(b.budget))
	if err != nil {
		return daemon.Client{}, nil, err
	}
	return daemon.ServeWith(ctx, eng, filepath.Join(dir, d.Name()+".db"), "bench-scaling-"+d.Name(), credits, daemon.Options{MaxSessions: b.sessions})
}

func run(sizes []int, rounds int, timeout time.Duration, imports, snaps int, snapWorkspace int64, dataDir, stateDir string) (err error) {
	ctx := context.Background()
	images := image.Open(dataDir)
	img, err := images.Resolve("python")
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "stockade-bench-scaling-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	ds, remove, err := daemon.NewDrivers(tmp, stateDir)
	if err != nil {
		return err
	}
	defer remove()
	rc, gv := ds.Runc, ds.Gvisor
	state := ds.State
	// At the end the daemons stop; whatever a failed run left, the
	// drivers' own clean-up destroys (every sandbox in their state
	// directories is the benchmark's); and the runtimes must list no
	// container.
	var stops []func()
	defer func() {
		for _, stop := range stops {
			stop()
		}
		reap(rc, gv.Driver)
		clean := true
		for _, rt := range []struct{ binary, dir string }{{"runc", filepath.Join(state, "runc")}, {"runsc", filepath.Join(state, "gvisor")}} {
			if bundles, _ := os.ReadDir(filepath.Join(rt.dir, "bundles")); len(bundles) > 0 {
				clean, err = false, errors.Join(err, fmt.Errorf("after the clean-up, %d bundles are left in %s", len(bundles), rt.dir))
			}
			root := filepath.Join(rt.dir, "state")
			if _, serr := os.Stat(root); serr != nil {
				continue
			}
			left, lerr := leftContainers(rt.binary, root)
			if lerr == nil && left != "" {
				lerr = fmt.Errorf("after the clean-up, %s --root %s list still lists %s", rt.binary, root, strings.Join(strings.Fields(left), " "))
			}
			clean, err = clean && lerr == nil, errors.Join(err, lerr)
		}
		if clean {
			fmt.Println("\nAfter the run, `runc --root STATE list` and `runsc --root STATE list` list no container and no bundle is left.")
		}
	}()

	largest := slices.Max(sizes)
	limits := sandbox.DefaultLimits()
	b := bounds{sessions: largest, budget: int64(largest) * limits.Memory}
	credits := int64(100)
	for _, n := range sizes {
		credits += int64(2 * n * (1 + 2*rounds))
	}
	v2 := cgroupV2()
	load := loadAvg()
	rssBefore := selfRSS()
	var tiers []*tier
	for _, d := range []sandbox.Driver{rc, gv} {
		c, stop, err := serve(ctx, d, images, tmp, b, credits)
		if err != nil {
			return fmt.Errorf("%s: %w", d.Name(), err)
		}
		stops = append(stops, stop)
		tiers = append(tiers, &tier{d: d, c: c, stateDir: filepath.Join(state, d.Name())})
	}

	p := plan{rounds: rounds, timeout: timeout, imports: imports, bin: ds.Shim[0], state: state, v2: v2, tiers: tiers}
	var results []*result
	for _, n := range sizes {
		for _, t := range tiers {
			r := t.measure(ctx, n, p)
			if r.err != nil {
				fmt.Fprintf(os.Stderr, "bench/scaling: %s, %d sessions: %v\n", t.d.Name(), n, r.err)
			}
			results = append(results, r)
		}
	}
	importing := "all at once"
	if imports > 0 {
		importing = fmt.Sprintf("%d at a time", imports)
	}
	fmt.Printf("python sessions over HTTP, approval none, cold sandboxes (no warm pool), opened all at once, then `%s` in %s (untimed); %d rounds, each `%s` in every session at once, then `%s`; load average %s at the start, %s at the end\n\n",
		python.PandasImport, importing, rounds, strings.ReplaceAll(counter, "\n", "; "), python.PandasCell, load, loadAvg())
	printLatency(results)
	fmt.Println()
	printMemory(results, v2)
	fmt.Printf("\nThe daemon was configured to allow the largest size: sessions.max_per_workspace %d (default %d), memory_budget %s = %d x the sandbox memory limit %s (default 3/4 of the host's memory, %s here). Daemon RSS is this process's VmRSS: both drivers' daemons (engine, capability layer, SQLite, HTTP API) and the benchmark's clients; %s before any daemon started.\n",
		b.sessions, config.Default().Sessions.MaxPerWorkspace, sandbox.FormatSize(b.budget), largest, sandbox.FormatSize(limits.Memory),
		gib(config.Default().MemoryBudget), mib(rssBefore))
	var failed []string
	for _, r := range results {
		if r.err != nil {
			failed = append(failed, fmt.Sprintf("- %s, %d sessions: %v", r.driver, r.n, r.err))
		}
	}
	if len(failed) > 0 {
		fmt.Printf("\nFailed sizes:\n%s\n", strings.Join(failed, "\n"))
	}

	if snaps > 0 {
		where := "no /workspace (the kernel in /tmp)"
		if snapWorkspace > 0 {
			where = "a /workspace of " + sandbox.FormatSize(snapWorkspace)
		}
		fmt.Printf("\npaused sessions on disk: gVisor's Snapshotter (runsc checkpoint) of a detached sandbox with %s and an idle python kernel, %d checkpoints of each state, medians; each restored and its kernel's state checked\n\n",
			where, snaps)
		snapDir := filepath.Join(tmp, "checkpoints")
		if err := os.Mkdir(snapDir, 0o700); err != nil {
			return err
		}
		res, err := snapshots(ctx, gv, img, snapDir, snapWorkspace, snaps, v2)
		if err != nil {
			return fmt.Errorf("gvisor snapshots: %w", err)
		}
		printSnapshots(res, v2)
		fmt.Printf("\nrunc: no pause on this host: %s (Capabilities.Lacks of the runc driver).\n", rc.Capabilities().Lacks["Snapshots"])
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d sizes failed", len(failed), len(results))
	}
	return nil
}

// result is what one size measured on one driver.
type result struct {
	driver string
	n      int
	// open holds each session's opening; opened is how long opening them
	// all took, imported how long importing pandas in all of them took.
	open, counter, pandas table.Variant
	opened, imported      time.Duration
	mem                   []cgroupMemory
	host                  hostMemory
	daemon                int64 // this process's RSS
	err                   error
}

// plan is what every size runs and where it looks.
type plan struct {
	rounds  int
	timeout time.Duration // of a size on a driver
	imports int           // sessions importing pandas at once; 0: all
	// bin is the shims' executable, state the benchmark's state
	// directory, v2 the cgroup hierarchy's version.
	bin, state string
	v2         bool
	tiers      []*tier
}

// measure opens n sessions on t at once, imports pandas in p.imports of
// them at a time, runs p.rounds of cells in all of them at once, reads
// the memory, and ends them; within p.timeout. It then waits until no
// sandbox of any tier is left, so that the next size starts on a clean
// host.
func (t *tier) measure(ctx context.Context, n int, p plan) *result {
	r := &result{driver: t.d.Name(), n: n}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	ids := make([]string, n)
	defer func() {
		// Ending must happen even after the timeout; it is bounded itself.
		end, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		errEnd := each(n, 0, nil, func(i int) error {
			if ids[i] == "" {
				return nil
			}
			return t.c.WithContext(end).EndSession(ids[i])
		})
		if errEnd != nil {
			errEnd = fmt.Errorf("ending the sessions: %w", errEnd)
		} else if errEnd = waitGone(end, p.tiers); errEnd != nil {
			errEnd = fmt.Errorf("after ending the sessions: %w", errEnd)
		}
		r.err = errors.Join(r.err, errEnd)
	}()
	c := t.c.WithContext(ctx)
	start := time.Now()
	if r.err = each(n, 0, &r.open, func(i int) (err error) {
		ids[i], err = c.Session()
		return err
	}); r.err != nil {
		r.err = fmt.Errorf("opening: %w", r.err)
		return r
	}
	r.opened = time.Since(start)
	start = time.Now()
	if r.err = each(n, p.imports, nil, func(i int) error { return c.Cell(ids[i], setup, "") }); r.err != nil {
		r.err = fmt.Errorf("importing pandas: %w", r.err)
		return r
	}
	r.imported = time.Since(start)
	for round := 1; round <= p.rounds; round++ {
		want := fmt.Sprintf("%d\n", round)
		if r.err = each(n, 0, &r.counter, func(i int) error { return c.Cell(ids[i], counter, want) }); r.err != nil {
			r.err = fmt.Errorf("round %d: %w", round, r.err)
			return r
		}
		if r.err = each(n, 0, &r.pandas, func(i int) error { return c.Cell(ids[i], python.PandasCell, python.PandasOut) }); r.err != nil {
			r.err = fmt.Errorf("round %d, pandas: %w", round, r.err)
			return r
		}
	}
	if r.mem, r.err = sandboxMemory(t.stateDir, p.v2); r.err == nil && len(r.mem) != n {
		r.err = fmt.Errorf("found %d sandboxes of %s, want %d", len(r.mem), t.d.Name(), n)
	}
	if r.err == nil {
		r.host, r.err = readHostMemory(p.bin, p.state)
	}
	if r.err == nil && r.host.shims != n {
		r.err = fmt.Errorf("found %d shims, want %d", r.host.shims, n)
	}
	r.daemon = selfRSS()
	return r
}

// each runs f(0) ... f(n-1), limit at a time (0: all at once), and waits
// for them all; each call's duration is added to v's samples, unless v
// is nil. The error says how many failed and the first one's error.
func each(n, limit int, v *table.Variant, f func(i int) error) error {
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed int
		first  error
	)
	if limit <= 0 {
		limit = n
	}
	slots := make(chan struct{}, limit)
	for i := range n {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			start := time.Now()
			err := f(i)
			d := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				failed++
				if first == nil {
					first = err
				}
			case v != nil:
				v.Samples = append(v.Samples, d)
			}
		})
	}
	wg.Wait()
	if failed > 0 {
		return fmt.Errorf("%d of %d failed, the first: %w", failed, n, first)
	}
	return nil
}

// waitGone waits until no tier's state directory holds a sandbox's
// bundle (a session's sandbox may be destroyed after its end answered).
func waitGone(ctx context.Context, tiers []*tier) error {
	for {
		left := 0
		for _, t := range tiers {
			bundles, _ := os.ReadDir(filepath.Join(t.stateDir, "bundles"))
			left += len(bundles)
		}
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d sandboxes still there: %w", left, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// reap destroys every sandbox left in the drivers' state directories
// and says so (only a failed run leaves any), then checks with each
// runtime's own list (`runc --root STATE list`) that no container is
// left.
func reap(ds ...*ocidriver.Driver) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, d := range ds {
		ids, err := d.Reap(ctx, nil)
		if len(ids) > 0 || err != nil {
			fmt.Fprintf(os.Stderr, "bench/scaling: destroyed %d sandboxes left behind (%v): %s\n", len(ids), err, strings.Join(ids, " "))
		}
	}
}

// leftContainers lists the containers the runtime binary still knows
// in its root directory root.
func leftContainers(binary, root string) (string, error) {
	out, err := exec.Command(binary, "--root", root, "list", "--quiet").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s --root %s list: %v: %s", binary, root, err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// printLatency prints opening and cell latency by driver and size, with
// each size's cell p50 against the smallest size's on the same driver.
func printLatency(results []*result) {
	smallest := slices.MinFunc(results, func(a, b *result) int { return a.n - b.n }).n
	vs := fmt.Sprintf("p50 vs %d", smallest)
	t := table.New("driver", "sessions", "opening p50", "opening p95", "all open after", "pandas imported in all after",
		"`x = x + 1` p50", "p95", vs, "pandas cell p50", "p95", vs).Labels(2)
	// A driver whose smallest size failed has no ratios.
	base := map[string]*result{}
	for _, r := range results {
		if r.n == smallest && r.err == nil {
			base[r.driver] = r
		}
	}
	ratio := func(v func(*result) time.Duration, r *result) string {
		if b := base[r.driver]; b != nil {
			return table.Ratio(v(r), v(b))
		}
		return ""
	}
	counterP50 := func(r *result) time.Duration { return r.counter.Pct(50) }
	pandasP50 := func(r *result) time.Duration { return r.pandas.Pct(50) }
	for _, r := range results {
		if r.err != nil {
			t.Row(r.driver, strconv.Itoa(r.n), "FAILED: "+short(r.err))
			continue
		}
		t.Row(r.driver, strconv.Itoa(r.n), table.MS(r.open.Pct(50)), table.MS(r.open.Pct(95)), table.MS(r.opened), table.MS(r.imported),
			table.MS(r.counter.Pct(50)), table.MS(r.counter.Pct(95)), ratio(counterP50, r),
			table.MS(r.pandas.Pct(50)), table.MS(r.pandas.Pct(95)), ratio(pandasP50, r))
	}
	t.Print(os.Stdout)
}

// printMemory prints the memory of each size's sessions, once their cells
// have run and they are idle.
func printMemory(results []*result, v2 bool) {
	usage, anon := usageFiles(v2)
	fmt.Printf("memory with the sessions idle after their cells: the sandboxes' memory cgroups (%s; anonymous: memory.stat %s), summed and per session; the host processes of the sessions outside those cgroups (shims, and runtime processes beside the sandbox), their summed PSS (smaps_rollup); the daemon's RSS\n\n", usage, anon)
	t := table.New("driver", "sessions", "sandboxes' cgroups", "per session", "anonymous per session", "host processes (shims + runtime)", "their PSS", "per session", "daemon RSS").Labels(2)
	for _, r := range results {
		if r.err != nil {
			t.Row(r.driver, strconv.Itoa(r.n), "FAILED: "+short(r.err))
			continue
		}
		var u, a int64
		for _, m := range r.mem {
			u, a = u+m.usage, a+m.anon
		}
		k := int64(len(r.mem))
		t.Row(r.driver, strconv.Itoa(r.n), mib(u), mib(u/k), mib(a/k), fmt.Sprintf("%d + %d", r.host.shims, r.host.runtimes),
			mib(r.host.pss), mib(r.host.pss/k), mib(r.daemon))
	}
	t.Print(os.Stdout)
}

// printSnapshots prints the checkpoints' sizes on disk and the paused
// sessions a GiB holds.
func printSnapshots(res []*snapshotResult, v2 bool) {
	usage, _ := usageFiles(v2)
	t := table.New("kernel state", "memory cgroup before ("+usage+")", "checkpoint allocated (du)", "apparent size", "paused sessions per GiB", "checkpoint p50", "restore + a cell p50")
	for _, r := range res {
		alloc := median(r.allocated)
		t.Row(r.kind.name, mib(median(r.memory)), mib(alloc), mib(median(r.apparent)), strconv.FormatInt((1<<30)/max(alloc, 1), 10),
			table.MS(r.checkpoint.Pct(50)), table.MS(r.restored.Pct(50)))
	}
	t.Print(os.Stdout)
}

func median(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// short is the first line of err, at most 100 characters, for a table's
// cell; the whole error is printed below the tables.
func short(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	if len(s) > 100 {
		s = s[:97] + "..."
	}
	return s
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
