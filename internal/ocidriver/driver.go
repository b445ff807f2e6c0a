// Package ocidriver runs sandboxes with an OCI runtime CLI (runc or runsc)
// and the Stockade guest agent as the sandbox's PID 1. driver/runc and
// driver/gvisor are thin configurations of it: the bundle, the lifecycle and
// the guest protocol are the same, only the runtime binary, its flags and
// where the numbers come from differ. What it shares with driver/docker (the
// guest session, the cgroup counters, sandbox IDs) is in internal/sandboxkit.
package ocidriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/hostids"
	"github.com/stockade-sh/stockade/internal/oci"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// Config configures one OCI-runtime driver.
type Config struct {
	// Name is the driver's configuration name ("runc", "gvisor").
	Name string
	Tier sandbox.Tier
	// Boundary says in one line what separates code in the tier from the
	// host (sandbox.Capabilities.Boundary).
	Boundary string
	// Binary is the runtime executable (path or name on PATH).
	Binary string
	// GlobalArgs go before the subcommand, after --root.
	GlobalArgs []string
	// NetworkArgs are the network modes the driver supports, each with the
	// arguments added after GlobalArgs when a sandbox of that mode is run
	// (runsc: --network=none or --network=sandbox; runc: none). Nil means
	// NetworkNone only, with no arguments.
	NetworkArgs map[sandbox.NetworkMode][]string
	// StateDir holds the runtime's state (StateDir/state) and the bundles
	// (StateDir/bundles), of this process only. It is created if missing.
	StateDir string
	// GuestPath is the host path of the stockade-guest binary.
	GuestPath string
	// Defaults fill the zero fields of a Spec's limits.
	Defaults sandbox.Limits
	// PeakFromCgroup takes peak memory from the host cgroup (true for runc,
	// where the cgroup holds exactly the sandbox's processes); otherwise the
	// guest's maximum resident set size is used.
	PeakFromCgroup bool
	// CPUFromCgroup takes an Exec's CPU time from the host cgroup (true
	// for runsc, whose Sentry's own count of a task's CPU time runs on
	// while the host throttles it; see sandboxkit.Guest.CPUFromCgroup);
	// otherwise the guest's count of its children's is used.
	CPUFromCgroup bool
	// PrivateRootForMounts gives each sandbox with data mounts an overlay
	// of the image as its root, for runtimes that create mount points in
	// the root they are given (runsc); see mountPrivateRoot.
	PrivateRootForMounts bool
	// Kernel says whether sandboxed code reaches the host kernel (runc) or
	// a user-space kernel (gVisor); the bundle differs slightly.
	Kernel oci.Kernel
	// ChannelFDs is set for a runtime that copies the container's stdio
	// through pipes of its own (runc run): the guest's frames then go over
	// descriptors 3 and 4, passed on with --preserve-fds 2, so that no
	// frame waits on the runtime's copy loop (see package guest, Channel).
	ChannelFDs bool
	// InstallHint is appended to errors about a missing runtime binary.
	InstallHint string
	// ReadyTimeout bounds how long Create waits for the guest's greeting;
	// zero means 30 s.
	ReadyTimeout time.Duration
	// UserNamespace gives each sandbox a user namespace with host ids of
	// its own, from HostIDs; a sandbox with egress gets the one its
	// network was prepared in, if any (sandbox.EgressNet).
	UserNamespace bool
	// HostIDs hands out the user namespaces' host ids; nil means
	// hostids.Default(), which every process on the host shares.
	HostIDs *hostids.Allocator
	// Shim is the command that supervises a detached sandbox (Spec.Detached):
	// `stockade shim`, to which the shim's directory is appended (see
	// package supervisor). Nil refuses detached sandboxes; Reattach works
	// without it.
	Shim []string
	// Snapshots is set for a runtime that saves and restores a running
	// sandbox (runsc checkpoint and restore): the driver is then built
	// with NewSnapshotting, not New, and is a sandbox.Snapshotter.
	Snapshots bool
	// Lacks says why the driver lacks the abilities it lacks
	// (sandbox.Capabilities.Lacks), beyond those no OCI driver has.
	Lacks map[string]string
}

// CgroupParent is the cgroup under which every sandbox's cgroup lives.
const CgroupParent = "/stockade"

