package oci

import (
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/errdefs"
)

//go:generate go run mksyscalls.go

// deniedSyscalls are removed from every allow rule of Docker's default
// profile. Whatever is not allowed gets the profile's default action (EPERM).
var deniedSyscalls = []string{
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
	// clone3 passes its flags in a struct that seccomp cannot inspect, so it
	// cannot be filtered like clone; the ENOSYS rule below makes libc fall
	// back to clone, whose flags are checked.
	"clone3",
}

// allowedSocketDomains replaces Docker's socket allow-list: the sandbox gets
// local, IP and netlink sockets only (no AF_ALG, AF_PACKET, AF_VSOCK, ...).
var allowedSocketDomains = []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}

// nativeArch is the seccomp architecture of each GOARCH the guest is built
// for; syscallNames (zsyscalls.go) has the system calls of each.
var nativeArch = map[string]specs.Arch{"amd64": specs.ArchX86_64, "arm64": specs.ArchAARCH64}

// Seccomp returns a copy of Stockade's tightened seccomp profile for the
// host's architecture (see buildSeccomp); the profile is computed once per
// process.
func Seccomp() (*specs.LinuxSeccomp, error) {
	p, err := profile()
	if err != nil {
		return nil, err
	}
	c := *p
	c.Architectures = slices.Clone(p.Architectures)
	c.Syscalls = slices.Clone(p.Syscalls)
	return &c, nil
}

var profile = sync.OnceValues(func() (*specs.LinuxSeccomp, error) {
	return buildSeccomp(runtime.GOARCH, hostKernel())
})

// buildSeccomp returns Stockade's tightened seccomp profile for goarch on
// a kernel of version kernel (major, minor): Docker's default profile for a
// process without capabilities on that architecture, minus deniedSyscalls,
// with socket(2) restricted to allowedSocketDomains and TIOCSTI refused.
//
// The profile names only system calls that goarch has (arm64 has no open,
// fork or stat, only their *at forms), and its only architecture is the
// native one: the runtime kills a process that makes a system call of
// another architecture (the 32-bit x86 or x32 ABIs on amd64, arm32 on
// arm64), which Docker's profile would allow as sub-architectures.
func buildSeccomp(goarch string, kernel [2]uint64) (*specs.LinuxSeccomp, error) {
	arch, ok := nativeArch[goarch]
	known := syscallNames[goarch]
	if !ok || len(known) == 0 {
		return nil, fmt.Errorf("building the seccomp profile: architecture %s is not supported (amd64 and arm64 are): %w", goarch, errdefs.ErrFailedPrecondition)
	}
	base := seccomp.DefaultProfile()
	out := &specs.LinuxSeccomp{
		DefaultAction:   base.DefaultAction,
		DefaultErrnoRet: base.DefaultErrnoRet,
		Architectures:   []specs.Arch{arch},
	}
	for _, rule := range base.Syscalls {
		if !ruleApplies(rule, goarch, kernel) {
			continue
		}
		r := rule.LinuxSyscall
		if slices.Contains(r.Names, "socket") && len(r.Args) > 0 {
			continue // replaced below
		}
		if rule.Name != "" {
			r.Names = append(r.Names, rule.Name)
		}
		r.Names = slices.DeleteFunc(slices.Clone(r.Names), func(n string) bool {
			_, has := slices.BinarySearch(known, n)
			return !has || slices.Contains(deniedSyscalls, n) || n == "ioctl"
		})
		if len(r.Names) > 0 {
			out.Syscalls = append(out.Syscalls, r)
		}
	}
	for _, d := range allowedSocketDomains {
		out.Syscalls = append(out.Syscalls, specs.LinuxSyscall{
			Names:  []string{"socket"},
			Action: specs.ActAllow,
			Args:   []specs.LinuxSeccompArg{{Index: 0, Value: d, Op: specs.OpEqualTo}},
		})
	}
	// ioctl is allowed except TIOCSTI, which pushes bytes into a terminal's
	// input queue (a classic way to type commands into the parent's tty).
	// The kernel reads the request as 32 bits and seccomp sees 64, so the
	// test must be "the low 32 bits are not TIOCSTI": a plain 64-bit "not
	// equal" lets TIOCSTI with garbage in the high bits through
	// (CVE-2019-10063). Seccomp compares a masked argument for equality
	// only, and libseccomp lets an unconditional allow win over a
	// conditional refusal; so the allow is one rule per bit, "differs from
	// TIOCSTI in this bit", and a request that matches none is TIOCSTI and
	// gets the default action.
	for bit := uint64(1); bit <= 1<<31; bit <<= 1 {
		out.Syscalls = append(out.Syscalls, specs.LinuxSyscall{
			Names:  []string{"ioctl"},
			Action: specs.ActAllow,
			Args:   []specs.LinuxSeccompArg{{Index: 1, Value: bit, ValueTwo: ^uint64(unix.TIOCSTI) & bit, Op: specs.OpMaskedEqual}},
		})
	}
	nosys := uint(unix.ENOSYS)
	out.Syscalls = append(out.Syscalls, specs.LinuxSyscall{
		Names:    []string{"clone3"},
		Action:   specs.ActErrno,
		ErrnoRet: &nosys,
	})
	return out, nil
}

// traceClone3 turns the clone3 rule into a trace rule (see
// UserSpaceKernel for why): with no tracer, which ptrace being refused
// guarantees, a trace rule answers ENOSYS, in the Sentry as in Linux.
func traceClone3(sc *specs.LinuxSeccomp) {
	for i, r := range sc.Syscalls {
		if len(r.Names) == 1 && r.Names[0] == "clone3" {
			sc.Syscalls[i] = specs.LinuxSyscall{Names: []string{"clone3"}, Action: specs.ActTrace}
		}
	}
}

// ruleApplies reports whether a rule of Docker's profile is part of the
// profile for goarch on kernel, for a process without capabilities: the
// conditions moby's own generator evaluates for the host it runs on
// (architectures, capabilities, kernel version), evaluated for goarch.
func ruleApplies(r *seccomp.Syscall, goarch string, kernel [2]uint64) bool {
	atLeast := func(v *seccomp.KernelVersion) bool {
		return kernel[0] > v.Kernel || (kernel[0] == v.Kernel && kernel[1] >= v.Major)
	}
	if x := r.Excludes; x != nil {
		// A rule excluded for a capability stays: the process has none.
		if slices.Contains(x.Arches, goarch) || (x.MinKernel != nil && atLeast(x.MinKernel)) {
			return false
		}
	}
	if in := r.Includes; in != nil {
		if len(in.Arches) > 0 && !slices.Contains(in.Arches, goarch) {
			return false
		}
		if len(in.Caps) > 0 || (in.MinKernel != nil && !atLeast(in.MinKernel)) {
			return false
		}
	}
	return true
}

// hostKernel is the running kernel's version (major, minor); zero when it
// cannot be read, which leaves out the rules that need a newer kernel.
func hostKernel() [2]uint64 {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return [2]uint64{}
	}
	release, _, _ := strings.Cut(unix.ByteSliceToString(u.Release[:]), "-")
	parts := strings.SplitN(release, ".", 3)
	var v [2]uint64
	for i := 0; i < 2 && i < len(parts); i++ {
		v[i], _ = strconv.ParseUint(parts[i], 10, 64)
	}
	return v
}
