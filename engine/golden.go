package engine

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/fsmode"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// A golden checkpoint is a template's sandbox saved once, its kernel
// started and its Start and Ready run, on a tier that can save a sandbox
// (sandbox.Snapshotter: gVisor). A session of a tool of the template then
// restores it instead of starting cold: a restore costs what reading the
// checkpoint costs, whatever Start costs (imports, model loads), and
// holds no live sandbox while no session runs, where a warm pool holds
// its sandboxes' memory.
//
// MakeGolden starts the sandbox as a pool does, unbound and detached (no
// session's or workspace's labels), with the limits of the template's
// first tool (by name) and the sessions' /workspace size
// (GoldenOptions.Workspace), checks that Start left /workspace empty,
// and saves it into
//
//	<GoldenOptions.Dir>/<template>/<image hex>-<digest of start, ready,
//	    env, workdir, limits, workspace, driver, runtime build>/
//	  golden.json   goldenRecord: what the checkpoint was made from
//	  checkpoint/   the driver's checkpoint
//
// built in a temporary directory beside it and renamed into place, the
// template's older checkpoints removed after. A new build of the
// template (another image digest), another Start or another runtime
// build (runsc replaced: only the build that made a checkpoint restores
// it) has another name: sessions start cold until MakeGolden saves it,
// which a session finding only another build's checkpoint of its
// template asks for (remakeGolden).
//
// Each restore is a new sandbox of its own: a new ID, its own copy of
// the saved memory, /tmp and /workspace (tmpfs, part of the checkpoint,
// empty /workspace), bound once to its session's labels and limits (the
// restore itself keeps the saved limits: Bind tightens memory, CPU and
// timeout; a session whose limits it cannot take, another /tmp size,
// pids or output cap, starts cold, as a session a pool cannot serve
// does). Then a hidden cell reseeds what the checkpoint would make
// every restore share (reseed): python's random module, numpy's global
// RandomState if numpy is imported, tempfile's name sequence; the shell's
// $RANDOM. os.urandom, uuid.uuid4 and secrets read the kernel's random
// source, which a restored gVisor sandbox draws from the host afresh.
// What cannot change: python's str and bytes hash seed (PYTHONHASHSEED,
// fixed when the interpreter starts: every session of the checkpoint
// hashes strings alike, and iterates sets of strings in one order), and
// any generator Start made and holds itself (a numpy Generator from
// default_rng, a random.Random instance), which restores with the same
// state in every session. A node template gets no checkpoint: V8's
// Math.random and OpenSSL's generator in node keep their state, and
// nothing can reseed them from outside.
//
// One-shots of a golden template do not restore it: a checkpoint holds a
// kernel between cells, and a one-shot's program is a process of its own
// (its exit status, signals, __main__), which a cell is not; and the
// one-shot pools that save their loader waiting for its program
// (poolsnap_exec.go) leave out a template's tool, whose Start may hold
// state no reseed reaches. They run Start in their own process
// (template.go), from a warm pool where one is configured.

// GoldenOptions configures golden checkpoints.
type GoldenOptions struct {
	// Dir holds the checkpoints (DataDir/golden); empty means none are
	// made (MakeGolden is ErrFailedPrecondition) and none restored.
	Dir string
	// Workspace is the /workspace size of the sessions restored: the
	// daemon's session size. A session of another size starts cold.
	// Zero means PoolOptions.SessionWorkspace.
	Workspace int64
	// Labels are the golden sandbox's while it is made (the daemon's
	// owner label, so that a daemon that died meanwhile reaps it); they
	// stay on every sandbox restored from it. Nil means those StartPools
	// was given.
	Labels map[string]string
	// NoAhead, when true, creates no sandbox ahead for a golden restore
	// (golden_ahead.go): each restore starts its runtime. A benchmark's
	// baseline; false (the zero value) keeps one ready slot per golden
	// template.
	NoAhead bool
}

// WithGolden makes the engine make and restore golden checkpoints.
func WithGolden(o GoldenOptions) Option { return func(e *Engine) { e.golden = o } }

