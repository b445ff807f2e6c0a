package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/internal/fsmode"
	"github.com/stockade-sh/stockade/sandbox"
)

// A session pool on a tier that saves sandboxes (sandbox.Snapshotter:
// gVisor) refills from a checkpoint of its own instead of starting a
// sandbox and its kernel and importing numpy and pandas each time: a
// restore reads the saved interpreter back, which costs a fraction of
// the CPU (BENCHMARKS.md, "Warm path under load"). The pool makes the
// checkpoint once, from the first sandbox it starts cold (the sandbox is
// saved, which ends it, and the pool restores its first sandbox from
// it), in
//
//	<PoolOptions.CheckpointDir>/<daemon>/<pool>/<key>/checkpoint/
//
// root-only (the driver's checkpoint, its record under the shims' MAC,
// whose key is the daemon's state directory's: <daemon> is a digest of
// the pools' owner labels, which name that directory, so that daemons
// sharing a data directory neither read nor remove each other's),
// where key is a digest of what the sandbox was made of: the driver, the
// tool's record, the image's digest, the limits, /workspace size, labels,
// kernel and runtime build (runtimeBuild: only the build that made a
// checkpoint restores it). Another image, tool record or runtime build
// is another key: the pool
// makes a new checkpoint and removes the old. The pools' stop removes
// the daemon's checkpoints (removeSnaps: a state directory of a test or
// benchmark is used once, and its checkpoints would stay for good); a
// daemon that starts over the checkpoints of one killed with the same
// state directory reuses those of the same key and removes those of
// pools it no longer has (removeStaleSnaps). A checkpoint holds nothing
// of anyone's: it is saved before any session is bound. A restore that fails starts the sandbox cold
// (counted: PoolDemandObserver.PoolRestoreFailed); a checkpoint that
// cannot be made leaves the pool on cold refills, logged once.
//
// Each restore is a sandbox of its own, as a golden restore is
// (golden.go): a new ID, its own copy of the saved memory, /tmp and
// /workspace (tmpfs, empty when saved), the kernel's random state
// reseeded by the hidden reseed cell (python's random, numpy's global
// RandomState, tempfile's name sequence); os.urandom, uuid4 and secrets
// read the kernel's random source, which a restored gVisor sandbox draws
// from the host afresh. What stays the checkpoint's, in every sandbox
// restored: the string hash seed (PYTHONHASHSEED, fixed when the
// interpreter starts), the process ids and address-space layout of the
// saved processes (so id() of the objects numpy and pandas made at import
// time), and any generator the import itself created and holds.
//
// One-shot pools are checkpointed likewise where the driver restores a
// sandbox with its interpreter in flight (sandbox.ExecRestorer): see
// poolsnap_exec.go. Not checkpointed: pools of a template's tool, whose
// Start may hold state of its own that no reseed reaches (a template
// opts into that with golden: true); and every pool on runc, which
// cannot checkpoint on these hosts (CRIU). Those refill cold.

// poolCheckpointDir is the directory, below the checkpoint's, that the
// driver writes.
const poolCheckpointDir = "checkpoint"

// poolSnap is a session pool's checkpoint.
type poolSnap struct {
	snap sandbox.Snapshotter
	root string // <CheckpointDir>/<daemon>/<pool>
	mu   sync.Mutex
	// off is set once a checkpoint could not be made, or one remade
	// could not be restored either: cold refills.
	off bool
	// dropped is set once a checkpoint that could not be restored was
	// removed, to be made again by the next refill.
	dropped bool
}

// snapOf is the checkpoint of a new pool p, or nil when p refills cold.
func (e *Engine) snapOf(p *pool) *poolSnap {
	snap, ok := p.drv.(sandbox.Snapshotter)
	if !p.session {
		// A one-shot pool's interpreter is saved waiting for its program
		// and adopted when restored (poolsnap_exec.go).
		_, ok = p.drv.(sandbox.ExecRestorer)
	}
	if !ok || !p.drv.Capabilities().Snapshots || e.poolOpts.CheckpointDir == "" ||
		p.tool.Template != "" || p.rt.Name != "python" {
		return nil
	}
	return &poolSnap{snap: snap, root: filepath.Join(e.snapDaemonDir(), strings.ReplaceAll(p.name, "/", "_"))}
}

