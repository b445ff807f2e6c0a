package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// A pool's sandbox, once taken, is bound to whom it serves (bind), and a
// one-shot pool's runs one program: the interpreter waiting in it
// (pool.py) is sent the code and the program's stdin (feed), and the
// engine keeps the run's timeout (runWarm); see pool.go.

// runWarm runs req in w, which acquire bound to it, as Run runs it in a
// fresh sandbox, and destroys w. The program has ended when it returns
// (the guest stopped or killed what it left), and no one else can take w: its
// destruction (15-25 ms), and then the pool's refill, go on in the
// background, as an egress network's removal does, and Wait waits for
// the destruction.
func (e *Engine) runWarm(ctx context.Context, req Request, p *pool, w *warm, limits sandbox.Limits) (*Result, error) {
	defer e.closing.Go(func() {
		_, sp := telemetry.Start(ctx, telemetry.SandboxDestroy, telemetry.Driver(p.drv.Name()))
		p.giveBack(ctx, w)
		sp.End(nil)
	})
	if req.OnStart != nil {
		if err := req.OnStart(p.drv.Name()); err != nil {
			return nil, fmt.Errorf("recording the start: %w", err)
		}
	}
	w.out.Store(&req.OnOutput)
	start := time.Now()
	go feed(w.ex, p.rt.FileName, req.Code, req.Stdin)
	waited := make(chan struct{})
	var (
		res *sandbox.Result
		err error
	)
	// The wait does not end with ctx: the select below cancels the exec
	// and then reads its result, which a cut-short run reports.
	go func() {
		res, err = w.ex.Wait(context.WithoutCancel(ctx))
		close(waited)
	}()
	timer := time.NewTimer(limits.Timeout)
	defer timer.Stop()
	timedOut := false
	select {
	case <-waited:
	case <-timer.C:
		timedOut = true
		_ = w.ex.Cancel()
		<-waited
	case <-ctx.Done():
		_ = w.ex.Cancel()
		<-waited
		cut := fmt.Errorf("running in sandbox %s: %w", w.sb.ID(), ctx.Err())
		if err != nil {
			return nil, cut
		}
		// What it printed and used, as a cold run cut short reports it.
		res.Status, res.Duration = sandbox.StatusKilled, time.Since(start)
		return nil, &sandbox.CutShortError{Result: res, Err: cut}
	}
	if err != nil {
		return nil, err
	}
	if p.tool.Template != "" {
		if err := startFailure(p.tool.Template, res); err != nil {
			return nil, err
		}
	}
	r := resultOf(res, p.drv.Name(), p.rt.Name)
	r.DurationMS = time.Since(start).Milliseconds()
	r.Network = networkOf(false, len(p.tool.Credentials) > 0) // pools serve no request for egress
	if timedOut && res.Status == sandbox.StatusKilled {
		// As a cold run's timeout (the guest's timer) reports it.
		r.Status, r.ExitCode, r.Signal = sandbox.StatusTimedOut, -1, 0
	}
	return r, nil
}

// feed sends the program to a pool interpreter (pool.py's stdin): the
// header, the code, then the program's stdin, and closes it. A program
// that ends before reading all of its stdin makes the writes fail, as a
// cold run's feeding of its stdin does.
func feed(ex sandbox.Exec, name string, code, stdin []byte) {
	in := ex.Stdin()
	h, _ := json.Marshal(map[string]any{"path": "/tmp/" + name, "argv": []string{"/tmp/" + name}, "size": len(code)})
	msg := append(append(poolHeaderLen(len(h)), h...), code...)
	if _, err := in.Write(msg); err == nil && len(stdin) > 0 {
		_, _ = in.Write(stdin)
	}
	_ = in.Close()
}

// poolHeaderLen is the line before a header to pool.py: its length n in 8
// decimal digits and a newline (a header, a path, argv and a size, is far
// below 10^8 bytes).
func poolHeaderLen(n int) []byte { return fmt.Appendf(nil, "%08d\n", n) }

// bind binds w, which take returned, to labels (the pool's own stay, and
// labels must agree with them) and limits, and says whether it did; a
// sandbox it cannot bind is destroyed (logged).
func (p *pool) bind(ctx context.Context, w *warm, labels map[string]string, limits sandbox.Limits) bool {
	added := map[string]string{}
	for k, v := range labels {
		if _, ok := p.labels[k]; !ok {
			added[k] = v
		} else if p.labels[k] != v {
			p.giveBack(ctx, w)
			p.e.log.Warn("labels disagree with the pool's", "pool", p.name, "label", k)
			return false
		}
	}
	if err := p.binder.Bind(ctx, w.sb, sandbox.Binding{Labels: added, Limits: limits}); err != nil {
		p.e.log.Warn("binding a pool sandbox", "pool", p.name, "sandbox", w.sb.ID(), "err", err)
		p.giveBack(ctx, w)
		return false
	}
	return true
}

