package sandboxkit

import (
	"context"
	"fmt"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/sandbox"
)

// ResumeExec is Resume for a guest restored from a checkpoint of a pool
// sandbox whose interpreter waited for its program (see Freeze): instead
// of cancelling the exec the earlier client left, it adopts it, as the
// Exec that req (the request the pool started it with: its exit notice,
// streamed stdin and OnOutput) would have started, and returns it. Its
// timeout starts now. The guest must run no kernel (a one-shot pool's
// sandbox has none). A guest that runs no exec is ErrFailedPrecondition
// (the restored interpreter died); the caller destroys the sandbox.
func (g *Guest) ResumeExec(ctx context.Context, req sandbox.ExecRequest) (sandbox.Exec, error) {
	if !req.ExitNotice || !req.StdinStream {
		return nil, fmt.Errorf("adopting an exec: only a pool's interpreter (exit notice, streamed stdin) is adopted: %w", errdefs.ErrInvalidArgument)
	}
	c, end, err := g.begin()
	if err != nil {
		return nil, err
	}
	p, err := c.Ping(ctx)
	end()
	if err != nil {
		return nil, g.connErr(err)
	}
	if len(p.Kernels) > 0 || len(p.Cells) > 0 {
		// A pool's one-shot sandbox has no kernel: this is not one.
		return nil, fmt.Errorf("sandbox %s: the restored guest runs kernels; only a one-shot pool's exec is adopted: %w", g.Sandbox, errdefs.ErrFailedPrecondition)
	}
	if p.Exec == 0 {
		return nil, fmt.Errorf("sandbox %s: the restored guest runs no exec to adopt: %w", g.Sandbox, errdefs.ErrFailedPrecondition)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.dead:
		return nil, fmt.Errorf("sandbox %s is no longer running: %w", g.Sandbox, errdefs.ErrFailedPrecondition)
	case g.running != nil:
		return nil, fmt.Errorf("sandbox %s runs another program; one runs at a time: %w", g.Sandbox, errdefs.ErrConflict)
	}
	var onOutput func(guest.Stream, []byte)
	if req.OnOutput != nil {
		onOutput = func(s guest.Stream, p []byte) { req.OnOutput(stream(s), p) }
	}
	ex, err := c.AdoptExec(p.Exec, true, guest.ExecOptions{OutputCap: g.Limits.OutputCap, OnOutput: onOutput})
	if err != nil {
		return nil, fmt.Errorf("adopting exec %d of sandbox %s: %w", p.Exec, g.Sandbox, g.connErr(err))
	}
	timeout := req.Timeout
	if timeout <= 0 || (g.Limits.Timeout > 0 && timeout > g.Limits.Timeout) {
		timeout = g.Limits.Timeout
	}
	h := &execHandle{g: g, req: req, cancel: make(chan struct{}), done: make(chan struct{})}
	h.oomBefore = g.Cgroup.OOMKills()
	h.cpuBefore.Store(int64(g.Cgroup.CPUUsage()))
	g.Cgroup.ResetPeak()
	h.start = time.Now()
	g.track(context.WithoutCancel(ctx), h, ex, timeout)
	return h, nil
}