// snapDaemonDir is the directory of this daemon's pool checkpoints:
// below PoolOptions.CheckpointDir, named by a digest of the owner labels
// StartPools was given.
func (e *Engine) snapDaemonDir() string {
	e.poolsMu.Lock()
	b, _ := json.Marshal(e.ownerLabels)
	e.poolsMu.Unlock()
	h := sha256.Sum256(b)
	return filepath.Join(e.poolOpts.CheckpointDir, hex.EncodeToString(h[:8]))
}

// removeStaleSnaps removes the checkpoints of pools no longer
// configured (or no longer checkpointed) from this daemon's directory:
// each pool's own directory keeps its checkpoint for reuse, and drops
// an older key's when it makes a new one (save). The saves a crash cut
// short (.new-*) go too: no save runs before the pools start.
func (e *Engine) removeStaleSnaps(pools []*pool) {
	if e.poolOpts.CheckpointDir == "" {
		return
	}
	dir := e.snapDaemonDir()
	keep := map[string]bool{}
	for _, p := range pools {
		if p.snap != nil {
			keep[filepath.Base(p.snap.root)] = true
		}
	}
	entries, _ := os.ReadDir(dir)
	for _, d := range entries {
		if keep[d.Name()] {
			saves, _ := filepath.Glob(filepath.Join(dir, d.Name(), ".new-*"))
			for _, s := range saves {
				if err := os.RemoveAll(s); err != nil {
					e.log.Warn("removing a pool checkpoint's save cut short", "dir", s, "err", err)
				}
			}
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, d.Name())); err != nil {
			e.log.Warn("removing the checkpoint of a pool no longer kept", "dir", filepath.Join(dir, d.Name()), "err", err)
		}
	}
}

// removeSnaps removes this daemon's pool checkpoints (the pools' stop).
func (e *Engine) removeSnaps() {
	if e.poolOpts.CheckpointDir == "" {
		return
	}
	if err := os.RemoveAll(e.snapDaemonDir()); err != nil {
		e.log.Warn("removing the pools' checkpoints", "err", err)
	}
}

// key is the name of the checkpoint of p's sandboxes of image digest.
func (p *pool) snapKey(digest string) (string, error) {
	var ks any = p.argv // a one-shot pool's interpreter
	if p.session {
		k, _, err := p.e.sessionKernel(p.tool, p.rt, poolModules[p.rt.Name])
		if err != nil {
			return "", err
		}
		ks = k
	}
	build, err := runtimeBuild(p.drv)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, v := range []any{p.drv.Name(), p.tool, digest, p.created, p.workspace, p.labels, ks, build} {
		b, err := json.Marshal(v)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%d:%s\n", len(b), b)
	}
	return hex.EncodeToString(h.Sum(nil))[:32], nil
}

