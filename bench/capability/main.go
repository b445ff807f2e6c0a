// Command capability measures what the capability layer adds to an
// invocation, side by side and interleaved in one run so that machine noise
// hits every variant alike:
//
//  1. Latency with the real runc driver: the engine's one-shot run in
//     process (engine.Run) against the same run through the whole capability
//     layer (POST /v1/executions, synchronous, over real HTTP on loopback:
//     key lookup, policy decision, credit reservation and tool_calls row,
//     audit events, outcome recorded, result read back). The difference of
//     the two is the per-call overhead; "outside the driver" subtracts from
//     each call the time spent in its driver calls (Create, Exec, Destroy)
//     to show it per call rather than as a difference of two distributions.
//  2. Isolation with a fake driver whose sandboxes answer at once: the same
//     two variants with nothing but Stockade's own work left, so the
//     difference is the capability layer's cost alone.
//  3. Sustained throughput: -invocations runs at each -concurrency through
//     HTTP (MaxConcurrent = concurrency, a queue large enough never to
//     refuse) and directly on the engine with as many workers, in
//     alternating rounds.
//
// It needs root, runc and the runtime's image (`make setup`). Each service
// (one per variant, as a database serves one daemon) has a store of its
// own: SQLite in a temporary directory unless -db names a PostgreSQL
// database, in which each works in a fresh schema dropped at the end.
// Everything listens on 127.0.0.1 only, and the run stops by itself.
//
//	CGO_ENABLED=0 go run ./bench/capability
//	CGO_ENABLED=0 go run ./bench/capability -db "$(scripts/pgtest.sh)"
//	CGO_ENABLED=0 go run ./bench/capability -runtime python -n 50 -fake-n 500 -concurrency 4,8 -invocations 60 -rounds 5
//	CGO_ENABLED=0 go run ./bench/capability -sqlite-sync full,normal
//
// -sqlite-sync full,normal runs every variant through HTTP once per
// SQLite synchronous setting, side by side (FULL, the store's, flushes
// every commit; NORMAL may lose the last ones at a power failure).
//
// -trace off,on runs every variant through HTTP with tracing off and on,
// side by side: on is the daemon's tracing (internal/telemetry.Setup)
// with the sampler at 1.0 (always_on), exporting over OTLP/HTTP in
// batches to a receiver in this process that reads and drops them; off
// records no span (the phases' durations are observed in both).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stockade-sh/stockade/bench/internal/table"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/guestbin"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store/sqlite"
)

// options are the command line.
type options struct {
	n, fakeN, invocations, rounds int
	concurrency                   []int
	runtime, dataDir, stateDir    string
	db                            string
	// syncs are the SQLite synchronous settings the HTTP variants run
	// with, each over databases of its own.
	syncs []string
	// traces are the tracing settings the HTTP variants run with: off,
	// on, or both.
	traces []string
}

// programs are the code each runtime runs and what it prints.
var programs = map[string]struct{ code, want string }{
	"shell":  {"echo hi", "hi\n"},
	"python": {"print(1)", "1\n"},
}

