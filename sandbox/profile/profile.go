// Package profile declares, once, the security profile every Stockade
// sandbox gets on every tier (docs/design.md §3), and the known ways in
// which a tier presents it otherwise (Profile.Differences). It is data only;
// every consumer reads it and none restates it:
//
//   - internal/oci builds runc's and runsc's config.json from it, and the
//     seccomp filter from its Seccomp policy;
//   - driver/docker builds the container's configuration from it;
//   - sandbox/conformance asserts it by attack from inside each tier;
//   - blastradius compares a tool's sandbox with it;
//   - the README's sandbox section is its Markdown (TestREADME).
//
// Each consumer takes the profile as a value, so that its tests can change
// one entry of a copy and see it follow:
//
//	p := profile.Default()
//	p.User.UID = 1000 // a test's copy; Default is unchanged
package profile

import (
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/sandbox"
)

// Fixed paths inside every sandbox. Images carry them as mount points.
const (
	// GuestPath is where the guest agent is bound read-only (an empty
	// file in every image).
	GuestPath = "/.stockade/guest"
	// DataDir is the directory below which a tool record's data mounts
	// are bound read-only (an empty directory in every image).
	DataDir = "/data"
)

// Profile is the security profile of a sandbox. The zero Profile is not
// one; Default is Stockade's.
type Profile struct {
	// ReadOnlyRoot mounts the runtime image read-only as the root.
	ReadOnlyRoot bool
	// Mounts are the kernel file systems and the minimal /dev, in mount
	// order, each exactly as mounted.
	Mounts []Mount
	// Scratch are the program's writable tmpfs mounts.
	Scratch []Scratch
	// MaskedPaths are hidden (an empty file or directory mounted over
	// them); ReadOnlyPaths are remounted read-only: runc's and Docker's
	// defaults.
	MaskedPaths   []string
	ReadOnlyPaths []string
	// Dev is what /dev holds.
	Dev Dev
	// Guest is the guest agent's bind mount; Data the parent of a tool's
	// data mounts; ResolvConf the file bound over /etc/resolv.conf with
	// egress. With the image they are the only host paths in a sandbox.
	Guest      Bind
	Data       Data
	ResolvConf Bind
	// User is the uid and gid of every process in the sandbox, the guest's
	// and the program's, with no supplementary group.
	User User
	// Capabilities are what each of the five capability sets holds
	// (bounding, effective, inheritable, permitted, ambient): their
	// CAP_* names. Stockade's holds none.
	Capabilities []string
	// NoNewPrivs sets no_new_privs: no execve gains privileges.
	NoNewPrivs bool
	// Seccomp is the system call filter's policy.
	Seccomp Seccomp
	// Namespaces are the namespaces of its own every sandbox gets. A tier
	// that can adds a user namespace (sandbox.Capabilities.UserNamespace).
	Namespaces []Namespace
	// Network is what a sandbox without egress has.
	Network Network
	// Limits are the default limits (sandbox.DefaultLimits); CPU is each
	// tier's (sandbox.Capabilities.DefaultCPU).
	Limits sandbox.Limits
	// Rlimits are the resource limits of every process, beside Limits.
	Rlimits []Rlimit
	// Env is the program's whole environment.
	Env []string
	// Hostname is the sandbox's host name.
	Hostname string
	// Differences are the known ways in which a tier or a driver presents
	// the profile otherwise than the shared-kernel tiers do.
	Differences []Difference
}

// Mount is a file system mounted in every sandbox.
type Mount struct {
	Path    string
	Type    string
	Source  string
	Options []string
	// Writable is true when the sandbox's user may write in it.
	Writable bool
}

// Scratch is a writable tmpfs, size-capped, that lives as long as its
// sandbox.
type Scratch struct {
	Path string
	// Options are its mount options; its size is the sandbox's
	// sandbox.Limits.TmpSize.
	Options []string
	// SessionOnly is true for a session's workspace, which no one-shot
	// sandbox has.
	SessionOnly bool
}

// Bind is a host file or directory bound into the sandbox at Path.
type Bind struct {
	Path    string
	Options []string
}

// Data is where a tool record's data mounts go.
type Data struct {
	// Dir holds the mount points: a small tmpfs of root's, mounted with
	// ParentOptions, present only when the record has mounts, so that
	// the runtime does not create mount points in the shared image.
	Dir           string
	ParentOptions []string
	// Options are each data mount's. They are plain binds: a mount below
	// the source would not be made read-only with them, so it is not
	// carried into the sandbox at all.
	Options []string
}

