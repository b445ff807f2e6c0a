package engine

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// BenchmarkPoolRunLatency times a pooled one-shot's run (print(1)) in
// the engine, from its code sent to its first output and to its end, in
// a gVisor one-shot pool's sandbox started cold (and settled), one
// restored from the pool's checkpoint and warmed (poolsnap_exec.go), and
// one restored unwarmed (PoolOptions.Unwarmed), each bound as a run
// binds it and run a second after it was made, as a pool sandbox waits;
// the variants interleaved. Run with -benchtime=Nx.
func BenchmarkPoolRunLatency(b *testing.B) {
	testenv.RequiresRoot(b)
	testenv.RequiresBinary(b, "runsc")
	drivers, _ := shimDrivers(b, nil)
	pools := map[bool]*pool{}
	for _, warmed := range []bool{true, false} {
		e, err := New(drivers, "gvisor", image.Open(testenv.DataDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
			WithPools(PoolOptions{CheckpointDir: b.TempDir(), Unwarmed: !warmed}))
		if err != nil {
			b.Fatal(err)
		}
		p, err := e.newPool(PoolSpec{Runtime: "python", Size: 1}, map[string]string{LabelOwner: poolOwner}, false)
		if err != nil {
			b.Fatal(err)
		}
		pools[warmed] = p
	}
	ctx := context.Background()
	for _, p := range pools {
		w, _, err := p.refill(ctx) // the checkpoint, outside the measure
		if err != nil {
			b.Fatal(err)
		}
		_ = w.sb.Destroy(ctx)
	}
	restored := func(p *pool) func() (*warm, error) {
		return func() (*warm, error) {
			w, ok, err := p.refill(ctx)
			if err == nil && !ok {
				_ = w.sb.Destroy(ctx)
				b.Fatal("the refill was not restored from the checkpoint")
			}
			return w, err
		}
	}
	type variant struct {
		name         string
		p            *pool
		make         func() (*warm, error)
		first, ended []time.Duration
	}
	vs := []*variant{
		{name: "cold", p: pools[true], make: func() (*warm, error) {
			w, err := pools[true].create(ctx)
			if err == nil {
				err = settle(ctx, w)
			}
			return w, err
		}},
		{name: "restored-warmed", p: pools[true], make: restored(pools[true])},
		{name: "restored-unwarmed", p: pools[false], make: restored(pools[false])},
	}
	b.ResetTimer()
	for range b.N {
		for _, v := range vs {
			w, err := v.make()
			if err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
			time.Sleep(time.Second)
			if !v.p.bind(ctx, w, map[string]string{LabelExecution: "bench"}, sandbox.Limits{Memory: v.p.base.Memory, CPU: v.p.base.CPU}) {
				b.Fatalf("%s: the sandbox could not be bound", v.name)
			}
			var once sync.Once
			var first time.Duration
			start := time.Now()
			out := func(sandbox.Stream, []byte) { once.Do(func() { first = time.Since(start) }) }
			w.out.Store(&out)
			go feed(w.ex, v.p.rt.FileName, []byte("print(1)\n"), nil)
			res, err := w.ex.Wait(ctx)
			ended := time.Since(start)
			_ = w.sb.Destroy(ctx)
			if err != nil || strings.TrimSpace(string(res.Stdout)) != "1" {
				b.Fatalf("%s: got %v, %+v", v.name, err, res)
			}
			v.first, v.ended = append(v.first, first), append(v.ended, ended)
		}
	}
	b.StopTimer()
	for _, v := range vs {
		b.ReportMetric(ms(median(v.first)), v.name+"-first-ms")
		b.ReportMetric(ms(median(v.ended)), v.name+"-ended-ms")
		b.Logf("%-17s first %v ended %v", v.name, v.first, v.ended)
	}
}
