// Command steady measures the warm path as a user meets it (issue 32): a
// pooled one-shot python print(1) over HTTP sent at a steady rate, so that
// each run's pool refill shares the machine with the runs that follow it,
// on runc and gVisor, beside the bare interpreter sent at the same rate;
// then what a run costs in CPU and what a pool sandbox costs while it
// waits.
//
//   - For each rate (-rates: requests per second, "max" for one request
//     after the other as fast as they answer), each variant gets -n
//     requests in turn, the variants' order rotated from one rate to the
//     next, each tier's pool full and settled (-settle) before its turn
//     (the wait is not timed). A request is sent at its time whether or
//     not the one before has answered (an open loop); its latency is its
//     own round trip. The table gives p50 and p95 and the p50 against the
//     bare interpreter's at the same rate.
//   - CPU per run: the CPU time of every sandbox of the tier (its cgroups'
//     cpuacct usage: the runtime's sandbox process and gofer, the guest,
//     the interpreter; not the daemon nor the runtime's CLI), from the
//     first request of a turn until the pool is full and settled again,
//     divided by the turn's requests: a run and its refill.
//   - Idle CPU: each tier's pool sandboxes, full and settled, read over
//     -idle before the first turn, as a share of one core per sandbox, for
//     the one-shot pool's and for the session pool's (-sessions, whose
//     sandboxes only wait), as the default daemon keeps both.
//
// A tier is runc or gvisor; gvisor=RUNSC is gVisor with another runsc
// build, so that two builds can be measured side by side in one run;
// gvisor-unwarmed is gVisor whose restored refills are not warmed
// (engine.PoolOptions.Unwarmed), to compare.
// Everything is bounded: -n requests per variant and rate, and a turn
// that takes longer than -turn-timeout fails the run. Run it from the
// module's root (it builds the shim).
//
// gVisor's pools refill from their checkpoints as the daemon's do
// (engine/poolsnap.go, poolsnap_exec.go); -restore=false refills them
// cold, to compare.
//
//	go run ./bench/steady [-n 20] [-rates 0.5,1,2,max] [-pool 2] [-sessions 1] [-idle 30s] [-tiers runc,gvisor] [-restore=false]
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/bench/internal/daemon"
	"github.com/stockade-sh/stockade/bench/internal/python"
	"github.com/stockade-sh/stockade/bench/internal/table"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/oci"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/sandbox"
)

func main() {
	n := flag.Int("n", 20, "requests of each variant at each rate")
	rates := flag.String("rates", "0.5,1,2,max", "request rates per second, comma-separated; max: each request as soon as the one before answered")
	size := flag.Int("pool", 2, "size of each tier's one-shot python pool (the default daemon's is 2)")
	sessions := flag.Int("sessions", 1, "size of each tier's python session pool, whose sandboxes only wait (the default daemon's is 1)")
	settle := flag.Duration("settle", 3*time.Second, "how long a pool's newest sandbox has had before a turn starts and before idle CPU is read")
	idle := flag.Duration("idle", 30*time.Second, "how long the idle CPU of the pool sandboxes is read")
	turnTimeout := flag.Duration("turn-timeout", 5*time.Minute, "bound of one variant's turn at one rate")
	tiers := flag.String("tiers", "runc,gvisor", "tiers, comma-separated: runc, gvisor, gvisor=RUNSC for gVisor with that runsc, gvisor-unwarmed for gVisor whose restored refills are not warmed")
	dataDir := flag.String("data-dir", config.Default().DataDir, "image store")
	runsc := flag.String("runsc", config.Default().RunscPath, "runsc executable of the gvisor tier (a tier gvisor=RUNSC has its own)")
	restore := flag.Bool("restore", true, "refill gVisor's pools from their checkpoints, as the daemon does (false: every refill cold)")
	flag.Parse()
	rs, err := parseRates(*rates)
	if err == nil {
		err = run(context.Background(), opts{n: *n, rates: rs, size: *size, sessions: *sessions, settle: *settle, idle: *idle,
			turnTimeout: *turnTimeout, tiers: strings.Split(*tiers, ","), dataDir: *dataDir, runsc: *runsc, restore: *restore})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "steady:", err)
		os.Exit(1)
	}
}

type opts struct {
	n           int
	rates       []float64 // 0 is max
	size        int
	sessions    int
	settle      time.Duration
	idle        time.Duration
	turnTimeout time.Duration
	tiers       []string
	dataDir     string
	runsc       string
	restore     bool
}

// want is how many sandboxes a tier's pools hold when full.
func (o opts) want() int { return o.size + o.sessions }

