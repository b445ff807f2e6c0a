package ocidriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/internal/fsmode"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
	"github.com/stockade-sh/stockade/supervisor"
)

// Snapshotting is a Driver whose runtime saves a running sandbox and
// starts it again (runsc checkpoint and restore): gVisor's. runc's
// checkpoints go through CRIU, which cannot dump a process on the hosts
// Stockade is tested on, so the runc driver is a plain Driver and declares
// Snapshots false (driver/runc).
//
// A checkpoint directory is created root-only (0700), and the files the
// runtime writes the sandbox's memory to, readable by anyone (0644), are
// made root-only too (fsmode.PrivateTree). Restore trusts nothing in it
// that the driver did not write: it refuses a directory that is a
// symbolic link, another user's, or open to other users, and a record
// whose MAC under the shims' key (supervisor.LoadKey) does not hold, the
// MAC covering a digest of the image (hashed again unless the image's
// files are those, unchanged since, that this driver hashed before:
// digestCache); and it builds the restored sandbox's OCI spec afresh from
// the record (its image, limits and labels) with the current profile, so
// that no spec, hook or mount comes from the directory.
//
//	dir/sandbox.json  the sandbox's record (snapshotRecord), with its MAC
//	dir/image/        the runtime's image of its processes and memory
type Snapshotting struct {
	*Driver
	// ahead are the sandboxes created ahead for restores (ahead.go).
	ahead aheadSlots
	// digests spares Restore hashing an image it checked before.
	digests digestCache
	// builds names the runtime's build (runtimebuild.go).
	builds buildCache
}

var _ sandbox.LiveSnapshotter = (*Snapshotting)(nil)

// NewSnapshotting returns a driver for cfg, whose Snapshots must be set.
func NewSnapshotting(cfg Config) (*Snapshotting, error) {
	switch {
	case !cfg.Snapshots:
		return nil, fmt.Errorf("ocidriver: NewSnapshotting needs Config.Snapshots: %w", errdefs.ErrInvalidArgument)
	case cfg.UserNamespace:
		// The restored sandbox's processes would keep the ids of the
		// saved sandbox's lease of host ids, which ends with it.
		return nil, fmt.Errorf("ocidriver: a Snapshotting driver gives no user namespaces: %w", errdefs.ErrInvalidArgument)
	}
	d, err := newDriver(cfg)
	if err != nil {
		return nil, err
	}
	return &Snapshotting{Driver: d}, nil
}

// snapshotRecord is what a checkpoint directory says of the sandbox it
// saved.
type snapshotRecord struct {
	// From is the saved sandbox's ID, Driver its driver's name.
	From    string              `json:"from"`
	Driver  string              `json:"driver"`
	Labels  map[string]string   `json:"labels,omitempty"`
	Limits  sandbox.Limits      `json:"limits"`
	Network sandbox.NetworkMode `json:"network,omitempty"`
	// Unbound is true for a sandbox CreateUnbound made and Bind has not
	// bound: the restored one is unbound too (a warm pool's image).
	Unbound bool `json:"unbound,omitempty"`
	// Hello is the saved guest's greeting and LastID the highest request
	// id used before the checkpoint: the restored guest is past its
	// handshake (supervisor.Meta.Hello).
	Hello  guest.Hello `json:"hello"`
	LastID uint32      `json:"last_id"`
	Saved  time.Time   `json:"saved"`
	// Image is the saved sandbox's root filesystem, and ImageDigest the
	// digest of the runtime's image (imageDigest).
	Image       sandbox.Image `json:"image"`
	ImageDigest string        `json:"image_digest"`
	// Workspace is the size of the saved sandbox's /workspace (a session's;
	// zero for none): the restored sandbox must mount what the saved one
	// had, or the runtime cannot restore it.
	Workspace int64 `json:"workspace,omitempty"`
	// Runtime names the runtime build that saved it (RuntimeBuild): only
	// that build restores it.
	Runtime string `json:"runtime,omitempty"`
	// MAC authenticates the rest under the shims' key.
	MAC string `json:"mac"`
}

