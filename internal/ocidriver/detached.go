package ocidriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/supervisor"
)

// A detached sandbox (sandbox.Spec.Detached) is run by a shim (package
// supervisor) instead of this process: the shim starts `<runtime> run` with
// the guest's channel as its own pipes (Config.ChannelFDs says which
// descriptors) and serves the guest on a socket in
// StateDir/shims/<id>, so the sandbox outlives this process and Reattach
// reaches it again. The shim's record carries what Reattach needs to serve
// it (shimRecord) and the sandbox's labels; its MAC, under the key in
// StateDir/shims, is how this driver knows the record is its own.

// shimState is what a detached sandbox holds of its shim.
type shimState struct {
	binary string           // the runtime, as the shim runs it
	conn   *supervisor.Conn // nil until connected
	// deadline is the sandbox's when it starts (sandbox.Spec.Deadline);
	// SetDeadline moves it in the shim and its record.
	deadline time.Time
}

var _ sandbox.Deadliner = (*sbx)(nil)

// endArgv gives m the runtime's commands that end the sandbox, which its
// shim runs when it ends the sandbox by itself (supervisor.Meta.KillArgv,
// DeleteArgv), as Destroy runs them.
func (s *sbx) endArgv(m *supervisor.Meta, binary string) {
	m.KillArgv = append([]string{binary}, s.d.runtimeArgs(s.network, "kill", s.id, "KILL")...)
	m.DeleteArgv = append([]string{binary}, s.d.runtimeArgs(s.network, "delete", "--force", s.id)...)
}

// SetDeadline moves the deadline at which the sandbox's shim ends it by
// itself (sandbox.Deadliner): in the shim, and in its record, which a
// restarted daemon reads.
func (s *sbx) SetDeadline(ctx context.Context, t time.Time) error {
	if s.shim == nil || s.shim.conn == nil {
		return fmt.Errorf("sandbox %s is not detached: it ends with its creator and has no deadline: %w", s.id, errdefs.ErrFailedPrecondition)
	}
	// The record is rewritten whole: Bind must not write it meanwhile.
	s.bindMu.Lock()
	defer s.bindMu.Unlock()
	key, err := supervisor.LoadKey(s.d.shimRoot())
	if err != nil {
		return err
	}
	m, err := s.d.readShimMeta(s.id)
	if err != nil {
		return fmt.Errorf("moving the deadline of sandbox %s: %w", s.id, err)
	}
	m.Deadline = t.UTC()
	if err := supervisor.WriteMeta(s.d.shimDir(s.id), key, m); err != nil {
		return fmt.Errorf("moving the deadline of sandbox %s: %w", s.id, err)
	}
	if err := s.shim.conn.EndAt(t); err != nil {
		return fmt.Errorf("moving the deadline of sandbox %s: %v: %w", s.id, err, errdefs.ErrUnavailable)
	}
	return nil
}

// shimRecord is the driver's own part of a shim's record.
type shimRecord struct {
	Limits  sandbox.Limits      `json:"limits"`
	Network sandbox.NetworkMode `json:"network,omitempty"`
}

func (d *Driver) shimRoot() string         { return filepath.Join(d.cfg.StateDir, "shims") }
func (d *Driver) shimDir(id string) string { return filepath.Join(d.shimRoot(), id) }

// readShimMeta reads sandbox id's shim record, checked as this driver's.
func (d *Driver) readShimMeta(id string) (supervisor.Meta, error) {
	dir := d.shimDir(id)
	if _, err := os.Stat(dir); err != nil {
		return supervisor.Meta{}, err
	}
	key, err := supervisor.LoadKey(d.shimRoot())
	if err != nil {
		return supervisor.Meta{}, err
	}
	m, err := supervisor.ReadMeta(dir, key)
	if err != nil {
		return supervisor.Meta{}, err
	}
	if m.Driver != d.cfg.Name || m.Bundle != d.bundleDir(id) {
		return supervisor.Meta{}, fmt.Errorf("shim %s is of driver %q and bundle %s: %w", id, m.Driver, m.Bundle, supervisor.ErrNotOurs)
	}
	return m, nil
}

// startShim records the sandbox for its shim, starts the shim and waits for
// the guest's hello through it.
func (s *sbx) startShim(ctx context.Context) error {
	d := s.d
	key, err := supervisor.LoadKey(d.shimRoot())
	if err != nil {
		return err
	}
	m := supervisor.Meta{
		ID: s.id, Driver: d.cfg.Name, Bundle: d.bundleDir(s.id),
		Created:    time.Now().UTC(),
		Argv:       append([]string{s.shim.binary}, d.runtimeArgs(s.network, d.runArgs(s.id)...)...),
		Env:        runtimeEnv,
		ChannelFDs: d.cfg.ChannelFDs,
		Deadline:   s.shim.deadline,
	}
	s.endArgv(&m, s.shim.binary)
	if err := s.writeMeta(key, m, s.labels, s.unbound, s.Guest.Limits); err != nil {
		return err
	}
	if err := supervisor.Launch(ctx, d.cfg.Shim, d.shimDir(s.id)); err != nil {
		return err
	}
	return s.connect(ctx)
}

