package oci

import (
	"fmt"
	"slices"
	"sync"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

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

// Seccomp returns a copy of Stockade's tightened seccomp profile (see
// buildSeccomp); the profile is computed once per process.
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

var profile = sync.OnceValues(buildSeccomp)

// buildSeccomp returns Stockade's tightened seccomp profile: Docker's default
// profile for a process without capabilities, minus deniedSyscalls, with
// socket(2) restricted to allowedSocketDomains, TIOCSTI refused and only the
// native architecture allowed (other architectures' system calls kill the
// process).
func buildSeccomp() (*specs.LinuxSeccomp, error) {
	// The profile's capability-gated rules are evaluated against the bounding
	// set; an empty one selects the rules for an unprivileged process.
	base, err := seccomp.GetDefaultProfile(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}})
	if err != nil {
		return nil, fmt.Errorf("generating default seccomp profile: %w", err)
	}
	out := &specs.LinuxSeccomp{
		DefaultAction:   base.DefaultAction,
		DefaultErrnoRet: base.DefaultErrnoRet,
		Architectures:   []specs.Arch{specs.ArchX86_64},
	}
	for _, rule := range base.Syscalls {
		if slices.Contains(rule.Names, "socket") && len(rule.Args) > 0 {
			continue // replaced below
		}
		rule.Names = slices.DeleteFunc(slices.Clone(rule.Names), func(n string) bool {
			return slices.Contains(deniedSyscalls, n) || n == "ioctl"
		})
		if len(rule.Names) > 0 {
			out.Syscalls = append(out.Syscalls, rule)
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
