package conformance

import (
	"maps"
	"slices"
	"strings"
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
// profile's, with the host's files declared mounted where the sandbox runs.
func TestAllowedMount(t *testing.T) {
	moved := profile.Default()
	moved.Guest.Path = "/.agent"
	moved.Scratch = moved.Scratch[:1]
	runc := profile.On{Driver: "runc", Tier: sandbox.TierContainer}
	docker := profile.On{Driver: "docker", Tier: sandbox.TierDocker}
	kubeRunc := profile.On{Driver: profile.KubernetesDriver, Tier: sandbox.TierContainer}
	kubeGVisor := profile.On{Driver: profile.KubernetesDriver, Tier: sandbox.TierGVisor}
	for _, tt := range []struct {
		name    string
		p       profile.Profile
		on      profile.On
		point   string
		options string
		want    bool
	}{
		{"root", profile.Default(), runc, "/", "ro", true},
		{"scratch", profile.Default(), runc, "/tmp", "rw", true},
		{"a session's workspace", profile.Default(), runc, "/workspace", "rw", true},
		{"no workspace in the profile", moved, runc, "/workspace", "rw", false},
		{"the guest", profile.Default(), runc, "/.stockade/guest", "ro", true},
		{"the guest moved", moved, runc, "/.stockade/guest", "ro", false},
		{"the guest where it moved", moved, runc, "/.agent", "ro", true},
		{"below a kernel file system", profile.Default(), runc, "/proc/kcore", "ro", true},
		{"a host directory", profile.Default(), runc, "/mnt", "ro", false},
		{"dockerd's file on docker", profile.Default(), docker, "/etc/hosts", "ro,nosuid", true},
		{"dockerd's file read-write", profile.Default(), docker, "/etc/hosts", "rw", false},
		{"dockerd's file elsewhere", profile.Default(), runc, "/etc/hosts", "ro", false},
		{"the kubelet's hosts, read-write", profile.Default(), kubeRunc, "/etc/hosts", "rw,relatime", true},
		{"the kubelet's resolv.conf", profile.Default(), kubeGVisor, "/etc/resolv.conf", "ro", true},
		{"the kubelet's resolv.conf read-write", profile.Default(), kubeGVisor, "/etc/resolv.conf", "rw", false},
		{"the termination message file", profile.Default(), kubeGVisor, profile.KubeletDir + "/termination-log", "rw", true},
		{"the termination message file elsewhere", profile.Default(), runc, profile.KubeletDir + "/termination-log", "ro", false},
		{"the kubelet's hosts on docker", profile.Default(), docker, "/etc/hosts", "rw", false},
		{"another file of the node", profile.Default(), kubeRunc, "/etc/passwd", "ro", false},
		{"a host directory on kubernetes", profile.Default(), kubeGVisor, "/var/lib/kubelet", "ro", false},
	} {
		if got := allowedMount(tt.p, tt.on, tt.point, tt.options); got != tt.want {
			t.Errorf("%s: allowedMount(%+v, %s, %s): got %t, want %t", tt.name, tt.on, tt.point, tt.options, got, tt.want)
		}
	}
}

// TestHostFileWrites checks that a host's file the sandbox's user could
// open for writing, by its path or through /proc/self/root, is a problem,
// and a refusal by permissions or a read-only mount is not.
func TestHostFileWrites(t *testing.T) {
	files := []hostFile{{profile.File{Path: "/etc/hosts"}, "kubelet-files"}}
	for _, tt := range []struct {
		name   string
		direct syscall.Errno
		proc   syscall.Errno
		want   int
	}{
		{"refused by permissions", syscall.EACCES, syscall.EACCES, 0},
		{"a read-only mount", syscall.EROFS, syscall.EROFS, 0},
		{"writable", 0, 0, 2},
		{"writable through /proc/self/root", syscall.EACCES, 0, 1},
		{"refused otherwise", syscall.EPERM, syscall.EACCES, 1},
	} {
		seen, problems := hostFileWrites(files, func(path string) errno {
			if path == "/proc/self/root/etc/hosts" {
				return errno{Errno: int(tt.proc)}
			}
			return errno{Errno: int(tt.direct)}
		})
		if len(seen) != 2 || len(problems) != tt.want {
			t.Errorf("%s: saw %v, problems %q; want %d problems", tt.name, seen, problems, tt.want)
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

// TestFileProblems checks the contents Filesystem/KubeletFiles and
// DockerEtcFiles accept: what the kubelet and dockerd write, not a node's
// own files (which a pod of the host's network, or a hostPath at the same
// path, would show).
func TestFileProblems(t *testing.T) {
	p := profile.Default()
	file := func(driver string, tier sandbox.Tier, path string) profile.File {
		d, ok := p.Difference(profile.On{Driver: driver, Tier: tier}, map[string]string{"kubernetes": "kubelet-files", "docker": "docker-etc-files"}[driver])
		if !ok {
			t.Fatalf("no difference of driver %s", driver)
		}
		for _, f := range d.Files {
			if f.Path == path {
				return f
			}
		}
		t.Fatalf("driver %s declares no %s", driver, path)
		return profile.File{}
	}
	kubeHosts := file("kubernetes", sandbox.TierGVisor, "/etc/hosts")
	dockerHosts := file("docker", sandbox.TierDocker, "/etc/hosts")
	resolv := file("kubernetes", sandbox.TierGVisor, p.ResolvConf.Path)
	const (
		kubelet = "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n10.244.0.7\tsandbox\n"
		dockerd = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n"
		// A node's own /etc/hosts, as a pod of the host's network gets it
		// (the kubelet's header then says "(host network)").
		node        = "127.0.0.1\tlocalhost\n127.0.1.1\tnode-1.example.internal node-1\n::1\tlocalhost ip6-localhost ip6-loopback\n"
		hostNetwork = "# Kubernetes-managed hosts file (host network).\n" + node
	)
	for _, tt := range []struct {
		name    string
		f       profile.File
		content string
		want    int // problems; 0: accepted
	}{
		{"the kubelet's", kubeHosts, kubelet, 0},
		{"the node's, through hostNetwork", kubeHosts, hostNetwork, 3},
		{"the node's, by a hostPath", kubeHosts, node, 3},
		{"the kubelet's, without the pod's name", kubeHosts, strings.TrimSuffix(kubelet, "10.244.0.7\tsandbox\n"), 1},
		{"dockerd's", dockerHosts, dockerd, 0},
		{"dockerd's with the sandbox's address", dockerHosts, dockerd + "172.17.0.2\tsandbox\n", 0},
		{"the node's, for docker", dockerHosts, node, 1},
		{"a line added to dockerd's", dockerHosts, dockerd + "10.0.0.9\tdb.internal\n", 1},
		{"the driver's resolv.conf", resolv, "nameserver 127.0.0.1\n", 0},
		{"the cluster's resolv.conf", resolv, "search stockade.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n", 2},
	} {
		if got := fileProblems(tt.f, tt.content, p.Hostname, "node-1"); len(got) != tt.want {
			t.Errorf("%s: got problems %q, want %d", tt.name, got, tt.want)
		}
	}
	// The node's host name unknown, the node's files still fail.
	for _, f := range []profile.File{kubeHosts, dockerHosts} {
		if got := fileProblems(f, node, p.Hostname, ""); len(got) == 0 {
			t.Errorf("%s: the node's hosts file accepted when the node's name is unknown", f.Path)
		}
	}
}
