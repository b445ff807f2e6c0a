package ocidriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/oci"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/supervisor"
)

// A restore skips most of the runtime's start when it restores into a
// sandbox created ahead, a ready slot: `runsc create` of the bundle a
// restore of the checkpoint would build, run by a shim in its first phase
// (supervisor.Meta.CreateArgv), with the guest's channel as its pipes. The
// shim, the runtime's sandbox and gofer processes and the Sentry's boot
// are then done before a session asks; a Restore that finds a ready slot
// for its checkpoint rewrites the shim's record with `runsc restore` of
// that container and starts it (supervisor.Conn.Start): only the restore
// itself is left (BENCHMARKS.md, "Templates").
//
// A slot is made for one checkpoint's spec: PrepareRestore builds its
// bundle exactly as Restore would (oci.Build of the checkpoint's record,
// the current profile), and a Restore takes a slot only when the spec it
// would build is the same (aheadKey: the record's image, limits,
// /workspace, network, labels and runtime build; a restore that adds
// labels takes none). A slot holds no one's code or data: an empty
// Sentry and gofer (about 15.5 MB, the cgroup's memory after the create),
// with the checkpoint's labels and limits; its shim ends it when its
// directory goes, and Reattach and Reap end one a dead daemon left (its
// record names no start: Argv is empty until a Restore takes it, and
// CreateArgv stays until the restored guest answered). A slot nobody
// takes within aheadIdle is ended. Any failure of a slot's start
// destroys it and the Restore goes the usual way.

// maxAhead bounds the ready slots of one driver: a fork's 8, or 8 golden
// templates' one each (about 124 MB of memory).
const maxAhead = 8

// aheadIdle is how long a ready slot waits to be taken before it is
// ended: a checkpoint whose restores stopped (a golden template nobody
// opens) costs no memory once it has been idle that long, and its next
// restore goes the usual way. A variable for the tests.
var aheadIdle = 5 * time.Minute

// aheadSlot is one sandbox created ahead.
type aheadSlot struct {
	s      *sbx
	key    string
	expiry *time.Timer // ends it after aheadIdle (expireAhead)
}

// aheadSlots are a driver's ready slots. The zero value is ready to use.
type aheadSlots struct {
	mu      sync.Mutex
	ready   []*aheadSlot
	making  map[string]int // slots being made, by key, counted in maxAhead
	made    sync.WaitGroup // the slots being made
	dropped bool           // DropPrepared was called: none is made any more
	claimed int            // slots taken by a Restore (tests read it)
	failed  int            // slots whose start failed (tests read it)
	lastErr error          // the latest such failure, until AheadFailure

}

// aheadKey is what a restore's spec is built from (Restore's oci.Build),
// with the runtime build: a slot serves a restore of the same key only.
func aheadKey(rec snapshotRecord, labels map[string]string) string {
	if len(labels) == 0 {
		labels = nil
	}
	b, _ := json.Marshal(struct {
		Image     sandbox.Image
		Limits    sandbox.Limits
		Network   sandbox.NetworkMode
		Workspace int64
		Labels    map[string]string
		Unbound   bool
		Runtime   string
	}{rec.Image, rec.Limits, rec.Network, rec.Workspace, labels, rec.Unbound, rec.Runtime})
	return string(b)
}

// PrepareRestore creates a sandbox ahead for the checkpoint in dir, a
// ready slot that a later Restore of it (or of another checkpoint of the
// same spec) starts into, unless one is ready already: PrepareRestores
// with n 1.
func (d *Snapshotting) PrepareRestore(ctx context.Context, dir string) error {
	return d.PrepareRestores(ctx, dir, 1)
}

