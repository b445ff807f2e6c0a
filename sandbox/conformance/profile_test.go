package conformance

import (
	"maps"
	"slices"
	"syscall"
	"testing"

	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// TestRefusedSyscalls checks the refusals the suite expects of Stockade's
// policy against the list it asserted before the policy was a table, and
// that they follow an edited copy of the policy.
func TestRefusedSyscalls(t *testing.T) {
	eperm, enosys := refusal{errno: syscall.EPERM}, refusal{errno: syscall.ENOSYS}
	want := map[string]refusal{"clone3": enosys, "clone3_newuser": enosys, "x32_getpid": {signal: syscall.SIGSYS}}
	for _, name := range []string{
		"io_uring_setup", "userfaultfd", "bpf", "perf_event_open",
		"keyctl", "add_key", "request_key",
		"ptrace_traceme", "ptrace_seize_pid1", "ptrace_seize_child", "process_vm_readv",
		"unshare_newuser", "unshare_newns", "unshare_newnet", "clone_newuser", "setns",
		"mount", "fsopen",
		"socket_af_alg", "socket_af_packet", "socket_af_vsock",
		"ioctl_tiocsti", "ioctl_tiocsti_high_bits",
	} {
		want[name] = eperm
	}
	if got := refusedSyscalls(profile.Default().Seccomp, "amd64"); !maps.Equal(got, want) {
		t.Errorf("amd64: got %v, want %v", got, want)
	}
	delete(want, "x32_getpid")
	if got := refusedSyscalls(profile.Default().Seccomp, "arm64"); !maps.Equal(got, want) {
		t.Errorf("arm64: got %v, want %v", got, want)
	}

	for _, tt := range []struct {
		name    string
		edit    func(*profile.Seccomp)
		changed map[string]*refusal // nil: no longer expected
	}{
		{"ptrace allowed", func(s *profile.Seccomp) {
			s.Denied = slices.DeleteFunc(s.Denied, func(n string) bool { return n == "ptrace" })
		}, map[string]*refusal{"ptrace_traceme": nil, "ptrace_seize_pid1": nil, "ptrace_seize_child": nil}},
		{"AF_ALG sockets", func(s *profile.Seccomp) {
			s.SocketFamilies = append(s.SocketFamilies, profile.SocketFamily{Name: "AF_ALG", Value: 38})
		}, map[string]*refusal{"socket_af_alg": nil}},
		{"TIOCSTI allowed", func(s *profile.Seccomp) { s.RefusedIoctl = profile.Ioctl{} }, map[string]*refusal{"ioctl_tiocsti": nil, "ioctl_tiocsti_high_bits": nil}},
		{"clone3 answered EPERM", func(s *profile.Seccomp) { s.ENOSYS = nil }, map[string]*refusal{"clone3": &eperm, "clone3_newuser": &eperm}},
		{"other architectures allowed", func(s *profile.Seccomp) { s.NativeOnly = false }, map[string]*refusal{"x32_getpid": nil}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := profile.Default()
			tt.edit(&p.Seccomp)
			got := refusedSyscalls(p.Seccomp, "amd64")
			want := refusedSyscalls(profile.Default().Seccomp, "amd64")
			for name, r := range tt.changed {
				if r == nil {
					delete(want, name)
				} else {
					want[name] = *r
				}
			}
			if !maps.Equal(got, want) {
				t.Errorf("got %v, want %v", got, want)
			}
		})
	}
}

// TestAllowedMount checks that the mounts the suite accepts are the
// profile's, with what the tier declares it mounts.
func TestAllowedMount(t *testing.T) {
	moved := profile.Default()
	moved.Guest.Path = "/.agent"
	moved.Scratch = moved.Scratch[:1]
	for _, tt := range []struct {
		name    string
		p       profile.Profile
		tier    sandbox.Tier
		point   string
		options string
		want    bool
	}{
		{"root", profile.Default(), sandbox.TierContainer, "/", "ro", true},
		{"scratch", profile.Default(), sandbox.TierContainer, "/tmp", "rw", true},
		{"a session's workspace", profile.Default(), sandbox.TierContainer, "/workspace", "rw", true},
		{"no workspace in the profile", moved, sandbox.TierContainer, "/workspace", "rw", false},
		{"the guest", profile.Default(), sandbox.TierContainer, "/.stockade/guest", "ro", true},
		{"the guest moved", moved, sandbox.TierContainer, "/.stockade/guest", "ro", false},
		{"the guest where it moved", moved, sandbox.TierContainer, "/.agent", "ro", true},
		{"below a kernel file system", profile.Default(), sandbox.TierContainer, "/proc/kcore", "ro", true},
		{"a host directory", profile.Default(), sandbox.TierContainer, "/mnt", "ro", false},
		{"dockerd's file on docker", profile.Default(), sandbox.TierDocker, "/etc/hosts", "ro,nosuid", true},
		{"dockerd's file read-write", profile.Default(), sandbox.TierDocker, "/etc/hosts", "rw", false},
		{"dockerd's file elsewhere", profile.Default(), sandbox.TierContainer, "/etc/hosts", "ro", false},
	} {
		if got := allowedMount(tt.p, tt.tier, tt.point, tt.options); got != tt.want {
			t.Errorf("%s: allowedMount(%s, %s, %s): got %t, want %t", tt.name, tt.tier, tt.point, tt.options, got, tt.want)
		}
	}
}

func TestGroupOutside(t *testing.T) {
	for _, tt := range []struct {
		rng  string
		gid  uint32
		want bool
	}{{"1 0", 65534, true}, {"0 2147483647", 65534, false}, {"0 100", 65534, true}, {"", 65534, false}} {
		if got := groupOutside(tt.rng, tt.gid); got != tt.want {
			t.Errorf("groupOutside(%q, %d): got %t, want %t", tt.rng, tt.gid, got, tt.want)
		}
	}
}