// counted reports a hit or a miss of p.
func (p *pool) counted(hit bool) {
	switch o := p.e.poolObs; {
	case o == nil:
	case hit:
		o.PoolHit(p.name)
	default:
		o.PoolMiss(p.name)
	}
}

func (e *Engine) observeSize(pool string, n int) {
	if e.poolObs != nil {
		e.poolObs.PoolSize(pool, n)
	}
}

// acquire takes a bound sandbox of a pool for req, or returns nil: no pool
// of req's tool and runtime, one that cannot serve it, an empty one, or a
// Bind that failed (logged; that sandbox is destroyed).
func (e *Engine) acquire(ctx context.Context, req Request, tool tools.Tool, limits sandbox.Limits) (*pool, *warm) {
	e.poolsMu.Lock()
	pools := e.pools
	e.poolsMu.Unlock()
	for _, p := range pools {
		if p.session || p.tool.Name != tool.Name || p.rt.Name != req.Runtime {
			continue
		}
		ctx, sp := telemetry.Start(ctx, telemetry.PoolAcquire)
		var w *warm
		if p.serves(req, tool, limits) {
			w = p.takeOrWait(ctx)
		}
		if w == nil || !p.bind(ctx, w, req.Labels, sandbox.Limits{Memory: limits.Memory, CPU: limits.CPU}) {
			p.counted(false)
			sp.EndAs("miss", nil)
			return nil, nil
		}
		p.counted(true)
		sp.EndAs("hit", nil)
		return p, w
	}
	return nil, nil
}

// acquireSession takes a session pool's sandbox for a session of spec,
// which CheckSession resolved to tool, drv and rt, binds it and returns it
// as the session's, its kernel ready; or returns nil, for a cold
// OpenSession, as acquire does.
func (e *Engine) acquireSession(ctx context.Context, spec SessionSpec, tool tools.Tool, drv sandbox.Driver, rt image.Runtime) *Session {
	e.poolsMu.Lock()
	pools := e.pools
	e.poolsMu.Unlock()
	limits := spec.Limits.WithDefaults(e.Limits(tool))
	for _, p := range pools {
		if !p.session || p.tool.Name != tool.Name || p.rt.Name != rt.Name {
			continue
		}
		ctx, sp := telemetry.Start(ctx, telemetry.PoolAcquire)
		var w *warm
		if p.servesSession(spec, drv, limits) {
			w = p.takeOrWait(ctx)
		}
		if w == nil || !p.bind(ctx, w, spec.Labels, sandbox.Limits{Memory: limits.Memory, CPU: limits.CPU, Timeout: limits.Timeout}) {
			p.counted(false)
			sp.EndAs("miss", nil)
			return nil
		}
		// The sandbox is the session's now, as a cold one would be: out of
		// the pool's count, in the budget as the session's, and a kernel
		// restarted in it is a cold kernel.
		p.handOver(w)
		ks, pre, err := e.sessionKernel(tool, rt, nil)
		if d, ok := w.sb.(sandbox.Deadliner); ok && err == nil {
			// The pool's deadline goes, also for a session without one.
			err = d.SetDeadline(ctx, spec.Deadline)
		}
		var s *Session
		if err == nil {
			s, err = newSession(w.sb, p.drv.Name(), rt, limits, ks)
		}
		if err != nil {
			e.log.Warn("serving a session from a pool sandbox", "pool", p.name, "sandbox", w.sb.ID(), "err", err)
			w.destroy(ctx)
			p.counted(false)
			sp.EndAs("miss", err)
			return nil
		}
		s.kernel, s.mem, s.prelude = w.k, w.release, pre
		p.counted(true)
		sp.EndAs("hit", nil)
		return s
	}
	return nil
}

// takeOrWait takes a sandbox of p, which can serve the caller, waiting
// for a refill about to end (awaitRefill) when p is empty; a caller left
// without one is demand (pooldemand.go).
func (p *pool) takeOrWait(ctx context.Context) *warm {
	if w := p.take(ctx); w != nil {
		return w
	}
	// Found empty: demand, whether a refill then serves it or not.
	p.demanded()
	if p.awaitRefill(ctx) {
		return p.take(ctx)
	}
	return nil
}
