// Package oci builds the OCI runtime bundle that runc and runsc run: one
// config.json carrying Stockade's whole security profile, which it reads
// from sandbox/profile (where the profile is declared once, for every
// tier), and the seccomp filter built from the profile's policy.
//
//	s, err := oci.Build(oci.Options{ID: id, Spec: spec, GuestPath: guest, CgroupsPath: "/stockade/" + id})
//	err = oci.WriteBundle(dir, s)
package oci

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// LabelPrefix prefixes Spec.Labels in the bundle's annotations.
const LabelPrefix = "sh.stockade.label."

// Options are the inputs of Build.
type Options struct {
	ID   string
	Spec sandbox.Spec
	// Limits are the effective limits (defaults already applied).
	Limits sandbox.Limits
	// GuestPath is the host path of the guest agent binary.
	GuestPath string
	// CgroupsPath is the cgroup of the sandbox, relative to the cgroup root.
	CgroupsPath string
	// Kernel says who enforces the profile inside the sandbox; see Kernel.
	Kernel Kernel
	// NetNSPath and ResolvConf are required for sandbox.NetworkEgress and
	// must be empty otherwise: the absolute path of the prepared network
	// namespace the sandbox joins, and the absolute host path of the file
	// bind-mounted read-only at /etc/resolv.conf (images carry one as the
	// mount point).
	NetNSPath  string
	ResolvConf string
	// HostUIDBase, when not zero, gives the sandbox a user namespace of
	// its own: root inside is HostUIDBase on the host, and the sandbox
	// user HostUIDBase+1 (the same for gids). No other uid is mapped.
	HostUIDBase uint32
	// UserNSPath, with HostUIDBase, is an existing user namespace with
	// that mapping for the sandbox to join instead of a new one: the one
	// that owns NetNSPath.
	UserNSPath string
	// ChannelFDs tells the guest that its frames go over descriptors 3
	// and 4, which the runtime passes on (guest.ChannelEnv), not its stdio.
	ChannelFDs bool
}

// guestEnv is the guest's own environment.
func guestEnv(channelFDs bool) []string {
	env := []string{"GOMAXPROCS=1"}
	if channelFDs {
		env = append(env, guest.ChannelEnv+"="+guest.ChannelFDs)
	}
	return env
}

// Kernel is what the sandboxed program's system calls reach.
type Kernel int

const (
	// HostKernel: the program talks to the host kernel (runc, docker). The
	// seccomp profile and the pids cgroup are the boundary.
	HostKernel Kernel = iota
	// UserSpaceKernel: the program talks to gVisor's Sentry, which enforces
	// the profile itself. Two things differ: runsc turns every ERRNO rule
	// into EPERM, and glibc falls back from clone3 to clone only on ENOSYS
	// (on EPERM no thread could start), so clone3 gets a trace rule, which
	// without a tracer answers ENOSYS (see traceENOSYS); and the
	// host pids cgroup also counts the Sentry's own threads, so the
	// program's process limit is RLIMIT_NPROC inside the sandbox (the
	// Sentry counts only the sandbox's tasks) with headroom on the host.
	// And gVisor's netstack gives ICMP datagram sockets to every process
	// (it implements no net.ipv4.ping_group_range), so the filter refuses
	// them (see refuseICMPSockets).
	UserSpaceKernel
)

// sentryThreads is the headroom of the host pids limit for gVisor's own
// threads.
const sentryThreads = 256

// CPUPeriod is the CFS period (µs) the CPU quota is expressed in.
const CPUPeriod = 100000

// Build returns the OCI runtime spec for a sandbox with Stockade's
// profile (profile.Default).
func Build(o Options) (*specs.Spec, error) {
	sc, err := Seccomp()
	if err != nil {
		return nil, err
	}
	return build(profile.Default(), sc, o)
}

