package profile

import "github.com/stockade-sh/stockade/sandbox"

// Difference is a known way in which a tier, or a driver, presents the
// security profile otherwise than the shared-kernel tiers do, without a gap
// in it. The conformance check it names asserts the tier's own fact
// instead, so a declared difference that stops holding fails the check too
// (and must then be removed here); the blast-radius audit accepts the same
// fact where it is declared and nothing more.
type Difference struct {
	// ID names the difference for the checks that read it. One ID may be
	// declared for several places (On), each with its own fact.
	ID string
	// Tier is the tier whose sandboxes present it; empty, every tier of
	// Driver.
	Tier sandbox.Tier
	// Driver, when set, limits it to the sandboxes of that driver
	// (sandbox.Driver.Name): a fact of the platform the driver runs them
	// on (a Kubernetes node's kubelet), not of the tier's runtime. Empty,
	// every driver of Tier.
	Driver string
	// Check is the conformance subtest that asserts it.
	Check string
	// Fact is what the checks observe on the tier.
	Fact string
	// Reason says why the profile holds all the same.
	Reason string
	// Devices are the device nodes the tier adds to the minimal /dev.
	Devices []Device
	// Files are the host's files mounted into the sandbox, none of which
	// the sandbox's user can open for writing: each with a line of the
	// fixed contents the driver gives it.
	Files []File
}

// On is where a sandbox runs: the driver that made it (its Name) and its
// tier.
type On struct {
	Driver string
	Tier   sandbox.Tier
}

// Applies reports whether d is declared for the sandboxes on.
func (d Difference) Applies(on On) bool {
	return (d.Tier == "" || d.Tier == on.Tier) && (d.Driver == "" || d.Driver == on.Driver)
}

// Where says, in a few words, where d is declared: "gvisor", "kubernetes
// driver", "kubernetes driver, container tier".
func (d Difference) Where() string {
	switch {
	case d.Driver == "":
		return string(d.Tier)
	case d.Tier == "":
		return d.Driver + " driver"
	}
	return d.Driver + " driver, " + string(d.Tier) + " tier"
}

// File is a host's file mounted into a sandbox.
type File struct {
	Path string
	// Lines are lines of the fixed contents the driver gives it, each a
	// whole line of the file (compared field by field, whatever blanks
	// part them); none where the sandbox's user cannot read it.
	Lines []string
	// Host, when set, is the host name a line of the file must end with
	// (the profile's, in a hosts file).
	Host string
	// Exact says the file holds no line but Lines, May, comments and
	// lines ending with the profile's host name: what the runtime
	// writes, to the letter.
	Exact bool
	// May are lines an Exact file may hold besides Lines.
	May []string
	// Writable is true when the mount is read-write: the file's mode, or
	// its directory's, is what keeps the sandbox's user from writing it.
	Writable bool
}

// KubernetesDriver is the name of the driver (driver/kubernetes) whose
// differences are declared here.
const KubernetesDriver = "kubernetes"

// KubeletDir is the directory of root's, mode 0700, in which the kubernetes
// driver has the kubelet mount a pod's termination message file: every
// image the driver writes has it, so that the sandbox's user, with no
// capability, resolves no path to the file (driver/kubernetes).
const KubeletDir = "/.stockade-kubelet"

