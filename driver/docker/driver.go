// Package docker is the `docker` tier: sandboxes are containers of a Docker
// Engine, driven through its API (github.com/moby/moby/client), with the
// same security profile as the container tier (docs/design.md §3) and the
// same guest agent as PID 1, reached over the container's attached stdin and
// stdout.
//
// The runtime image is imported into the engine from the image store on first
// use, with the guest agent inside it, so a sandbox has no host bind mount.
// Every container carries the label sh.stockade.sandbox=<id> and is removed
// by Destroy, or by Reap after a crash.
//
//	d, err := docker.New(docker.Config{Host: "unix:///run/stockade/docker.sock", GuestPath: guestPath})
//	sb, err := d.Create(ctx, sandbox.Spec{Image: img})
package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/oci"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/sandbox"
)

// Labels every container of this driver carries.
const (
	// LabelSandbox holds the sandbox ID.
	LabelSandbox = "sh.stockade.sandbox"
	// LabelPrefix prefixes the keys of Spec.Labels, as in the OCI tiers'
	// annotations.
	LabelPrefix = oci.LabelPrefix
)

// DefaultCPU is the CPU share of a docker-tier sandbox.
const DefaultCPU = 0.5

// containerPrefix starts the name of every container of this driver.
const containerPrefix = "stockade-"

// Config configures the docker driver.
type Config struct {
	// Host is the engine's address, e.g. "unix:///run/stockade/docker.sock"
	// or "tcp://127.0.0.1:2375". Empty means the Docker client's default,
	// unix:///var/run/docker.sock.
	Host string
	// GuestPath is the host path of the stockade-guest binary, which is
	// added to every imported image. Required.
	GuestPath string
	// Defaults fill the zero fields of a Spec's limits; zero fields of
	// Defaults take sandbox.DefaultLimits and a CPU of DefaultCPU.
	Defaults sandbox.Limits
	// ReadyTimeout bounds how long Create waits for the guest's greeting;
	// zero means 30 s.
	ReadyTimeout time.Duration
}

// Driver implements sandbox.Driver on a Docker Engine. It is safe for
// concurrent use. It connects lazily: New does no I/O, and an engine that is
// unreachable only fails Health and Create.
type Driver struct {
	cfg     Config
	cli     *client.Client
	seccomp string // the tightened profile as Docker's JSON

	importing chan struct{}   // holds a token while an import runs: one at a time
	imageMu   sync.Mutex      // guards images
	images    map[string]bool // tags known to exist in the engine

	guestMu  sync.Mutex
	guestSum guestSum

	recent recentSandboxes // for Leftovers

	health sandboxkit.HealthCache
}

var (
	_ sandbox.Driver        = (*Driver)(nil)
	_ sandbox.HealthChecker = (*Driver)(nil)
	_ sandbox.Reaper        = (*Driver)(nil)
	_ sandbox.Leftovers     = (*Driver)(nil)
)

// noReattach is why the docker tier has no detached sandboxes.
const noReattach = "the guest channel is an attach stream through dockerd, which passes bytes, not frames: a daemon that stops in the middle of a frame leaves half of it in the guest's stdin, and a new attach cannot tell where the next frame starts"