// PrepareRestores creates sandboxes ahead, at once, until n are ready or
// being made for the spec of the checkpoint in dir (n restores of it at
// once: a fork's). It checks dir as Restore does. At most maxAhead slots
// are kept (ErrResourceExhausted when fewer than n could be made);
// DropPrepared ends them. A daemon that calls it must call DropPrepared
// before it exits; one that dies leaves slots its next start reaps.
func (d *Snapshotting) PrepareRestores(ctx context.Context, dir string, n int) error {
	if len(d.cfg.Shim) == 0 {
		return fmt.Errorf("the %s driver has no shim to create a sandbox ahead: %w", d.cfg.Name, errdefs.ErrFailedPrecondition)
	}
	rec, binary, err := d.checkedSnapshot(ctx, dir)
	if err != nil {
		return err
	}
	key := aheadKey(rec, rec.Labels)
	d.ahead.mu.Lock()
	total, have := len(d.ahead.ready), d.ahead.making[key]
	for _, m := range d.ahead.making {
		total += m
	}
	for _, sl := range d.ahead.ready {
		if sl.key == key {
			have++
		}
	}
	want := min(n-have, maxAhead-total)
	switch {
	case d.ahead.dropped:
		d.ahead.mu.Unlock()
		return fmt.Errorf("the %s driver's sandboxes created ahead were dropped: %w", d.cfg.Name, errdefs.ErrFailedPrecondition)
	case n-have <= 0:
		d.ahead.mu.Unlock()
		return nil
	}
	if want > 0 {
		if d.ahead.making == nil {
			d.ahead.making = map[string]int{}
		}
		d.ahead.making[key] += want
		d.ahead.made.Add(want)
	}
	d.ahead.mu.Unlock()
	errs := make([]error, max(want, 0))
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = d.makeAhead(ctx, dir, rec, binary, key) })
	}
	wg.Wait()
	if want < n-have {
		errs = append(errs, fmt.Errorf("%d sandboxes are created ahead already: %w", maxAhead, errdefs.ErrResourceExhausted))
	}
	return errors.Join(errs...)
}

// makeAhead makes one slot for key (rec's, of the checkpoint in dir),
// counted in making by the caller.
func (d *Snapshotting) makeAhead(ctx context.Context, dir string, rec snapshotRecord, binary, key string) (err error) {
	var s *sbx
	defer func() {
		d.ahead.mu.Lock()
		if d.ahead.making[key]--; d.ahead.making[key] == 0 {
			delete(d.ahead.making, key)
		}
		if err == nil {
			sl := &aheadSlot{s: s, key: key}
			d.ahead.ready = append(d.ahead.ready, sl)
			sl.expiry = time.AfterFunc(aheadIdle, func() { d.expireAhead(sl) })
		}
		d.ahead.mu.Unlock()
		d.ahead.made.Done()
	}()
	labels := maps.Clone(rec.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	s, err = d.newRestored(rec, labels, binary)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = s.Destroy(context.WithoutCancel(ctx))
		}
	}()
	key2, err := supervisor.LoadKey(d.shimRoot())
	if err != nil {
		return err
	}
	bundle := d.bundleDir(s.id)
	// As a restore's (restore): the channel is the runtime's stdio, never
	// extra descriptors (Snapshotting is gVisor's, without ChannelFDs).
	create := []string{"create", "--bundle", bundle}
	m := supervisor.Meta{
		ID: s.id, Driver: d.cfg.Name, Bundle: bundle, Created: time.Now().UTC(),
		// The shim ends a slot still waiting a minute after the daemon
		// would have (expireAhead): one a dead daemon left ends anyway.
		Deadline:   time.Now().Add(aheadIdle + time.Minute),
		CreateArgv: append([]string{binary}, d.runtimeArgs(s.network, append(create, s.id)...)...),
		Env:        runtimeEnv,
	}
	s.endArgv(&m, binary)
	if err := s.writeMeta(key2, m, s.labels, s.unbound, rec.Limits); err != nil {
		return err
	}
	// The shim bounds its create itself (30 s) and says when it is done:
	// killing it mid-create, as Launch does when its ctx ends, would
	// leave a sandbox nothing tracks, so only a shim stuck well past its
	// own bound is killed.
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if err := supervisor.Launch(lctx, d.cfg.Shim, d.shimDir(s.id)); err != nil {
		return fmt.Errorf("creating a sandbox ahead for %s: %w", dir, err)
	}
	return nil
}

