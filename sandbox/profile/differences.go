package profile

import "github.com/stockade-sh/stockade/sandbox"

// Difference is a known way in which a tier presents the security profile
// otherwise than the shared-kernel tiers do, without a gap in it. The
// conformance check it names asserts the tier's own fact instead, so a
// declared difference that stops holding fails the check too (and must
// then be removed here); the blast-radius audit accepts the same fact on
// the tier and nothing more.
type Difference struct {
	// ID names the difference for the checks that read it.
	ID   string
	Tier sandbox.Tier
	// Check is the conformance subtest that asserts it.
	Check string
	// Fact is what the checks observe on the tier.
	Fact string
	// Reason says why the profile holds all the same.
	Reason string
	// Devices are the device nodes the tier adds to the minimal /dev.
	Devices []Device
	// Files are the files the tier mounts read-only, each with a line of
	// the fixed contents the driver gives it.
	Files []File
}

// File is a file with a line of its contents.
type File struct {
	Path, Line string
}

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
				{p.ResolvConf.Path, "nameserver 127.0.0.1"},
				{"/etc/hostname", p.Hostname},
				{"/etc/hosts", "127.0.0.1"},
			},
		},
		{
			ID: "low-ports", Tier: sandbox.TierGVisor, Check: "Network",
			Fact:   "binding a port below 1024 succeeds",
			Reason: "gVisor's netstack, not the host kernel, implements the sockets and checks neither CAP_NET_BIND_SERVICE nor ip_unprivileged_port_start (runsc applies no such sysctl), and seccomp cannot read bind's address; the port is the sandbox's own network stack's, reachable from inside the sandbox only (loopback, or an egress namespace whose host-side rules admit no inbound connection)",
		},
	}
}
