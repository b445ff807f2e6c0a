package sandboxkit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/sandbox"
)

// The Guest's file operations implement sandbox.Files over the guest
// protocol: the guest walks every path a component at a time below its
// root, never following a symlink (see guest.ValidatePath and
// cmd/stockade-guest), and the data travels in frames. They may run while
// an Exec runs.

var _ sandbox.Files = (*Guest)(nil)

// begin returns the guest's client for one request (a file operation, a
// kernel's start or listing), counted until end is called, or
// ErrFailedPrecondition when the guest is gone, frozen or not ready:
// Freeze refuses while a request is counted.
func (g *Guest) begin() (c *guest.Client, end func(), err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c = g.client.Load()
	if g.dead || c == nil {
		return nil, nil, fmt.Errorf("sandbox %s is no longer running: %w", g.Sandbox, errdefs.ErrFailedPrecondition)
	}
	g.ops++
	return c, g.endOp, nil
}

func (g *Guest) endOp() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ops--
}

// connErr gives an error of the guest client an errdefs class: a
// connection that ended is a sandbox that is gone.
func (g *Guest) connErr(err error) error {
	if errors.Is(err, guest.ErrClosed) && !errdefs.IsFailedPrecondition(err) {
		return fmt.Errorf("%w (sandbox %s is gone): %w", err, g.Sandbox, errdefs.ErrFailedPrecondition)
	}
	return err
}

func (g *Guest) WriteFile(ctx context.Context, p string, mode fs.FileMode, r io.Reader, max int64) (int64, error) {
	c, end, err := g.begin()
	if err != nil {
		return 0, err
	}
	defer end()
	if mode&^fs.ModePerm != 0 {
		return 0, fmt.Errorf("writing %s: mode %v has bits beside the permissions: %w", p, mode, errdefs.ErrInvalidArgument)
	}
	n, err := c.WriteFile(ctx, p, uint32(mode), r, max)
	return n, g.connErr(err)
}

func (g *Guest) ReadFile(ctx context.Context, p string, max int64) ([]byte, sandbox.FileInfo, error) {
	c, end, err := g.begin()
	if err != nil {
		return nil, sandbox.FileInfo{}, err
	}
	defer end()
	data, res, err := c.ReadFile(ctx, p, max)
	if err != nil {
		return nil, sandbox.FileInfo{}, g.connErr(err)
	}
	return data, sandbox.FileInfo{Name: path.Base(p), Type: sandbox.TypeFile, Size: res.Size, Mode: fs.FileMode(res.Mode) & fs.ModePerm}, nil
}

func (g *Guest) ListDir(ctx context.Context, p string) ([]sandbox.FileInfo, bool, error) {
	c, end, err := g.begin()
	if err != nil {
		return nil, false, err
	}
	defer end()
	res, err := c.ListDir(ctx, p)
	if err != nil {
		return nil, false, g.connErr(err)
	}
	out := make([]sandbox.FileInfo, len(res.Entries))
	for i, e := range res.Entries {
		out[i] = fileInfo(e)
	}
	return out, res.Truncated, nil
}

func (g *Guest) Stat(ctx context.Context, p string) (sandbox.FileInfo, error) {
	c, end, err := g.begin()
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	defer end()
	e, err := c.Stat(ctx, p)
	if err != nil {
		return sandbox.FileInfo{}, g.connErr(err)
	}
	return fileInfo(*e), nil
}

func (g *Guest) Remove(ctx context.Context, p string) error {
	c, end, err := g.begin()
	if err != nil {
		return err
	}
	defer end()
	return g.connErr(c.Remove(ctx, p))
}

func (g *Guest) Mkdir(ctx context.Context, p string, mode fs.FileMode) error {
	c, end, err := g.begin()
	if err != nil {
		return err
	}
	defer end()
	if mode&^fs.ModePerm != 0 {
		return fmt.Errorf("creating directory %s: mode %v has bits beside the permissions: %w", p, mode, errdefs.ErrInvalidArgument)
	}
	return g.connErr(c.Mkdir(ctx, p, uint32(mode)))
}

// fileInfo converts an entry the guest client has validated.
func fileInfo(e guest.Entry) sandbox.FileInfo {
	return sandbox.FileInfo{
		Name:    e.Name,
		Type:    sandbox.FileType(e.Type),
		Size:    e.Size,
		Mode:    fs.FileMode(e.Mode) & fs.ModePerm,
		ModTime: time.Unix(0, e.MTime),
	}
}
