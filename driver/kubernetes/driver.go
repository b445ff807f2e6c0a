// Package kubernetes is the `kubernetes` driver: a sandbox is a pod of a
// Kubernetes cluster, driven through its API (k8s.io/client-go), with
// Stockade's security profile in the pod's terms (docs/design.md §3) and the
// same guest agent as PID 1, reached over the pod's attach stream (stdin and
// stdout, WebSocket with a fall back to SPDY), as driver/docker reaches it
// over a container's.
//
// One driver value serves one tier: TierGVisor runs its pods with the
// cluster's gVisor RuntimeClass (Config.RuntimeClass, "gvisor" unless
// named), TierContainer with the cluster's default runtime (runc) or the
// RuntimeClass named.
//
// The pod: one container of the runtime image with the guest inside
// (images: see ImageRef and WriteImageArchive), no service account token,
// no host namespace, no host path the pod spec could leave out (the
// kubelet still mounts /etc/hosts, /etc/hostname, /etc/resolv.conf and
// /dev/termination-log into every container), uid and gid 65534, every
// capability dropped, no privilege escalation, Stockade's seccomp filter
// (a Localhost profile: Config.Seccomp) or RuntimeDefault, a
// read-only root, memory-backed /tmp, resources from the limits (requests
// equal limits). Every pod carries the labels LabelManaged and
// LabelSandbox (and LabelOwner), and the Spec's labels in an annotation,
// so that Reap finds what a crashed daemon left.
//
// Network: none. A pod has the cluster network's interface; the driver
// puts a deny-all NetworkPolicy in its namespace (enforced only where the
// cluster's network plugin enforces policies), and under gVisor the
// RuntimeClass should run runsc with --network=none, which leaves the pod
// loopback only. A Spec with egress is refused with the reason.
//
// What the cluster must give for the profile to hold: Stockade's seccomp
// filter on each node (SeccompProfile, named in Config.Seccomp), and a
// gVisor RuntimeClass whose runsc runs with --network=none and
// --oci-seccomp (without it runsc ignores the pod's filter). What it
// cannot give through a pod's spec (the conformance suite shows each): a
// pids limit per pod (the kubelet's podPidsLimit is one for the node),
// nosuid and nodev on /tmp (an emptyDir), a /dev and /etc without the
// kubelet's files (see docs/kubernetes.md), and, unless the daemon runs
// on the pods' node and reads their cgroups (nodeCgroup), an OOM kill of
// a process other than PID 1 told as such (the kubelet reports PID 1's
// only, as the container's terminated reason OOMKilled).
//
// Warm one-shot pools: CreateUnbound and Bind (bind.go); a binding adds
// its labels to the pod's and may shorten its lifetime, but cannot change
// its memory or CPU (Capabilities.BindFixedLimits).
//
// Absent, with the reasons in Capabilities.Lacks: detached sandboxes
// (re-attach, and so session pools), egress given at bind time,
// snapshots (pause, resume, fork).
//
//	d, err := kubernetes.New(kubernetes.Config{Kubeconfig: path, Namespace: "stockade", Tier: sandbox.TierGVisor})
//	sb, err := d.Create(ctx, sandbox.Spec{Image: img})
package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/oci"
	"github.com/stockade-sh/stockade/internal/registry"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// Default CPU shares, as the local tiers'.
const (
	DefaultCPUContainer = 0.5
	DefaultCPUGVisor    = 1
)

// DefaultCallTimeout bounds each call to the API server unless
// Config.CallTimeout says otherwise.
const DefaultCallTimeout = 30 * time.Second

// DefaultQPS is the rate of requests a second the driver's clients allow
// themselves together (one token bucket per driver) when the cluster's
// configuration sets none (twice as many in a burst).
const DefaultQPS = 50

// DefaultSessionCeiling is the SessionCeiling unless Config says
// otherwise: the configuration's default sessions.max_ttl.
const DefaultSessionCeiling = 24 * time.Hour

// reapWait bounds how long Reap waits for the pods it deleted to be gone:
// a pod on a node that does not answer stays Terminating until the node
// comes back or is removed, which Reap does not wait for.
const reapWait = 5 * time.Second

// DefaultRuntimeClass is the gVisor RuntimeClass a TierGVisor driver uses
// unless Config.RuntimeClass names another.
const DefaultRuntimeClass = "gvisor"

