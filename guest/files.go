package guest

import (
	"context"
	"fmt"
	"io"

	"github.com/stockade-sh/stockade/errdefs"
)

// File operations act below Roots only, on paths ValidatePath accepts: the
// guest walks each path a component at a time from the root's directory,
// never following a symlink, so that code in the sandbox cannot redirect
// them, even by swapping a component during the operation. The host never
// opens a host path named by the guest: data travels in frames.

// checkPath refuses, before anything is sent, a path the guest would
// refuse.
func checkPath(op, p string, root bool) error {
	if _, _, err := ValidatePath(p, root); err != nil {
		return fmt.Errorf("%s: %v: %w", op, err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// WriteFile writes what r yields, at most max bytes, to the file at path
// with the permission bits mode (0 means 0644), creating missing parent
// directories. The file appears whole (by rename) or not at all: more than
// max bytes, a cancelled ctx or a lost guest leave no file. It returns the
// bytes written.
func (c *Client) WriteFile(ctx context.Context, path string, mode uint32, r io.Reader, max int64) (int64, error) {
	op := "writing " + path
	if err := checkPath(op, path, false); err != nil {
		return 0, err
	}
	if mode > 0o7777 {
		return 0, invalid("%s: mode %#o has bits outside 07777", op, mode)
	}
	var res WriteResult
	done := make(chan error, 1)
	id, err := c.register(&waiter{
		handle: func(f Frame) (bool, error) { return answer(f, op, &res, done) },
		fail:   func(err error) { done <- fmt.Errorf("%s: %w", op, err) },
	})
	if err != nil {
		return 0, err
	}
	abort := func(err error) (int64, error) {
		// The guest drops the temporary file; its answer, if any, is
		// dropped here.
		_ = c.post(FrameCancel, id, nil)
		c.forget(id)
		return 0, err
	}
	if err := c.sendJSON(ctx, FrameWrite, id, WriteRequest{Path: path, Mode: mode}); err != nil {
		return abort(fmt.Errorf("%s: %w", op, err))
	}
	var sent int64
	buf := make([]byte, MaxChunk)
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if sent+int64(n) > max {
				return abort(fmt.Errorf("%s: more than %d bytes: %w", op, max, errdefs.ErrTooLarge))
			}
			select {
			case err := <-done:
				// The guest answered before the end: a refusal.
				c.forget(id)
				if err == nil {
					err = fmt.Errorf("%s: answered before the end: %w", op, ErrProtocol)
				}
				return 0, err
			default:
			}
			if err := c.send(ctx, FrameData, id, buf[:n]); err != nil {
				return abort(fmt.Errorf("%s: %w", op, err))
			}
			sent += int64(n)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return abort(fmt.Errorf("%s: reading the data: %w", op, rerr))
		}
	}
	if err := c.send(ctx, FrameEnd, id, nil); err != nil {
		return abort(fmt.Errorf("%s: %w", op, err))
	}
	select {
	case err := <-done:
		if err != nil {
			return 0, err
		}
	case <-ctx.Done():
		return abort(fmt.Errorf("%s: %w", op, ctx.Err()))
	}
	if res.Size != sent {
		err := fmt.Errorf("%s: the guest wrote %d bytes of %d: %w", op, res.Size, sent, ErrProtocol)
		c.end(err)
		return 0, err
	}
	return sent, nil
}

// ReadFile reads at most max bytes of the regular file at path. The result
// says the file's size and mode, and whether it was longer than max; the
// host keeps max bytes at most, whatever the guest sends.
func (c *Client) ReadFile(ctx context.Context, path string, max int64) ([]byte, *ReadResult, error) {
	op := "reading " + path
	if err := checkPath(op, path, false); err != nil {
		return nil, nil, err
	}
	if max < 0 {
		return nil, nil, invalid("%s: negative size bound", op)
	}
	var (
		data []byte
		res  ReadResult
	)
	done := make(chan error, 1)
	id, err := c.register(&waiter{
		handle: func(f Frame) (bool, error) {
			switch f.Type {
			case FrameData:
				if len(f.Payload) > MaxChunk || int64(len(data))+int64(len(f.Payload)) > max {
					return true, fmt.Errorf("%s: more data than asked for: %w", op, ErrProtocol)
				}
				data = append(data, f.Payload...)
				return false, nil
			case FrameResult:
				if err := decodeReply(f.Payload, &res); err != nil {
					return true, err
				}
				if !res.Truncated && res.Size < int64(len(data)) {
					return true, fmt.Errorf("%s: %d bytes of a file of %d: %w", op, len(data), res.Size, ErrProtocol)
				}
				done <- nil
				return true, nil
			}
			return answer(f, op, nil, done)
		},
		fail: func(err error) { done <- fmt.Errorf("%s: %w", op, err) },
	})
	if err != nil {
		return nil, nil, err
	}
	if err := c.sendJSON(ctx, FrameRead, id, ReadRequest{Path: path, Max: max}); err != nil {
		c.forget(id)
		return nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	select {
	case err := <-done:
		if err != nil {
			return nil, nil, err
		}
		return data, &res, nil
	case <-ctx.Done():
		_ = c.post(FrameCancel, id, nil)
		c.forget(id)
		return nil, nil, fmt.Errorf("%s: %w", op, ctx.Err())
	}
}

// ListDir lists the directory at path (a root itself too), at most
// MaxListEntries entries; Truncated says there were more.
func (c *Client) ListDir(ctx context.Context, path string) (*ListResult, error) {
	op := "listing " + path
	if err := checkPath(op, path, true); err != nil {
		return nil, err
	}
	var res ListResult
	if err := c.call(ctx, FrameList, PathRequest{Path: path}, op, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Stat describes the file at path without following a symlink there.
func (c *Client) Stat(ctx context.Context, path string) (*Entry, error) {
	op := "stat " + path
	if err := checkPath(op, path, true); err != nil {
		return nil, err
	}
	var e Entry
	if err := c.call(ctx, FrameStat, PathRequest{Path: path}, op, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// Remove removes the file or empty directory at path; a symlink is removed
// itself, never followed.
func (c *Client) Remove(ctx context.Context, path string) error {
	op := "removing " + path
	if err := checkPath(op, path, false); err != nil {
		return err
	}
	return c.call(ctx, FrameRemove, PathRequest{Path: path}, op, nil)
}

// Mkdir creates the directory at path and its missing parents, with the
// permission bits mode (0 means 0755); an existing directory is success.
func (c *Client) Mkdir(ctx context.Context, path string, mode uint32) error {
	op := "creating directory " + path
	if err := checkPath(op, path, false); err != nil {
		return err
	}
	if mode > 0o7777 {
		return invalid("%s: mode %#o has bits outside 07777", op, mode)
	}
	return c.call(ctx, FrameMkdir, MkdirRequest{Path: path, Mode: mode}, op, nil)
}