// LabelGolden marks a golden sandbox and those restored from it with the
// template's name.
const LabelGolden = "stockade.golden"

// goldenRecord is golden.json: what a checkpoint was made from.
type goldenRecord struct {
	Template  string            `json:"template"`
	Tool      string            `json:"tool"`
	Driver    string            `json:"driver"`
	Image     string            `json:"image"`
	Limits    sandbox.Limits    `json:"limits"`
	Workspace int64             `json:"workspace"`
	Labels    map[string]string `json:"labels,omitempty"`
	Made      time.Time         `json:"made"`
	Bytes     int64             `json:"bytes"`
}

const (
	goldenRecordFile = "golden.json"
	goldenCheckpoint = "checkpoint"
)

// golden is what a golden checkpoint of tool's template would be made
// from: the tool, its driver and runtime, template and image, limits and
// the checkpoint's directory.
type golden struct {
	tool   tools.Tool
	drv    sandbox.Driver
	snap   sandbox.Snapshotter
	rt     image.Runtime
	img    sandbox.Image
	tm     *image.TemplateManifest
	limits sandbox.Limits
	ws     int64
	dir    string
}

// goldenWorkspace is the /workspace size of golden sandboxes.
func (e *Engine) goldenWorkspace() int64 {
	if e.golden.Workspace > 0 {
		return e.golden.Workspace
	}
	return e.poolOpts.SessionWorkspace
}

// goldenOf is the golden checkpoint of template: of its first tool (by
// name) that goldenRefuses not, on that tool's driver, which must save
// sandboxes.
func (e *Engine) goldenOf(template string) (*golden, error) {
	var refused error
	for _, n := range e.tools.Names() {
		t, err := e.tools.Get(n)
		if err != nil || t.Template != template {
			continue
		}
		if err := goldenRefuses(t); err != nil {
			refused = cmp.Or(refused, err)
			continue
		}
		return e.goldenFor(t)
	}
	if refused != nil {
		return nil, refused
	}
	return nil, errdefs.Publicf("no tool runs template %q: %w", template, errdefs.ErrNotFound)
}