// maxSnapshotRecord bounds a sandbox.json.
const maxSnapshotRecord = 1 << 20

// seal sets r's MAC under key and returns r encoded.
func (r snapshotRecord) seal(key []byte) ([]byte, error) {
	r.MAC = ""
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	r.MAC = supervisor.MAC(key, b)
	return json.Marshal(r)
}

// verify reports whether r's MAC holds under key.
func (r snapshotRecord) verify(key []byte) bool {
	mac := r.MAC
	r.MAC = ""
	b, err := json.Marshal(r)
	return err == nil && supervisor.CheckMAC(key, b, mac)
}

const (
	snapshotRecordFile = "sandbox.json"
	snapshotImageDir   = "image"
)

// Checkpoint saves sb, an idle sandbox of this driver without data mounts
// or egress, into dir and destroys it. When saving fails, sb serves on
// (unless the runtime ended it) and dir is removed; when only the
// destruction fails, dir holds the checkpoint.
func (d *Snapshotting) Checkpoint(ctx context.Context, sb sandbox.Sandbox, dir string) error {
	_, err := d.save(ctx, sb, dir, nil)
	return err
}

// Snapshot saves sb into dir as Checkpoint does but leaves it running
// (runsc checkpoint -leave-running): sb stalls while its memory is
// written, then serves on with its kernels (o.Thawed is called then).
// The saved record leaves out the labels named in o.Unbind, so that a
// Restore may give them new values (a snapshot of one session restored
// as another session of the same workspace); every other label still
// binds it (checkBinding). It returns how long sb's guest was frozen.
func (d *Snapshotting) Snapshot(ctx context.Context, sb sandbox.Sandbox, dir string, o sandbox.SnapshotOptions) (time.Duration, error) {
	return d.save(ctx, sb, dir, &o)
}

