// Command pool measures one-shot python print(1) from a warm pool side by
// side with a cold one-shot, the bare interpreter and `docker run` with the
// same profile, interleaved in one run so that machine noise hits every
// variant alike, on runc and gVisor:
//
//   - POST /v1/executions over HTTP on loopback, through the whole
//     capability layer with approval none and SQLite (package
//     bench/internal/daemon), from a pool of the default tool (numpy and
//     pandas imported already) and cold: the figures;
//   - the engine's one-shot run in process, pooled and cold (what the
//     daemon does per invocation, without HTTP and the capability layer):
//     the difference is the layer's cost;
//   - `chroot ROOTFS python3 -c 'print(1)'`, the bare interpreter;
//   - `docker run` of python under the docker driver's profile
//     (bench/internal/dockerrun), when a Docker Engine is given.
//
// Every sample is timed once each tier's pool has a sandbox whose
// interpreter has had -settle to import numpy and pandas (the wait is not
// timed): a pooled sample measures a pool that keeps up, and no sample
// shares the CPU with a pool's refill. It then prints the idle memory of a pool
// sandbox (its memory cgroup; under gVisor with the Sentry) beyond the
// bare interpreter's anonymous resident set with numpy and pandas
// imported.
//
// Last, it times a new python session and its first cell using pandas
// through a daemon over HTTP with approval none (bench/internal/daemon),
// from a session pool (numpy and pandas imported in its kernel already)
// and cold, on runc and gVisor (sessions.go).
//
//	go run ./bench/pool [-n 30] [-settle 3s] [-docker-host unix:///tmp/sbd/docker.sock]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/bench/internal/daemon"
	"github.com/stockade-sh/stockade/bench/internal/dockerrun"
	"github.com/stockade-sh/stockade/bench/internal/python"
	"github.com/stockade-sh/stockade/bench/internal/table"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/internal/wiring"
	"github.com/stockade-sh/stockade/sandbox"
)

func main() {
	n := flag.Int("n", 30, "runs of each variant")
	settle := flag.Duration("settle", 3*time.Second, "how long a pool sandbox's interpreter has to import numpy and pandas before a pooled run is timed")
	host := flag.String("docker-host", os.Getenv("DOCKER_HOST"), "Docker Engine for the docker run variant (default $DOCKER_HOST; none: no such variant)")
	dataDir := flag.String("data-dir", config.Default().DataDir, "image store")
	flag.Parse()
	if err := run(context.Background(), *n, *settle, *host, *dataDir); err != nil {
		fmt.Fprintln(os.Stderr, "pool:", err)
		os.Exit(1)
	}
}

// readiness follows one pool through engine.PoolObserver: how many
// sandboxes are ready, and when the last one was created.
type readiness struct {
	mu     sync.Mutex
	ready  int
	last   time.Time
	misses int
}

func (r *readiness) PoolSize(_ string, n int) { r.mu.Lock(); r.ready = n; r.mu.Unlock() }
func (r *readiness) PoolHit(string)           {}
func (r *readiness) PoolMiss(string)          { r.mu.Lock(); r.misses++; r.mu.Unlock() }
func (r *readiness) PoolRefill(string, time.Duration) {
	r.mu.Lock()
	r.last = time.Now()
	r.mu.Unlock()
}

// wait waits until the pool is full (size) and its last sandbox has
// settled.
func (r *readiness) wait(size int, settle time.Duration) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		ok := r.ready >= size && time.Since(r.last) >= settle
		r.mu.Unlock()
		if ok {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("the pool did not fill within 2 minutes")
}

// tier is one driver's engines.
type tier struct {
	driver      string
	cold, ready *engine.Engine
	// The daemons serving the two engines over HTTP.
	coldHTTP, readyHTTP daemon.Client
	state               *readiness
	stateDir            string
}

// pooled is run, which must have been served by the tier's pool: a
// pooled sample that ran cold would be timed as pooled.
func (t *tier) pooled(run func() error) func() error {
	return func() error {
		t.state.mu.Lock()
		before := t.state.misses
		t.state.mu.Unlock()
		err := run()
		t.state.mu.Lock()
		missed := t.state.misses > before
		t.state.mu.Unlock()
		if err == nil && missed {
			err = fmt.Errorf("the %s pool missed (it had a settled sandbox)", t.driver)
		}
		return err
	}
}

