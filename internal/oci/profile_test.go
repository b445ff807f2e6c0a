package oci

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// mountAt returns s's mount at dest.
func mountAt(s *specs.Spec, dest string) (specs.Mount, bool) {
	for _, m := range s.Mounts {
		if m.Destination == dest {
			return m, true
		}
	}
	return specs.Mount{}, false
}

// TestBuildFollowsProfile changes one entry of a copy of the profile at a
// time and checks that the bundle follows it: the bundle is built from
// the table, not from facts of its own.
func TestBuildFollowsProfile(t *testing.T) {
	img := sandbox.Image{Rootfs: "/images/python"}
	o := Options{ID: "x", Spec: sandbox.Spec{Image: img}, Limits: sandbox.DefaultLimits(), GuestPath: "/guest", CgroupsPath: "/stockade/x", HostUIDBase: sandbox.FirstHostID}
	for _, tt := range []struct {
		name    string
		edit    func(*profile.Profile)
		mounts  []sandbox.Mount
		follows func(*specs.Spec) bool
	}{
		{"another uid", func(p *profile.Profile) { p.User = profile.User{UID: 1000, GID: 1001} }, nil, func(s *specs.Spec) bool {
			return s.Process.User.UID == 1000 && s.Process.User.GID == 1001 && s.Linux.UIDMappings[1].ContainerID == 1000 && s.Linux.GIDMappings[1].ContainerID == 1001
		}},
		{"a writable root", func(p *profile.Profile) { p.ReadOnlyRoot = false }, nil, func(s *specs.Spec) bool { return !s.Root.Readonly }},
		{"a scratch option", func(p *profile.Profile) { p.Scratch[0].Options = append(p.Scratch[0].Options, "noexec") }, nil, func(s *specs.Spec) bool {
			m, ok := mountAt(s, "/tmp")
			return ok && slices.Contains(m.Options, "noexec")
		}},
		{"the workspace in every sandbox", func(p *profile.Profile) { p.Scratch[1].SessionOnly = false }, nil, func(s *specs.Spec) bool {
			_, ok := mountAt(s, "/workspace")
			return ok
		}},
		{"a kernel mount's option", func(p *profile.Profile) { p.Mounts[3].Options = []string{"nosuid"} }, nil, func(s *specs.Spec) bool {
			m, ok := mountAt(s, "/dev/shm")
			return ok && slices.Equal(m.Options, []string{"nosuid"})
		}},
		{"another masked path", func(p *profile.Profile) { p.MaskedPaths = append(p.MaskedPaths, "/proc/interrupts") }, nil, func(s *specs.Spec) bool {
			return slices.Contains(s.Linux.MaskedPaths, "/proc/interrupts")
		}},
		{"another read-only path", func(p *profile.Profile) { p.ReadOnlyPaths = append(p.ReadOnlyPaths, "/proc/kmsg") }, nil, func(s *specs.Spec) bool {
			return slices.Contains(s.Linux.ReadonlyPaths, "/proc/kmsg")
		}},
		{"the guest elsewhere", func(p *profile.Profile) { p.Guest.Path = "/.agent" }, nil, func(s *specs.Spec) bool {
			_, ok := mountAt(s, "/.agent")
			return ok && s.Process.Args[0] == "/.agent"
		}},
		{"data mounts elsewhere", func(p *profile.Profile) { p.Data.Dir = "/mnt" }, []sandbox.Mount{{Source: "/srv/sales", Target: "/mnt/sales"}}, func(s *specs.Spec) bool {
			parent, ok := mountAt(s, "/mnt")
			_, bound := mountAt(s, "/mnt/sales")
			return ok && parent.Type == "tmpfs" && bound
		}},
		{"a capability", func(p *profile.Profile) { p.Capabilities = []string{"CAP_NET_BIND_SERVICE"} }, nil, func(s *specs.Spec) bool {
			c, want := s.Process.Capabilities, []string{"CAP_NET_BIND_SERVICE"}
			return slices.Equal(c.Bounding, want) && slices.Equal(c.Effective, want) && slices.Equal(c.Inheritable, want) && slices.Equal(c.Permitted, want) && slices.Equal(c.Ambient, want)
		}},
		{"no no_new_privs", func(p *profile.Profile) { p.NoNewPrivs = false }, nil, func(s *specs.Spec) bool { return !s.Process.NoNewPrivileges }},
		{"no cgroup namespace", func(p *profile.Profile) { p.Namespaces = p.Namespaces[:len(p.Namespaces)-1] }, nil, func(s *specs.Spec) bool {
			return namespace(s, specs.CgroupNamespace) == nil && namespace(s, specs.PIDNamespace) != nil
		}},
		{"more files", func(p *profile.Profile) { p.Rlimits[0].Soft, p.Rlimits[0].Hard = 4096, 4096 }, nil, func(s *specs.Spec) bool {
			return s.Process.Rlimits[0] == specs.POSIXRlimit{Type: "RLIMIT_NOFILE", Soft: 4096, Hard: 4096}
		}},
		{"another hostname", func(p *profile.Profile) { p.Hostname = "box" }, nil, func(s *specs.Spec) bool { return s.Hostname == "box" }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := profile.Default()
			tt.edit(&p)
			sc, err := buildSeccomp(p.Seccomp, "amd64", goldenKernel)
			if err != nil {
				t.Fatal(err)
			}
			o := o
			o.Spec.Mounts = tt.mounts
			s, err := build(p, sc, o)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.follows(s) {
				t.Errorf("the bundle does not follow the profile with %s", tt.name)
			}
			def, err := build(profile.Default(), sc, o)
			if err == nil && tt.follows(def) {
				t.Errorf("the bundle of the default profile passes the check of %s: the check proves nothing", tt.name)
			}
		})
	}
}