// Driver implements sandbox.Driver on an OCI runtime CLI. It is safe for
// concurrent use.
type Driver struct {
	cfg Config
	v2  bool

	health sandboxkit.HealthCache

	selfTestMu  sync.Mutex // serialises self-tests
	selfTestErr error      // the last self-test's failure; nil when it passed or none ran

	adoptOnce sync.Once // adoptBundles, before the first allocation
	orphans   sync.Once // reapOrphans, at the first create

	// spared are the sandboxes Reap leaves alone: those this driver is
	// creating, and those a Reattach returned that are not destroyed yet.
	sparedMu sync.Mutex
	spared   map[string]bool
}

var (
	_ sandbox.Driver        = (*Driver)(nil)
	_ sandbox.HealthChecker = (*Driver)(nil)
	_ sandbox.Reaper        = (*Driver)(nil)
	_ sandbox.Leftovers     = (*Driver)(nil)
	_ sandbox.Reattacher    = (*Driver)(nil)
)

// noBindEgress is why an OCI sandbox gets its network at create only.
const noBindEgress = "a sandbox's network namespace is joined when its runtime starts it; internal/netns prepares egress only as a namespace for a sandbox to join, not inside a running one"

// New returns a driver for cfg. It does not check that the runtime is
// installed; Health does, and Create fails clearly if it is not.
func New(cfg Config) (*Driver, error) {
	if cfg.Snapshots {
		return nil, fmt.Errorf("ocidriver: a Config with Snapshots is built with NewSnapshotting: %w", errdefs.ErrInvalidArgument)
	}
	return newDriver(cfg)
}