// save is Checkpoint (live nil) and Snapshot (live its options): a
// live save leaves the sandbox running.
func (d *Snapshotting) save(ctx context.Context, sb sandbox.Sandbox, dir string, live *sandbox.SnapshotOptions) (stall time.Duration, err error) {
	leaveRunning := live != nil
	thawed := func() {}
	if live != nil && live.Thawed != nil {
		thawed = sync.OnceFunc(live.Thawed)
	}
	defer thawed()
	s, ok := sb.(*sbx)
	switch {
	case !ok || s.d != d.Driver:
		return 0, fmt.Errorf("checkpointing a sandbox the %s driver did not create: %w", d.cfg.Name, errdefs.ErrInvalidArgument)
	case !filepath.IsAbs(dir):
		return 0, fmt.Errorf("checkpointing sandbox %s: the directory %q is not absolute: %w", s.id, dir, errdefs.ErrInvalidArgument)
	case s.network != sandbox.NetworkNone:
		// The restored sandbox would need the prepared network namespace
		// the saved one joined, which ends with it.
		return 0, fmt.Errorf("checkpointing sandbox %s: a sandbox with a network (%s) is not saved: %w", s.id, s.network, errdefs.ErrFailedPrecondition)
	}
	bundle := d.bundleDir(s.id)
	config, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return 0, fmt.Errorf("checkpointing sandbox %s: reading its bundle: %w", s.id, err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(config, &spec); err != nil {
		return 0, fmt.Errorf("checkpointing sandbox %s: decoding its bundle: %w", s.id, err)
	}
	if spec.Root == nil || strings.HasPrefix(spec.Root.Path, bundle+"/") {
		// Its root is an overlay of the bundle's, with data mounts below
		// it, which the restored sandbox would not have.
		return 0, fmt.Errorf("checkpointing sandbox %s: a sandbox with data mounts is not saved: %w", s.id, errdefs.ErrFailedPrecondition)
	}
	// The saved guest must be past its handshake: a client sends its
	// Accept with its first request, and the shim of the restored guest
	// passes every Accept in the v2 header (supervisor.Meta.Hello). A
	// ping, answered, proves the Accept arrived.
	c := s.Guest.Client()
	if c == nil {
		return 0, fmt.Errorf("checkpointing sandbox %s: its guest is not ready: %w", s.id, errdefs.ErrFailedPrecondition)
	}
	if _, err := c.Ping(ctx); err != nil {
		return 0, fmt.Errorf("checkpointing sandbox %s: pinging its guest: %w", s.id, err)
	}
	build, err := d.RuntimeBuild(ctx)
	if err != nil {
		return 0, fmt.Errorf("checkpointing sandbox %s: %w", s.id, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return 0, fmt.Errorf("checkpointing sandbox %s: %s exists already: %w", s.id, dir, errdefs.ErrConflict)
		}
		return 0, fmt.Errorf("checkpointing sandbox %s: creating its directory: %w", s.id, err)
	}
	hello, lastID, err := s.Guest.Freeze()
	if err != nil {
		os.Remove(dir)
		return 0, err
	}
	frozen := time.Now()
	saved := false
	defer func() {
		if err != nil && !saved {
			s.Guest.Thaw()
			os.RemoveAll(dir)
		}
	}()
	key, err := supervisor.LoadKey(d.shimRoot())
	if err != nil {
		return 0, err
	}
	s.bindMu.Lock()
	rec := snapshotRecord{
		From: s.id, Driver: d.cfg.Name, Labels: maps.Clone(s.labels), Limits: s.Guest.Limits,
		Network: s.network, Unbound: s.unbound, Hello: hello, LastID: lastID, Saved: time.Now().UTC(),
		Image: sandbox.Image{Rootfs: spec.Root.Path}, Workspace: workspaceOf(spec), Runtime: build,
	}
	s.bindMu.Unlock()
	if live != nil {
		for _, k := range live.Unbind {
			delete(rec.Labels, k)
		}
	}
	image := filepath.Join(dir, snapshotImageDir)
	if err := os.Mkdir(image, 0o700); err != nil {
		return 0, fmt.Errorf("checkpointing sandbox %s: %w", s.id, err)
	}
	// The runtime saves the sandbox and then ends it; its run (the
	// daemon's child or the shim's) ends with it. With -leave-running
	// the sandbox goes on once saved, its guest thawed below.
	args := []string{"checkpoint", "--image-path", image}
	if leaveRunning {
		args = append(args, "--leave-running")
	}
	out, err := d.runtimeCmd(ctx, s.network, append(args, s.id)...).CombinedOutput()
	if leaveRunning {
		s.Guest.Thaw()
		stall = time.Since(frozen)
		thawed()
	}
	if err != nil {
		return 0, fmt.Errorf("checkpointing sandbox %s: %v: %s: %w", s.id, err, sandboxkit.OneLine(string(out)), errdefs.ErrUnavailable)
	}
	// The runtime writes the memory's files readable by anyone; the
	// directory is root-only, and so is every file below it.
	if err := fsmode.PrivateTree(image); err != nil {
		return 0, fmt.Errorf("checkpointing sandbox %s: %w", s.id, err)
	}
	if rec.ImageDigest, err = d.digests.sealDigest(image); err != nil {
		return 0, fmt.Errorf("checkpointing sandbox %s: %w", s.id, err)
	}
	b, err := rec.seal(key)
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(dir, snapshotRecordFile), b, 0o600); err != nil {
		return 0, fmt.Errorf("checkpointing sandbox %s: %w", s.id, err)
	}
	// What is saved stays when the clean-up fails: Restore can use it,
	// and a later Destroy finishes the clean-up.
	saved = true
	if leaveRunning {
		return stall, nil
	}
	if err := s.Destroy(ctx); err != nil {
		return 0, fmt.Errorf("checkpointing sandbox %s: saved in %s, then destroying it: %w", s.id, dir, err)
	}
	return 0, nil
}