// Config configures the kubernetes driver.
type Config struct {
	// Kubeconfig is the path of a kubeconfig file; empty means the
	// in-cluster configuration (the daemon runs in a pod of the cluster).
	Kubeconfig string
	// Namespace holds the sandboxes' pods and their network policy.
	// Required.
	Namespace string
	// Tier is TierGVisor or TierContainer.
	Tier sandbox.Tier
	// RuntimeClass is the pods' RuntimeClass: for TierGVisor empty means
	// DefaultRuntimeClass, for TierContainer the cluster's default runtime.
	RuntimeClass string
	// Owner, when set, is put on every pod (LabelOwner), and Reap and
	// Leftovers look only at pods that carry it: the daemon's name, where
	// several share a namespace.
	Owner string
	// GuestPath is the host path of the stockade-guest binary that the
	// images carry (it names them: ImageRef). Required unless ImageRef is.
	GuestPath string
	// Registry, if set, is where `stockade image push` put the images:
	// host[:port][/prefix] (registry.ParseReference). Pods then name their image
	// Registry/<name>@<digest>, pulled IfNotPresent, the digest being
	// what the registry's tag of the image names (see imageRef); empty
	// means ImageRef(img, guest digest), imported on the node, never
	// pulled.
	Registry string
	// RegistryInsecure has the driver ask Registry over plain http, not
	// https (the nodes' containerd must pull it so too).
	RegistryInsecure bool
	// RegistryAuth is how the driver asks Registry for the digests of its
	// tags: basic auth (what `stockade image push` takes), the HTTP
	// client.
	RegistryAuth registry.Options
	// ImageRef, if set, names the image of a pod and how the kubelet gets
	// it, instead of Registry or ImageRef(img, guest digest).
	// Its images must hold TerminationLogDir, root's, mode 0700, as
	// WriteImageArchive's do (docs/kubernetes.md).
	ImageRef func(img sandbox.Image) (ref string, pull corev1.PullPolicy, err error)
	// Seccomp, if set, is the name of Stockade's seccomp filter on the
	// nodes, relative to the kubelet's seccomp directory
	// (<kubelet root>/seccomp), whose contents and name SeccompProfile
	// gives. Empty means the runtime's default filter
	// (RuntimeDefault), which lets ptrace, process_vm_readv, TIOCSTI and
	// AF_PACKET sockets through.
	Seccomp string
	// Defaults fill the zero fields of a Spec's limits; zero fields take
	// sandbox.DefaultLimits and the tier's default CPU.
	Defaults sandbox.Limits
	// ReadyTimeout bounds how long Create waits for the pod to run and the
	// guest to greet; zero means 60 s (a pulled image takes longer).
	ReadyTimeout time.Duration
	// SessionCeiling is the longest a session's pod (a Spec with a
	// Workspace and no Deadline) may run before the kubelet ends it, less
	// a margin (see podLifetime); zero means DefaultSessionCeiling.
	SessionCeiling time.Duration
	// Log receives what the driver cannot return: a failed deletion of
	// the pod of a Create that failed. Nil means slog.Default().
	Log *slog.Logger
	// CallTimeout bounds each call to the API server but the watch and
	// the attach stream (also as the Timeout of the client New builds);
	// zero means DefaultCallTimeout.
	CallTimeout time.Duration
	// Client and REST, when set, are used instead of those Kubeconfig
	// gives: tests pass a fake clientset (Create then needs REST for the
	// attach stream).
	Client kubernetes.Interface
	REST   *rest.Config
}

// Driver implements sandbox.Driver on a Kubernetes cluster. It is safe for
// concurrent use. New does no I/O: a cluster that cannot be reached fails
// only Health and Create.
type Driver struct {
	cfg    Config
	cs     kubernetes.Interface // every call but the watch and the attach (Timeout: CallTimeout)
	watch  kubernetes.Interface // the watch of awaitRunning (no Timeout, which would cut it)
	rest   *rest.Config         // the attach stream's (no Timeout)
	caps   sandbox.Capabilities
	health sandboxkit.HealthCache

	reapWait time.Duration // reapWait; tests shorten it

	policyMu sync.Mutex
	policyOK bool // the deny-all policy exists

	guest    guestDigest
	registry *registry.Location // Registry parsed; nil without
	digests  digestCache        // the images' digests in the registry, with one
}

var (
	_ sandbox.Driver        = (*Driver)(nil)
	_ sandbox.HealthChecker = (*Driver)(nil)
	_ sandbox.Reaper        = (*Driver)(nil)
	_ sandbox.Leftovers     = (*Driver)(nil)
	_ sandbox.Binder        = (*Driver)(nil)
)