func newDriver(cfg Config) (*Driver, error) {
	if cfg.Name == "" || cfg.Binary == "" || cfg.StateDir == "" || cfg.GuestPath == "" {
		return nil, fmt.Errorf("ocidriver: Name, Binary, StateDir and GuestPath are required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	if cfg.NetworkArgs == nil {
		cfg.NetworkArgs = map[sandbox.NetworkMode][]string{sandbox.NetworkNone: nil}
	}
	if cfg.HostIDs == nil {
		cfg.HostIDs = hostids.Default()
	}
	d := &Driver{cfg: cfg, v2: cgroupV2()}
	d.health.Check = d.checkHealth
	return d, nil
}

func (d *Driver) Name() string { return d.cfg.Name }

func (d *Driver) Capabilities() sandbox.Capabilities { return d.cfg.Capabilities() }

// Capabilities are what a driver of c declares, without building one.
func (c Config) Capabilities() sandbox.Capabilities {
	modes := []sandbox.NetworkMode{sandbox.NetworkNone}
	if c.NetworkArgs != nil {
		modes = slices.Sorted(maps.Keys(c.NetworkArgs))
	}
	lacks := map[string]string{"BindEgress": noBindEgress}
	maps.Copy(lacks, c.Lacks)
	return sandbox.Capabilities{
		Tier:          c.Tier,
		SharedKernel:  c.Kernel == oci.HostKernel,
		Boundary:      c.Boundary,
		DefaultCPU:    c.Defaults.CPU,
		NetworkModes:  modes,
		Sessions:      true,
		UserNamespace: c.UserNamespace,
		Health:        true,
		Reap:          true,
		Leftovers:     true,
		Files:         true,
		Kernels:       true,
		Reattach:      true,
		Bind:          true,
		Snapshots:     c.Snapshots,
		Lacks:         lacks,
	}
}

func (d *Driver) stateRoot() string          { return filepath.Join(d.cfg.StateDir, "state") }
func (d *Driver) bundleDir(id string) string { return filepath.Join(d.cfg.StateDir, "bundles", id) }

// runtimeState lists the runtime's state of sandbox id that exists: runc
// keeps a directory named by the id, runsc flat files "<id>_sandbox:<id>"
// (.state, .lock) and a socket "runsc-<id>.sock". Sandbox ids hold no
// pattern characters.
func (d *Driver) runtimeState(id string) []string {
	var out []string
	for _, pattern := range []string{id, id + "_sandbox:*", "runsc-" + id + ".sock"} {
		m, _ := filepath.Glob(filepath.Join(d.stateRoot(), pattern))
		out = append(out, m...)
	}
	return out
}

// removeUnreadableState removes the runtime's state of sandbox id when
// the runtime cannot: runsc writes its .state file in place, so a runsc
// killed while it wrote one (Destroy's last resort, the OOM killer) leaves
// a file that no longer reads as JSON, on which every `runsc delete`
// fails, and the sandbox could never be destroyed nor reaped. Only such a
// file, and only once no process names the sandbox any more (the
// runtime's sandbox and gofer die with it, by their parent-death signal,
// shortly after), lets the state go: the runtime then has nothing left to
// end. It reports whether it removed the state.
func (d *Driver) removeUnreadableState(ctx context.Context, id string) bool {
	unreadable := func() bool {
		for _, f := range d.runtimeState(id) {
			if b, err := os.ReadFile(f); strings.HasSuffix(f, ".state") && err == nil && !json.Valid(b) {
				return true
			}
		}
		return false
	}
	if !unreadable() {
		return false
	}
	for deadline := time.Now().Add(5 * time.Second); len(sandboxkit.ProcessesMentioning(id)) > 0; {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Still unreadable once nothing runs: not a runsc that was writing it
	// when it was read above.
	if !unreadable() {
		return false
	}
	for _, f := range d.runtimeState(id) {
		if err := os.RemoveAll(f); err != nil {
			return false
		}
	}
	return true
}

func (d *Driver) cgroupOf(id string) cgroup {
	return cgroup{sandboxkit.Cgroup{V2: d.v2, Path: CgroupParent + "/" + id}}
}

// Health reports whether the driver can run sandboxes: the runtime answers
// `--version`, the guest agent is a static executable for this host, and
// the last self-test, if one failed, passes when tried again. The answer
// is cached (sandboxkit.HealthCache): Health is asked before every
// invocation and costs a lock and a clock reading while the answer is
// fresh.
func (d *Driver) Health(ctx context.Context) error {
	return d.health.Health(ctx)
}

func (d *Driver) checkHealth(ctx context.Context) error {
	d.selfTestMu.Lock()
	failed := d.selfTestErr
	d.selfTestMu.Unlock()
	if failed != nil {
		// Only a sandbox that starts proves that this is mended.
		return d.SelfTest(ctx)
	}
	if err := d.checkVersion(ctx); err != nil {
		return err
	}
	return sandboxkit.CheckGuest(d.cfg.GuestPath)
}

// checkVersion runs `<runtime> --version`: a runtime that cannot answer
// that (not installed, not executable, built for another host, or a
// stand-in such as /bin/false) cannot run a sandbox either.
func (d *Driver) checkVersion(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.cfg.Binary, "--version")
	cmd.Env = runtimeEnv
	out, err := cmd.CombinedOutput()
	switch {
	case errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist):
		return d.missingBinary(err)
	case err != nil:
		return fmt.Errorf("%s --version failed (%v: %s); %s: %w", d.cfg.Binary, err, sandboxkit.OneLine(string(out)), d.cfg.InstallHint, errdefs.ErrUnavailable)
	case !strings.Contains(string(out), "version"):
		return fmt.Errorf("%s --version printed no version (%q); %s: %w", d.cfg.Binary, sandboxkit.OneLine(string(out)), d.cfg.InstallHint, errdefs.ErrUnavailable)
	}
	return nil
}

// selfTestPrefix starts the IDs of self-test sandboxes, which Reap removes
// whatever their labels: one is left only by a daemon that died during its
// start.
const selfTestPrefix = "selftest-"

// SelfTest starts one sandbox whose root holds nothing but the mount
// points, waits for its guest's greeting and destroys it: the proof, which
// Health cannot give, that the runtime, the guest, the cgroups and the
// security profile work together on this host. The daemon runs it for each
// driver when it starts. Its answer becomes the driver's health; after a
// failure, Health tries it again each time the cached answer expires,
// until it passes.
func (d *Driver) SelfTest(ctx context.Context) error {
	d.selfTestMu.Lock()
	defer d.selfTestMu.Unlock()
	err := d.selfTest(ctx)
	if err != nil {
		err = fmt.Errorf("the %s driver's self-test (one sandbox that only starts) failed: %w", d.cfg.Name, err)
	}
	d.selfTestErr = err
	d.health.Set(err)
	return err
}