// parseRates reads -rates; "max" is 0.
func parseRates(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "max" {
			out = append(out, 0)
			continue
		}
		r, err := strconv.ParseFloat(f, 64)
		if err != nil || r <= 0 || r > 100 {
			return nil, fmt.Errorf("-rates: %q is not a rate in (0, 100] nor max", f)
		}
		out = append(out, r)
	}
	return out, nil
}

func rateName(r float64) string {
	if r == 0 {
		return "max"
	}
	return strconv.FormatFloat(r, 'f', -1, 64) + "/s"
}

// readiness follows a tier's pools through engine.PoolObserver: how
// many sandboxes each holds, when the last refill ended, the misses.
type readiness struct {
	mu     sync.Mutex
	ready  map[string]int
	last   time.Time
	misses int
}

func (r *readiness) PoolSize(pool string, n int) { r.mu.Lock(); r.ready[pool] = n; r.mu.Unlock() }
func (r *readiness) PoolHit(string)              {}
func (r *readiness) PoolMiss(string)             { r.mu.Lock(); r.misses++; r.mu.Unlock() }
func (r *readiness) PoolRefill(string, time.Duration) {
	r.mu.Lock()
	r.last = time.Now()
	r.mu.Unlock()
}

func (r *readiness) missCount() int { r.mu.Lock(); defer r.mu.Unlock(); return r.misses }