// noReattach is why the kubernetes driver has no detached sandboxes.
const noReattach = "the guest channel is the pod's attach stream, which passes bytes, not frames: a daemon that stops in the middle of a frame leaves half of it in the guest's stdin, and a new attach cannot tell where the next frame starts"

// New returns a driver for cfg. It reads the kubeconfig but does not
// contact the cluster.
func New(cfg Config) (*Driver, error) {
	if cfg.Namespace == "" {
		return nil, fmt.Errorf("kubernetes: Namespace is required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.ImageRef == nil && cfg.GuestPath == "" {
		return nil, fmt.Errorf("kubernetes: GuestPath or ImageRef is required: %w", errdefs.ErrInvalidArgument)
	}
	var (
		reg    *registry.Location
		client *registry.Client
	)
	if cfg.Registry != "" {
		loc, err := registry.ParseReference(cfg.Registry)
		if err != nil {
			return nil, err
		}
		if cfg.RegistryInsecure {
			loc.Scheme = "http"
		}
		if client, err = registry.New(loc, cfg.RegistryAuth); err != nil {
			return nil, err
		}
		reg = &loc
	}
	var cpu float64
	switch cfg.Tier {
	case sandbox.TierGVisor:
		cpu = DefaultCPUGVisor
		if cfg.RuntimeClass == "" {
			cfg.RuntimeClass = DefaultRuntimeClass
		}
	case sandbox.TierContainer:
		cpu = DefaultCPUContainer
	default:
		return nil, fmt.Errorf("kubernetes: tier %q: want %s or %s: %w", cfg.Tier, sandbox.TierGVisor, sandbox.TierContainer, errdefs.ErrInvalidArgument)
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 60 * time.Second
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.SessionCeiling == 0 {
		cfg.SessionCeiling = DefaultSessionCeiling
	}
	cfg.Defaults = cfg.Defaults.WithDefaults(sandbox.Limits{CPU: cpu}).WithDefaults(sandbox.DefaultLimits())
	d := &Driver{cfg: cfg, cs: cfg.Client, watch: cfg.Client, rest: cfg.REST, reapWait: reapWait, registry: reg}
	d.digests.client = client
	if d.rest == nil {
		var err error
		if cfg.Kubeconfig == "" {
			d.rest, err = rest.InClusterConfig()
		} else {
			d.rest, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
		}
		if err != nil {
			return nil, fmt.Errorf("kubernetes: reading the cluster's configuration: %v: %w", err, errdefs.ErrInvalidArgument)
		}
	}
	if d.rest.QPS == 0 && d.rest.Burst == 0 {
		// client-go's default, 5 requests a second (burst 10), is for
		// occasional clients: a daemon creating, watching and deleting
		// pods met it at two pods at once (Destroy's polls waited over a
		// second; bench/kube's -qps). A controller's budget instead; the
		// API server's priority and fairness still bounds us.
		// One token bucket for the driver's clients (the calls', the
		// watch's and the attach stream's), which CopyConfig shares.
		d.rest = rest.CopyConfig(d.rest) // not the caller's Config.REST
		d.rest.QPS, d.rest.Burst = DefaultQPS, 2*DefaultQPS
		d.rest.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(DefaultQPS, 2*DefaultQPS)
	}
	if d.cs == nil {
		// The Timeout of an http.Client ends a watch's response too: the
		// watch has a client without it, and the attach stream's
		// executors take no Timeout from d.rest.
		bounded := rest.CopyConfig(d.rest)
		bounded.Timeout = cfg.CallTimeout
		cs, err := kubernetes.NewForConfig(bounded)
		if err != nil {
			return nil, fmt.Errorf("kubernetes: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		ws, err := kubernetes.NewForConfig(d.rest)
		if err != nil {
			return nil, fmt.Errorf("kubernetes: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		d.cs, d.watch = cs, ws
	}
	d.caps = Capabilities(cfg)
	d.health.Check = d.checkHealth
	return d, nil
}

func (d *Driver) Name() string { return "kubernetes" }

func (d *Driver) Capabilities() sandbox.Capabilities { return d.caps }

// Capabilities returns what the driver New(cfg) returns declares (its
// tier, RuntimeClass and filter are cfg's), without building it.
func Capabilities(cfg Config) sandbox.Capabilities {
	tier, runtimeClass, cpu := cfg.Tier, cfg.RuntimeClass, DefaultCPUContainer
	if tier == sandbox.TierGVisor {
		cpu = DefaultCPUGVisor
		if runtimeClass == "" {
			runtimeClass = DefaultRuntimeClass
		}
	}
	filter := "the runtime's default seccomp filter"
	if cfg.Seccomp != "" {
		filter = "Stockade's seccomp filter"
	}
	c := sandbox.Capabilities{
		Tier:         tier,
		SharedKernel: tier == sandbox.TierContainer,
		Remote:       true,
		Boundary:     "Linux namespaces, cgroups, " + filter + ", no capabilities, in a pod of a Kubernetes cluster (shared node kernel)",
		DefaultCPU:   cpu,
		NetworkModes: []sandbox.NetworkMode{sandbox.NetworkNone},
		Sessions:     true,
		Health:       true,
		Reap:         true,
		Leftovers:    true,
		Files:        true,
		Kernels:      true,
		Bind:         true,
		// A running pod's resources cannot be changed (in-place pod
		// resizing is not something every cluster has): see Bind.
		BindFixedLimits: true,
		Lacks: map[string]string{
			"BindEgress": "the kubernetes driver has no egress at all",
			"Reattach":   noReattach,
			"Snapshots":  "a cluster cannot pause, checkpoint or fork a pod's sandbox through its API (and a restored guest would need a re-attach, which the attach stream cannot give)",
		},
	}
	if tier == sandbox.TierGVisor {
		c.Boundary = "gVisor's user-space kernel (RuntimeClass " + runtimeClass + ") in a pod of a Kubernetes cluster, no capabilities"
	}
	return c
}

// Health reports whether the driver can run sandboxes: the API server
// answers a listing of the namespace's pods. The answer is cached
// (sandboxkit.HealthCache): Health is asked before every invocation.
func (d *Driver) Health(ctx context.Context) error { return d.health.Health(ctx) }

func (d *Driver) checkHealth(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := d.cs.CoreV1().Pods(d.cfg.Namespace).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return d.apiError("listing pods in namespace "+d.cfg.Namespace+" of", err)
	}
	return nil
}

// apiError classifies an error of the API server by its status.
func (d *Driver) apiError(doing string, err error) error {
	var class error
	switch {
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("%s the cluster: %w", doing, err)
	case apierrors.IsNotFound(err):
		class = errdefs.ErrNotFound
	case apierrors.IsAlreadyExists(err), apierrors.IsConflict(err):
		class = errdefs.ErrConflict
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		class = errdefs.ErrInvalidArgument
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		class = errdefs.ErrPermissionDenied
	default:
		class = errdefs.ErrUnavailable
	}
	return fmt.Errorf("%s the cluster: %v: %w", doing, err, class)
}

// Create starts a sandbox: it makes sure of the namespace's deny-all
// policy, creates the pod, waits for its container to run, attaches to it
// and waits for the guest's greeting. On error the pod is deleted.
func (d *Driver) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	return d.create(ctx, spec, false)
}

// create is Create, of a sandbox that Bind binds later when unbound.
func (d *Driver) create(ctx context.Context, spec sandbox.Spec, unbound bool) (_ sandbox.Sandbox, err error) {
	id, err := sandbox.ResolveID(spec.ID)
	if err != nil {
		return nil, err
	}
	if spec.Detached {
		return nil, fmt.Errorf("the kubernetes driver cannot detach a sandbox: %s: %w", noReattach, errdefs.ErrInvalidArgument)
	}
	limits := spec.Limits.WithDefaults(d.cfg.Defaults)
	if err := limits.Check(sandbox.Limits{}); err != nil {
		return nil, err
	}
	ref, pull, err := d.imageRef(ctx, spec.Image)
	if err != nil {
		return nil, err
	}
	pod, err := buildPod(profile.Default(), podConfig{
		ID: id, Namespace: d.cfg.Namespace, Owner: d.cfg.Owner, Image: ref, PullPolicy: pull,
		RuntimeClass: d.cfg.RuntimeClass, Sysctls: d.cfg.Tier == sandbox.TierContainer, Seccomp: d.cfg.Seccomp,
		NProc:    d.cfg.Tier == sandbox.TierGVisor,
		Lifetime: podLifetime(spec, limits, d.cfg.ReadyTimeout, d.cfg.SessionCeiling, time.Now()),
	}, spec, limits)
	if err != nil {
		return nil, err
	}
	if err := d.ensurePolicy(ctx); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, d.cfg.CallTimeout)
	created, err := d.cs.CoreV1().Pods(d.cfg.Namespace).Create(cctx, pod, metav1.CreateOptions{})
	cancel()
	if err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("sandbox %q already exists: %w", id, errdefs.ErrConflict)
		}
		// The API server may have created it before ctx ended.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_ = d.deletePod(rctx, pod.Name, "", 1)
		cancel()
		return nil, d.apiError("creating a pod in", err)
	}
	sb := d.newSbx(id, created, limits)
	sb.unbound, sb.session = unbound, spec.Workspace > 0 || !spec.Deadline.IsZero()
	defer func() {
		if err != nil {
			if derr := sb.Destroy(context.WithoutCancel(ctx)); derr != nil {
				// The pod's ActiveDeadlineSeconds ends it, or the next
				// start's Reap.
				d.cfg.Log.Warn("kubernetes: deleting the pod of a sandbox that did not start", "sandbox", id, "pod", pod.Name, "err", derr)
			}
		}
	}()
	if err := sb.start(ctx); err != nil {
		return nil, err
	}
	return sb, nil
}

// ensurePolicy creates the namespace's deny-all network policy once per
// driver value; one that exists already is kept.
func (d *Driver) ensurePolicy(ctx context.Context) error {
	d.policyMu.Lock()
	defer d.policyMu.Unlock()
	if d.policyOK {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.CallTimeout)
	defer cancel()
	_, err := d.cs.NetworkingV1().NetworkPolicies(d.cfg.Namespace).Create(ctx, denyAll(d.cfg.Namespace), metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return d.apiError("creating the deny-all network policy in", err)
	}
	d.policyOK = true
	return nil
}

// selector selects the pods of this driver (and owner), and with id set
// the one of that sandbox.
func (d *Driver) selector(id string) string {
	set := labels.Set{LabelManaged: ManagedBy}
	if d.cfg.Owner != "" {
		set[LabelOwner] = d.cfg.Owner
	}
	if id != "" {
		set[LabelSandbox] = sandboxLabel(id)
	}
	return set.AsSelector().String()
}

// ContainerID returns the runtime's ID of the container of sandbox id's
// pod (the kubelet's containerID without its "containerd://" scheme), for
// tests that look at the node.
func (d *Driver) ContainerID(ctx context.Context, id string) (string, error) {
	pod, err := d.cs.CoreV1().Pods(d.cfg.Namespace).Get(ctx, PodName(id), metav1.GetOptions{})
	if err != nil {
		return "", d.apiError("reading pod "+PodName(id)+" in", err)
	}
	for _, c := range pod.Status.ContainerStatuses {
		if c.Name == containerName && c.ContainerID != "" {
			_, cid, _ := strings.Cut(c.ContainerID, "://")
			return cid, nil
		}
	}
	return "", fmt.Errorf("pod %s has no container yet: %w", pod.Name, errdefs.ErrNotFound)
}

// SeccompProfile returns Stockade's seccomp filter for tier (the one the
// local tier loads, from the profile: under gVisor the variant the Sentry
// enforces, which answers ENOSYS where the host filter kills and refuses
// ICMP sockets) as the JSON a node's kubelet reads for a Localhost
// profile, and the content-addressed name to give its file below the
// kubelet's seccomp directory (Config.Seccomp). runsc applies it only
// with --oci-seccomp: the gVisor RuntimeClass's handler must pass it.
func SeccompProfile(tier sandbox.Tier) (name string, data []byte, err error) {
	sc, err := oci.Seccomp()
	if err != nil {
		return "", nil, err
	}
	if tier == sandbox.TierGVisor {
		// oci.Build is where the gVisor variant is made; the spec around
		// it is not used.
		spec, err := oci.Build(oci.Options{
			ID: "seccomp", Spec: sandbox.Spec{Image: sandbox.Image{Rootfs: "/"}},
			Limits: sandbox.DefaultLimits().WithDefaults(sandbox.Limits{CPU: DefaultCPUGVisor}), GuestPath: profile.GuestPath,
			Kernel: oci.UserSpaceKernel,
		})
		if err != nil {
			return "", nil, err
		}
		if spec.Linux == nil || spec.Linux.Seccomp == nil {
			return "", nil, fmt.Errorf("the gVisor spec has no seccomp filter")
		}
		sc = spec.Linux.Seccomp
	}
	// The OCI form is a valid Docker (and containerd) profile with the same
	// meaning, as driver/docker relies on too.
	if data, err = json.Marshal(sc); err != nil {
		return "", nil, fmt.Errorf("encoding seccomp profile: %w", err)
	}
	return "stockade-" + digest12(string(data)) + ".json", data, nil
}
