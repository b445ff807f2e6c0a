package engine

// What a pool serves and how a sandbox is taken from it: the checks a
// run or a session passes to be served by a pool, and the taking of its
// oldest waiting sandbox.

import (
	"context"
	"errors"
	"time"

	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// serves says whether the pool's sandboxes can run req with limits, its
// effective limits: a one-shot pool of the same tool, runtime and driver,
// no network or mounts, and limits the pool's sandboxes can take (fits).
func (p *pool) serves(req Request, tool tools.Tool, limits sandbox.Limits) bool {
	switch {
	case p.session || tool.Name != p.tool.Name || req.Runtime != p.rt.Name:
		return false
	case req.Driver != "" && req.Driver != p.drv.Name():
		return false
	case req.Network || len(req.ExtraMounts) > 0:
		return false
	}
	return p.fits(limits)
}

// fits says whether a pool sandbox can take limits: by a Bind (tighter
// memory and CPU, and for a session's a shorter timeout) or by the engine
// (a one-shot's shorter timeout); its output cap, /tmp size and pids stay,
// and so do its memory and CPU where Bind cannot change them
// (Capabilities.BindFixedLimits: a Kubernetes pod's resources).
func (p *pool) fits(limits sandbox.Limits) bool {
	if p.drv.Capabilities().BindFixedLimits && (limits.Memory != p.base.Memory || limits.CPU != p.base.CPU) {
		return false
	}
	return limits.Check(p.base) == nil && limits.OutputCap == p.base.OutputCap &&
		limits.TmpSize == p.base.TmpSize && limits.Pids == p.base.Pids
}

// servesSession says whether the pool's sandboxes can be the sandbox of
// a session of spec on drv with limits, its effective limits: a session
// pool of the same tool, runtime and driver, /workspace size and limits
// it fits, and the runtime's own kernel.
func (p *pool) servesSession(spec SessionSpec, drv sandbox.Driver, limits sandbox.Limits) bool {
	return p.session && drv.Name() == p.drv.Name() && spec.Workspace == p.workspace &&
		spec.Kernel == nil && p.fits(limits)
}

// take removes a sandbox whose interpreter still waits, or returns nil:
// the oldest, which has had the longest to settle (a cold one's imports,
// a restored one's warm-up: poolsnap_exec.go) while the newest may
// still share the CPU with its refill's last steps. The caller must
// give it back (giveBack) once its run has ended. A sandbox too old,
// whose interpreter ended or of a template's former build is destroyed
// on the way, in the background (Engine.Wait waits for it): the oldest
// come first, and a request after a rebuild would otherwise wait for
// the whole pool's destruction.
func (p *pool) take(ctx context.Context) *warm {
	for {
		p.mu.Lock()
		if len(p.ready) == 0 {
			p.mu.Unlock()
			return nil
		}
		w := p.ready[0]
		p.ready = p.ready[1:]
		n := len(p.ready)
		if p.taken == nil {
			p.taken = map[*warm]time.Time{}
		}
		p.taken[w] = time.Now()
		p.mu.Unlock()
		p.e.observeSize(p.name, n)
		if time.Since(w.born) <= p.maxAge && !w.ended() && p.current(w) {
			return w
		}
		p.e.closing.Go(func() { p.giveBack(context.WithoutCancel(ctx), w) })
	}
}

// current says whether w runs the image its tool runs now: a template
// rebuilt since w was made has another.
func (p *pool) current(w *warm) bool {
	if p.tool.Template == "" {
		return true
	}
	img, _, err := p.e.imageOf(p.tool, p.rt)
	return err == nil && img.Digest == w.image
}

// ended says whether w's interpreter has ended (it died waiting).
func (w *warm) ended() bool {
	if w.k != nil {
		select {
		case <-w.k.Done():
			return true
		default:
			return false
		}
	}
	// A context already cancelled makes Wait a poll: it returns at once
	// unless the exec has ended. It is nobody's ctx to derive from.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := w.ex.Wait(ctx)
	return !errors.Is(err, context.Canceled)
}