func (d *Driver) selfTest(ctx context.Context) error {
	if err := d.checkVersion(ctx); err != nil {
		return err
	}
	if err := sandboxkit.CheckGuest(d.cfg.GuestPath); err != nil {
		return err
	}
	// The root must be reachable from the sandbox's user namespace, whose
	// root is no host user: not below the state directory (0700), but in
	// a directory of its own that every user may traverse and only root
	// may change.
	root, err := os.MkdirTemp("", "stockade-selftest-")
	if err != nil {
		return fmt.Errorf("creating the self-test root: %w", err)
	}
	defer os.RemoveAll(root)
	if err := os.Chmod(root, 0o755); err != nil {
		return fmt.Errorf("creating the self-test root: %w", err)
	}
	// An image holds the mount points of the profile's mounts.
	p := profile.Default()
	dirs := []string{filepath.Dir(p.Guest.Path)}
	for _, m := range p.Mounts {
		dirs = append(dirs, m.Path)
	}
	for _, s := range p.Scratch {
		if !s.SessionOnly {
			dirs = append(dirs, s.Path)
		}
	}
	for _, dir := range dirs {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			return fmt.Errorf("creating the self-test root: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, p.Guest.Path), nil, 0o644); err != nil {
		return fmt.Errorf("creating the self-test root: %w", err)
	}
	// The sandbox's own user reads the root: its modes are set whatever
	// the daemon's umask took off them.
	err = filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			return os.Chmod(p, 0o755)
		}
		return os.Chmod(p, 0o644)
	})
	if err != nil {
		return fmt.Errorf("creating the self-test root: %w", err)
	}
	sb, err := d.Create(ctx, sandbox.Spec{ID: selfTestPrefix + sandbox.NewID(), Image: sandbox.Image{Rootfs: root}})
	if err != nil {
		return err
	}
	return sb.Destroy(ctx)
}

func (d *Driver) missingBinary(err error) error {
	return fmt.Errorf("%s not found (%v); %s: %w", d.cfg.Binary, err, d.cfg.InstallHint, errdefs.ErrUnavailable)
}

// runtimeCmd builds an invocation of the runtime CLI for a sandbox of
// network mode mode. Its environment is fixed: nothing of the caller's
// environment reaches the runtime.
func (d *Driver) runtimeCmd(ctx context.Context, mode sandbox.NetworkMode, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, d.cfg.Binary, d.runtimeArgs(mode, args...)...)
	cmd.Env = runtimeEnv
	return cmd
}

// runtimeArgs are the runtime's arguments for a subcommand (args) of a
// sandbox of network mode mode.
func (d *Driver) runtimeArgs(mode sandbox.NetworkMode, args ...string) []string {
	full := append([]string{"--root", d.stateRoot()}, d.cfg.GlobalArgs...)
	full = append(full, d.cfg.NetworkArgs[mode]...)
	return append(full, args...)
}

// runArgs are the runtime's arguments that run sandbox id, its guest's
// channel passed on as descriptors 3 and 4 after stdio when ChannelFDs is
// set.
func (d *Driver) runArgs(id string) []string {
	args := []string{"run", "--bundle", d.bundleDir(id)}
	if d.cfg.ChannelFDs {
		args = append(args, "--preserve-fds", "2")
	}
	return append(args, id)
}

// runtimeEnv is the runtime's whole environment.
var runtimeEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// Create starts a sandbox: it writes the bundle, starts `<runtime> run` with
// the guest as PID 1 and waits for the guest's greeting.
func (d *Driver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	return d.create(ctx, spec, false)
}