// wait waits until the tier's pools hold want sandboxes in all (each
// pool holds no more than its size) and the newest refill has had
// settle.
func (r *readiness) wait(want int, settle time.Duration) error {
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		n := 0
		for _, k := range r.ready {
			n += k
		}
		ok := n >= want && time.Since(r.last) >= settle
		r.mu.Unlock()
		if ok {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("the pools did not fill within 3 minutes")
}

// tier is one driver's pooled daemon.
type tier struct {
	driver   string
	http     daemon.Client
	state    *readiness
	bundles  string // the driver's bundles directory: one entry per sandbox
	misses   map[float64]int
	turnCPU  map[float64]time.Duration
	turnRuns map[float64]int
}

// sandboxes lists the tier's sandboxes by id.
func (t *tier) sandboxes() []string {
	es, _ := os.ReadDir(t.bundles)
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func cgroupOf(id string) sandboxkit.Cgroup {
	return sandboxkit.Cgroup{Path: ocidriver.CgroupParent + "/" + id}
}

func run(ctx context.Context, o opts) error {
	img, err := image.Open(o.dataDir).Resolve("python")
	if err != nil {
		return err
	}
	// The session pools' sandboxes are supervised by `stockade shim`:
	// the binary is built for the run.
	bin, err := os.MkdirTemp("", "stockade-bench-steady-bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(bin)
	shim, guest, err := daemon.Binaries(bin)
	if err != nil {
		return err
	}
	var ts []*tier
	for i, spec := range o.tiers {
		// A tier is a driver, or gvisor=RUNSC for gVisor with another
		// runsc (two builds side by side).
		d, runsc, other := strings.Cut(spec, "=")
		name := d
		if !other {
			runsc = o.runsc
		} else {
			name = fmt.Sprintf("%s (%s)", d, runsc)
		}
		// gvisor-unwarmed: restored refills not warmed, to compare.
		unwarmed := d == "gvisor-unwarmed"
		if unwarmed {
			d = "gvisor"
		}
		cfg := config.Default()
		cfg.DataDir, cfg.Driver = o.dataDir, d
		if cfg.StateDir, err = os.MkdirTemp("", "stockade-bench-steady-"); err != nil {
			return err
		}
		defer os.RemoveAll(cfg.StateDir)
		var drv sandbox.Driver
		switch d {
		case "runc":
			drv, err = runc.New(runc.Config{StateDir: filepath.Join(cfg.StateDir, d), GuestPath: guest, Shim: shim})
		case "gvisor":
			drv, err = gvisor.New(gvisor.Config{Binary: runsc, StateDir: filepath.Join(cfg.StateDir, d), GuestPath: guest, Shim: shim})
		default:
			err = fmt.Errorf("-tiers: %q is neither runc nor gvisor[=RUNSC]", spec)
		}
		if err != nil {
			return err
		}
		checkpoints := ""
		if o.restore {
			checkpoints = filepath.Join(cfg.StateDir, "pool-checkpoints")
		}
		eng, err := engine.New(map[string]sandbox.Driver{d: drv}, d, image.Open(o.dataDir), cfg.Defaults, cfg.Ceiling,
			engine.WithPools(engine.PoolOptions{Pools: []engine.PoolSpec{{Runtime: "python", Size: o.size, Sessions: o.sessions}},
				SessionWorkspace: int64(cfg.Sessions.WorkspaceSize),
				// As the daemon's (wiring.PoolOptions): gVisor's pools
				// refill from their checkpoints there.
				CheckpointDir: checkpoints, Unwarmed: unwarmed}))
		if err != nil {
			return err
		}
		t := &tier{driver: name, state: &readiness{ready: map[string]int{}}, bundles: filepath.Join(cfg.StateDir, d, "bundles"),
			misses: map[float64]int{}, turnCPU: map[float64]time.Duration{}, turnRuns: map[float64]int{}}
		eng.SetPoolObserver(t.state)
		// The daemon's service starts before the pool: it reaps the
		// sandboxes of its owner when it starts.
		owner := fmt.Sprintf("bench-steady-%d-%s", i, d)
		c, stopD, err := daemon.Serve(ctx, eng, filepath.Join(cfg.StateDir, "steady.db"), owner, int64(10*(o.n*len(o.rates)+5)))
		if err != nil {
			return err
		}
		defer stopD()
		t.http = c
		stop, err := eng.StartPools(ctx, map[string]string{engine.LabelOwner: owner})
		if err != nil {
			return err
		}
		defer stop()
		ts = append(ts, t)
	}
	for _, t := range ts {
		if err := t.state.wait(o.want(), o.settle); err != nil {
			return fmt.Errorf("%s: %w", t.driver, err)
		}
	}
	idleCPU, err := measureIdle(ts, o)
	if err != nil {
		return err
	}
	type variant struct {
		name    string
		t       *tier // nil for the bare interpreter
		run     func() error
		samples map[float64][]time.Duration
	}
	var vs []*variant
	for _, t := range ts {
		vs = append(vs, &variant{name: "pooled one-shot over HTTP, " + t.driver, t: t, run: t.http.OneShot(python.Print, python.PrintOut)})
	}
	bare := &variant{name: "chroot python3 -c 'print(1)' (bare)", run: python.Bare(img.Rootfs, python.Print, python.PrintOut)}
	vs = append(vs, bare)
	for i, r := range o.rates {
		for _, j := range table.Order(i, len(vs)) {
			v := vs[j]
			for _, t := range ts {
				if err := t.state.wait(o.want(), o.settle); err != nil {
					return fmt.Errorf("%s: %w", t.driver, err)
				}
			}
			var meter *cpuMeter
			var misses int
			if v.t != nil {
				meter, misses = startCPUMeter(v.t.sandboxes), v.t.state.missCount()
			}
			ds, err := turn(ctx, v.run, r, o.n, o.turnTimeout)
			if err != nil {
				return fmt.Errorf("%s at %s: %w", v.name, rateName(r), err)
			}
			if v.samples == nil {
				v.samples = map[float64][]time.Duration{}
			}
			v.samples[r] = ds
			if v.t != nil {
				v.t.misses[r] += v.t.state.missCount() - misses
				// The turn's refills end before the pool is full
				// and settled again: their CPU is the turn's.
				err := v.t.state.wait(o.want(), o.settle)
				cpu := meter.stop()
				if err != nil {
					return err
				}
				v.t.turnCPU[r] += cpu
				v.t.turnRuns[r] += len(ds)
			}
		}
	}
	fmt.Printf("pooled one-shot python print(1) over HTTP at a steady rate (an open loop; max: one after the other), pool size %d, %d requests per variant and rate, variants in turn, each turn started with the pools full and settled %s\n\n", o.size, o.n, o.settle)
	tb := table.New("variant", "rate", "p50", "p95", "p50 vs bare", "95% interval")
	for _, r := range o.rates {
		for _, v := range vs {
			ratio, interval := "1.00x", ""
			if v != bare {
				ratio = table.Ratio(table.Pct(v.samples[r], 50), table.Pct(bare.samples[r], 50))
				interval = table.RatioInterval(v.samples[r], bare.samples[r], 50)
			}
			tb.Row(v.name, rateName(r), table.MS(table.Pct(v.samples[r], 50)), table.MS(table.Pct(v.samples[r], 95)), ratio, interval)
		}
	}
	tb.Print(os.Stdout)
	fmt.Printf("\nCPU per pooled run (its sandbox's and its refill's cgroups, from a turn's first request until the pool is full and settled again, over the turn's requests), and the idle CPU of a pool sandbox (full and settled, read over %s)\n\n", o.idle)
	head := []string{"tier"}
	for _, r := range o.rates {
		head = append(head, "CPU per run at "+rateName(r)+" (pool misses)")
	}
	head = append(head, "idle CPU per one-shot pool sandbox", "idle CPU per session pool sandbox")
	tb = table.New(head...)
	for _, t := range ts {
		row := []string{t.driver}
		for _, r := range o.rates {
			row = append(row, fmt.Sprintf("%.3f s (%d)", (t.turnCPU[r]/time.Duration(max(t.turnRuns[r], 1))).Seconds(), t.misses[r]))
		}
		row = append(row, idleCPU[t.driver+" one-shot"], cmp.Or(idleCPU[t.driver+" session"], "none"))
		tb.Row(row...)
	}
	tb.Print(os.Stdout)
	return nil
}

// turn sends n requests of run at rate per second (0: each after the one
// before answered) and returns their round trips. Bounded by timeout.
func turn(ctx context.Context, run func() error, rate float64, n int, timeout time.Duration) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ds := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		if rate == 0 {
			t0 := time.Now()
			if err := run(); err != nil {
				return nil, err
			}
			ds[i] = time.Since(t0)
			if ctx.Err() != nil {
				return nil, fmt.Errorf("the turn took longer than %s", timeout)
			}
			continue
		}
		at := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		select {
		case <-time.After(time.Until(at)):
		case <-ctx.Done():
			return nil, fmt.Errorf("the turn took longer than %s", timeout)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			errs[i] = run()
			ds[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("the turn took longer than %s", timeout)
	}
	return ds, nil
}

// measureIdle reads each tier's pool sandboxes' CPU over o.idle, all
// tiers at once, and gives the mean per sandbox of each kind (one-shot,
// session) of each tier as a share of a core, with the CPU-seconds per
// minute.
func measureIdle(ts []*tier, o opts) (map[string]string, error) {
	type sbx struct {
		id, kind string
		before   time.Duration
	}
	all := map[*tier][]sbx{}
	for _, t := range ts {
		for _, id := range t.sandboxes() {
			all[t] = append(all[t], sbx{id: id, kind: t.kindOf(id), before: cgroupOf(id).CPUUsage()})
		}
	}
	start := time.Now()
	time.Sleep(o.idle)
	elapsed := time.Since(start)
	out := map[string]string{}
	for _, t := range ts {
		sum, n := map[string]time.Duration{}, map[string]int{}
		for _, s := range all[t] {
			u := cgroupOf(s.id).CPUUsage()
			if u == 0 {
				return nil, fmt.Errorf("%s: sandbox %s ended while its idle CPU was read", t.driver, s.id)
			}
			sum[s.kind] += u - s.before
			n[s.kind]++
		}
		for _, kind := range []string{"one-shot", "session"} {
			if n[kind] == 0 {
				continue
			}
			per := sum[kind] / time.Duration(n[kind])
			out[t.driver+" "+kind] = fmt.Sprintf("%.3f%% of a core (%.3f s/min)", 100*per.Seconds()/elapsed.Seconds(), per.Seconds()*60/elapsed.Seconds())
		}
	}
	return out, nil
}

// kindOf says whether sandbox id is of a session pool ("session") or a
// one-shot pool's, by the pool label its bundle records.
func (t *tier) kindOf(id string) string {
	var c struct {
		Annotations map[string]string `json:"annotations"`
	}
	b, _ := os.ReadFile(filepath.Join(t.bundles, id, "config.json"))
	_ = json.Unmarshal(b, &c)
	if strings.HasSuffix(c.Annotations[oci.LabelPrefix+engine.LabelPool], "/session") {
		return "session"
	}
	return "one-shot"
}

// cpuMeter follows the CPU time of a tier's sandboxes while a turn runs,
// each read every 10 ms until its cgroup is gone: a sandbox's count is its
// last reading, which misses at most its last 10 ms (its cgroup outlives
// its processes until the driver removes it), less its reading when the
// meter started (the pool's sandboxes' start and imports are not the
// turn's; their refills are).
type cpuMeter struct {
	mu         sync.Mutex
	base, last map[string]time.Duration
	done       chan struct{}
	wg         sync.WaitGroup
}

func startCPUMeter(list func() []string) *cpuMeter {
	m := &cpuMeter{base: map[string]time.Duration{}, last: map[string]time.Duration{}, done: make(chan struct{})}
	for _, id := range list() {
		u := cgroupOf(id).CPUUsage()
		m.base[id], m.last[id] = u, u
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-m.done:
				return
			case <-tick.C:
			}
			for _, id := range list() {
				if u := cgroupOf(id).CPUUsage(); u > 0 {
					m.mu.Lock()
					m.last[id] = max(m.last[id], u)
					m.mu.Unlock()
				}
			}
		}
	}()
	return m
}

// stop stops the meter and returns the CPU time its sandboxes used while
// it ran.
func (m *cpuMeter) stop() time.Duration {
	close(m.done)
	m.wg.Wait()
	var sum time.Duration
	for id, u := range m.last {
		sum += u - m.base[id]
	}
	return sum
}
