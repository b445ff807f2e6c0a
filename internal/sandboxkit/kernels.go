package sandboxkit

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/sandbox"
)

// The Guest's kernels implement sandbox.Kernels over the guest protocol:
// the guest owns each kernel's processes (they stay between Execs until
// the kernel stops), and a kernel is named by the id of the request that
// started it.

var _ sandbox.Kernels = (*Guest)(nil)

func (g *Guest) StartKernel(ctx context.Context, spec sandbox.KernelSpec) (sandbox.Kernel, error) {
	if len(spec.Argv) == 0 || !strings.HasPrefix(spec.Argv[0], "/") {
		return nil, fmt.Errorf("a kernel's argv must start with an absolute path: %w", errdefs.ErrInvalidArgument)
	}
	c, end, err := g.begin()
	if err != nil {
		return nil, err
	}
	defer end()
	k, err := c.StartKernel(ctx, guest.KernelRequest{Argv: spec.Argv, Env: spec.Env, Cwd: spec.Cwd})
	if err != nil {
		return nil, g.connErr(err)
	}
	return g.kernel(k), nil
}

// kernel returns the one handle of k.
func (g *Guest) kernel(k *guest.Kernel) *kernel {
	g.mu.Lock()
	defer g.mu.Unlock()
	if h := g.kernels[k.ID()]; h != nil {
		return h
	}
	if g.kernels == nil {
		g.kernels = map[uint32]*kernel{}
	}
	h := &kernel{g: g, k: k}
	g.kernels[k.ID()] = h
	return h
}

// ListKernels asks the guest which kernels live and returns their handles,
// in the order they were started; a kernel an earlier client of the guest
// started is adopted (see ReservedIDs).
func (g *Guest) ListKernels(ctx context.Context) ([]sandbox.Kernel, error) {
	c, end, err := g.begin()
	if err != nil {
		return nil, err
	}
	defer end()
	p, err := c.Ping(ctx)
	if err != nil {
		return nil, g.connErr(err)
	}
	return g.adopt(c, p)
}

// adopt returns the handles of the kernels p says live, adopting those it
// has none of yet.
func (g *Guest) adopt(c *guest.Client, p *guest.Pong) ([]sandbox.Kernel, error) {
	ids := slices.Clone(p.Kernels)
	slices.Sort(ids)
	var out []sandbox.Kernel
	for _, id := range ids {
		g.mu.Lock()
		h := g.kernels[id]
		g.mu.Unlock()
		if h == nil {
			k, err := c.AdoptKernel(id)
			if err != nil {
				return nil, fmt.Errorf("adopting kernel %d of sandbox %s: %w", id, g.Sandbox, g.connErr(err))
			}
			h = g.kernel(k)
		}
		out = append(out, h)
	}
	return out, nil
}

// Resume makes a Guest reached again (see ReservedIDs) ready to serve: it
// asks the guest for its state and cancels the exec and interrupts the
// cells an earlier client left running, whose results nobody would read.
// It waits for the exec to end, and at most cancelGrace for the cells (a
// kernel that does not end its cell stays busy: Stop it). It returns the
// guest's kernels.
func (g *Guest) Resume(ctx context.Context) ([]sandbox.Kernel, error) {
	c, end, err := g.begin()
	if err != nil {
		return nil, err
	}
	defer end()
	interrupted := map[uint32]bool{}
	var cellsDeadline time.Time
	for {
		p, err := c.Ping(ctx)
		if err != nil {
			return nil, g.connErr(err)
		}
		cells := 0
		for _, id := range p.Cells {
			if cellsDeadline.IsZero() || time.Now().Before(cellsDeadline) {
				cells++
			}
			if interrupted[id] {
				continue
			}
			interrupted[id] = true
			if cellsDeadline.IsZero() {
				cellsDeadline = time.Now().Add(cancelGrace)
			}
			if err := c.CancelID(id); err != nil {
				return nil, g.connErr(err)
			}
		}
		if p.Exec == 0 && cells == 0 {
			// The kernels of this answer: a ping more costs a round trip
			// into a sandbox just restored, whose every system call is slow
			// until gVisor's fast path comes back.
			return g.adopt(c, p)
		}
		if p.Exec != 0 {
			if err := c.CancelID(p.Exec); err != nil {
				return nil, g.connErr(err)
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for an earlier client's exec or cells in sandbox %s to end: %w", g.Sandbox, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// kernel is one kernel's handle.
type kernel struct {
	g *Guest
	k *guest.Kernel
	// oomBefore is the cgroup's OOM kill count when the last cell
	// started (OOMKilled).
	oomBefore atomic.Int64
}

func (k *kernel) ID() string { return strconv.FormatUint(uint64(k.k.ID()), 10) }

func (k *kernel) Done() <-chan struct{} { return k.k.Done() }

func (k *kernel) Interrupt() error { return k.g.connErr(k.k.Interrupt()) }

func (k *kernel) Stop(ctx context.Context) error { return k.g.connErr(k.k.Stop(ctx)) }

func (k *kernel) Run(ctx context.Context, cell sandbox.Cell) (*sandbox.CellResult, error) {
	if err := k.g.beginCell(); err != nil {
		return nil, err
	}
	defer k.g.endCell()
	opts := guest.CellOptions{Stdin: cell.Stdin, OutputCap: k.g.limits().OutputCap, MaxDisplays: sandbox.MaxDisplays}
	if cell.OnOutput != nil {
		opts.OnOutput = func(s guest.Stream, p []byte) { cell.OnOutput(stream(s), p) }
	}
	if cell.OnDisplay != nil {
		opts.OnDisplay = func(d *guest.Display) { cell.OnDisplay(sandbox.Display{MimeType: d.MimeType, Data: d.Data}) }
	}
	k.oomBefore.Store(k.g.Cgroup.OOMKills())
	start := time.Now()
	out, err := k.k.Run(ctx, cell.Code, opts)
	if err != nil {
		return nil, k.g.connErr(err)
	}
	res := &sandbox.CellResult{
		Status:          sandbox.CellStatus(out.Result.Status),
		Stdout:          out.Stdout,
		Stderr:          out.Stderr,
		StdoutTruncated: out.StdoutTruncated,
		StderrTruncated: out.StderrTruncated,
		DisplaysDropped: out.DisplaysDropped,
		Duration:        time.Since(start),
	}
	if e := out.Result.Error; e != nil {
		res.Error = &sandbox.CellError{Name: e.Name, Value: e.Value, Traceback: e.Traceback}
	}
	if v := out.Result.Value; v != nil {
		res.Value = &sandbox.Display{MimeType: v.MimeType, Data: v.Data}
	}
	for _, d := range out.Displays {
		res.Displays = append(res.Displays, sandbox.Display{MimeType: d.MimeType, Data: d.Data})
	}
	return res, nil
}

// stream converts a guest stream.
func stream(s guest.Stream) sandbox.Stream {
	if s == guest.Stderr {
		return sandbox.Stderr
	}
	return sandbox.Stdout
}