// create is Create, of a sandbox that Bind binds later when unbound.
func (d *Driver) create(ctx context.Context, spec sandbox.Spec, unbound bool) (_ sandbox.Sandbox, err error) {
	id, err := sandbox.ResolveID(spec.ID)
	if err != nil {
		return nil, err
	}
	binary, lerr := exec.LookPath(d.cfg.Binary)
	if lerr != nil {
		return nil, d.missingBinary(lerr)
	}
	if spec.Detached && len(d.cfg.Shim) == 0 {
		// As any Spec field the driver cannot serve (sandbox.Spec.Detached).
		return nil, fmt.Errorf("the %s driver has no shim to supervise a detached sandbox (ocidriver.Config.Shim; the daemon runs `stockade shim`): %w", d.cfg.Name, errdefs.ErrInvalidArgument)
	}
	if _, ok := d.cfg.NetworkArgs[spec.Network]; !ok {
		return nil, fmt.Errorf("the %s driver does not support network mode %q: %w", d.cfg.Name, spec.Network, errdefs.ErrInvalidArgument)
	}
	if spec.Network == sandbox.NetworkEgress && spec.Egress == nil {
		return nil, fmt.Errorf("network mode %q needs a prepared network (Spec.Egress): %w", spec.Network, errdefs.ErrInvalidArgument)
	}
	limits := spec.Limits.WithDefaults(d.cfg.Defaults).WithDefaults(sandbox.DefaultLimits())
	if err := limits.Check(sandbox.Limits{}); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(d.cfg.StateDir, "bundles"), 0o700); err != nil {
		return nil, fmt.Errorf("creating state directory: %w", err)
	}
	// A process's first create removes what killed processes left in the
	// state directory (a SIGKILLed `stockade run`'s sandbox), so that
	// the next run cleans up after the last. A failure leaves them to the
	// next process; it does not stop this create.
	d.orphans.Do(func() { _, _ = d.reapOrphans(ctx) })
	// Until its bundle records its labels, Reap tells the sandbox from what
	// a crashed create left only by this.
	if !d.spare(id, true) {
		return nil, fmt.Errorf("sandbox %q already exists: %w", id, errdefs.ErrConflict)
	}
	defer d.spare(id, false)
	bundle := d.bundleDir(id)
	if err := os.Mkdir(bundle, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("sandbox %q already exists: %w", id, errdefs.ErrConflict)
		}
		return nil, fmt.Errorf("creating bundle directory: %w", err)
	}
	bundleMade(id)
	sb := d.newSbx(id, limits)
	sb.network, sb.labels, sb.unbound = spec.Network, maps.Clone(spec.Labels), unbound
	if spec.Detached {
		sb.shim = &shimState{binary: binary, deadline: spec.Deadline.UTC()}
	}
	defer func() {
		if err != nil {
			_ = sb.Destroy(context.WithoutCancel(ctx))
		}
	}()
	if !spec.Detached {
		// Its creator's end is its end: reapOrphans finds it by this
		// once this process is gone.
		if err := writeCreator(bundle); err != nil {
			return nil, err
		}
	}
	if d.cfg.PrivateRootForMounts && len(spec.Mounts) > 0 {
		root, err := mountPrivateRoot(bundle, spec.Image.Rootfs)
		if err != nil {
			return nil, err
		}
		spec.Image.Rootfs = root
	}
	o := oci.Options{
		ID: id, Spec: spec, Limits: limits, GuestPath: d.cfg.GuestPath,
		CgroupsPath: d.cgroupOf(id).Path, Kernel: d.cfg.Kernel, ChannelFDs: d.cfg.ChannelFDs,
	}
	switch {
	case !d.cfg.UserNamespace:
	case spec.Network != sandbox.NetworkEgress:
		d.adoptOnce.Do(d.adoptBundles)
		if sb.ids, err = d.cfg.HostIDs.Allocate(bundle); err != nil {
			return nil, err
		}
		o.HostUIDBase = sb.ids.Base
	case spec.Egress.UserNSPath != "":
		// The network namespace belongs to this user namespace, made
		// with it: the sandbox joins both.
		o.HostUIDBase, o.UserNSPath = spec.Egress.HostIDBase, spec.Egress.UserNSPath
	default:
		// A network namespace of the host's user namespace: a new user
		// namespace could not mount sysfs for it, so the sandbox runs
		// without one.
	}
	if spec.Network == sandbox.NetworkEgress {
		// The bundle is removed with the sandbox, and its resolv.conf
		// with it.
		o.NetNSPath = spec.Egress.NetNSPath
		o.ResolvConf = filepath.Join(bundle, "resolv.conf")
		if err := os.WriteFile(o.ResolvConf, spec.Egress.ResolvConf, 0o644); err != nil {
			return nil, fmt.Errorf("writing resolv.conf: %w", err)
		}
		// The sandbox's own user reads it, whatever the daemon's umask.
		if err := os.Chmod(o.ResolvConf, 0o644); err != nil {
			return nil, fmt.Errorf("writing resolv.conf: %w", err)
		}
	}
	s, err := oci.Build(o)
	if err != nil {
		return nil, fmt.Errorf("building OCI spec: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := oci.WriteConfig(bundle, s); err != nil {
		return nil, err
	}
	if err := sb.cg.prepare(limits.Memory); err != nil {
		return nil, err
	}
	if err := sb.start(ctx); err != nil {
		return nil, err
	}
	return sb, nil
}

// bundleMade is called as a create has made the bundle's directory (tests
// reap there).
var bundleMade = func(id string) {}