func main() {
	var o options
	flag.IntVar(&o.n, "n", 100, "timed runs of each real-driver latency variant")
	flag.IntVar(&o.fakeN, "fake-n", 2000, "timed runs of each fake-driver variant")
	flag.IntVar(&o.invocations, "invocations", 60, "invocations per throughput round")
	flag.IntVar(&o.rounds, "rounds", 5, "throughput rounds of each variant at each concurrency")
	conc := flag.String("concurrency", "4,8", "comma-separated concurrency levels of the throughput runs")
	flag.StringVar(&o.runtime, "runtime", "shell", "runtime of the invocations: shell (echo hi) or python (print(1))")
	flag.StringVar(&o.dataDir, "data-dir", config.Default().DataDir, "image store and guest agent directory")
	flag.StringVar(&o.stateDir, "state-dir", "/run", "parent of the temporary runc state directory (a tmpfs, as in production)")
	flag.StringVar(&o.db, "db", "", "PostgreSQL URL (postgres://...) to benchmark on instead of SQLite in a temporary directory")
	syncs := flag.String("sqlite-sync", "full", "comma-separated SQLite synchronous settings to run the HTTP variants with, side by side: full, normal")
	traces := flag.String("trace", "off", "comma-separated tracing settings to run the HTTP variants with, side by side: off, on (sampler 1.0, OTLP/HTTP to a receiver in this process)")
	flag.Parse()
	for _, s := range strings.Split(*traces, ",") {
		switch s = strings.TrimSpace(s); s {
		case "off", "on":
			o.traces = append(o.traces, s)
		default:
			fmt.Fprintf(os.Stderr, "capability: -trace: %q is neither off nor on\n", s)
			os.Exit(2)
		}
	}
	for _, s := range strings.Split(*syncs, ",") {
		switch s = strings.ToUpper(strings.TrimSpace(s)); s {
		case sqlite.SyncFull, sqlite.SyncNormal:
			o.syncs = append(o.syncs, s)
		default:
			fmt.Fprintf(os.Stderr, "capability: -sqlite-sync: %q is neither full nor normal\n", s)
			os.Exit(2)
		}
	}
	if len(o.traces) > 1 && len(o.syncs) > 1 {
		fmt.Fprintln(os.Stderr, "capability: -trace off,on and -sqlite-sync full,normal do not combine")
		os.Exit(2)
	}
	if o.db != "" && len(o.syncs) > 1 {
		fmt.Fprintln(os.Stderr, "capability: -sqlite-sync compares SQLite settings; it takes one value with -db")
		os.Exit(2)
	}
	for _, f := range strings.Split(*conc, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c <= 0 {
			fmt.Fprintf(os.Stderr, "capability: -concurrency: %q is not a positive number\n", f)
			os.Exit(2)
		}
		o.concurrency = append(o.concurrency, c)
	}
	if _, ok := programs[o.runtime]; !ok || o.n <= 0 || o.fakeN <= 0 || o.invocations <= 0 || o.rounds <= 0 {
		fmt.Fprintln(os.Stderr, "capability: -runtime must be shell or python and the counts positive")
		os.Exit(2)
	}
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "capability:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	prog := programs[o.runtime]
	images := image.Open(o.dataDir)
	if _, err := images.Resolve(o.runtime); err != nil {
		return err
	}
	guest, err := guestbin.Install(config.Config{DataDir: o.dataDir}.BinDir())
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "stockade-bench-capability-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	state, err := os.MkdirTemp(o.stateDir, "stockade-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(state)
	rc, err := runc.New(runc.Config{StateDir: state, GuestPath: guest})
	if err != nil {
		return err
	}
	// Both engines register their driver as "runc": the default tool runs on
	// the default driver's tier, the container tier.
	timed := &timedDriver{Driver: rc}
	realEng, err := engine.New(map[string]sandbox.Driver{"runc": timed}, "runc", images, sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		return err
	}
	fakeEng, err := engine.New(map[string]sandbox.Driver{"runc": fakeDriver{out: []byte(prog.want)}}, "runc", images, sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		return err
	}

	calls := 2*(o.n+1) + 2*(o.fakeN+1) + len(o.concurrency)*o.rounds*o.invocations
	d := openDaemon(o.db, tmp, int64(4*calls))
	defer d.close()
	// The HTTP variants' settings: each SQLite synchronous setting, or
	// tracing off and on.
	var modes []mode
	for _, sync := range o.syncs {
		for _, tr := range o.traces {
			m := mode{sync: sync, trace: tr, label: "synchronous=" + sync}
			if len(o.traces) > 1 {
				m.label = "tracing " + tr
			}
			modes = append(modes, m)
		}
	}
	if slices.Contains(o.traces, "on") {
		stop, err := startTracing(ctx)
		if err != nil {
			return err
		}
		defer stop()
	}
	// One set of services per setting, each over databases of its own.
	realSvc, fakeSvc := map[string]target{}, map[string]target{}
	throughput := map[int]map[string]target{}
	for _, m := range modes {
		owner := func(name string) string { return "bench-" + name + "-" + strings.ToLower(m.sync) + "-" + m.trace }
		if realSvc[m.label], err = d.serve(ctx, realEng, capability.ServiceOptions{Owner: owner("real")}, m.sync); err != nil {
			return err
		}
		if fakeSvc[m.label], err = d.serve(ctx, fakeEng, capability.ServiceOptions{Owner: owner("fake")}, m.sync); err != nil {
			return err
		}
		for _, c := range o.concurrency {
			svc, err := d.serve(ctx, realEng, capability.ServiceOptions{Owner: owner(fmt.Sprintf("c%d", c)), MaxConcurrent: c, MaxQueue: 10 * o.invocations}, m.sync)
			if err != nil {
				return err
			}
			if throughput[c] == nil {
				throughput[c] = map[string]target{}
			}
			throughput[c][m.label] = svc
		}
	}

	body, err := json.Marshal(capability.InvokeRequest{Runtime: o.runtime, Code: prog.code})
	if err != nil {
		return err
	}
	direct := func(eng *engine.Engine) func() error {
		return func() error {
			telemetry.SetTracing(false)
			res, err := eng.Run(ctx, engine.Request{Runtime: o.runtime, Code: []byte(prog.code)})
			if err == nil && (res.Status != sandbox.StatusSucceeded || res.Stdout != prog.want) {
				err = fmt.Errorf("unexpected result %+v", res)
			}
			return err
		}
	}
	viaHTTP := func(t target, m mode) func() error {
		return func() error {
			telemetry.SetTracing(m.trace == "on")
			return d.invoke(ctx, t, body, prog.want)
		}
	}
	// httpName names the HTTP variant of a setting; the setting shows
	// when the run compares several.
	httpName := func(name string, m mode) string {
		if len(modes) > 1 {
			return name + ", " + m.label
		}
		return name
	}
	storeName := "SQLite (synchronous=" + strings.Join(o.syncs, ", ") + ")"
	if o.db != "" {
		storeName = "PostgreSQL"
	}
	traceName := ""
	if slices.Contains(o.traces, "on") {
		traceName = ", tracing on: sampler 1.0, OTLP/HTTP in batches to a receiver in this process"
	}
	fmt.Printf("capability layer overhead: %s %q, store %s%s, one run\n\n", o.runtime, prog.code, storeName, traceName)

	// 1. Real driver, one call at a time.
	outside := func(run func() error, dst *[]time.Duration) func() error {
		return func() error {
			timed.take()
			start := time.Now()
			if err := run(); err != nil {
				return err
			}
			*dst = append(*dst, time.Since(start)-timed.take())
			return nil
		}
	}
	outs := make([][]time.Duration, 1+len(modes))
	variants := []*table.Variant{{Name: "engine.Run in process", Run: outside(direct(realEng), &outs[0])}}
	for i, m := range modes {
		variants = append(variants, &table.Variant{Name: httpName("POST /v1/executions over HTTP", m), Run: outside(viaHTTP(realSvc[m.label], m), &outs[i+1])})
	}
	if err := table.Interleave(o.n, variants); err != nil {
		return err
	}
	for i := range outs {
		outs[i] = outs[i][1:] // drop the warm-up round
	}
	a := variants[0]
	fmt.Printf("1. real runc driver, one call at a time, %d runs each, interleaved\n\n", o.n)
	t := table.New("variant", "median", "p95", "median vs engine.Run", "outside the driver, median", "outside the driver, p95")
	t.Row(a.Name, table.MS(a.Pct(50)), table.MS(a.Pct(95)), "1.00x", table.MS(table.Pct(outs[0], 50)), table.MS(table.Pct(outs[0], 95)))
	for i, b := range variants[1:] {
		t.Row(b.Name, table.MS(b.Pct(50)), table.MS(b.Pct(95)), table.Ratio(b.Pct(50), a.Pct(50)), table.MS(table.Pct(outs[i+1], 50)), table.MS(table.Pct(outs[i+1], 95)))
	}
	for i, b := range variants[1:] {
		t.Row(httpName("overhead per call (HTTP - engine)", modes[i]), table.MS(b.Pct(50)-a.Pct(50)), table.MS(b.Pct(95)-a.Pct(95)), "",
			table.MS(table.Pct(outs[i+1], 50)-table.Pct(outs[0], 50)), table.MS(table.Pct(outs[i+1], 95)-table.Pct(outs[0], 95)))
	}
	t.Print(os.Stdout)

	// 2. Fake driver: the capability layer alone.
	fa := &table.Variant{Name: "engine.Run in process, fake driver", Run: direct(fakeEng)}
	fakes := []*table.Variant{fa}
	for _, m := range modes {
		fakes = append(fakes, &table.Variant{Name: httpName("POST /v1/executions over HTTP, fake driver", m), Run: viaHTTP(fakeSvc[m.label], m)})
	}
	if err := table.Interleave(o.fakeN, fakes); err != nil {
		return err
	}
	fmt.Printf("\n2. fake driver (sandboxes answer at once): the capability layer in isolation, %d runs each, interleaved\n\n", o.fakeN)
	t = table.New("variant", "median", "p95", "median vs the first HTTP variant")
	t.Row(fa.Name, table.MS(fa.Pct(50)), table.MS(fa.Pct(95)), "")
	for _, fb := range fakes[1:] {
		t.Row(fb.Name, table.MS(fb.Pct(50)), table.MS(fb.Pct(95)), table.Ratio(fb.Pct(50), fakes[1].Pct(50)))
	}
	for i, fb := range fakes[1:] {
		t.Row(httpName("capability layer per call (HTTP - engine)", modes[i]), table.MS(fb.Pct(50)-fa.Pct(50)), table.MS(fb.Pct(95)-fa.Pct(95)), "")
	}
	t.Print(os.Stdout)

	// 3. Sustained throughput, real driver.
	fmt.Printf("\n3. sustained throughput, real runc driver, %d invocations per round, %d rounds of each variant, alternating\n\n", o.invocations, o.rounds)
	t = table.New("concurrency", "variant", "invocations/s", "latency median", "latency p95", "throughput vs engine.Run").Labels(2)
	for _, c := range o.concurrency {
		batches := []*batch{{name: "engine.Run in process", run: direct(realEng)}}
		for _, m := range modes {
			batches = append(batches, &batch{name: httpName("POST /v1/executions over HTTP", m), run: viaHTTP(throughput[c][m.label], m)})
		}
		for range o.rounds {
			for _, bt := range batches {
				if err := bt.do(o.invocations, c); err != nil {
					return err
				}
			}
		}
		for _, bt := range batches {
			t.Row(strconv.Itoa(c), bt.name, fmt.Sprintf("%.1f", bt.rate()), table.MS(table.Pct(bt.lat, 50)), table.MS(table.Pct(bt.lat, 95)),
				fmt.Sprintf("%.2fx", bt.rate()/batches[0].rate()))
		}
	}
	t.Print(os.Stdout)
	return nil
}