// Dev is the minimal /dev.
type Dev struct {
	// Names are the only entries at the top of /dev.
	Names []string
	// Devices are the only character devices, besides pseudo-terminal
	// slaves (major PTYMajor).
	Devices  []Device
	PTYMajor int
	// HostNodes are the device nodes a runtime may bind from the host's
	// devtmpfs instead of making them (runc does so in a user namespace,
	// where it cannot mknod).
	HostNodes []string
}

// Device is a character device.
type Device struct {
	// Name is its path below /dev.
	Name         string
	Major, Minor int
}

// User is a uid and a gid.
type User struct {
	UID, GID uint32
}

// Seccomp is the policy of the system call filter. internal/oci builds the
// filter from it for the host's architecture.
type Seccomp struct {
	// Base names the profile the filter starts from: Docker's default
	// profile for a process without capabilities.
	Base string
	// Denied are removed from every allow rule of the base, so that they
	// get its default action (EPERM).
	Denied []string
	// SocketFamilies are the only families socket(2) may create.
	SocketFamilies []SocketFamily
	// RefusedIoctl is the one ioctl(2) request refused, whatever the high
	// 32 bits of the request (the kernel reads 32).
	RefusedIoctl Ioctl
	// ENOSYS are answered ENOSYS instead of EPERM, with why.
	ENOSYS []Reasoned
	// NativeOnly kills a process that makes a system call of an
	// architecture other than the host's.
	NativeOnly bool
}

// SocketFamily is an address family of socket(2).
type SocketFamily struct {
	Name  string
	Value uint64
}

// Ioctl is an ioctl(2) request.
type Ioctl struct {
	Name    string
	Request uint64
	// Why it is refused.
	Why string
}

// Reasoned is a name with the reason it is in the profile.
type Reasoned struct {
	Name string
	Why  string
}

// Namespace is a kind of Linux namespace.
type Namespace struct {
	// Type is its OCI name ("network").
	Type string
	// Links are its names in /proc/self/ns ("net").
	Links []string
}

// Network is the network of a sandbox without egress.
type Network struct {
	// Interfaces are the only interfaces.
	Interfaces []string
	// Sysctls are the network settings the program sees: the host
	// kernel's defaults for a new network namespace, which keep ICMP
	// sockets from every group and the ports below 1024 from
	// unprivileged processes. dockerd changes them; the docker driver
	// sets them back.
	Sysctls []Sysctl
}

// Sysctl is a kernel setting.
type Sysctl struct {
	Name, Value string
}

// Rlimit is a resource limit, as setrlimit(2) names it.
type Rlimit struct {
	Type       string // "RLIMIT_NOFILE"
	Soft, Hard uint64
}

