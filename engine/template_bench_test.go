package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// benchTemplate starts as a data-science template would: pandas, numpy
// and sympy imported; the first cell uses two of them.
var benchTemplate = image.TemplateManifest{Name: "bench", Base: "python", Golden: true,
	Start: "import numpy, pandas, sympy", Ready: "assert sympy.sqrt(4) == 2"}

const benchFirstCell = "print(pandas.DataFrame({'a': range(1000)}).a.sum(), sympy.sqrt(8))"

// BenchmarkTemplateSession measures, on gVisor, a new session of a
// template whose Start imports numpy, pandas and sympy: OpenSession and
// its first cell using them, cold (the sandbox made, the kernel started,
// Start run), restored from the template's golden checkpoint, and taken
// from a session pool of the template, one of each per round, the order
// turning every round; before each sample the pool is full again, so that
// no refill runs while a sample is timed. Then what holding the template
// ready costs while no session runs: a pooled sandbox's memory cgroup
// (its Sentry and its memory file), against no live sandbox and the
// checkpoint's bytes on disk; and a session's sandbox's memory after its
// first cell, by kind; and where a golden restore's time goes. It prints
// the tables with the ratios; run it with -benchtime=10x for ten rounds.
func BenchmarkTemplateSession(b *testing.B) {
	testenv.RequiresRoot(b)
	testenv.RequiresBinary(b, "runsc")
	ctx := context.Background()
	bench := boundTools(b, "gvisor", map[string]image.TemplateManifest{"bench": benchTemplate})
	imgs := templateImages{Store: image.Open(testenv.DataDir()), templates: map[string]image.TemplateManifest{"bench": benchTemplate}}
	newEngine := func(o ...Option) *Engine {
		d, err := gvisor.New(gvisor.Config{StateDir: b.TempDir(), GuestPath: testenv.Guest(b), Shim: testenv.Shim(b)})
		if err != nil {
			b.Fatal(err)
		}
		e, err := New(map[string]sandbox.Driver{"gvisor": d}, "gvisor", imgs, sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
			append([]Option{bench}, o...)...)
		if err != nil {
			b.Fatal(err)
		}
		return e
	}
	cold := newEngine()
	golden := newEngine(WithGolden(GoldenOptions{Dir: b.TempDir(), Workspace: poolWorkspace}))
	// The same golden restore without a sandbox created ahead: the
	// baseline of the slot's gain, side by side.
	plain := newEngine(WithGolden(GoldenOptions{Dir: b.TempDir(), Workspace: poolWorkspace, NoAhead: true}))
	defer func() {
		for _, e := range []*Engine{golden, plain} {
			_ = e.Wait(ctx)
			if err := e.DropReadySlots(ctx); err != nil {
				b.Error(err)
			}
		}
	}()
	pooled := newEngine(WithPools(PoolOptions{Pools: []PoolSpec{{Tool: "bench", Sessions: 1}}, SessionWorkspace: poolWorkspace}))
	made := time.Now()
	if err := golden.MakeGolden(ctx, "bench"); err != nil {
		b.Fatal(err)
	}
	makeTime := time.Since(made)
	if err := plain.MakeGolden(ctx, "bench"); err != nil {
		b.Fatal(err)
	}
	stop, err := pooled.StartPools(ctx, map[string]string{LabelOwner: poolOwner})
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	poolReady := func() *warm {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			p := pooled.pools[0]
			p.mu.Lock()
			var w *warm
			if len(p.ready) > 0 {
				w = p.ready[0]
			}
			p.mu.Unlock()
			if w != nil {
				return w
			}
			if time.Now().After(deadline) {
				b.Fatal("the pool did not fill within 2 minutes")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	v2 := benchCgroupV2()
	type kind struct {
		name             string
		e                *Engine
		open, cell, both []time.Duration
		mem              []int64
		phases           []goldenPhases
	}
	kinds := []*kind{{name: "cold", e: cold}, {name: "golden (slot)", e: golden}, {name: "golden (no slot)", e: plain},
		{name: "session pool", e: pooled}}
	var cur *kind
	sample := func(k *kind, timed bool) {
		poolReady()
		cur = k
		start := time.Now()
		s, err := k.e.OpenSession(ctx, SessionSpec{Tool: "bench", Workspace: poolWorkspace,
			Labels: map[string]string{LabelOwner: poolOwner, LabelSession: "ses_bench"}})
		if err != nil {
			b.Fatalf("%s: %v", k.name, err)
		}
		opened := time.Now()
		r, err := s.Cell(ctx, CellRequest{Code: benchFirstCell, Timeout: time.Minute})
		done := time.Now()
		if err != nil || r.Stdout != "499500 2*sqrt(2)\n" {
			b.Fatalf("%s: first cell: %+v, %v", k.name, r, err)
		}
		mem, _ := benchSandboxMemory(s.SandboxID(), v2)
		_ = s.Close(ctx)
		if timed {
			k.open = append(k.open, opened.Sub(start))
			k.cell = append(k.cell, done.Sub(opened))
			k.both = append(k.both, done.Sub(start))
			k.mem = append(k.mem, mem)
		}
	}
	// One untimed round: caches warm.
	for _, k := range kinds {
		sample(k, false)
	}
	goldenRestored = func(p goldenPhases) { cur.phases = append(cur.phases, p) }
	defer func() { goldenRestored = func(goldenPhases) {} }()
	round := 0
	b.ResetTimer()
	for b.Loop() {
		for j := range kinds {
			sample(kinds[(j+round)%len(kinds)], true)
		}
		round++
	}
	b.StopTimer()
	idle, err := benchSandboxMemory(poolReady().sb.ID(), v2)
	if err != nil {
		b.Fatal(err)
	}
	for _, k := range kinds {
		if len(k.phases) > len(k.open) {
			// The untimed round's.
			k.phases = k.phases[len(k.phases)-len(k.open):]
		}
	}
	disk, err := golden.GoldenBytes("bench")
	if err != nil {
		b.Fatal(err)
	}

	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
	ratio := func(a, c time.Duration) string { return fmt.Sprintf("%.2fx", float64(a)/float64(c)) }
	mib := func(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
	c := kinds[0]
	var out strings.Builder
	fmt.Fprintf(&out, "a new session of a python template whose start imports numpy, pandas and sympy, on gVisor, and its first cell using pandas and sympy; median of %d each, interleaved\n\n", len(c.both))
	fmt.Fprintf(&out, "| session from      | OpenSession | open vs cold | first cell |      both | both p95  | both vs cold | sandbox memory after the cell |\n")
	fmt.Fprintf(&out, "| ----------------- | ----------: | -----------: | ---------: | --------: | --------: | -----------: | ----------------------------: |\n")
	for _, k := range kinds {
		fmt.Fprintf(&out, "| %-17s | %11s | %12s | %10s | %9s | %9s | %12s | %29s |\n", k.name, ms(median(k.open)), ratio(median(k.open), median(c.open)),
			ms(median(k.cell)), ms(median(k.both)), ms(pct95(k.both)), ratio(median(k.both), median(c.both)), mib(medianInt(k.mem)))
		b.ReportMetric(float64(median(k.both))/float64(time.Millisecond), "ms-"+strings.ReplaceAll(k.name, " ", "-"))
	}
	for _, g := range kinds[1:3] {
		phases := g.phases
		fmt.Fprintf(&out, "\n%s: a golden restore's OpenSession by phase, median of %d\n\n", g.name, len(phases))
		fmt.Fprintf(&out, "| phase                                                          |    median | of OpenSession |\n")
		fmt.Fprintf(&out, "| -------------------------------------------------------------- | --------: | -------------: |\n")
		if len(phases) != len(g.open) {
			b.Fatalf("%s: %d golden restores timed by phase, %d sessions", g.name, len(phases), len(g.open))
		}
		for _, r := range []struct {
			name string
			of   func(goldenPhases) time.Duration
		}{
			{"driver's restore (checkpoint checked, runsc restore, resume)", func(p goldenPhases) time.Duration { return p.restore }},
			{"binding and deadline", func(p goldenPhases) time.Duration { return p.bind }},
			{"kernel adopted", func(p goldenPhases) time.Duration { return p.kernel }},
			{"reseed cell", func(p goldenPhases) time.Duration { return p.reseed }},
		} {
			var ds []time.Duration
			for _, p := range phases {
				ds = append(ds, r.of(p))
			}
			fmt.Fprintf(&out, "| %-62s | %9s | %13.0f%% |\n", r.name, ms(median(ds)), 100*float64(median(ds))/float64(median(g.open)))
		}
		var rest []time.Duration
		for i, p := range phases {
			rest = append(rest, g.open[i]-p.restore-p.bind-p.kernel-p.reseed)
		}
		fmt.Fprintf(&out, "| %-62s | %9s | %13.0f%% |\n", "the rest (the tool and template resolved, golden.json read)", ms(median(rest)),
			100*float64(median(rest))/float64(median(g.open)))
	}
	if _, claimed, failed := golden.drivers["gvisor"].(interface{ Prepared() (int, int, int) }).Prepared(); true {
		fmt.Fprintf(&out, "\ngolden (slot): %d restores took a sandbox created ahead, %d of them fell back; %d restores in all\n", claimed, failed, len(kinds[1].phases)+1)
	}
	fmt.Fprintf(&out, "\nholding the template ready while no session runs (the checkpoint made once, in %s)\n\n", ms(makeTime))
	fmt.Fprintf(&out, "| kept as                     | live sandbox memory (cgroup) | on disk    |\n")
	fmt.Fprintf(&out, "| --------------------------- | ---------------------------: | ---------: |\n")
	fmt.Fprintf(&out, "| a session pool's sandbox    | %28s | %10s |\n", mib(idle), "0 MiB")
	fmt.Fprintf(&out, "| the golden checkpoint       | %28s | %10s |\n", "0 MiB", mib(disk))
	fmt.Fprintf(&out, "\nthe checkpoint on disk is %.2fx the pooled sandbox's memory, which it frees\n", float64(disk)/float64(idle))
	// Printed, not logged: the testing package cuts a benchmark's log to
	// ten lines.
	fmt.Print("\n" + out.String() + "\n")
}

// benchCgroupV2 says whether the host uses the unified hierarchy, as the
// OCI drivers decide it.
func benchCgroupV2() bool {
	var st unix.Statfs_t
	return unix.Statfs(sandboxkit.CgroupRoot, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// benchSandboxMemory is the usage of the memory cgroup of the OCI
// sandbox id: under gVisor its Sentry and its memory file.
func benchSandboxMemory(id string, v2 bool) (int64, error) {
	cg := sandboxkit.Cgroup{V2: v2, Path: ocidriver.CgroupParent + "/" + id}
	name := "memory.usage_in_bytes"
	if v2 {
		name = "memory.current"
	}
	raw, err := os.ReadFile(filepath.Join(cg.MemoryDir(), name))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
}

// pct95 is the 95th percentile of ds (the largest of fewer than 20).
func pct95(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)-1, len(s)*95/100)]
}

func medianInt(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