// goldenRefuses says why sessions of tool cannot come from a golden
// checkpoint, or nil: a tool that mounts data or reaches the broker,
// which the golden sandbox has none of (an unbound sandbox, as a pool's:
// pool.go refuses such tools too), starts cold.
func goldenRefuses(tool tools.Tool) error {
	if len(tool.Filesystem.Mounts) > 0 || len(tool.Credentials) > 0 {
		return errdefs.Publicf("tool %q mounts data or reaches the broker, which a golden checkpoint holds nothing of: template %s starts cold: %w", tool.Name, tool.Template, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// goldenFor is the golden checkpoint of tool's template on tool's driver.
func (e *Engine) goldenFor(tool tools.Tool) (*golden, error) {
	if err := goldenRefuses(tool); err != nil {
		return nil, err
	}
	_, drv, rt, err := e.resolve(Request{Tool: tool.Name})
	if err != nil {
		return nil, err
	}
	img, tm, err := e.templateOf(tool)
	if err != nil {
		return nil, err
	}
	snap, ok := drv.(sandbox.Snapshotter)
	if !ok || !drv.Capabilities().Snapshots {
		return nil, errdefs.Publicf("the %s tier cannot restore a checkpoint: template %s starts cold: %w", drv.Capabilities().Tier, tm.Name, errdefs.ErrFailedPrecondition)
	}
	if tm.Base == "node" {
		return nil, errdefs.Publicf("a node sandbox's random state (V8's Math.random, OpenSSL's generator) cannot be reseeded after a restore: template %s starts cold: %w", tm.Name, errdefs.ErrFailedPrecondition)
	}
	if e.golden.Dir == "" {
		return nil, errdefs.Publicf("this server keeps no golden checkpoints (no directory for them): template %s starts cold: %w", tm.Name, errdefs.ErrFailedPrecondition)
	}
	ws := e.goldenWorkspace()
	if ws <= 0 {
		return nil, errdefs.Publicf("the sessions' /workspace size is not set: template %s starts cold: %w", tm.Name, errdefs.ErrFailedPrecondition)
	}
	limits := e.Limits(tool)
	build, err := runtimeBuild(drv)
	if err != nil {
		return nil, err
	}
	g := &golden{tool: tool, drv: drv, snap: snap, rt: rt, img: img, tm: tm, limits: limits, ws: ws}
	h := sha256.New()
	env, _ := json.Marshal(templateEnv(tm))
	lim, _ := json.Marshal(limits)
	for _, s := range []string{tm.Start, tm.Ready, string(env), tm.Workdir, string(lim), fmt.Sprint(ws), drv.Name(), build} {
		fmt.Fprintf(h, "%d:%s\n", len(s), s)
	}
	digest := strings.TrimPrefix(img.Digest, "sha256:")
	if len(digest) > 32 {
		digest = digest[:32]
	}
	g.dir = filepath.Join(e.golden.Dir, tm.Name, digest+"-"+hex.EncodeToString(h.Sum(nil))[:32])
	return g, nil
}

// runtimeBuilder is a Snapshotter whose checkpoints only the runtime
// build that made them restores (ocidriver.Snapshotting: gVisor's image
// format is its build's own): RuntimeBuild names the build it runs.
type runtimeBuilder interface {
	RuntimeBuild(ctx context.Context) (string, error)
}

// runtimeBuild names the runtime build of drv, or "" for a driver whose
// checkpoints do not depend on it: the golden and pool checkpoints' keys
// hold it, so that another build (runsc replaced) makes its own rather
// than fail restoring the old ones.
func runtimeBuild(drv sandbox.Driver) (string, error) {
	rb, ok := drv.(runtimeBuilder)
	if !ok {
		return "", nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return rb.RuntimeBuild(ctx)
}

// MakeGolden makes the golden checkpoint of template, a template whose
// declaration asks for one (golden: true), unless it exists already:
// see the comment at the top of golden.go. On a tier that cannot save a
// sandbox (runc, docker) it is ErrFailedPrecondition saying that the
// template starts cold, as it then does.
func (e *Engine) MakeGolden(ctx context.Context, template string) (err error) {
	g, err := e.goldenOf(template)
	if err != nil {
		return err
	}
	if !g.tm.Golden {
		return errdefs.Publicf("template %s does not ask for a golden checkpoint (golden: true): %w", template, errdefs.ErrFailedPrecondition)
	}
	e.goldenMu.Lock()
	defer e.goldenMu.Unlock()
	if _, err := readGolden(g.dir); err == nil {
		return nil
	}
	parent := filepath.Dir(g.dir)
	if err := os.MkdirAll(parent, fsmode.Dir); err != nil {
		return fmt.Errorf("making template %s's golden checkpoint: %w", template, err)
	}
	tmp, err := os.MkdirTemp(parent, ".new-")
	if err != nil {
		return fmt.Errorf("making template %s's golden checkpoint: %w", template, err)
	}
	defer os.RemoveAll(tmp)
	rec, err := e.saveGolden(ctx, g, filepath.Join(tmp, goldenCheckpoint))
	if err != nil {
		return fmt.Errorf("making template %s's golden checkpoint: %w", template, err)
	}
	b, _ := json.Marshal(rec)
	if err := os.WriteFile(filepath.Join(tmp, goldenRecordFile), b, fsmode.File); err != nil {
		return err
	}
	if err := os.Rename(tmp, g.dir); err != nil {
		return fmt.Errorf("making template %s's golden checkpoint: %w", template, err)
	}
	// The template's older checkpoints go; a restore reading one now
	// fails and starts cold.
	entries, _ := os.ReadDir(parent)
	for _, d := range entries {
		if p := filepath.Join(parent, d.Name()); p != g.dir && !strings.HasPrefix(d.Name(), ".new-") {
			if err := os.RemoveAll(p); err != nil {
				e.log.Warn("removing an old golden checkpoint", "template", template, "dir", p, "err", err)
			}
		}
	}
	e.log.Info("golden checkpoint made", "template", template, "dir", g.dir, "bytes", rec.Bytes)
	e.prepareGolden(g)
	return nil
}

// saveGolden starts g's sandbox, runs its kernel's Start and Ready, and
// checkpoints it into dir.
func (e *Engine) saveGolden(ctx context.Context, g *golden, dir string) (goldenRecord, error) {
	b, ok := g.drv.(sandbox.Binder)
	if !ok {
		return goldenRecord{}, fmt.Errorf("the %s driver cannot create unbound sandboxes: %w", g.drv.Name(), errdefs.ErrFailedPrecondition)
	}
	release, err := e.mem.reserve(g.limits.Memory)
	if err != nil {
		return goldenRecord{}, err
	}
	defer release()
	labels := map[string]string{LabelGolden: g.tm.Name, LabelImage: g.img.Digest}
	owner := e.golden.Labels
	if owner == nil {
		e.poolsMu.Lock()
		owner = e.ownerLabels
		e.poolsMu.Unlock()
	}
	for k, v := range owner {
		labels[k] = v
	}
	sb, err := b.CreateUnbound(ctx, sandbox.Spec{Image: g.img, Limits: g.limits, Labels: labels, Detached: true, Workspace: g.ws,
		Deadline: time.Now().Add(10 * time.Minute)})
	if err != nil {
		return goldenRecord{}, fmt.Errorf("creating %s sandbox: %w", g.drv.Name(), err)
	}
	saved := false
	defer func() {
		if !saved {
			_ = sb.Destroy(context.WithoutCancel(ctx))
		}
	}()
	ks, pre, err := e.sessionKernel(g.tool, g.rt, nil)
	if err != nil {
		return goldenRecord{}, err
	}
	k, err := sb.(sandbox.Kernels).StartKernel(ctx, ks)
	if err != nil {
		return goldenRecord{}, fmt.Errorf("starting the %s kernel: %w", g.rt.Name, err)
	}
	if err := pre.run(ctx, k); err != nil {
		return goldenRecord{}, err
	}
	// Every restore's /workspace is the checkpoint's: it must be empty.
	files, ok := sb.(sandbox.Files)
	if !ok {
		return goldenRecord{}, fmt.Errorf("the %s sandbox has no files: %w", g.drv.Name(), errdefs.ErrFailedPrecondition)
	}
	infos, _, err := files.ListDir(ctx, WorkspaceDir)
	if err != nil {
		return goldenRecord{}, fmt.Errorf("listing %s: %w", WorkspaceDir, err)
	}
	if len(infos) > 0 {
		var names []string
		for _, fi := range infos {
			names = append(names, fi.Name)
		}
		slices.Sort(names)
		return goldenRecord{}, errdefs.Publicf("template %s's start left files in %s (%s), which every session restored would share; write them elsewhere (/tmp): %w",
			g.tm.Name, WorkspaceDir, strings.Join(names, ", "), errdefs.ErrFailedPrecondition)
	}
	if err := g.snap.Checkpoint(ctx, sb, dir); err != nil {
		return goldenRecord{}, err
	}
	saved = true
	n, err := DiskUsage(dir)
	if err != nil {
		return goldenRecord{}, err
	}
	return goldenRecord{Template: g.tm.Name, Tool: g.tool.Name, Driver: g.drv.Name(), Image: g.img.Digest, Limits: g.limits,
		Workspace: g.ws, Labels: labels, Made: time.Now().UTC(), Bytes: n}, nil
}

// readGolden reads the record of the golden checkpoint in dir.
func readGolden(dir string) (goldenRecord, error) {
	var rec goldenRecord
	b, err := os.ReadFile(filepath.Join(dir, goldenRecordFile))
	if err != nil {
		return rec, err
	}
	if len(b) > 1<<20 {
		return rec, errors.New("golden.json is too large")
	}
	return rec, json.Unmarshal(b, &rec)
}

// GoldenBytes is the disk the golden checkpoint of template takes, or an
// error when it has none (ErrNotFound) or cannot have one.
func (e *Engine) GoldenBytes(template string) (int64, error) {
	g, err := e.goldenOf(template)
	if err != nil {
		return 0, err
	}
	rec, err := readGolden(g.dir)
	if err != nil {
		return 0, errdefs.Publicf("template %s has no golden checkpoint: %w", template, errdefs.ErrNotFound)
	}
	return rec.Bytes, nil
}

// restoreGolden serves a session of spec, which CheckSession resolved to
// tool, drv and rt, from its template's golden checkpoint, or returns nil
// (logged when a restore failed) for a cold OpenSession: no checkpoint, or
// one the session cannot take (another driver, /workspace size or
// limits; a kernel of its own).
func (e *Engine) restoreGolden(ctx context.Context, spec SessionSpec, tool tools.Tool, drv sandbox.Driver) *Session {
	if e.golden.Dir == "" || tool.Template == "" || spec.Kernel != nil {
		return nil
	}
	g, err := e.goldenFor(tool)
	if err != nil || !g.tm.Golden || g.drv.Name() != drv.Name() {
		return nil
	}
	rec, err := readGolden(g.dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			e.remakeGolden(g)
		}
		return nil
	}
	limits := spec.Limits.WithDefaults(e.Limits(tool))
	fits := limits.Check(rec.Limits) == nil && limits.OutputCap == rec.Limits.OutputCap &&
		limits.TmpSize == rec.Limits.TmpSize && limits.Pids == rec.Limits.Pids
	if !fits || spec.Workspace != rec.Workspace || rec.Driver != drv.Name() {
		return nil
	}
	s, err := e.restore(ctx, g, rec, spec, limits)
	if err != nil {
		e.log.Warn("restoring a golden checkpoint; the session starts cold", "template", g.tm.Name, "err", err)
		return nil
	}
	return s
}

// remakeGolden makes g's checkpoint in the background when its template
// has another one (of another runtime build, image or Start: a golden
// template whose checkpoint was made before), once per checkpoint
// directory in this engine's life: a checkpoint that cannot be made
// (Start left files in /workspace) is not tried again on every session.
// The session that found it missing starts cold, as those do that come
// while it is made. Engine.Wait waits for it.
func (e *Engine) remakeGolden(g *golden) {
	entries, err := os.ReadDir(filepath.Dir(g.dir))
	if err != nil || !slices.ContainsFunc(entries, func(d fs.DirEntry) bool { return !strings.HasPrefix(d.Name(), ".new-") }) {
		return
	}
	if _, tried := e.goldenRemakes.LoadOrStore(g.dir, true); tried {
		return
	}
	e.closing.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		e.log.Info("remaking a golden checkpoint made by another runtime build, image or start", "template", g.tm.Name)
		if err := e.MakeGolden(ctx, g.tm.Name); err != nil {
			e.log.Warn("remaking a golden checkpoint; the template's sessions start cold", "template", g.tm.Name, "err", err)
		}
	})
}

// restore restores g's checkpoint (rec) as the sandbox of a session of
// spec with limits, bound, its kernel's random state reseeded.
func (e *Engine) restore(ctx context.Context, g *golden, rec goldenRecord, spec SessionSpec, limits sandbox.Limits) (_ *Session, err error) {
	b, ok := g.drv.(sandbox.Binder)
	if !ok {
		return nil, fmt.Errorf("the %s driver cannot bind: %w", g.drv.Name(), errdefs.ErrFailedPrecondition)
	}
	added := map[string]string{}
	for k, v := range spec.Labels {
		if old, ok := rec.Labels[k]; !ok {
			added[k] = v
		} else if old != v {
			return nil, fmt.Errorf("label %s is %q in the checkpoint, not %q", k, old, v)
		}
	}
	release, err := e.mem.reserve(limits.Memory)
	if err != nil {
		return nil, err
	}
	var ph goldenPhases
	mark := func(d *time.Duration) func() {
		t := time.Now()
		return func() { *d = time.Since(t) }
	}
	done := mark(&ph.restore)
	sb, err := g.snap.Restore(ctx, filepath.Join(g.dir, goldenCheckpoint), nil)
	// The next session's sandbox is created ahead (golden_ahead.go), once
	// this one's is ready: its runtime's start would slow this one's
	// binding and reseed.
	defer e.prepareGolden(g)
	if err != nil {
		release()
		return nil, err
	}
	done()
	defer func() {
		if err != nil {
			_ = sb.Destroy(context.WithoutCancel(ctx))
			release()
		}
	}()
	done = mark(&ph.bind)
	if err := b.Bind(ctx, sb, sandbox.Binding{Labels: added, Limits: sandbox.Limits{Memory: limits.Memory, CPU: limits.CPU, Timeout: limits.Timeout}}); err != nil {
		return nil, fmt.Errorf("binding: %w", err)
	}
	if d, ok := sb.(sandbox.Deadliner); ok {
		// The golden sandbox's deadline goes, also for a session without
		// one.
		if err := d.SetDeadline(ctx, spec.Deadline); err != nil {
			return nil, err
		}
	}
	spec.Runtime = g.rt.Name
	s, err := e.liveOf(sb, g.drv.Name(), spec)
	if err != nil {
		return nil, err
	}
	done()
	done = mark(&ph.kernel)
	found, err := s.takeKernel(ctx)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, ErrKernelLost
	}
	done()
	done = mark(&ph.reseed)
	if err := reseed(ctx, s.currentKernel(), g.rt.Name); err != nil {
		return nil, err
	}
	done()
	goldenRestored(ph)
	s.Limits, s.mem = limits, e.inUse.hold(imageLabel(sb, g.img.Digest), release)
	return s, nil
}