// New returns a docker driver for cfg. It does not contact the engine.
func New(cfg Config) (*Driver, error) {
	if cfg.GuestPath == "" {
		return nil, fmt.Errorf("docker: GuestPath is required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	cfg.Defaults = cfg.Defaults.WithDefaults(sandbox.Limits{CPU: DefaultCPU}).WithDefaults(sandbox.DefaultLimits())
	opts := []client.Opt{client.WithAPIVersionNegotiation()}
	if cfg.Host != "" {
		opts = append(opts, client.WithHost(cfg.Host))
	}
	cli, err := client.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("docker: engine address %q: %v: %w", cfg.Host, err, errdefs.ErrInvalidArgument)
	}
	sc, err := oci.Seccomp()
	if err != nil {
		return nil, err
	}
	// Docker's profile format is a superset of the OCI one: the OCI JSON is
	// a valid Docker profile with the same meaning.
	b, err := json.Marshal(sc)
	if err != nil {
		return nil, fmt.Errorf("encoding seccomp profile: %w", err)
	}
	d := &Driver{cfg: cfg, cli: cli, seccomp: string(b), images: map[string]bool{}, importing: make(chan struct{}, 1)}
	d.health.Check = d.checkHealth
	return d, nil
}

// Close releases the driver's idle connections to the engine. Sandboxes
// must be destroyed first.
func (d *Driver) Close() error { return d.cli.Close() }

func (d *Driver) Name() string { return "docker" }

func (d *Driver) Capabilities() sandbox.Capabilities { return Capabilities() }

// Capabilities are what the docker driver declares, without building one.
func Capabilities() sandbox.Capabilities {
	return sandbox.Capabilities{
		Tier:         sandbox.TierDocker,
		SharedKernel: true,
		Boundary:     "Linux namespaces, cgroups, seccomp filter, no capabilities, managed by dockerd (shared host kernel)",
		DefaultCPU:   DefaultCPU,
		NetworkModes: []sandbox.NetworkMode{sandbox.NetworkNone},
		Sessions:     true,
		Health:       true,
		Reap:         true,
		Leftovers:    true,
		Files:        true,
		Kernels:      true,
		Lacks: map[string]string{
			"Bind":       "a container's labels are fixed when it is created, so the engine could not keep a binding's labels for Reap",
			"BindEgress": "the docker tier has no egress at all",
			"Reattach":   noReattach,
			"Snapshots":  "docker checkpoints through CRIU, which cannot dump any process on this host's kernel, and a restored container's guest would need a re-attach, which the attach stream cannot give (see Reattach)",
		},
	}
}

// Host is the engine address the driver talks to.
func (d *Driver) Host() string { return d.cli.DaemonHost() }

// Health reports whether the driver can run sandboxes: the engine answers
// a ping (negotiating the API version) and the guest agent is a static
// executable for this host. The answer is cached (sandboxkit.HealthCache):
// Health is asked before every invocation.
func (d *Driver) Health(ctx context.Context) error {
	return d.health.Health(ctx)
}

func (d *Driver) checkHealth(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := d.cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			// An engine that takes 5 s to answer a ping is as good as down.
			return d.unreachable("reaching", err)
		}
		return d.engineError("reaching", err)
	}
	return sandboxkit.CheckGuest(d.cfg.GuestPath)
}

// unreachable is the error of an engine that does not answer, with the hint
// that starts one.
func (d *Driver) unreachable(doing string, err error) error {
	return fmt.Errorf("%s the Docker engine at %s: %v; start one with `scripts/dockerd.sh start DIR` and set the docker host (DOCKER_HOST) to what it prints: %w",
		doing, d.Host(), err, errdefs.ErrUnavailable)
}

// engineError classifies an error of the engine API: an engine that cannot
// be reached is ErrUnavailable with a hint, the others keep their class.
func (d *Driver) engineError(doing string, err error) error {
	switch {
	case client.IsErrConnectionFailed(err):
		return d.unreachable(doing, err)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%s the Docker engine: %w", doing, err)
	case errors.Is(err, context.DeadlineExceeded):
		// The caller's deadline, which a long import can pass: not an
		// engine that is down (Health's ping, with a deadline of its own,
		// says so).
		return fmt.Errorf("%s the Docker engine: %w: %w", doing, err, errdefs.ErrUnavailable)
	case cerrdefs.IsNotFound(err):
		return fmt.Errorf("%s the Docker engine: %v: %w", doing, err, errdefs.ErrNotFound)
	case cerrdefs.IsConflict(err):
		return fmt.Errorf("%s the Docker engine: %v: %w", doing, err, errdefs.ErrConflict)
	case cerrdefs.IsInvalidArgument(err):
		return fmt.Errorf("%s the Docker engine: %v: %w", doing, err, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("%s the Docker engine: %v: %w", doing, err, errdefs.ErrUnavailable)
}

// Create starts a sandbox: it imports the image if the engine lacks it,
// creates the container, attaches to its stdio, starts it and waits for the
// guest's greeting.
func (d *Driver) Create(ctx context.Context, spec sandbox.Spec) (_ sandbox.Sandbox, err error) {
	id, err := sandbox.ResolveID(spec.ID)
	if err != nil {
		return nil, err
	}
	if spec.Detached {
		return nil, fmt.Errorf("the docker driver cannot detach a sandbox: %s: %w", noReattach, errdefs.ErrInvalidArgument)
	}
	if spec.Workspace < 0 {
		return nil, fmt.Errorf("a /workspace of %d bytes: %w", spec.Workspace, errdefs.ErrInvalidArgument)
	}
	limits := spec.Limits.WithDefaults(d.cfg.Defaults)
	if err := limits.Check(sandbox.Limits{}); err != nil {
		return nil, err
	}
	tag, err := d.ImportImage(ctx, spec.Image)
	if err != nil {
		return nil, err
	}
	cc, hc, err := d.containerConfig(id, spec, limits, tag)
	if err != nil {
		return nil, fmt.Errorf("building container config: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	created, err := d.cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: containerPrefix + id, Config: cc, HostConfig: hc})
	if cerrdefs.IsNotFound(err) {
		// The image was removed from the engine behind our back: import
		// it again, once.
		d.forgetImage(tag)
		if tag, err = d.ImportImage(ctx, spec.Image); err != nil {
			return nil, err
		}
		cc.Image = tag
		created, err = d.cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: containerPrefix + id, Config: cc, HostConfig: hc})
	}
	if err != nil {
		if cerrdefs.IsConflict(err) {
			return nil, fmt.Errorf("sandbox %q already exists: %w", id, errdefs.ErrConflict)
		}
		// The engine may have created the container before ctx ended or
		// the connection broke; remove it by its name (Reap would later).
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		_ = d.remove(rctx, containerPrefix+id)
		cancel()
		return nil, d.engineError("creating a container in", err)
	}
	sb := d.newSbx(id, created.ID, limits)
	d.recent.add(id, created.ID)
	defer func() {
		if err != nil {
			_ = sb.Destroy(context.WithoutCancel(ctx))
		}
	}()
	if err := sb.start(ctx); err != nil {
		return nil, err
	}
	return sb, nil
}

// Leftovers lists anything of sandbox id that is still there: containers
// labelled with it, and, for sandboxes this driver created, the container's
// cgroups and processes on this host. Empty means clean. It is meant for
// tests and bounds itself to 10 s within ctx.
func (d *Driver) Leftovers(ctx context.Context, id string) []string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out []string
	list, err := d.cli.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", LabelSandbox+"="+id),
	})
	if err != nil {
		out = append(out, fmt.Sprintf("listing containers: %v", err))
	}
	for _, c := range list.Items {
		out = append(out, fmt.Sprintf("container %s %v (%s)", c.ID, c.Names, c.State))
	}
	if _, err := d.cli.ContainerInspect(ctx, containerPrefix+id, client.ContainerInspectOptions{}); err == nil {
		out = append(out, "container "+containerPrefix+id)
	}
	if rec, ok := d.recent.get(id); ok {
		out = append(out, rec.cgroup.Dirs()...)
		// The container's shim names the container's full ID.
		out = append(out, sandboxkit.ProcessesMentioning(rec.containerID)...)
	}
	return out
}