// differences returns the known differences of the tiers from p.
func differences(p Profile) []Difference {
	return []Difference{
		{
			ID: "status-nonewprivs", Tier: sandbox.TierGVisor, Check: "Credentials/NoNewPrivs",
			Fact:   "/proc/self/status has no NoNewPrivs line",
			Reason: "the Sentry's status file omits it; prctl(PR_GET_NO_NEW_PRIVS) answers 1, which is asserted",
		},
		{
			ID: "x32-abi", Tier: sandbox.TierGVisor, Check: "Syscalls/x32_getpid",
			Fact:   "a system call of the x32 ABI is refused with EPERM instead of killing the caller",
			Reason: "runsc compiles the OCI profile for the native architecture only and gives a call of another ABI the profile's default action; the Sentry implements no other ABI, and no call of the sandbox reaches the host kernel",
		},
		{
			ID: "root-eacces", Tier: sandbox.TierGVisor, Check: "Filesystem/RootReadOnly",
			Fact:   "creating a file in a directory of root's in the read-only image answers EACCES, not EROFS",
			Reason: "the Sentry checks the directory's permissions before the mount's read-only flag, which Linux checks first; where the permissions allow it (/var/tmp, mode 1777) it answers EROFS (asserted), and statfs reports the image read-only (asserted)",
		},
		{
			ID: "tmp-nodev", Tier: sandbox.TierGVisor, Check: "Filesystem/Tmp",
			Fact:   "/tmp is not mounted nodev",
			Reason: "runsc ignores the nodev mount option (it applies ro, noexec, nosuid and noatime) and the Sentry enforces nodev nowhere; a device node cannot be made there (mknod needs CAP_MKNOD, which no set holds; asserted), and any device in the sandbox is one the Sentry emulates, never the host's",
		},
		{
			ID: "proc-sys-rw", Tier: sandbox.TierGVisor, Check: "Filesystem/ProcAndSysReadOnly",
			Fact:   "/proc/sys is not a read-only mount",
			Reason: "runsc ignores the OCI readonlyPaths; its /proc/sys is the Sentry's own emulation, whose few writable files belong to the sandbox's root, so the program (uid 65534, no capabilities) can open none of them for writing (every file is tried), and a write by root would change only the Sentry's settings, never the host kernel's",
		},
		{
			ID: "dev-fuse-tun", Tier: sandbox.TierGVisor, Check: "Filesystem/DevMinimal",
			Fact:    "/dev/fuse and /dev/net/tun exist",
			Reason:  "the Sentry registers FUSE and TUN devices of its own in every sandbox; they are emulated, not the host's, and using them needs a mount or CAP_NET_ADMIN, which the profile refuses",
			Devices: []Device{{"fuse", 10, 229}, {"net/tun", 10, 200}},
		},
		{
			ID: "docker-etc-files", Tier: sandbox.TierDocker, Check: "Filesystem/NoHostMounts",
			Fact:   "/etc/resolv.conf, /etc/hostname and /etc/hosts are mounts of dockerd's",
			Reason: "dockerd bind-mounts them into every container, even with --network=none; they are read-only and the driver writes fixed contents into them (Filesystem/DockerEtcFiles)",
			Files: []File{
				{Path: p.ResolvConf.Path, Lines: []string{"nameserver 127.0.0.1"}},
				{Path: "/etc/hostname", Lines: []string{p.Hostname}, Exact: true},
				// What dockerd writes for a container without a network:
				// its default entries, none of the host's.
				{Path: "/etc/hosts", Lines: []string{"127.0.0.1 localhost"}, Exact: true, May: []string{
					"::1 localhost ip6-localhost ip6-loopback",
					"fe00::0 ip6-localnet",
					"ff00::0 ip6-mcastprefix",
					"ff02::1 ip6-allnodes",
					"ff02::2 ip6-allrouters",
				}},
			},
		},
		{
			ID: "low-ports", Tier: sandbox.TierGVisor, Check: "Network",
			Fact:   "binding a port below 1024 succeeds",
			Reason: "gVisor's netstack, not the host kernel, implements the sockets and checks neither CAP_NET_BIND_SERVICE nor ip_unprivileged_port_start (runsc applies no such sysctl), and seccomp cannot read bind's address; the port is the sandbox's own network stack's, reachable from inside the sandbox only (loopback, or an egress namespace whose host-side rules admit no inbound connection)",
		},
		{
			ID: "tmp-nosuid", Driver: KubernetesDriver, Check: "Filesystem/Tmp",
			Fact:   "/tmp is not mounted nosuid",
			Reason: "it is an emptyDir of medium Memory (as a session's /workspace is), which the kubelet mounts with no such option, and a pod spec cannot ask for one (a volume mount has no options; gVisor's mount hints, pod annotations dev.gvisor.spec.mount.NAME.options, make the Sentry's own tmpfs, and runsc refuses a nosuid one under a container mount without nosuid); the program cannot give a file there to another user (chown is refused, asserted), so a set-uid file it makes is its own, and no_new_privs (asserted by Credentials/NoNewPrivs) has execve ignore set-uid and set-gid bits and file capabilities anyway; the scratch stays memory-backed and capped (ENOSPC at the cap, asserted)",
		},
		{
			ID: "tmp-nodev", Driver: KubernetesDriver, Tier: sandbox.TierContainer, Check: "Filesystem/Tmp",
			Fact:   "/tmp is not mounted nodev",
			Reason: "the kubelet mounts an emptyDir with no such option and a pod spec cannot ask for one; a device node cannot be made there (mknod needs CAP_MKNOD, which no set holds; asserted), and the container's device cgroup admits the minimal /dev's devices only",
		},
		{
			ID: "kubelet-files", Driver: KubernetesDriver, Check: "Filesystem/NoHostMounts",
			Fact:   "/etc/hosts, /etc/hostname, /etc/resolv.conf and the termination message file (" + KubeletDir + "/termination-log) are files of the node, mounted by the kubelet and containerd (/etc/hosts and the termination message file read-write)",
			Reason: "the kubelet mounts them into every container whatever the pod spec says (a volume there would only put another file of the node in their place); they are root's, the sandbox's user opens none of them for writing, also through /proc/self/root (EACCES or EROFS, asserted), the termination message file's directory is root's, mode 0700, so no path to it resolves, and the driver sets the contents of the others (dnsPolicy None with nameserver 127.0.0.1, the profile's host name), and /etc/hosts is the kubelet's own, headed \"# Kubernetes-managed hosts file.\" and naming the pod by the profile's host name: nothing of the cluster's resolvers or the node's names is in them (asserted)",
			Files: []File{
				{Path: p.ResolvConf.Path, Lines: []string{"nameserver 127.0.0.1"}},
				{Path: "/etc/hostname", Lines: []string{p.Hostname}, Exact: true},
				// The kubelet's own file (not the node's, which it would
				// give a pod of the host's network), naming the pod by the
				// profile's host name.
				{Path: "/etc/hosts", Lines: []string{"# Kubernetes-managed hosts file.", "127.0.0.1 localhost"}, Host: p.Hostname, Writable: true},
				{Path: KubeletDir + "/termination-log", Writable: true},
			},
		},
	}
}