// Restore starts a detached sandbox from what Checkpoint saved in dir,
// with a new ID, through a shim in restore mode (supervisor.Meta.Hello):
// the guest goes on where it was saved, with its kernels. A sandbox saved
// unbound is restored unbound: Bind binds it. A label of labels that the
// saved sandbox had with another value is refused (checkBinding), and so
// is a checkpoint another runtime build made (checkBuild): nothing is
// started then.
func (d *Snapshotting) Restore(ctx context.Context, dir string, labels map[string]string) (sandbox.Sandbox, error) {
	return d.restore(ctx, dir, labels, resumeGuest)
}

// restore is Restore, its guest made ready to serve by resume.
func (d *Snapshotting) restore(ctx context.Context, dir string, labels map[string]string, resume func(context.Context, *sbx) error) (_ sandbox.Sandbox, err error) {
	if len(d.cfg.Shim) == 0 {
		return nil, fmt.Errorf("the %s driver has no shim to supervise a restored sandbox (ocidriver.Config.Shim): %w", d.cfg.Name, errdefs.ErrFailedPrecondition)
	}
	rec, binary, err := d.checkedSnapshot(ctx, dir)
	if err != nil {
		return nil, err
	}
	if err := checkBinding(rec.Labels, labels); err != nil {
		return nil, err
	}
	all := maps.Clone(rec.Labels)
	if all == nil {
		all = map[string]string{}
	}
	maps.Copy(all, labels)
	// A sandbox created ahead for the same spec skips the runtime's start
	// (ahead.go); when its start fails, the restore goes the usual way.
	if s := d.takeAhead(aheadKey(rec, all)); s != nil {
		if err := d.restoreAhead(ctx, s, dir, rec, resume); err == nil {
			d.spare(s.id, false)
			return s, nil
		}
	}
	s, err := d.newRestored(rec, all, binary)
	if err != nil {
		return nil, fmt.Errorf("restoring from %s: %w", dir, err)
	}
	// Spared from Reap until its shim's record names it, as a create is.
	defer d.spare(s.id, false)
	id, bundle := s.id, d.bundleDir(s.id)
	defer func() {
		if err != nil {
			_ = s.Destroy(context.WithoutCancel(ctx))
		}
	}()
	key, err := supervisor.LoadKey(d.shimRoot())
	if err != nil {
		return nil, err
	}
	hello := rec.Hello
	// -background: runsc restore returns once the kernel's state and the
	// memory file's metadata are loaded, and the Sentry goes on loading
	// the memory's pages while the guest runs (a page not loaded yet is
	// waited for when touched; a save waits for all of them). It holds
	// the image's files open, which the runtime passes it as descriptors:
	// removing the directory meanwhile (a paused session's resume removes
	// its checkpoint once recorded; a fork's snapshot goes once its forks
	// started) unlinks them but loses no page. A page that cannot be read
	// then ends the sandbox instead of failing the restore. It needs an
	// uncompressed image, which Checkpoint writes (runsc's default).
	// Measured in BENCHMARKS.md ("Snapshots and forks"): 8 restores at
	// once overlap their loading with their guests' work.
	m := supervisor.Meta{
		ID: id, Driver: d.cfg.Name, Bundle: bundle, Created: time.Now().UTC(),
		Argv:  append([]string{binary}, d.runtimeArgs(s.network, "restore", "--background", "--image-path", filepath.Join(dir, snapshotImageDir), "--bundle", bundle, id)...),
		Env:   runtimeEnv,
		Hello: &hello, LastID: rec.LastID,
	}
	s.endArgv(&m, binary)
	if err := s.writeMeta(key, m, all, rec.Unbound, rec.Limits); err != nil {
		return nil, err
	}
	if err := supervisor.Launch(ctx, d.cfg.Shim, d.shimDir(id)); err != nil {
		return nil, err
	}
	if err := s.connect(ctx); err != nil {
		return nil, err
	}
	if err := resume(ctx, s); err != nil {
		return nil, fmt.Errorf("restoring sandbox %s from %s: %w", id, dir, err)
	}
	return s, nil
}