// refill makes one sandbox for p: from p's checkpoint when it has one
// (made first from a cold sandbox when it has none yet), else cold.
// restored says which.
func (p *pool) refill(ctx context.Context) (w *warm, restored bool, err error) {
	s := p.snap
	if s == nil {
		w, err := p.create(ctx)
		return w, false, err
	}
	img, _, err := p.e.imageOf(p.tool, p.rt)
	if err != nil {
		return nil, false, err
	}
	key, err := p.snapKey(img.Digest)
	if err != nil {
		return nil, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dir := filepath.Join(s.root, key, poolCheckpointDir)
	if s.off {
		w, err := p.create(ctx)
		return w, false, err
	}
	if _, err := os.Stat(dir); err != nil {
		w, err := p.create(ctx)
		if err != nil {
			return nil, false, err
		}
		if w, err = p.save(ctx, w, key); w != nil || err != nil {
			// Not saved: the cold sandbox serves, or is gone (err).
			return w, false, err
		}
	}
	w, err = p.restore(ctx, dir, img.Digest)
	if err != nil {
		if ctx.Err() != nil {
			return nil, false, err
		}
		// A checkpoint that cannot be restored (a MAC key changed with
		// the state dir, a runtime upgraded, a corrupt image) would fail
		// every refill: it is removed and made again once, and the pool
		// refills cold if that one fails too.
		p.e.log.Warn("restoring a pool sandbox from its checkpoint; starting it cold and dropping the checkpoint", "pool", p.name, "remade", s.dropped, "err", err)
		if o, ok := p.e.poolObs.(PoolDemandObserver); ok {
			o.PoolRestoreFailed(p.name)
		}
		if rerr := os.RemoveAll(filepath.Join(s.root, key)); rerr != nil || s.dropped {
			s.off = true
		}
		s.dropped = true
		w, err := p.create(ctx)
		return w, false, err
	}
	return w, true, nil
}

// save checkpoints w, a cold sandbox of p, as the checkpoint of key,
// which ends w, and removes p's other checkpoints. It returns nil, nil
// once saved; when saving fails, w if it still serves (or an error), and
// p refills cold from then on.
func (p *pool) save(ctx context.Context, w *warm, key string) (*warm, error) {
	s := p.snap
	fail := func(err error) (*warm, error) {
		s.off = true
		p.e.log.Warn("making a pool's checkpoint; the pool refills cold", "pool", p.name, "err", err)
		if !w.ended() {
			return w, nil
		}
		_ = w.sb.Destroy(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("making the pool's checkpoint: %w", err)
	}
	if err := os.MkdirAll(s.root, fsmode.Dir); err != nil {
		return fail(err)
	}
	tmp, err := os.MkdirTemp(s.root, ".new-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(tmp)
	if !p.session {
		if err := settle(ctx, w); err != nil {
			return fail(err)
		}
	}
	start := time.Now()
	if err := s.snap.Checkpoint(ctx, w.sb, filepath.Join(tmp, poolCheckpointDir)); err != nil {
		return fail(err)
	}
	final := filepath.Join(s.root, key)
	if err := os.Rename(tmp, final); err != nil {
		// w is gone (saved, then ended): a new cold one serves.
		s.off = true
		return nil, fmt.Errorf("making the pool's checkpoint: %w", err)
	}
	entries, _ := os.ReadDir(s.root)
	for _, d := range entries {
		if d.Name() != key && !strings.HasPrefix(d.Name(), ".new-") {
			if err := os.RemoveAll(filepath.Join(s.root, d.Name())); err != nil {
				p.e.log.Warn("removing a pool's old checkpoint", "pool", p.name, "err", err)
			}
		}
	}
	p.e.log.Info("pool checkpoint made", "pool", p.name, "dir", final, "took", time.Since(start))
	return nil, nil
}

// restore restores a sandbox of p from the checkpoint in dir, of the
// image of digest: unbound, its kernel ready, its random state reseeded,
// its deadline the pool's.
func (p *pool) restore(ctx context.Context, dir, digest string) (_ *warm, err error) {
	if !p.session {
		return p.restoreExec(ctx, dir, digest)
	}
	sb, err := p.snap.snap.Restore(ctx, dir, nil)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = sb.Destroy(context.WithoutCancel(ctx))
		}
	}()
	if d, ok := sb.(sandbox.Deadliner); ok {
		// As create sets it (see there).
		if err := d.SetDeadline(ctx, time.Now().Add(p.maxAge+time.Minute)); err != nil {
			return nil, err
		}
	}
	ks, err := sb.(sandbox.Kernels).ListKernels(ctx)
	if err != nil {
		return nil, err
	}
	if len(ks) != 1 {
		return nil, fmt.Errorf("the restored sandbox has %d kernels, not one: %w", len(ks), errors.ErrUnsupported)
	}
	if err := reseed(ctx, ks[0], p.rt.Name); err != nil {
		return nil, err
	}
	return &warm{sb: sb, k: ks[0], born: time.Now(), image: digest, log: p.e.log}, nil
}