// goldenPhases are the times of a golden restore's phases: the driver's
// restore (the checkpoint checked, the runtime's restore, the guest
// resumed), the binding (with the session's deadline), the kernel's
// adoption, the reseed cell.
type goldenPhases struct{ restore, bind, kernel, reseed time.Duration }

// goldenRestored is called with the phases of each golden restore that
// succeeds (BenchmarkTemplateSession's breakdown).
var goldenRestored = func(goldenPhases) {}

// reseedCells are the hidden cells that give a restored kernel random
// state of its own, by runtime (see the comment at the top of golden.go).
var reseedCells = map[string]string{
	"python": `exec(compile("""
import sys
if "random" in sys.modules:
    sys.modules["random"].seed()
if "numpy" in sys.modules:
    sys.modules["numpy"].random.seed()
if "tempfile" in sys.modules:
    sys.modules["tempfile"]._name_sequence = None
""", "<reseed>", "exec"), {})`,
	"shell": `RANDOM=$(od -An -N2 -tu2 /dev/urandom)`,
}

// hiddenCell starts a python cell that the kernel does not count in its
// cells' names (kernel/python.py): the caller's first cell in a restored
// kernel is <cell-1>, as in a cold one.
const hiddenCell = "# stockade: hidden cell\n"

// reseed runs the reseed cell of runtime in k, hidden where the kernel
// can hide one (python).
func reseed(ctx context.Context, k sandbox.Kernel, runtime string) error {
	code, ok := reseedCells[runtime]
	if !ok {
		return fmt.Errorf("no reseed for runtime %q", runtime)
	}
	if runtime == "python" {
		code = hiddenCell + code
	}
	r, err := k.Run(ctx, sandbox.Cell{Code: code})
	if err != nil {
		return fmt.Errorf("reseeding the restored kernel: %w", err)
	}
	if why := cellFailure(r, string(r.Stderr)); why != "" {
		return fmt.Errorf("reseeding the restored kernel: %s", why)
	}
	return nil
}