// checkBinding refuses to restore a sandbox saved with labels saved for
// one that labels describe otherwise: a label both name must have one
// value. The saved labels are under the record's MAC, so a session's
// checkpoint (its session and workspace labels) copied over another's is
// refused, not restored with the first session's state. The error names
// no path: it may reach the session's owner.
func checkBinding(saved, labels map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if v, ok := saved[k]; ok && v != labels[k] {
			return fmt.Errorf("the checkpoint was saved for %s %q, not %q: %w: %w", k, v, labels[k], sandbox.ErrForeignCheckpoint, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// workspaceOf is the size of the session-only scratch tmpfs (/workspace)
// that spec mounts, or 0 when it has none.
func workspaceOf(spec specs.Spec) int64 {
	for _, sc := range profile.Default().Scratch {
		if !sc.SessionOnly {
			continue
		}
		for _, m := range spec.Mounts {
			if m.Destination != sc.Path {
				continue
			}
			for _, o := range m.Options {
				if v, ok := strings.CutPrefix(o, "size="); ok {
					n, _ := strconv.ParseInt(v, 10, 64)
					return n
				}
			}
		}
	}
	return 0
}

// readSnapshot reads and checks the record of the checkpoint in dir: dir
// must be private to this process's user (supervisor.CheckPrivate), the
// record's MAC must hold under the shims' key, and the image must be the
// one the record's digest names.
func (d *Snapshotting) readSnapshot(dir string) (snapshotRecord, error) {
	var rec snapshotRecord
	if !filepath.IsAbs(dir) {
		return rec, fmt.Errorf("restoring from %q: the directory is not absolute: %w", dir, errdefs.ErrInvalidArgument)
	}
	if _, err := supervisor.CheckPrivate(dir, true); err != nil {
		return rec, fmt.Errorf("restoring from %s: %w", dir, err)
	}
	key, err := supervisor.LoadKey(d.shimRoot())
	if err != nil {
		return rec, err
	}
	b, err := supervisor.ReadPrivate(filepath.Join(dir, snapshotRecordFile), maxSnapshotRecord)
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	switch {
	case err != nil:
		return rec, fmt.Errorf("restoring from %s: reading its record: %v: %w", dir, err, errdefs.ErrInvalidArgument)
	case !rec.verify(key):
		return rec, fmt.Errorf("restoring from %s: its record was not written by this driver's key holder: %w", dir, errdefs.ErrInvalidArgument)
	case rec.Driver != d.cfg.Name:
		return rec, fmt.Errorf("restoring from %s: it holds a sandbox of driver %q, not %q: %w", dir, rec.Driver, d.cfg.Name, errdefs.ErrInvalidArgument)
	case rec.Limits.Check(sandbox.Limits{}) != nil || rec.Network != sandbox.NetworkNone || rec.Workspace < 0:
		return rec, fmt.Errorf("restoring from %s: its record does not hold: %w", dir, errdefs.ErrInvalidArgument)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return rec, fmt.Errorf("restoring from %s: %w", dir, err)
	}
	for _, e := range entries {
		if e.Name() != snapshotRecordFile && e.Name() != snapshotImageDir {
			// Nothing else is read, but a directory that holds more than
			// Checkpoint wrote (an OCI spec of an older release, or of
			// someone else) is not taken for a checkpoint.
			return rec, fmt.Errorf("restoring from %s: it holds %s, which Checkpoint does not write: %w", dir, e.Name(), errdefs.ErrInvalidArgument)
		}
	}
	image := filepath.Join(dir, snapshotImageDir)
	if _, err := supervisor.CheckPrivate(image, true); err != nil {
		return rec, fmt.Errorf("restoring from %s: %w", dir, err)
	}
	digest, err := d.digests.digest(image)
	if err != nil {
		return rec, fmt.Errorf("restoring from %s: %w", dir, err)
	}
	if digest != rec.ImageDigest {
		return rec, fmt.Errorf("restoring from %s: its image is not the one saved (%s, recorded %s): %w", dir, digest, rec.ImageDigest, errdefs.ErrInvalidArgument)
	}
	return rec, nil
}