// build returns the OCI runtime spec for a sandbox with profile p and the
// seccomp filter sc, which is p's (see Seccomp).
func build(p profile.Profile, sc *specs.LinuxSeccomp, o Options) (*specs.Spec, error) {
	if o.Spec.Image.Rootfs == "" || !filepath.IsAbs(o.Spec.Image.Rootfs) {
		return nil, fmt.Errorf("image rootfs %q is not an absolute path", o.Spec.Image.Rootfs)
	}
	switch o.Spec.Network {
	case sandbox.NetworkNone:
		if o.NetNSPath != "" || o.ResolvConf != "" {
			return nil, fmt.Errorf("a sandbox without network takes no network namespace path or resolv.conf")
		}
	case sandbox.NetworkEgress:
		// Without a prepared namespace the runtime would make a fresh one,
		// or worse; egress is never granted without the host side.
		if !filepath.IsAbs(o.NetNSPath) || !filepath.IsAbs(o.ResolvConf) {
			return nil, fmt.Errorf("network mode %q needs the absolute paths of a prepared network namespace and a resolv.conf, got %q and %q", o.Spec.Network, o.NetNSPath, o.ResolvConf)
		}
	default:
		return nil, fmt.Errorf("network mode %q is not supported", o.Spec.Network)
	}
	if o.UserNSPath != "" && (o.HostUIDBase == 0 || o.NetNSPath == "" || !filepath.IsAbs(o.UserNSPath)) {
		return nil, fmt.Errorf("a user namespace to join (%q) needs an absolute path, its host uid base and the network namespace it owns", o.UserNSPath)
	}
	var rlimits []specs.POSIXRlimit
	for _, r := range p.Rlimits {
		rlimits = append(rlimits, specs.POSIXRlimit{Type: r.Type, Hard: r.Hard, Soft: r.Soft})
	}
	l := o.Limits
	memory := l.Memory
	swap := l.Memory // memory+swap equal to memory: no swap
	pids := l.Pids
	quota := int64(l.CPU * CPUPeriod)
	period := uint64(CPUPeriod)
	if o.Kernel == UserSpaceKernel {
		traceENOSYS(sc)
		refuseICMPSockets(sc)
		rlimits = append(rlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: uint64(l.Pids), Soft: uint64(l.Pids)})
		pids = l.Pids + sentryThreads
	}

	annotations := map[string]string{}
	for k, v := range o.Spec.Labels {
		annotations[LabelPrefix+k] = v
	}

	var mounts []specs.Mount
	for _, m := range p.Mounts {
		mounts = append(mounts, specs.Mount{Destination: m.Path, Type: m.Type, Source: m.Source, Options: slices.Clone(m.Options)})
	}
	if o.Spec.Workspace < 0 {
		return nil, fmt.Errorf("workspace size %d is negative", o.Spec.Workspace)
	}
	for _, t := range p.Scratch {
		size := l.TmpSize
		if t.SessionOnly {
			if o.Spec.Workspace == 0 {
				continue // no one-shot sandbox has it
			}
			size = o.Spec.Workspace
		}
		mounts = append(mounts, specs.Mount{Destination: t.Path, Type: "tmpfs", Source: "tmpfs", Options: append(slices.Clone(t.Options), "size="+strconv.FormatInt(size, 10))})
	}
	mounts = append(mounts, specs.Mount{Destination: p.Guest.Path, Type: "bind", Source: o.GuestPath, Options: slices.Clone(p.Guest.Options)})
	if o.ResolvConf != "" {
		mounts = append(mounts, specs.Mount{Destination: p.ResolvConf.Path, Type: "bind", Source: o.ResolvConf, Options: slices.Clone(p.ResolvConf.Options)})
	}
	if len(o.Spec.Mounts) > 0 {
		// The data mounts' mount points are made on this tmpfs: the runtime
		// would otherwise create them in the shared image on disk. It is
		// root's, so the sandbox user cannot write to it.
		mounts = append(mounts, specs.Mount{Destination: p.Data.Dir, Type: "tmpfs", Source: "tmpfs", Options: slices.Clone(p.Data.ParentOptions)})
	}
	// Data mounts are plain binds, not rbinds: a mount below the source
	// would not be made read-only with them (runc applies "ro" to the top
	// mount only), so it is not carried into the sandbox at all.
	for _, m := range o.Spec.Mounts {
		if !filepath.IsAbs(m.Source) || !strings.HasPrefix(m.Target, p.Data.Dir+"/") || filepath.Clean(m.Target) != m.Target {
			return nil, fmt.Errorf("mount %q -> %q: the source must be absolute and the target a clean path below %s", m.Source, m.Target, p.Data.Dir)
		}
		mounts = append(mounts, specs.Mount{Destination: m.Target, Type: "bind", Source: m.Source, Options: slices.Clone(p.Data.Options)})
	}

	var namespaces []specs.LinuxNamespace
	for _, n := range p.Namespaces {
		ns := specs.LinuxNamespace{Type: specs.LinuxNamespaceType(n.Type)}
		if ns.Type == specs.NetworkNamespace {
			ns.Path = o.NetNSPath
		}
		namespaces = append(namespaces, ns)
	}
	if o.HostUIDBase != 0 {
		namespaces = append(namespaces, specs.LinuxNamespace{Type: specs.UserNamespace, Path: o.UserNSPath})
	}

	s := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			User: specs.User{UID: p.User.UID, GID: p.User.GID},
			Args: []string{p.Guest.Path},
			// The guest's own environment (the program's comes from the
			// ExecRequest; nothing is inherited from the host). One P keeps the
			// guest to a few threads, which starts faster, above all under gVisor
			// where every thread and system call costs more.
			Env: guestEnv(o.ChannelFDs),
			Cwd: "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: slices.Clone(p.Capabilities), Effective: slices.Clone(p.Capabilities), Inheritable: slices.Clone(p.Capabilities),
				Permitted: slices.Clone(p.Capabilities), Ambient: slices.Clone(p.Capabilities),
			},
			NoNewPrivileges: p.NoNewPrivs,
			Rlimits:         rlimits,
		},
		Root:        &specs.Root{Path: o.Spec.Image.Rootfs, Readonly: p.ReadOnlyRoot},
		Hostname:    p.Hostname,
		Mounts:      mounts,
		Annotations: annotations,
		Linux: &specs.Linux{
			CgroupsPath: o.CgroupsPath,
			Namespaces:  namespaces,
			UIDMappings: IDMappings(o.HostUIDBase, p.User.UID),
			GIDMappings: IDMappings(o.HostUIDBase, p.User.GID),
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				Memory:  &specs.LinuxMemory{Limit: &memory, Swap: &swap},
				Pids:    &specs.LinuxPids{Limit: pids},
				CPU:     &specs.LinuxCPU{Quota: &quota, Period: &period},
			},
			Seccomp:       sc,
			MaskedPaths:   slices.Clone(p.MaskedPaths),
			ReadonlyPaths: slices.Clone(p.ReadOnlyPaths),
		},
	}
	return s, nil
}