// writeMeta writes m, with the sandbox's labels, binding state, limits and
// network, as its shim's record.
func (s *sbx) writeMeta(key []byte, m supervisor.Meta, labels map[string]string, unbound bool, limits sandbox.Limits) error {
	data, err := json.Marshal(shimRecord{Limits: limits, Network: s.network})
	if err != nil {
		return err
	}
	m.Labels, m.Unbound, m.Data = labels, unbound, data
	return supervisor.WriteMeta(s.d.shimDir(s.id), key, m)
}

// connect dials the sandbox's shim and waits for the guest's hello, which
// the shim sends when the guest does or replays.
func (s *sbx) connect(ctx context.Context) error {
	dir := s.d.shimDir(s.id)
	conn, err := supervisor.Dial(ctx, dir)
	if err != nil {
		return err
	}
	s.shim.conn = conn
	s.Guest.In, s.Guest.Frames = conn, conn
	s.Guest.ReservedIDs = conn.Status().LastID
	if err := s.Guest.AwaitReady(ctx, s.d.cfg.ReadyTimeout); err != nil {
		return sandboxkit.StartError(s.d.cfg.Name, err, supervisor.Log(dir))
	}
	return nil
}

// stopShim ends a detached sandbox's runtime and shim: through the shim
// when connected (the guest's stdin closes, the guest kills everything and
// exits, and the runtime and shim with it), else, or when that does not
// end it, by killing the runtime and then the shim.
func (s *sbx) stopShim(ctx context.Context) {
	dir := s.d.shimDir(s.id)
	// gone waits for the shim to exit. The connection ends as it exits,
	// which the guest's client sees first; the process itself is polled
	// (it is no child of this one), finely, as it is gone soon after.
	gone := func(within time.Duration) bool {
		deadline := time.Now().Add(within)
		if c := s.Guest.Client(); c != nil {
			select {
			case <-c.Done():
			case <-time.After(within):
			}
		}
		for ; ; time.Sleep(time.Millisecond) {
			if _, running := supervisor.Running(dir); !running {
				return true
			}
			if time.Now().After(deadline) {
				return false
			}
		}
	}
	var conn *supervisor.Conn
	if s.shim != nil {
		conn = s.shim.conn
	}
	if _, running := supervisor.Running(dir); running && conn == nil {
		// One this process never connected to (Reap, Reattach's
		// unproven): its shim is asked as a connected one is. That is
		// how a sandbox created ahead ends soon (ahead.go): the runtime
		// cannot kill a sandbox that was never started.
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if c, err := supervisor.Dial(dctx, dir); err == nil {
			conn = c
		}
		cancel()
	}
	if _, running := supervisor.Running(dir); running {
		if conn == nil || conn.CloseGuestStdin() != nil || !gone(2*time.Second) {
			s.kill(ctx)
			if !gone(10 * time.Second) {
				kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				_ = supervisor.KillShim(kctx, dir)
				cancel()
			}
		}
	}
	if conn != nil {
		conn.Close()
	}
}