// allows reports whether sc allows a call of name with the given
// arguments, as libseccomp evaluates its rules: an allow rule every
// condition of which holds allows the call, whatever the other rules say.
func allows(sc *specs.LinuxSeccomp, name string, args ...uint64) bool {
	for _, r := range sc.Syscalls {
		if r.Action == specs.ActAllow && matches(r, name, args) {
			return true
		}
	}
	return false
}

// allowsInSentry reports whether sc allows a call of name with the given
// arguments, as gVisor's Sentry evaluates the filter runsc builds from it
// (runsc/specutils/seccomp): the first rule every condition of which holds
// decides; a call no rule matches gets the default action, which refuses.
func allowsInSentry(sc *specs.LinuxSeccomp, name string, args ...uint64) bool {
	for _, r := range sc.Syscalls {
		if matches(r, name, args) {
			return r.Action == specs.ActAllow
		}
	}
	return sc.DefaultAction == specs.ActAllow
}

// matches reports whether rule r applies to a call of name with the given
// arguments: every condition of r holds (the filters here never put two
// conditions on one argument, which runsc would OR).
func matches(r specs.LinuxSyscall, name string, args []uint64) bool {
	if !slices.Contains(r.Names, name) {
		return false
	}
	var a [6]uint64
	copy(a[:], args)
	for _, c := range r.Args {
		switch c.Op {
		case specs.OpEqualTo:
			if a[c.Index] != c.Value {
				return false
			}
		case specs.OpMaskedEqual:
			if a[c.Index]&c.Value != c.ValueTwo {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// TestSeccompFollowsProfile changes one entry of a copy of the profile's
// policy at a time and checks that the filter follows it.
func TestSeccompFollowsProfile(t *testing.T) {
	for _, tt := range []struct {
		name    string
		edit    func(*profile.Seccomp)
		follows func(*specs.LinuxSeccomp) bool
	}{
		// Docker's profile allows ptrace from Linux 4.8; the policy denies it.
		{"ptrace allowed", func(s *profile.Seccomp) {
			s.Denied = slices.DeleteFunc(s.Denied, func(n string) bool { return n == "ptrace" })
		}, func(sc *specs.LinuxSeccomp) bool { return allows(sc, "ptrace") }},
		{"AF_ALG sockets", func(s *profile.Seccomp) {
			s.SocketFamilies = append(s.SocketFamilies, profile.SocketFamily{Name: "AF_ALG", Value: unix.AF_ALG})
		}, func(sc *specs.LinuxSeccomp) bool { return allows(sc, "socket", unix.AF_ALG) }},
		{"TIOCSTI allowed", func(s *profile.Seccomp) { s.RefusedIoctl = profile.Ioctl{} }, func(sc *specs.LinuxSeccomp) bool {
			return allows(sc, "ioctl", 0, unix.TIOCSTI)
		}},
		{"TIOCSCTTY refused instead", func(s *profile.Seccomp) { s.RefusedIoctl.Request = unix.TIOCSCTTY }, func(sc *specs.LinuxSeccomp) bool {
			return allows(sc, "ioctl", 0, unix.TIOCSTI) && !allows(sc, "ioctl", 0, unix.TIOCSCTTY)
		}},
		{"clone3 answered EPERM", func(s *profile.Seccomp) { s.ENOSYS = nil }, func(sc *specs.LinuxSeccomp) bool {
			return !slices.ContainsFunc(sc.Syscalls, func(r specs.LinuxSyscall) bool { return slices.Contains(r.Names, "clone3") })
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := profile.Default()
			tt.edit(&p.Seccomp)
			sc, err := buildSeccomp(p.Seccomp, "amd64", goldenKernel)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.follows(sc) {
				t.Errorf("the filter does not follow the policy with %s", tt.name)
			}
			def, _ := buildSeccomp(profile.Default().Seccomp, "amd64", goldenKernel)
			if tt.follows(def) {
				t.Errorf("the default filter passes the check of %s: the check proves nothing", tt.name)
			}
		})
	}
	p := profile.Default()
	p.Seccomp.NativeOnly = false
	if _, err := buildSeccomp(p.Seccomp, "amd64", goldenKernel); err == nil {
		t.Errorf("a policy allowing other architectures: got a filter, want an error (only native filters are built)")
	}
}