// icmpFamilies are the IP socket families, each with its ICMP protocol.
var icmpFamilies = []struct{ family, protocol uint64 }{
	{unix.AF_INET, unix.IPPROTO_ICMP},
	{unix.AF_INET6, unix.IPPROTO_ICMPV6},
}

// refuseICMPSockets puts, before every other rule, one refusal of socket(2)
// per IP family for the family's ICMP protocol. Like the ioctl rules (see
// buildSeccomp) it compares the low 32 bits of the protocol, which are what
// the kernel reads, so a protocol with garbage in the high bits is refused
// too.
//
// The refusal holds because the filter is for the user-space kernel only:
// runsc builds it with gVisor's own seccomp package, which keeps the rules'
// order and lets the first rule that matches a call decide it
// (seccomp.Program.RuleSets), where libseccomp would let the unconditional
// allow of the family win. Narrowing the allow rules instead, which either
// evaluation honours, takes an allow rule per bit of the protocol, 64 in
// all, and the Sentry compiles the filter at every start: those 64 rules
// cost a gVisor sandbox 30-65 ms (BENCHMARKS.md).
func refuseICMPSockets(sc *specs.LinuxSeccomp) {
	eperm := uint(unix.EPERM)
	rules := make([]specs.LinuxSyscall, 0, len(icmpFamilies)+len(sc.Syscalls))
	for _, f := range icmpFamilies {
		rules = append(rules, specs.LinuxSyscall{
			Names:    []string{"socket"},
			Action:   specs.ActErrno,
			ErrnoRet: &eperm,
			Args: []specs.LinuxSeccompArg{
				{Index: 0, Value: f.family, Op: specs.OpEqualTo},
				{Index: 2, Value: 0xffffffff, ValueTwo: f.protocol, Op: specs.OpMaskedEqual},
			},
		})
	}
	sc.Syscalls = append(rules, sc.Syscalls...)
}

// IDMappings maps root and id inside a user namespace to base and base+1
// outside; nil for base 0 (no user namespace).
func IDMappings(base uint32, id uint32) []specs.LinuxIDMapping {
	if base == 0 {
		return nil
	}
	return []specs.LinuxIDMapping{{ContainerID: 0, HostID: base, Size: 1}, {ContainerID: id, HostID: base + 1, Size: 1}}
}

// WriteBundle creates dir (mode 0700, it must not exist) and writes
// config.json into it.
func WriteBundle(dir string, s *specs.Spec) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("creating bundle directory: %w", err)
	}
	return WriteConfig(dir, s)
}

// WriteConfig writes config.json into the bundle directory dir.
func WriteConfig(dir string, s *specs.Spec) error {
	// Compact: indenting the filter's few hundred rules took 0.13 ms of
	// every Create, for a file that only programs parse (the runtime, the
	// driver's reads of labels and host ids).
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encoding OCI spec: %w", err)
	}
	// Written whole or not at all (a temporary file renamed into place):
	// a bundle whose config reads is one a runtime may have started
	// (ocidriver's Reap).
	tmp := filepath.Join(dir, ".config.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing bundle config: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "config.json")); err != nil {
		return fmt.Errorf("writing bundle config: %w", err)
	}
	return nil
}