func run(ctx context.Context, n int, settle time.Duration, host, dataDir string) error {
	const size = 1
	img, err := image.Open(dataDir).Resolve("python")
	if err != nil {
		return err
	}
	var tiers []*tier
	for _, d := range []string{"runc", "gvisor"} {
		t := &tier{driver: d, state: &readiness{}}
		var stopD func()
		cfg := config.Default()
		cfg.DataDir, cfg.Driver = dataDir, d
		cfg.StateDir, err = os.MkdirTemp("", "stockade-bench-pool-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(cfg.StateDir)
		t.stateDir = cfg.StateDir
		if t.cold, err = wiring.Engine(cfg); err != nil {
			return err
		}
		drivers, err := wiring.Drivers(cfg)
		if err != nil {
			return err
		}
		t.ready, err = engine.New(drivers, d, image.Open(dataDir), cfg.Defaults, cfg.Ceiling,
			engine.WithPools(engine.PoolOptions{Pools: []engine.PoolSpec{{Runtime: "python", Size: size}}}))
		if err != nil {
			return err
		}
		t.ready.SetPoolObserver(t.state)
		// The daemons' services start before the pool: a service reaps
		// the sandboxes of its owner when it starts, and a pool's
		// sandboxes carry the owner of the daemon whose runs take them.
		owner := "bench-pool-" + d
		credits := int64(10 * (n + 5))
		if t.readyHTTP, stopD, err = daemon.Serve(ctx, t.ready, filepath.Join(cfg.StateDir, "ready.db"), owner, credits); err != nil {
			return err
		}
		defer stopD()
		if t.coldHTTP, stopD, err = daemon.Serve(ctx, t.cold, filepath.Join(cfg.StateDir, "cold.db"), owner+"-cold", credits); err != nil {
			return err
		}
		defer stopD()
		stop, err := t.ready.StartPools(ctx, map[string]string{engine.LabelOwner: owner})
		if err != nil {
			return err
		}
		defer stop()
		tiers = append(tiers, t)
	}
	oneShot := func(e *engine.Engine) func() error {
		return func() error {
			res, err := e.Run(ctx, engine.Request{Runtime: "python", Code: []byte("print(1)")})
			if err == nil && res.Stdout != "1\n" {
				err = fmt.Errorf("unexpected result %+v", res)
			}
			return err
		}
	}
	bare := &table.Variant{Name: "chroot python3 -c 'print(1)' (bare)", Run: table.Command("1\n", nil, "chroot", img.Rootfs, "/usr/bin/python3", "-c", "print(1)")}
	var dockerRun *table.Variant
	if host != "" {
		argv, cleanup, err := dockerrun.Argv(ctx, "docker", host, dataDir, "-c", "print(1)")
		if err != nil {
			return err
		}
		defer cleanup()
		dockerRun = &table.Variant{Name: "docker run (same profile, CLI)", Run: table.Command("1\n", []string{"DOCKER_HOST=" + host}, argv...)}
	}
	var vs []*table.Variant
	for _, t := range tiers {
		vs = append(vs,
			&table.Variant{Name: "pooled one-shot over HTTP, " + t.driver, Run: t.pooled(t.readyHTTP.OneShot(python.Print, python.PrintOut))},
			&table.Variant{Name: "cold one-shot over HTTP, " + t.driver, Run: t.coldHTTP.OneShot(python.Print, python.PrintOut)},
			&table.Variant{Name: "pooled one-shot in process, " + t.driver, Run: t.pooled(oneShot(t.ready))},
			&table.Variant{Name: "cold one-shot in process, " + t.driver, Run: oneShot(t.cold)})
	}
	vs = append(vs, bare)
	if dockerRun != nil {
		vs = append(vs, dockerRun)
	}
	// As table.Interleave, with an untimed wait before each sample until
	// every tier's pool is full and settled: a pool refilling (the
	// runtime, python importing numpy and pandas) takes CPU from whatever
	// runs beside it, whichever tier or variant that is.
	for i := -1; i < n; i++ {
		for _, j := range table.Order(i, len(vs)) {
			v := vs[j]
			for _, t := range tiers {
				if err := t.state.wait(size, settle); err != nil {
					return err
				}
			}
			start := time.Now()
			if err := v.Run(); err != nil {
				return fmt.Errorf("%s: %w", v.Name, err)
			}
			if d := time.Since(start); i >= 0 {
				v.Samples = append(v.Samples, d)
			}
		}
	}
	fmt.Printf("one-shot python print(1), %d runs each, interleaved; each run is timed once every pool is full and its sandbox has settled %s\n\n", n, settle)
	// Each ratio's 95% bootstrap interval over this run's samples
	// (table.RatioInterval) says how far the noise could move it.
	head := []string{"variant", "p50", "p95", "p50 vs bare", "95% interval"}
	if dockerRun != nil {
		head = append(head, "p50 vs docker run", "95% interval")
	}
	tb := table.New(head...)
	// interval is none for a variant against itself, whose ratio is 1.
	interval := func(v, base *table.Variant) string {
		if v == base {
			return ""
		}
		return table.RatioInterval(v.Samples, base.Samples, 50)
	}
	for _, v := range vs {
		row := []string{v.Name, table.MS(v.Pct(50)), table.MS(v.Pct(95)), table.Ratio(v.Pct(50), bare.Pct(50)), interval(v, bare)}
		if dockerRun != nil {
			row = append(row, table.Ratio(v.Pct(50), dockerRun.Pct(50)), interval(v, dockerRun))
		}
		tb.Row(row...)
	}
	tb.Print(os.Stdout)
	if err := idleMemory(tiers, img, settle); err != nil {
		return err
	}
	return sessions(ctx, n, settle, dataDir)
}

// idleMemory prints the memory of each tier's idle pool sandbox beside the
// bare interpreter's with numpy and pandas imported. The cgroup's usage
// holds, under gVisor, the Sentry and the sandbox's memory file; its rss
// is anonymous memory only.
func idleMemory(tiers []*tier, img sandbox.Image, settle time.Duration) error {
	interp, err := interpreterRSS(img)
	if err != nil {
		return err
	}
	fmt.Printf("\nidle memory of a pool sandbox (memory cgroup, after %s), beside the bare interpreter's anonymous resident set with numpy and pandas imported (%s)\n\n", settle, mib(interp))
	tb := table.New("tier", "cgroup usage", "beyond the interpreter", "cgroup rss", "rss beyond the interpreter")
	for _, t := range tiers {
		if err := t.state.wait(1, settle); err != nil {
			return err
		}
		bundles, err := os.ReadDir(filepath.Join(t.stateDir, t.driver, "bundles"))
		if err != nil || len(bundles) == 0 {
			return fmt.Errorf("finding the %s pool sandbox: %v", t.driver, err)
		}
		cg := sandboxkit.Cgroup{Path: ocidriver.CgroupParent + "/" + bundles[0].Name()}
		usage, rss := readInt(filepath.Join(cg.MemoryDir(), "memory.usage_in_bytes")), statRSS(filepath.Join(cg.MemoryDir(), "memory.stat"))
		tb.Row(t.driver, mib(usage), mib(usage-interp), mib(rss), mib(rss-interp))
	}
	tb.Print(os.Stdout)
	return nil
}

// interpreterRSS is the anonymous resident set of the bare interpreter
// (chroot, the same image) with numpy and pandas imported, read from the
// host's /proc: its own memory. Its file pages (the libraries) are left
// out, as a sandbox's cgroup is not charged for pages of the image the
// host has cached already.
func interpreterRSS(img sandbox.Image) (int64, error) {
	cmd := exec.Command("chroot", img.Rootfs, "/usr/bin/python3", "-c", "import numpy, pandas, sys, time\nprint('ready', flush=True)\ntime.sleep(60)")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	buf := make([]byte, 6)
	if _, err := io.ReadFull(out, buf); err != nil {
		return 0, fmt.Errorf("starting the bare interpreter: %w", err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "RssAnon:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no RssAnon in the bare interpreter's status")
}

func readInt(path string) int64 {
	b, _ := os.ReadFile(path)
	v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v
}

// statRSS is the rss of a v1 memory.stat (anonymous memory, shmem aside).
func statRSS(path string) int64 {
	b, _ := os.ReadFile(path)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "total_rss "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
