package conformance

import (
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// The checks of the system calls that the profile's seccomp policy
// refuses, each tried by the probe.

// refusal is how the profile refuses a system call: an errno, or a kill by
// signal.
type refusal struct {
	errno  syscall.Errno
	signal syscall.Signal
}

func (r refusal) String() string {
	if r.signal != 0 {
		return "killed by signal " + strconv.Itoa(int(r.signal))
	}
	return unix.ErrnoName(r.errno)
}

func (r refusal) matches(e errno) bool {
	return e.Errno >= 0 && e.Signal == int(r.signal) && (r.signal != 0 || e.is(r.errno))
}

// policyEntry is what of the profile's seccomp policy a probe attempt
// tries; one field is set.
type policyEntry struct {
	syscall string // a system call the policy denies, or answers ENOSYS
	family  string // a socket family, refused unless the policy allows it
	ioctl   string // an ioctl request the policy may refuse
	base    bool   // what the base profile refuses (clone's namespace flags)
	foreign bool   // a system call of another architecture (amd64's x32)
}

// syscallAttempts are the probe's attempts at what the seccomp policy
// refuses, each with the entry of the policy it tries. Without the
// profile, each succeeds for an unprivileged process on a typical kernel
// (except those also gated by capabilities: mount, setns, fsopen,
// unshare(CLONE_NEWNS|CLONE_NEWNET), socket(AF_PACKET), bpf; there the
// filter's verdict is what shows the filter refuses them).
var syscallAttempts = map[string]policyEntry{
	"io_uring_setup": {syscall: "io_uring_setup"}, "userfaultfd": {syscall: "userfaultfd"},
	"bpf": {syscall: "bpf"}, "perf_event_open": {syscall: "perf_event_open"},
	"keyctl": {syscall: "keyctl"}, "add_key": {syscall: "add_key"}, "request_key": {syscall: "request_key"},
	"ptrace_traceme": {syscall: "ptrace"}, "ptrace_seize_pid1": {syscall: "ptrace"}, "ptrace_seize_child": {syscall: "ptrace"},
	"process_vm_readv": {syscall: "process_vm_readv"},
	"unshare_newuser":  {syscall: "unshare"}, "unshare_newns": {syscall: "unshare"}, "unshare_newnet": {syscall: "unshare"},
	"setns": {syscall: "setns"}, "mount": {syscall: "mount"}, "fsopen": {syscall: "fsopen"},
	"clone3": {syscall: "clone3"}, "clone3_newuser": {syscall: "clone3"},
	"clone_newuser": {base: true},
	"socket_af_alg": {family: "AF_ALG"}, "socket_af_packet": {family: "AF_PACKET"}, "socket_af_vsock": {family: "AF_VSOCK"},
	"ioctl_tiocsti": {ioctl: "TIOCSTI"}, "ioctl_tiocsti_high_bits": {ioctl: "TIOCSTI"},
	"x32_getpid": {foreign: true},
}

// refusedSyscalls returns the probe's attempts that policy refuses, with
// how it refuses them on every tier.
//
// Every errno rule answers EPERM, the profile's default action: under
// gVisor too, which turns every errno rule into EPERM. An ENOSYS entry
// (clone3) must answer ENOSYS: glibc creates threads with clone3 and falls
// back to clone only on ENOSYS (EPERM breaks pthread_create), and clone's
// flags are what the profile can check. On the host kernel an errno rule
// says so; under gVisor a trace rule with no tracer does (see
// oci.UserSpaceKernel). The x32 ABI (amd64 only) is an architecture a
// native-only policy leaves out, and its filter kills the caller.
func refusedSyscalls(policy profile.Seccomp, goarch string) map[string]refusal {
	eperm, enosys := refusal{errno: syscall.EPERM}, refusal{errno: syscall.ENOSYS}
	m := map[string]refusal{}
	for name, a := range syscallAttempts {
		switch {
		case a.syscall != "" && slices.ContainsFunc(policy.ENOSYS, func(r profile.Reasoned) bool { return r.Name == a.syscall }):
			m[name] = enosys
		case a.syscall != "" && slices.Contains(policy.Denied, a.syscall):
			m[name] = eperm
		case a.family != "" && !slices.ContainsFunc(policy.SocketFamilies, func(f profile.SocketFamily) bool { return f.Name == a.family }):
			m[name] = eperm
		case a.ioctl != "" && policy.RefusedIoctl.Name == a.ioctl, a.base:
			m[name] = eperm
		case a.foreign && policy.NativeOnly && goarch == "amd64":
			m[name] = refusal{signal: syscall.SIGSYS}
		}
	}
	return m
}

// syscalls asserts, for each system call the profile must refuse, both the
// answer to the probe's real attempt and the sandbox filter's verdict on
// the same call, read by the probe without executing it (a filter of its
// own stacked on the sandbox's answers the call with TRACE, which an errno
// or kill rule outranks). The verdict tells the filter's refusal from the
// kernel's own (EPERM for want of a capability), on every tier. The
// probe's controls show that the means work on the tier: a raw child's
// allowed call succeeds, the overlay turns an allowed call into ENOSYS,
// and the raw fork and an allowed socket family succeed.
func (s *suite) syscalls(t *testing.T) {
	b := s.start(t, sandbox.Limits{})
	type attempt struct {
		errno
		Name    string `json:"name"`
		Verdict errno  `json:"verdict"`
	}
	var r struct {
		Results  []attempt `json:"results"`
		Controls []attempt `json:"controls"`
	}
	b.report(t, &r, "syscalls")
	got := map[string]attempt{}
	var summary []string
	for _, x := range r.Results {
		got[x.Name] = x
		summary = append(summary, x.Name+"="+x.errno.String()+"/"+x.Verdict.String())
	}
	t.Logf("tier %s (attempt/verdict): %s", s.caps.Tier, strings.Join(summary, " "))

	t.Run("Controls", func(t *testing.T) {
		want := map[string]refusal{
			"raw_child_getpid": {}, "verdict_getpid": {errno: syscall.ENOSYS},
			"raw_clone": {}, "socket_af_inet": {},
		}
		seen := 0
		for _, c := range r.Controls {
			w, ok := want[c.Name]
			if !ok {
				continue
			}
			seen++
			if !w.matches(c.errno) {
				t.Errorf("control %s: got %s, want %s", c.Name, c.errno, w)
			}
		}
		if seen != len(want) {
			t.Errorf("the probe reported %d of the %d controls %v", seen, len(want), r.Controls)
		}
	})
	for name, want := range refusedSyscalls(s.p.Seccomp, runtime.GOARCH) {
		if d, ok := s.difference("x32-abi"); ok && name == "x32_getpid" {
			// See the declared difference.
			want = refusal{errno: syscall.EPERM}
			t.Logf("tier %s: %s", d.Tier, d.Fact)
		}
		t.Run(name, func(t *testing.T) {
			a, ok := got[name]
			if !ok {
				t.Fatalf("the probe did not report %s", name)
			}
			if !want.matches(a.errno) {
				t.Errorf("%s: got %s, want %s", name, a.errno, want)
			}
			if !want.matches(a.Verdict) {
				t.Errorf("%s: the filter's verdict: got %s, want %s", name, a.Verdict, want)
			}
		})
	}
}
