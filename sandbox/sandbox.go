// Package sandbox defines the contract every Stockade isolation backend
// implements: a Driver creates Sandboxes, a Sandbox runs one or more Execs and
// is then destroyed. The package holds types and rules only; implementations
// live in driver/<name>.
//
// A one-shot run is Create, one Exec, Destroy:
//
//	sb, err := drv.Create(ctx, sandbox.Spec{Image: img})
//	if err != nil { ... }
//	defer sb.Destroy(context.WithoutCancel(ctx))
//	res, err := sandbox.Run(ctx, sb, sandbox.ExecRequest{File: f, Argv: argv})
//
// Run is Start and Wait in one call; Start returns the Exec's handle, to
// signal or cancel the program or stream its stdin while it runs.
//
// A process that fails (non-zero exit, signal, OOM kill, timeout) is reported
// in the Result; an error means the driver could not do its job.
//
// What a driver can do beyond that it says twice, and the two agree (the
// conformance suite checks it): as flags of its Capabilities, and as the
// small interfaces of abilities.go that its driver or sandbox values
// implement, found by type assertion.
package sandbox

import (
	"context"
	"io"
	"syscall"
	"time"
)

// Tier names an isolation boundary. What a tier is (whether it shares the
// host kernel, its boundary, its default CPU) its driver declares in its
// Capabilities.
type Tier string

// The tiers Stockade knows. Which ones can run depends on the host.
const (
	TierContainer Tier = "container" // namespaces, cgroups, seccomp (runc)
	TierGVisor    Tier = "gvisor"    // user-space kernel (runsc)
	TierDocker    Tier = "docker"    // namespaces through dockerd
	TierMicroVM   Tier = "microvm"   // hardware virtualisation
)

// Tiers returns the tiers Stockade knows, in the order above.
func Tiers() []Tier { return []Tier{TierContainer, TierGVisor, TierDocker, TierMicroVM} }

// NetworkMode says what network a sandbox gets. The zero value is no network.
type NetworkMode string

const (
	// NetworkNone leaves the sandbox with a loopback interface only.
	NetworkNone NetworkMode = ""
	// NetworkEgress routes traffic through the host-side egress proxy.
	NetworkEgress NetworkMode = "egress"
	// NetworkAllowlist leaves the sandbox's way out to its provider's
	// own network policy, set to the domains of Spec.Allow: a remote
	// driver's sandbox, which the host's proxy does not stand in front of.
	// Nothing of it is decided or audited by Stockade's proxy, and no
	// credential broker is reachable.
	NetworkAllowlist NetworkMode = "allowlist"
)

// Capabilities is what a driver is and can do, as data: the one place a
// tier's facts are declared, which the layers above read instead of
// switching on tier names.
type Capabilities struct {
	Tier Tier
	// SharedKernel is true when the sandboxed program's system calls reach
	// the host kernel, so that namespaces, cgroups and the seccomp filter
	// are the boundary and its processes are host processes; false when a
	// kernel of the sandbox's own answers them (gVisor's Sentry).
	SharedKernel bool
	// Remote is true when the sandboxes run off this host, on a cluster's
	// nodes or a provider's machines: their memory is not this host's, so
	// the engine's memory budget (memory_budget) does not count them; the
	// cluster or the provider bounds them.
	Remote bool
	// Boundary says in one line what separates code in the sandbox from
	// the host.
	Boundary string
	// DefaultCPU is the CPU share (cores) of a sandbox whose limits name
	// none.
	DefaultCPU   float64
	NetworkModes []NetworkMode
	// Sessions is true when Start may be called more than once on one
	// sandbox.
	Sessions bool
	// The abilities (abilities.go): each flag is true exactly when the
	// driver implements the interface named beside it, or, for Files and
	// Kernels, when every sandbox it creates does.
	Health    bool // HealthChecker
	Reap      bool // Reaper
	Leftovers bool // Leftovers
	Files     bool // Files, on each sandbox
	Kernels   bool // Kernels, on each sandbox
	Bind      bool // Binder
	Reattach  bool // Reattacher
	Snapshots bool // Snapshotter
	// BindEgress is true when Bind can give an unbound sandbox its egress
	// network (Binding.Egress); false when only CreateUnbound can.
	BindEgress bool
	// BindFixedLimits is true when Bind cannot change a sandbox's memory
	// and CPU (a Kubernetes pod's resources are fixed once it runs): a
	// Binding whose memory or CPU differs from the sandbox's is then
	// ErrInvalidArgument, and a pool serves only requests with the
	// limits its sandboxes were created with.
	BindFixedLimits bool
	// Lacks says, for each of the flags above (and BindEgress) that is
	// false, why the driver cannot do it, keyed by the flag's name
	// ("Snapshots"): the reason an operator reads where a tier refuses.
	Lacks map[string]string
	// UserNamespace is true when every sandbox has a user namespace of its
	// own, with host ids no other live sandbox has (see FirstHostID). A
	// network prepared for
	// such a sandbox (EgressNet) must then belong to a user namespace made
	// for it: see EgressNet.UserNSPath.
	UserNamespace bool
}