// Reap removes every container of this driver whose labels contain all of
// match (with an empty match, every container of this driver on the
// engine), running or not, and returns their sandbox IDs.
func (d *Driver) Reap(ctx context.Context, match map[string]string) ([]string, error) {
	f := make(client.Filters).Add("label", LabelSandbox)
	for k, v := range match {
		f.Add("label", LabelPrefix+k+"="+v)
	}
	list, err := d.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return nil, d.engineError("listing containers of", err)
	}
	var reaped []string
	for _, c := range list.Items {
		if err := d.remove(ctx, c.ID); err != nil {
			return reaped, err
		}
		reaped = append(reaped, c.Labels[LabelSandbox])
	}
	sort.Strings(reaped)
	return reaped, nil
}

// remove kills and removes one container. A container that is already gone
// is success.
func (d *Driver) remove(ctx context.Context, cid string) error {
	_, err := d.cli.ContainerRemove(ctx, cid, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	if err == nil || cerrdefs.IsNotFound(err) {
		return nil
	}
	if cerrdefs.IsConflict(err) {
		// Another removal is in progress; wait for it to finish.
		for range 50 {
			if _, ierr := d.cli.ContainerInspect(ctx, cid, client.ContainerInspectOptions{}); cerrdefs.IsNotFound(ierr) {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("removing container %.12s: %w", cid, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return d.engineError(fmt.Sprintf("removing container %.12s from", cid), err)
}

// recentSandboxes remembers the container and cgroup of the last sandboxes
// created, so that Leftovers can look for their traces on the host after the
// container is gone. It is bounded: old entries are forgotten.
type recentSandboxes struct {
	mu    sync.Mutex
	byID  map[string]*sandboxRecord
	order []string
}

type sandboxRecord struct {
	containerID string
	cgroup      sandboxkit.Cgroup
}

const maxRecent = 1024

func (r *recentSandboxes) add(id, containerID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byID == nil {
		r.byID = map[string]*sandboxRecord{}
	}
	if _, ok := r.byID[id]; !ok {
		r.order = append(r.order, id)
	}
	r.byID[id] = &sandboxRecord{containerID: containerID}
	if len(r.order) > maxRecent {
		delete(r.byID, r.order[0])
		r.order = r.order[1:]
	}
}

func (r *recentSandboxes) setCgroup(id string, cg sandboxkit.Cgroup) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec, ok := r.byID[id]; ok {
		rec.cgroup = cg
	}
}

func (r *recentSandboxes) get(id string) (sandboxRecord, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.byID[id]
	if !ok {
		return sandboxRecord{}, false
	}
	return *rec, true
}