// batch is one throughput variant: rounds of invocations run by a fixed
// number of workers.
type batch struct {
	name string
	run  func() error
	lat  []time.Duration // every invocation's latency
	n    int             // invocations timed
	wall time.Duration   // sum of the rounds' wall clocks
}

// do runs n invocations with c workers, each taking the next invocation as
// soon as its previous one returned.
func (b *batch) do(n, c int) error {
	lat := make([]time.Duration, n)
	errs := make([]error, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range c {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				t := time.Now()
				errs[i] = b.run()
				lat[i] = time.Since(t)
			}
		})
	}
	wg.Wait()
	b.wall += time.Since(start)
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("%s at concurrency %d: %w", b.name, c, err)
		}
	}
	b.lat = append(b.lat, lat...)
	b.n += n
	return nil
}

// rate is the invocations per second over all rounds.
func (b *batch) rate() float64 { return float64(b.n) / b.wall.Seconds() }

// mode is one setting the HTTP variants run with: a SQLite synchronous
// setting and tracing off or on; label names it.
type mode struct{ sync, trace, label string }

// startTracing sets up the daemon's tracing (internal/telemetry.Setup)
// with the sampler at 1.0, exporting over OTLP/HTTP to a receiver in this
// process that reads each request whole and drops it, and leaves it off
// until a variant turns it on (telemetry.SetTracing). stop flushes it and
// stops the receiver.
func startTracing(ctx context.Context) (stop func(), err error) {
	var batches atomic.Int64
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		batches.Add(1)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.URL, "OTEL_TRACES_SAMPLER": "always_on"}
	for k, v := range env {
		os.Setenv(k, v)
	}
	shutdown, err := telemetry.Setup(ctx, os.Getenv, "bench")
	if err != nil {
		rcv.Close()
		return nil, err
	}
	telemetry.SetTracing(false)
	return func() {
		_ = shutdown(ctx)
		rcv.Close()
		fmt.Printf("\ntracing: the receiver took %d batches of spans\n", batches.Load())
	}, nil
}