// Image is a runtime image resolved from the image store.
type Image struct {
	Name   string // "python", "node", "shell"
	Digest string // "sha256:..."
	Rootfs string // absolute host path of the unpacked root filesystem
}

// Spec describes a sandbox. The zero Spec (plus an Image) is the most
// restrictive sandbox: no network, empty environment, read-only root, default
// limits.
type Spec struct {
	// ID names the sandbox; empty means the driver generates one. It must
	// match IDPattern.
	ID string
	// Image is the root filesystem, mounted read-only. Required.
	Image Image
	// Limits bound the sandbox; zero fields take the defaults.
	Limits Limits
	// Network is the network mode; zero means none (loopback only).
	Network NetworkMode
	// Egress is the prepared network of a NetworkEgress sandbox; required
	// for that mode and ignored otherwise. Nil means none.
	Egress *EgressNet
	// Allow and AllowPorts are the tool record's egress allowlist (domain
	// names, "*.example.com" for every name below example.com, and the
	// ports) of a NetworkAllowlist sandbox, which its provider enforces;
	// required for that mode and ignored otherwise.
	Allow      []string
	AllowPorts []int
	// Mounts are extra read-only bind mounts (tool records' data directories).
	// Nil means none.
	Mounts []Mount
	// Labels are kept with the sandbox's runtime state so that orphans can
	// be found after a crash. Nil means none.
	Labels map[string]string
	// Detached makes the sandbox independent of the process that created
	// it: it goes on running when that process exits, and a Reattacher
	// finds it again. False is the one-shot route, where the sandbox dies
	// with its creator. A driver without Capabilities.Reattach, or one
	// built without a supervisor for it, refuses it (ErrInvalidArgument, as
	// any field of a Spec the driver cannot serve).
	Detached bool
	// Deadline, for a detached sandbox, is when it ends itself, whether or
	// not any process still serves it: a sandbox whose creator stopped
	// for good does not run on (Deadliner moves it). The zero Deadline
	// never comes; a sandbox that is not detached ends with its creator
	// and ignores it.
	Deadline time.Time
	// Workspace is the size in bytes of the sandbox's /workspace, a tmpfs
	// of its own (nosuid, nodev, writable by the sandbox user) that lives
	// as long as the sandbox: a session's files. Zero means no /workspace,
	// as every one-shot sandbox.
	Workspace int64
}

// EgressNet is the host-prepared network a NetworkEgress sandbox joins:
// a network namespace whose only way out is the egress proxy (see
// internal/netns), and the resolv.conf naming its DNS responder.
type EgressNet struct {
	// NetNSPath is the absolute path of the namespace (a bind mount under
	// /run/netns) the sandbox joins.
	NetNSPath string
	// ResolvConf is the content of the sandbox's /etc/resolv.conf.
	ResolvConf []byte
	// UserNSPath, when not empty, is the user namespace (a bind mount) that
	// owns the network namespace, mapping root to HostIDBase and the
	// sandbox user to HostIDBase+1; a driver with
	// Capabilities.UserNamespace runs the sandbox in it. Without one, such
	// a driver runs the sandbox in the host's user namespace: a user
	// namespace of its own could not mount sysfs for a network namespace
	// that belongs to the host's.
	UserNSPath string
	HostIDBase uint32
}

// Mount is a read-only bind mount of a host directory into the sandbox.
type Mount struct {
	Source string // absolute host path
	Target string // absolute path inside the sandbox
}

// File is the code delivered into the sandbox. It is written to the
// sandbox's tmpfs, never bind-mounted.
type File struct {
	// Name is the base name under /tmp, e.g. "main.py". It must be a plain
	// file name (no slash, not "." or "..").
	Name string
	Data []byte
	// Mode is the permission bits; zero means 0o644.
	Mode uint32
}

// Stream names an output stream.
type Stream int

const (
	Stdout Stream = 1
	Stderr Stream = 2
)

func (s Stream) String() string {
	if s == Stderr {
		return "stderr"
	}
	return "stdout"
}

// ExecRequest asks a sandbox to run one program.
type ExecRequest struct {
	// File is written to /tmp/<File.Name> before the program starts.
	File File
	// Argv is the program and its arguments; Argv[0] is an absolute path
	// inside the sandbox. "{file}" in any element is replaced by the path of
	// File.
	Argv []string
	// Env is the program's whole environment, "KEY=value" pairs. Nil means
	// empty: nothing is ever inherited from the host.
	Env []string
	// Stdin is fed to the program, then closed. Nil means empty input.
	Stdin []byte
	// StdinStream makes the program's stdin the Exec's Stdin writer
	// instead; Stdin must then be nil.
	StdinStream bool
	// ExitNotice lets the program report its end before it is torn down:
	// see guest.ExecRequest.ExitNotice. A driver whose guest cannot do it
	// runs the Exec as if it were not set.
	ExitNotice bool
	// Timeout bounds this Exec's wall clock from Start; zero means the
	// sandbox's limit. On expiry the program and every process it started
	// are killed and the output so far returned; the sandbox is killed too
	// only when its guest does not end the program within a grace period.
	Timeout time.Duration
	// OnOutput, if set, receives each chunk of output as it arrives, up to
	// the output cap. It is called from one goroutine at a time and must not
	// retain p.
	OnOutput func(s Stream, p []byte)
}