// Reattach reaches every detached sandbox of this driver again: each whose
// record is this driver's (its MAC under the shims' key, its driver, its
// bundle), whose labels carry match, whose shim runs and answers for it
// (the socket's peer is the shim the record's directory names) and whose
// guest greets and answers a ping is returned, connected, with its
// kernels. One proven not ours (ErrNotOurs: a record it did not write, of
// another driver or bundle, without match's labels, or a socket its shim
// does not serve) or dead (its shim is gone) is destroyed. One whose shim
// runs but does not answer in time is kept and named in the error: it
// may be slow, not lost, and a later Reattach tries it again. When ctx
// ends, Reattach stops and keeps the sandboxes it has not proven. An
// exec a dead client left running is cancelled.
func (d *Driver) Reattach(ctx context.Context, match map[string]string) ([]sandbox.Sandbox, error) {
	ids, err := supervisor.List(d.shimRoot())
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	key, err := supervisor.LoadKey(d.shimRoot())
	if err != nil {
		return nil, err
	}
	d.adoptOnce.Do(d.adoptBundles)
	var out []sandbox.Sandbox
	var errs []error
	for _, id := range ids {
		if d.isSpared(id) {
			// This process's own, being made or created ahead
			// (ahead.go): not a dead daemon's to reach again or end.
			continue
		}
		sb, err := d.reattach(ctx, id, key, match)
		if err == nil {
			out = append(out, sb)
			continue
		}
		if ctx.Err() != nil {
			errs = append(errs, fmt.Errorf("reattaching sandbox %s: %w; it and the sandboxes after it are kept", id, ctx.Err()))
			break
		}
		if _, running := supervisor.Running(d.shimDir(id)); running && !errors.Is(err, supervisor.ErrNotOurs) {
			errs = append(errs, fmt.Errorf("keeping sandbox %s, whose shim runs but did not answer (a later Reattach tries it again): %w", id, err))
			continue
		}
		if err := d.destroyUnproven(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

// reattachTimeout bounds the handshake and ping of one sandbox that
// Reattach tries.
var reattachTimeout = 30 * time.Second

// reattach proves sandbox id this driver's and connects to it.
func (d *Driver) reattach(ctx context.Context, id string, key []byte, match map[string]string) (_ *sbx, err error) {
	if err := sandbox.CheckID(id); err != nil {
		return nil, fmt.Errorf("%w: %w", err, supervisor.ErrNotOurs)
	}
	dir := d.shimDir(id)
	m, err := supervisor.ReadMeta(dir, key)
	if err != nil {
		return nil, err
	}
	var rec shimRecord
	switch {
	case m.Driver != d.cfg.Name || m.Bundle != d.bundleDir(id) || len(m.Argv) == 0:
		return nil, fmt.Errorf("shim %s is of driver %q and bundle %s: %w", id, m.Driver, m.Bundle, supervisor.ErrNotOurs)
	case len(m.CreateArgv) > 0:
		// A sandbox created ahead (ahead.go) that no restore finished:
		// it holds nothing anyone waits for.
		return nil, fmt.Errorf("sandbox %s was created ahead and never restored into: %w", id, supervisor.ErrNotOurs)
	case !hasLabels(m.Labels, match):
		return nil, fmt.Errorf("sandbox %s has labels %v, not %v: %w", id, m.Labels, match, supervisor.ErrNotOurs)
	case json.Unmarshal(m.Data, &rec) != nil || rec.Limits.Check(sandbox.Limits{}) != nil:
		return nil, fmt.Errorf("shim %s: the driver's record does not decode: %w", id, supervisor.ErrNotOurs)
	}
	if _, ok := d.cfg.NetworkArgs[rec.Network]; !ok {
		return nil, fmt.Errorf("shim %s: network mode %q: %w", id, rec.Network, supervisor.ErrNotOurs)
	}
	if _, running := supervisor.Running(dir); !running {
		return nil, fmt.Errorf("the shim of sandbox %s is gone: %w", id, errdefs.ErrNotFound)
	}
	s := d.newSbx(id, rec.Limits)
	s.network, s.labels, s.unbound = rec.Network, m.Labels, m.Unbound
	s.shim = &shimState{binary: m.Argv[0], deadline: m.Deadline}
	ctx, cancel := context.WithTimeout(ctx, reattachTimeout)
	defer cancel()
	defer func() {
		if err != nil && s.shim.conn != nil {
			s.Guest.MarkGone()
			s.shim.conn.Close()
		}
	}()
	if err := s.connect(ctx); err != nil {
		return nil, err
	}
	if _, err := s.Guest.Resume(ctx); err != nil {
		return nil, err
	}
	d.spare(id, true)
	return s, nil
}

// destroyUnproven destroys what a shim directory that Reattach could not
// prove is left of: the sandbox of its name, or, when the name is no
// sandbox ID, the directory alone.
func (d *Driver) destroyUnproven(ctx context.Context, id string) error {
	if sandbox.CheckID(id) != nil {
		return os.RemoveAll(filepath.Join(d.shimRoot(), id))
	}
	return d.newSbx(id, sandbox.Limits{}).Destroy(ctx)
}

// spare adds sandbox id to the spared ones, or removes it; adding reports
// false when it is spared already.
func (d *Driver) spare(id string, on bool) bool {
	d.sparedMu.Lock()
	defer d.sparedMu.Unlock()
	if !on {
		delete(d.spared, id)
		return true
	}
	if d.spared[id] {
		return false
	}
	if d.spared == nil {
		d.spared = map[string]bool{}
	}
	d.spared[id] = true
	return true
}

func (d *Driver) isSpared(id string) bool {
	d.sparedMu.Lock()
	defer d.sparedMu.Unlock()
	return d.spared[id]
}