// Leftovers lists anything of sandbox id that is still on the host: runtime
// state, bundle, cgroups, runtime processes. Empty means clean. It reads
// the host's files only, and does not use ctx.
func (d *Driver) Leftovers(_ context.Context, id string) []string {
	out := d.runtimeState(id)
	if _, err := os.Stat(d.bundleDir(id)); err == nil {
		out = append(out, d.bundleDir(id))
	}
	out = append(out, d.cgroupOf(id).Dirs()...)
	if _, err := os.Stat(d.shimDir(id)); err == nil {
		out = append(out, d.shimDir(id))
	}
	// The runtime's processes, and a shim's, name the sandbox's ID.
	out = append(out, sandboxkit.ProcessesMentioning(id)...)
	return out
}

// Reap destroys every sandbox whose bundle carries all labels of match,
// whether or not its runtime process is still alive, every self-test
// sandbox left behind, and every bundle that records nothing (a create
// that crashed before it wrote the bundle's config, so before it started
// anything). A state directory is one process's (Config.StateDir), so a
// bundle without a record that this driver is not creating is such a
// leftover.
func (d *Driver) Reap(ctx context.Context, match map[string]string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(d.cfg.StateDir, "bundles"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing bundles: %w", err)
	}
	d.adoptOnce.Do(d.adoptBundles)
	var reaped []string
	for _, e := range entries {
		id := e.Name()
		if d.isSpared(id) {
			continue
		}
		if !strings.HasPrefix(id, selfTestPrefix) && d.recorded(id) && !hasLabels(d.labelsOf(id), match) {
			continue
		}
		sb := d.newSbx(id, sandbox.Limits{})
		if err := sb.Destroy(ctx); err != nil {
			return reaped, err
		}
		reaped = append(reaped, id)
	}
	return reaped, nil
}

// hasLabels reports whether labels carry every label of match.
func hasLabels(labels, match map[string]string) bool {
	for k, v := range match {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// labelsOf returns the labels of sandbox id: its shim's record's, when it
// is detached and the record is this driver's, else its bundle's
// annotations and its binding's.
func (d *Driver) labelsOf(id string) map[string]string {
	if m, err := d.readShimMeta(id); err == nil {
		return m.Labels
	}
	labels := map[string]string{}
	for k, v := range readBundle(d.bundleDir(id)).Annotations {
		if name, ok := strings.CutPrefix(k, oci.LabelPrefix); ok {
			labels[name] = v
		}
	}
	maps.Copy(labels, readBinding(d.bundleDir(id)))
	return labels
}

// recorded reports whether sandbox id's bundle records it: a config that
// reads, or a shim's record.
func (d *Driver) recorded(id string) bool {
	if _, err := d.readShimMeta(id); err == nil {
		return true
	}
	b, err := os.ReadFile(filepath.Join(d.bundleDir(id), "config.json"))
	return err == nil && json.Valid(b)
}

// bundleConfig is what the driver reads back from a bundle's config.json.
type bundleConfig struct {
	Annotations map[string]string `json:"annotations"`
	Linux       struct {
		UIDMappings []struct {
			ContainerID uint32 `json:"containerID"`
			HostID      uint32 `json:"hostID"`
		} `json:"uidMappings"`
	} `json:"linux"`
}

// readBundle reads a bundle's config.json; zero when it cannot.
func readBundle(dir string) bundleConfig {
	var c bundleConfig
	if b, err := os.ReadFile(filepath.Join(dir, "config.json")); err == nil {
		_ = json.Unmarshal(b, &c)
	}
	return c
}

// hostIDBase is the host id the bundle maps root to; zero without a user
// namespace.
func (c bundleConfig) hostIDBase() uint32 {
	for _, m := range c.Linux.UIDMappings {
		if m.ContainerID == 0 {
			return m.HostID
		}
	}
	return 0
}

// adoptBundles records the host ids of the bundles already in the state
// directory (a crashed process's sandboxes, or a sandbox of its egress
// network's user namespace, whose pin the daemon removes at start) as in
// use for as long as each bundle exists, so that no new sandbox is given
// them before the reaper has destroyed their sandboxes. Slots already
// recorded, which is the usual case, stay as they are.
func (d *Driver) adoptBundles() {
	entries, _ := os.ReadDir(filepath.Join(d.cfg.StateDir, "bundles"))
	for _, e := range entries {
		dir := d.bundleDir(e.Name())
		if base := readBundle(dir).hostIDBase(); base != 0 {
			_ = d.cfg.HostIDs.Adopt(base, dir)
		}
	}
}