// Status is how a program ended.
type Status string

const (
	StatusSucceeded Status = "succeeded"  // exit code 0
	StatusFailed    Status = "failed"     // non-zero exit code
	StatusTimedOut  Status = "timed_out"  // wall clock limit reached; the program's processes killed
	StatusOOMKilled Status = "oom_killed" // memory limit reached
	StatusKilled    Status = "killed"     // ended by a signal, or the sandbox died
)

// Result is the outcome of an Exec. Everything in it that came from inside
// the sandbox has been bounded and validated by the driver.
type Result struct {
	Status          Status
	ExitCode        int // -1 when the program did not exit normally
	Signal          int // the signal that ended the program, 0 if none; 9 for an OOM kill
	Stdout          []byte
	Stderr          []byte
	StdoutTruncated bool
	StderrTruncated bool
	Duration        time.Duration // wall clock of the Exec as seen by the host
	// CPUTime is the user + system time of the program and its children,
	// and PeakMemory their peak memory in bytes, as the guest reports them
	// (or the sandbox's cgroup, where it holds only the sandbox's
	// processes). Under gVisor CPUTime is the sandbox's cgroup's over the
	// Exec, the Sentry's own use included: the Sentry's count of its
	// tasks' time runs on while the host throttles them. A run that timed
	// out has no report: both come from the sandbox's cgroup, under gVisor
	// including the Sentry's own use, and are zero where the cgroup is not
	// on this host (a remote engine).
	CPUTime    time.Duration
	PeakMemory int64
}

// CutShortError is Exec.Wait's error for a program ended because its
// Start's ctx ended while it ran: Result is what it had printed and used
// by then (StatusKilled; its CPU time and peak memory from the sandbox's
// cgroup, as for a timeout), and Err wraps the ctx's error.
type CutShortError struct {
	Result *Result
	Err    error
}

func (e *CutShortError) Error() string { return e.Err.Error() }
func (e *CutShortError) Unwrap() error { return e.Err }

// Driver creates sandboxes of one tier. Implementations are safe for
// concurrent use.
type Driver interface {
	// Name is the driver's configuration name ("runc", "gvisor", ...).
	Name() string
	Capabilities() Capabilities
	// Create starts a sandbox and returns once it is ready to Exec. On error
	// nothing is left behind. The caller must call Destroy on success.
	Create(ctx context.Context, spec Spec) (Sandbox, error)
}

// Sandbox is one running sandbox. It serves exactly one session and is then
// destroyed.
type Sandbox interface {
	ID() string
	// Start starts one program and returns its handle without waiting for
	// its end. One Exec runs at a time per sandbox: Start while another
	// has not ended fails with ErrConflict. ctx bounds the program, as
	// exec.CommandContext's does: when it ends (or req.Timeout passes),
	// the program and every process it started are ended, not the
	// sandbox, unless the sandbox does not comply within a grace period:
	// then it is killed. A sandbox that was killed or died cannot Start
	// again (ErrFailedPrecondition).
	Start(ctx context.Context, req ExecRequest) (Exec, error)
	// Destroy kills every process of the sandbox and removes all its state
	// (runtime state, cgroups, bundle). It is idempotent: destroying a
	// sandbox that is already gone succeeds. An error names what is left;
	// calling Destroy again tries again.
	Destroy(ctx context.Context) error
}

// Exec is one program started in a sandbox. Its methods are safe for
// concurrent use.
type Exec interface {
	// Wait waits for the program's end and returns its Result; every call
	// returns the same. When the ctx given to Start ended first, the
	// program was ended and Wait returns an error wrapping that ctx's
	// error (a *CutShortError where the driver kept what the program
	// printed and used by then). When Wait's own ctx ends first, it
	// returns that ctx's error and the program goes on.
	Wait(ctx context.Context) (*Result, error)
	// Signal sends sig to the program's process group. A program that has
	// ended is no error.
	Signal(sig syscall.Signal) error
	// Cancel ends the program and every process it started, as a timeout
	// does, and leaves the sandbox serving: Wait then returns the Result
	// (StatusKilled, unless the program ended first). A guest that does
	// not comply within a grace period is killed with the sandbox.
	Cancel() error
	// Stdin is the program's standard input when the request set
	// StdinStream, nil otherwise. Writes block while the program does not
	// read; Close ends the input. Writes after the program ended fail.
	Stdin() io.WriteCloser
}

// Run starts req in sb and waits for its end: the one-call form of Start
// and Wait. ctx bounds the program (see Sandbox.Start); when it ends, Run
// returns once the program is gone.
func Run(ctx context.Context, sb Sandbox, req ExecRequest) (*Result, error) {
	ex, err := sb.Start(ctx, req)
	if err != nil {
		return nil, err
	}
	// The program ends with ctx, within the driver's grace periods; Run
	// waits for that rather than leave its clean-up running.
	return ex.Wait(context.WithoutCancel(ctx))
}
