package engine

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// BenchmarkPoolRefill measures one pool refill, interleaved (each round
// makes one sandbox of every variant): a gVisor session pool's sandbox
// started cold (sandbox, kernel, numpy and pandas imported) and restored
// from the pool's checkpoint (poolsnap.go), a gVisor one-shot pool's
// likewise (its interpreter adopted, poolsnap_exec.go), and, for
// reference, the cold refills of runc's pools. Per variant it
// reports the median wall time until the refill returned, the median
// CPU time of the sandbox's cgroup then (the Sentry's on gVisor: the
// runtime's commands and the shim are not in it) and once it settled
// (settledCPU: a one-shot pool's create returns once its interpreter has
// started, before it has imported numpy and pandas), and this process's
// own CPU (user + system) per refill. Each sandbox is destroyed after
// it is measured, outside the timing. Run with -benchtime=Nx.
func BenchmarkPoolRefill(b *testing.B) {
	testenv.RequiresRoot(b)
	testenv.RequiresBinary(b, "runc")
	testenv.RequiresBinary(b, "runsc")
	drivers, _ := shimDrivers(b, nil)
	type variant struct {
		name    string
		p       *pool
		make    func(ctx context.Context, p *pool) (*warm, error)
		wall    []time.Duration
		cpu     []time.Duration
		settled []time.Duration
		self    []time.Duration
	}
	cold := func(ctx context.Context, p *pool) (*warm, error) { return p.create(ctx) }
	restored := func(ctx context.Context, p *pool) (*warm, error) {
		w, ok, err := p.refill(ctx)
		if err == nil && !ok {
			_ = w.sb.Destroy(context.Background())
			return nil, fmt.Errorf("the refill was not restored from the checkpoint")
		}
		return w, err
	}
	pools := map[string]*pool{}
	for _, driver := range []string{"gvisor", "runc"} {
		e, err := New(drivers, driver, image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
			WithPools(PoolOptions{SessionWorkspace: poolWorkspace, CheckpointDir: b.TempDir()}))
		if err != nil {
			b.Fatal(err)
		}
		for _, session := range []bool{true, false} {
			p, err := e.newPool(PoolSpec{Runtime: "python", Size: 1, Sessions: 1}, map[string]string{LabelOwner: poolOwner}, session)
			if err != nil {
				b.Fatal(err)
			}
			pools[fmt.Sprint(driver, session)] = p
		}
	}
	vs := []*variant{
		{name: "gvisor-session-cold", p: pools["gvisortrue"], make: cold},
		{name: "gvisor-session-restored", p: pools["gvisortrue"], make: restored},
		{name: "gvisor-oneshot-cold", p: pools["gvisorfalse"], make: cold},
		{name: "gvisor-oneshot-restored", p: pools["gvisorfalse"], make: restored},
		{name: "runc-session-cold", p: pools["runctrue"], make: cold},
		{name: "runc-oneshot-cold", p: pools["runcfalse"], make: cold},
	}
	ctx := context.Background()
	for _, k := range []string{"gvisortrue", "gvisorfalse"} {
		if pools[k].snap == nil {
			b.Fatalf("the gVisor pool %s has no checkpoint", k)
		}
		// The checkpoint is made once, outside the measure.
		w, _, err := pools[k].refill(ctx)
		if err != nil {
			b.Fatal(err)
		}
		_ = w.sb.Destroy(ctx)
	}
	b.ResetTimer()
	for range b.N {
		for _, v := range vs {
			self := processCPU()
			start := time.Now()
			w, err := v.make(ctx, v.p)
			if err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
			wall := time.Since(start)
			cpu, ok := cpuOf(w.sb)
			v.self = append(v.self, processCPU()-self)
			b.StopTimer()
			v.settled = append(v.settled, settledCPU(w.sb))
			if err := w.sb.Destroy(ctx); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if !ok {
				b.Fatalf("%s: the sandbox does not tell its CPU time", v.name)
			}
			v.wall, v.cpu = append(v.wall, wall), append(v.cpu, cpu)
		}
	}
	b.StopTimer()
	for _, v := range vs {
		b.ReportMetric(ms(median(v.wall)), v.name+"-wall-ms")
		b.ReportMetric(ms(median(v.cpu)), v.name+"-cgroup-cpu-ms")
		b.ReportMetric(ms(median(v.settled)), v.name+"-settled-cpu-ms")
		b.ReportMetric(ms(median(v.self)), v.name+"-self-cpu-ms")
		b.Logf("%-24s wall %v cgroup CPU %v settled %v own CPU %v", v.name, v.wall, v.cpu, v.settled, v.self)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// settledCPU is sb's cgroup CPU time once it has settled: less than 2 ms
// used in 200 ms (a one-shot pool's interpreter goes on importing numpy
// and pandas after create returns), or after 15 s.
func settledCPU(sb sandbox.Sandbox) time.Duration {
	last, _ := cpuOf(sb)
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		now, _ := cpuOf(sb)
		if now-last < 2*time.Millisecond {
			return now
		}
		last = now
	}
	return last
}

// processCPU is this process's own CPU time (the daemon's share of a
// refill: its children's, reaped at times of their own, would blur it).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
