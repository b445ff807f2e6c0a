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
	"github.com/stockade-sh/stockade/sandbox/profile"
)

//go:generate go run mksyscalls.go

// nativeArch is the seccomp architecture of each GOARCH the guest is built
// for; syscallNames (zsyscalls.go) has the system calls of each.
var nativeArch = map[string]specs.Arch{"amd64": specs.ArchX86_64, "arm64": specs.ArchAARCH64}

// Seccomp returns a copy of the seccomp filter of Stockade's profile
// (profile.Default) for the host's architecture (see buildSeccomp); the
// filter is computed once per process.
func Seccomp() (*specs.LinuxSeccomp, error) {
	f, err := hostFilter()
	if err != nil {
		return nil, err
	}
	c := *f
	c.Architectures = slices.Clone(f.Architectures)
	c.Syscalls = slices.Clone(f.Syscalls)
	return &c, nil
}

var hostFilter = sync.OnceValues(func() (*specs.LinuxSeccomp, error) {
	return buildSeccomp(profile.Default().Seccomp, runtime.GOARCH, hostKernel())
})

// buildSeccomp returns the seccomp filter of policy for goarch on a kernel
// of version kernel (major, minor): Docker's default profile for a process
// without capabilities on that architecture (policy.Base), minus
// policy.Denied, with socket(2) restricted to policy.SocketFamilies,
// policy.RefusedIoctl refused and policy.ENOSYS answered ENOSYS.
//
// The profile names only system calls that goarch has (arm64 has no open,
// fork or stat, only their *at forms), and its only architecture is the
// native one: the runtime kills a process that makes a system call of
// another architecture (the 32-bit x86 or x32 ABIs on amd64, arm32 on
// arm64), which Docker's profile would allow as sub-architectures.
func buildSeccomp(policy profile.Seccomp, goarch string, kernel [2]uint64) (*specs.LinuxSeccomp, error) {
	arch, ok := nativeArch[goarch]
	known := syscallNames[goarch]
	if !ok || len(known) == 0 {
		return nil, fmt.Errorf("building the seccomp profile: architecture %s is not supported (amd64 and arm64 are): %w", goarch, errdefs.ErrFailedPrecondition)
	}
	if !policy.NativeOnly {
		// Docker's profile allows the sub-architectures; no tier needs them.
		return nil, fmt.Errorf("building the seccomp profile: only a filter of the native architecture can be built: %w", errdefs.ErrInvalidArgument)
	}
	refuseIoctl := policy.RefusedIoctl.Name != ""
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
			return !has || slices.Contains(policy.Denied, n) || (refuseIoctl && n == "ioctl")
		})
		if len(r.Names) > 0 {
			out.Syscalls = append(out.Syscalls, r)
		}
	}
	for _, f := range policy.SocketFamilies {
		out.Syscalls = append(out.Syscalls, specs.LinuxSyscall{
			Names:  []string{"socket"},
			Action: specs.ActAllow,
			Args:   []specs.LinuxSeccompArg{{Index: 0, Value: f.Value, Op: specs.OpEqualTo}},
		})
	}
	// ioctl is allowed except the refused request. The kernel reads the
	// request as 32 bits and seccomp sees 64, so the test must be "the low
	// 32 bits are not the request": a plain 64-bit "not equal" lets TIOCSTI
	// with garbage in the high bits through (CVE-2019-10063). Seccomp
	// compares a masked argument for equality only, and libseccomp lets an
	// unconditional allow win over a conditional refusal; so the allow is
	// one rule per bit, "differs from the request in this bit", and a
	// request that matches none is the refused one and gets the default
	// action. (So one request at most can be refused this way.)
	if refuseIoctl {
		for bit := uint64(1); bit <= 1<<31; bit <<= 1 {
			out.Syscalls = append(out.Syscalls, specs.LinuxSyscall{
				Names:  []string{"ioctl"},
				Action: specs.ActAllow,
				Args:   []specs.LinuxSeccompArg{{Index: 1, Value: bit, ValueTwo: ^policy.RefusedIoctl.Request & bit, Op: specs.OpMaskedEqual}},
			})
		}
	}
	for _, r := range policy.ENOSYS {
		nosys := uint(unix.ENOSYS)
		out.Syscalls = append(out.Syscalls, specs.LinuxSyscall{
			Names:    []string{r.Name},
			Action:   specs.ActErrno,
			ErrnoRet: &nosys,
		})
	}
	return out, nil
}

// traceENOSYS turns every ENOSYS rule into a trace rule (see
// UserSpaceKernel for why): with no tracer, which ptrace being refused
// guarantees, a trace rule answers ENOSYS, in the Sentry as in Linux.
func traceENOSYS(sc *specs.LinuxSeccomp) {
	for i, r := range sc.Syscalls {
		if r.Action == specs.ActErrno && r.ErrnoRet != nil && *r.ErrnoRet == uint(unix.ENOSYS) {
			sc.Syscalls[i] = specs.LinuxSyscall{Names: r.Names, Action: specs.ActTrace}
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