// DropPrepared ends every ready slot (PrepareRestore), those being made
// once made, and returns once they are gone. PrepareRestore makes none
// from then on: a daemon calls it as it stops.
func (d *Snapshotting) DropPrepared(ctx context.Context) error {
	d.ahead.mu.Lock()
	d.ahead.dropped = true
	d.ahead.mu.Unlock()
	d.ahead.made.Wait()
	d.ahead.mu.Lock()
	ready := d.ahead.ready
	d.ahead.ready = nil
	d.ahead.mu.Unlock()
	errs := make([]error, len(ready))
	var wg sync.WaitGroup
	for i, sl := range ready {
		sl.expiry.Stop()
		// Destroy asks the waiting shim to close the guest's input: it
		// removes the created sandbox (Meta.DeleteArgv) and exits.
		wg.Go(func() { errs[i] = sl.s.Destroy(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Prepared counts the ready slots, and the Restores that took one and
// whose start failed (the Restore then went the usual way).
func (d *Snapshotting) Prepared() (ready, claimed, failed int) {
	d.ahead.mu.Lock()
	defer d.ahead.mu.Unlock()
	return len(d.ahead.ready), d.ahead.claimed, d.ahead.failed
}

// AheadFailure returns, once, why the latest Restore that took a slot
// could not start it (the Restore then went the usual way), or nil: the
// caller logs it, as a Restore that succeeded has no way to.
func (d *Snapshotting) AheadFailure() error {
	d.ahead.mu.Lock()
	defer d.ahead.mu.Unlock()
	err := d.ahead.lastErr
	d.ahead.lastErr = nil
	return err
}

// takeAhead removes and returns a ready slot for key, nil when none is.
func (d *Snapshotting) takeAhead(key string) *sbx {
	d.ahead.mu.Lock()
	defer d.ahead.mu.Unlock()
	for i, sl := range d.ahead.ready {
		if sl.key == key {
			d.ahead.ready = append(d.ahead.ready[:i], d.ahead.ready[i+1:]...)
			sl.expiry.Stop()
			return sl.s
		}
	}
	return nil
}

// expireAhead ends sl once it has waited aheadIdle, unless a Restore took
// it or DropPrepared ends it (DropPrepared waits for it through made).
func (d *Snapshotting) expireAhead(sl *aheadSlot) {
	d.ahead.mu.Lock()
	i := slices.Index(d.ahead.ready, sl)
	if i < 0 || d.ahead.dropped {
		d.ahead.mu.Unlock()
		return
	}
	d.ahead.ready = slices.Delete(d.ahead.ready, i, i+1)
	d.ahead.made.Add(1)
	d.ahead.mu.Unlock()
	defer d.ahead.made.Done()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Nobody waits for the answer: what a failed Destroy leaves carries
	// the slot's record, which the next daemon's Reattach ends.
	_ = sl.s.Destroy(ctx)
}

// restoreAhead restores the checkpoint in dir (rec) into slot s, which
// Restore took for it: the shim's record gets the restore's command and
// the checkpoint's hello, the shim starts it, and the guest is resumed.
// On failure the slot is destroyed; the caller restores the usual way.
func (d *Snapshotting) restoreAhead(ctx context.Context, s *sbx, dir string, rec snapshotRecord, resume func(context.Context, *sbx) error) (err error) {
	defer func() {
		d.ahead.mu.Lock()
		d.ahead.claimed++
		if err != nil {
			d.ahead.failed++
			d.ahead.lastErr = fmt.Errorf("restoring %s into the sandbox created ahead %s: %w (its log: %q)", dir, s.id, err, supervisor.Log(d.shimDir(s.id)))
		}
		d.ahead.mu.Unlock()
		if err != nil {
			if s.shim.conn != nil {
				s.Guest.MarkGone()
			}
			_ = s.Destroy(context.WithoutCancel(ctx))
		}
	}()
	key, err := supervisor.LoadKey(d.shimRoot())
	if err != nil {
		return err
	}
	m, err := d.readShimMeta(s.id)
	if err != nil {
		return err
	}
	hello := rec.Hello
	m.Argv = append([]string{s.shim.binary}, d.runtimeArgs(s.network, "restore", "--background", "--image-path", filepath.Join(dir, snapshotImageDir), "--bundle", m.Bundle, s.id)...)
	// The slot's own deadline goes: a restore's record has none (a
	// Deadliner's SetDeadline moves it).
	m.Hello, m.LastID, m.Deadline = &hello, rec.LastID, time.Time{}
	if err := supervisor.WriteMeta(d.shimDir(s.id), key, m); err != nil {
		return err
	}
	conn, err := supervisor.Dial(ctx, d.shimDir(s.id))
	if err != nil {
		return err
	}
	s.shim.conn = conn
	if !conn.Status().Waiting {
		return fmt.Errorf("the sandbox created ahead %s does not wait for its start: %w", s.id, errdefs.ErrUnavailable)
	}
	if err := conn.Start(); err != nil {
		return err
	}
	s.Guest.In, s.Guest.Frames = conn, conn
	s.Guest.ReservedIDs = max(conn.Status().LastID, rec.LastID)
	if err := s.Guest.AwaitReady(ctx, d.cfg.ReadyTimeout); err != nil {
		return err
	}
	if err := resume(ctx, s); err != nil {
		return err
	}
	// The restored guest answered: the record stops naming a slot, which
	// Reattach would end.
	m.CreateArgv = nil
	if err := supervisor.WriteMeta(d.shimDir(s.id), key, m); err != nil {
		return err
	}
	return nil
}

// newRestored makes the bundle and cgroup of a new sandbox to restore
// rec into, with labels: the spec is built afresh, as Create builds it
// (a checkpoint holds no spec, and the saved sandbox had neither data
// mounts nor network nor user namespace: Checkpoint and NewSnapshotting
// refuse them). The sandbox is spared from Reap; the caller un-spares it
// once its record is written, or destroys it.
func (d *Snapshotting) newRestored(rec snapshotRecord, labels map[string]string, binary string) (_ *sbx, err error) {
	id := sandbox.NewID()
	if err := os.MkdirAll(filepath.Join(d.cfg.StateDir, "bundles"), 0o700); err != nil {
		return nil, fmt.Errorf("creating state directory: %w", err)
	}
	if !d.spare(id, true) {
		return nil, fmt.Errorf("sandbox %q already exists: %w", id, errdefs.ErrConflict)
	}
	bundle := d.bundleDir(id)
	if err := os.Mkdir(bundle, 0o700); err != nil {
		d.spare(id, false)
		return nil, fmt.Errorf("creating bundle directory: %w", err)
	}
	s := d.newSbx(id, rec.Limits)
	s.network, s.labels, s.unbound = rec.Network, labels, rec.Unbound
	s.shim = &shimState{binary: binary}
	defer func() {
		if err != nil {
			_ = s.Destroy(context.Background())
		}
	}()
	spec, err := oci.Build(oci.Options{
		ID: id, Spec: sandbox.Spec{Image: rec.Image, Labels: labels, Network: rec.Network, Workspace: rec.Workspace}, Limits: rec.Limits,
		GuestPath: d.cfg.GuestPath, CgroupsPath: s.cg.Path, Kernel: d.cfg.Kernel,
	})
	if err != nil {
		return nil, fmt.Errorf("building OCI spec: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := oci.WriteConfig(bundle, spec); err != nil {
		return nil, err
	}
	if err := s.cg.prepare(rec.Limits.Memory); err != nil {
		return nil, err
	}
	return s, nil
}

// checkedSnapshot reads and checks the checkpoint in dir as Restore
// does, and finds the runtime, which must be the build that saved it.
func (d *Snapshotting) checkedSnapshot(ctx context.Context, dir string) (snapshotRecord, string, error) {
	rec, err := d.readSnapshot(dir)
	if err != nil {
		return rec, "", err
	}
	binary, lerr := exec.LookPath(d.cfg.Binary)
	if lerr != nil {
		return rec, "", d.missingBinary(lerr)
	}
	// Another build's Sentry panics reading the image: refused before
	// anything starts.
	build, err := d.builds.build(ctx, binary)
	if err != nil {
		return rec, "", err
	}
	if err := checkBuild(rec.Runtime, build); err != nil {
		return rec, "", fmt.Errorf("restoring from %s: %w", dir, err)
	}
	return rec, binary, nil
}