// Default returns Stockade's profile: a fresh copy, which the caller may
// change.
func Default() Profile {
	p := Profile{
		ReadOnlyRoot: true,
		Mounts: []Mount{
			{Path: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Path: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Path: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Path: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}, Writable: true},
			{Path: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}, Writable: true},
			{Path: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Scratch: []Scratch{
			{Path: "/tmp", Options: []string{"nosuid", "nodev", "mode=1777"}},
			{Path: "/workspace", Options: []string{"nosuid", "nodev", "mode=1777"}, SessionOnly: true},
		},
		MaskedPaths: []string{
			"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
			"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
		},
		ReadOnlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		Dev: Dev{
			Names: []string{"null", "zero", "full", "random", "urandom", "tty", "console", "ptmx", "pts", "shm", "mqueue", "fd", "stdin", "stdout", "stderr", "core"},
			Devices: []Device{
				{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9},
				{"tty", 5, 0}, {"console", 5, 1}, {"ptmx", 5, 2},
			},
			PTYMajor:  136,
			HostNodes: []string{"null", "zero", "full", "random", "urandom", "tty"},
		},
		Guest: Bind{Path: GuestPath, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		Data: Data{
			Dir:           DataDir,
			ParentOptions: []string{"nosuid", "nodev", "noexec", "mode=755", "size=64k"},
			Options:       []string{"bind", "ro", "nosuid", "nodev", "noexec"},
		},
		ResolvConf: Bind{Path: "/etc/resolv.conf", Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}},
		User:       User{UID: 65534, GID: 65534}, // nobody:nogroup
		NoNewPrivs: true,
		Seccomp: Seccomp{
			Base: "Docker's default profile (github.com/moby/profiles/seccomp)",
			Denied: []string{
				// Debugging and cross-process memory access.
				"ptrace", "process_vm_readv", "process_vm_writev",
				// Large kernel attack surfaces with a history of container escapes.
				"io_uring_setup", "io_uring_enter", "io_uring_register",
				"userfaultfd", "bpf", "perf_event_open",
				// The kernel keyring is not namespaced.
				"keyctl", "add_key", "request_key",
				// Namespace and mount manipulation.
				"unshare", "setns",
				"mount", "umount", "umount2", "mount_setattr", "move_mount", "open_tree",
				"fsopen", "fsconfig", "fsmount", "fspick", "pivot_root",
				// clone3 passes its flags in a struct that seccomp cannot
				// inspect, so it cannot be filtered like clone (see ENOSYS).
				"clone3",
			},
			// Local, IP and netlink sockets only (no AF_ALG, AF_PACKET,
			// AF_VSOCK, ...).
			SocketFamilies: []SocketFamily{{"AF_UNIX", unix.AF_UNIX}, {"AF_INET", unix.AF_INET}, {"AF_INET6", unix.AF_INET6}, {"AF_NETLINK", unix.AF_NETLINK}},
			RefusedIoctl:   Ioctl{Name: "TIOCSTI", Request: unix.TIOCSTI, Why: "it pushes bytes into a terminal's input queue, a classic way to type commands into the parent's terminal"},
			ENOSYS:         []Reasoned{{Name: "clone3", Why: "libc falls back to clone, whose flags the filter checks, on ENOSYS only: on EPERM no thread could start"}},
			NativeOnly:     true,
		},
		Namespaces: []Namespace{
			{Type: "pid", Links: []string{"pid", "pid_for_children"}},
			{Type: "network", Links: []string{"net"}},
			{Type: "ipc", Links: []string{"ipc"}},
			{Type: "uts", Links: []string{"uts"}},
			{Type: "mount", Links: []string{"mnt"}},
			{Type: "cgroup", Links: []string{"cgroup"}},
		},
		Network: Network{
			Interfaces: []string{"lo"},
			Sysctls:    []Sysctl{{"net.ipv4.ping_group_range", "1 0"}, {"net.ipv4.ip_unprivileged_port_start", "1024"}},
		},
		Limits: sandbox.DefaultLimits(),
		Rlimits: []Rlimit{
			{Type: "RLIMIT_NOFILE", Soft: 1024, Hard: 1024},
			{Type: "RLIMIT_CORE", Soft: 0, Hard: 0},
		},
		// A PATH into the image, so that shell code can call its tools by
		// name, and nothing else.
		Env:      []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		Hostname: "sandbox",
	}
	p.Differences = differences(p)
	return p
}

// Difference returns the difference id declared for the sandboxes on: the
// first that applies.
func (p *Profile) Difference(on On, id string) (Difference, bool) {
	for _, d := range p.Differences {
		if d.ID == id && d.Applies(on) {
			return d, true
		}
	}
	return Difference{}, false
}

// DevOn returns the /dev of a sandbox on: the minimal /dev, with the
// devices declared added there (Difference.Devices) and their names at the
// top of /dev.
func (p *Profile) DevOn(on On) Dev {
	d := p.Dev
	d.Names, d.Devices = slices.Clone(d.Names), slices.Clone(d.Devices)
	for _, diff := range p.Differences {
		if !diff.Applies(on) {
			continue
		}
		for _, dev := range diff.Devices {
			top, _, _ := strings.Cut(dev.Name, "/")
			if !slices.Contains(d.Names, top) {
				d.Names = append(d.Names, top)
			}
			d.Devices = append(d.Devices, dev)
		}
	}
	return d
}

// Allows reports whether character device major:minor may exist in d.
func (d Dev) Allows(major, minor int) bool {
	return major == d.PTYMajor || slices.ContainsFunc(d.Devices, func(dev Device) bool { return dev.Major == major && dev.Minor == minor })
}

// Sysctl returns the value of the network setting name, and false when the
// profile sets none.
func (n Network) Sysctl(name string) (string, bool) {
	for _, s := range n.Sysctls {
		if s.Name == name {
			return s.Value, true
		}
	}
	return "", false
}

// ScratchAt returns the scratch mounted at path.
func (p *Profile) ScratchAt(path string) (Scratch, bool) {
	for _, s := range p.Scratch {
		if s.Path == path {
			return s, true
		}
	}
	return Scratch{}, false
}
