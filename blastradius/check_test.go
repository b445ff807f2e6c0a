package blastradius

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/driver/docker"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
	"github.com/stockade-sh/stockade/tools"
)

// cleanReach is what the probe reports from a runc sandbox of the default
// tool (trimmed): exactly the record, no deviation.
const cleanReach = `{
 "env": ["PATH"], "path": "/usr/local/bin:/usr/bin:/bin",
 "caps": {
  "status": {"CapAmb": "0000000000000000", "CapBnd": "0000000000000000", "CapEff": "0000000000000000",
   "CapInh": "0000000000000000", "CapPrm": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"},
  "capget": {"errno": 0, "effective": "0000000000000000", "permitted": "0000000000000000", "inheritable": "0000000000000000"},
  "caps_checked": 41,
  "bounding": {"errno": 0, "value": "0000000000000000"}, "ambient": {"errno": 0, "value": "0000000000000000"},
  "no_new_privs": {"errno": 0, "value": 1}, "seccomp": {"errno": 0, "value": 2},
  "uid": 65534, "euid": 65534, "gid": 65534, "egid": 65534, "groups": []
 },
 "namespaces": [
  {"name": "cgroup", "link": "cgroup:[4026532250]"}, {"name": "ipc", "link": "ipc:[4026532179]"},
  {"name": "mnt", "link": "mnt:[4026532177]"}, {"name": "net", "link": "net:[4026532181]"},
  {"name": "pid", "link": "pid:[4026532180]"}, {"name": "pid_for_children", "link": "pid:[4026532180]"},
  {"name": "time", "link": "time:[4026531834]"}, {"name": "user", "link": "user:[4026531837]"},
  {"name": "uts", "link": "uts:[4026532178]"}
 ],
 "mounts": [
  {"mount_point": "/", "options": "ro,relatime", "fstype": "ext4", "source": "/dev/vda"},
  {"mount_point": "/proc", "options": "rw,nosuid,nodev,noexec,relatime", "fstype": "proc", "source": "proc"},
  {"mount_point": "/dev", "options": "rw,nosuid", "fstype": "tmpfs", "source": "tmpfs"},
  {"mount_point": "/dev/shm", "options": "rw,nosuid,nodev,noexec,relatime", "fstype": "tmpfs", "source": "shm"},
  {"mount_point": "/sys", "options": "ro,nosuid,nodev,noexec,relatime", "fstype": "sysfs", "source": "sysfs"},
  {"mount_point": "/tmp", "options": "rw,nosuid,nodev,relatime", "fstype": "tmpfs", "source": "tmpfs", "super_options": "rw,size=65536k"},
  {"mount_point": "/.stockade/guest", "options": "ro,nosuid,nodev,relatime", "fstype": "ext4", "source": "/dev/vda"},
  {"mount_point": "/proc/sys", "options": "ro,nosuid,nodev,noexec,relatime", "fstype": "proc", "source": "proc"},
  {"mount_point": "/sys/firmware", "options": "ro,relatime", "fstype": "tmpfs", "source": "tmpfs"}
 ],
 "walk": {"entries": 5466, "readable_files": 4397,
  "readable_by_mount": [{"mount_point": "/", "files": 4394}, {"mount_point": "/tmp", "files": 3}],
  "writable_dirs": ["/dev/shm", "/tmp"], "writable_files": ["/tmp/probe"], "writable_count": 3, "sockets": []},
 "dev": [{"name": "null", "type": "char", "major": 1, "minor": 3}, {"name": "pts", "type": "dir"},
  {"name": "pts/0", "type": "char", "major": 136, "minor": 0}, {"name": "shm", "type": "dir"}],
 "unix_sockets": {"paths": [], "unnamed": 0},
 "net": {"netlink": {"names": ["lo"]}, "proc_net_dev": ["lo"], "sys_class_net": ["lo"],
  "addresses": {"addrs": ["127.0.0.1/8 index 1", "::1/128 index 1"]}},
 "outbound": [
  {"kind": "tcp_host_loopback", "addr": "127.0.0.1:40000", "result": "ECONNREFUSED", "errno": 111},
  {"kind": "tcp_metadata", "addr": "169.254.169.254:80", "result": "ENETUNREACH", "errno": 101},
  {"kind": "dns", "name": "example.com", "addr": "127.0.0.1:53", "result": "ECONNREFUSED", "errno": 111}
 ],
 "limits": {"cgroup_pids_max": {"path": "", "value": ""}, "cgroup_memory_max": {"path": "", "value": ""},
  "rlimit_nproc": {"cur": "96365", "max": "96365"}, "meminfo_total_bytes": 25276510208, "tasks": 11}
}`

func cleanObserved(t *testing.T) *observed {
	t.Helper()
	o := &observed{
		listenAddr: "127.0.0.1:40000",
		hostNS: map[string]string{
			"cgroup": "cgroup:[4026531835]", "ipc": "ipc:[4026531839]", "mnt": "mnt:[4026531832]",
			"net": "net:[4026531833]", "pid": "pid:[4026531836]", "pid_for_children": "pid:[4026531836]",
			"time": "time:[4026531834]", "user": "user:[4026531837]", "uts": "uts:[4026531838]",
		},
		pids:     rawPidLimit{attempt: attempt{Errno: 11, Err: "EAGAIN"}, TasksBefore: 11, Forked: 116, Max: 192},
		pidsRes:  sandbox.Result{Status: sandbox.StatusSucceeded},
		pidsMax:  192,
		alloc:    rawAlloc{AllocatedMiB: 496},
		allocRes: sandbox.Result{Status: sandbox.StatusOOMKilled},
		allocMiB: 576,
	}
	if err := json.Unmarshal([]byte(cleanReach), &o.reach); err != nil {
		t.Fatal(err)
	}
	return o
}

func containerTool() tools.Tool { return tools.DefaultFor(sandbox.TierContainer) }

// tierCaps are what the drivers of each tier declare.
var tierCaps = map[sandbox.Tier]sandbox.Capabilities{
	sandbox.TierContainer: runc.Capabilities(),
	sandbox.TierGVisor:    gvisor.Capabilities(),
	sandbox.TierDocker:    docker.Capabilities(),
}

// checkDeviations fails t unless r has no deviation (subject "") or
// exactly one, about subject.
func checkDeviations(t *testing.T, r *Report, subject string) {
	t.Helper()
	var got []string
	for _, c := range r.Deviations {
		got = append(got, c.Subject)
	}
	switch {
	case subject == "" && len(got) > 0:
		t.Errorf("got deviations %v, want none", r.Deviations)
	case subject != "" && (len(got) != 1 || !strings.Contains(got[0], subject)):
		t.Errorf("got deviations %v, want exactly one about %q", r.Deviations, subject)
	}
}

// evaluateDefault evaluates o for tool t, audited on its tier's driver,
// against Stockade's profile.
func evaluateDefault(t tools.Tool, o *observed) *Report {
	return evaluate(profile.Default(), "", tierCaps[t.Tier], t, o)
}

// egressTool is containerTool with an egress allowlist.
func egressTool() tools.Tool {
	t := containerTool()
	t.Egress = tools.Egress{Allow: []string{"pypi.org"}, Ports: []int{443}}
	return t
}

// TestEvaluate widens a clean sandbox's findings one way at a time and
// checks that each is a deviation with the expected subject, and nothing
// else.
func TestEvaluate(t *testing.T) {
	tests := []struct {
		name    string
		tool    func() tools.Tool
		widen   func(o *observed)
		subject string // of the one deviation; "" for none
	}{
		{"clean", containerTool, func(o *observed) {}, ""},
		// Audited as an invocation without approved network: the same
		// sandbox as egress none's.
		{"egress tool", egressTool, func(o *observed) {}, ""},
		{"egress tool with an interface", egressTool, func(o *observed) { o.reach.Net.Netlink.Names = append(o.reach.Net.Netlink.Names, "eth0") }, "interfaces"},
		{"extra variable", containerTool, func(o *observed) { o.reach.Env = append(o.reach.Env, "AWS_SECRET_ACCESS_KEY") }, "AWS_SECRET_ACCESS_KEY"},
		{"PATH changed", containerTool, func(o *observed) { o.reach.Path = "/tmp:/usr/bin" }, "PATH"},
		{"root user", containerTool, func(o *observed) { o.reach.Caps.UID = 0 }, "user"},
		{"a capability", containerTool, func(o *observed) { o.reach.Caps.Status["CapEff"] = "0000000000000400" }, "capabilities"},
		{"no seccomp on runc", containerTool, func(o *observed) { o.reach.Caps.Seccomp.Value = json.RawMessage("0") }, "seccomp"},
		{"no seccomp presented on gvisor", func() tools.Tool { return tools.Default() }, func(o *observed) {
			o.reach.Caps.Seccomp.Value = json.RawMessage("0")
		}, ""},
		{"host net namespace", containerTool, func(o *observed) { o.reach.Namespaces[3].Link = "net:[4026531833]" }, "net"},
		{"shared user namespace", containerTool, func(o *observed) {}, ""},
		{"extra mount", containerTool, func(o *observed) {
			o.reach.Mounts = append(o.reach.Mounts, o.reach.Mounts[0])
			o.reach.Mounts[len(o.reach.Mounts)-1].MountPoint = "/mnt"
		}, "/mnt"},
		{"data tmpfs without record mounts", containerTool, func(o *observed) {
			o.reach.Mounts = append(o.reach.Mounts, o.reach.Mounts[5])
			o.reach.Mounts[len(o.reach.Mounts)-1].MountPoint = "/data"
		}, "/data"},
		{"root read-write", containerTool, func(o *observed) { o.reach.Mounts[0].Options = "rw,relatime" }, "/"},
		{"/proc/sys read-write", containerTool, func(o *observed) { o.reach.Mounts[7].Options = "rw,nosuid,nodev,noexec,relatime" }, "/proc/sys"},
		{"a host disk below /dev/shm", containerTool, func(o *observed) {
			o.reach.Mounts = append(o.reach.Mounts, o.reach.Mounts[0])
			m := &o.reach.Mounts[len(o.reach.Mounts)-1]
			m.MountPoint, m.Options = "/dev/shm/hostdata", "rw,relatime"
		}, "/dev/shm/hostdata"},
		{"a host directory over /dev/shm", containerTool, func(o *observed) {
			o.reach.Mounts[3].FSType, o.reach.Mounts[3].Source = "ext4", "/dev/vda"
		}, "/dev/shm"},
		{"something mounted in proc", containerTool, func(o *observed) {
			o.reach.Mounts = append(o.reach.Mounts, o.reach.Mounts[5])
			o.reach.Mounts[len(o.reach.Mounts)-1].MountPoint = "/proc/self/attr"
		}, "/proc/self/attr"},
		{"a host disk over a masked path", containerTool, func(o *observed) {
			o.reach.Mounts = append(o.reach.Mounts, o.reach.Mounts[0])
			m := &o.reach.Mounts[len(o.reach.Mounts)-1]
			m.MountPoint, m.Options = "/proc/scsi", "rw,relatime"
		}, "/proc/scsi"},
		{"a masked path", containerTool, func(o *observed) {
			o.reach.Mounts = append(o.reach.Mounts, o.reach.Mounts[5])
			m := &o.reach.Mounts[len(o.reach.Mounts)-1]
			m.MountPoint, m.FSType, m.Source, m.Root, m.Options = "/proc/kcore", "devtmpfs", "devtmpfs", "/null", "rw,relatime"
		}, ""},
		{"a masked directory", containerTool, func(o *observed) {
			o.reach.Mounts = append(o.reach.Mounts, o.reach.Mounts[5])
			m := &o.reach.Mounts[len(o.reach.Mounts)-1]
			m.MountPoint, m.Root, m.Options = "/proc/acpi", "/", "ro,relatime"
		}, ""},
		{"a host tmpfs over a masked directory", containerTool, func(o *observed) {
			o.reach.Mounts = append(o.reach.Mounts, o.reach.Mounts[5])
			m := &o.reach.Mounts[len(o.reach.Mounts)-1]
			m.MountPoint, m.Root, m.Options = "/proc/acpi", "/user/1000", "rw,nosuid"
		}, "/proc/acpi"},
		{"a read-write tmpfs over a masked directory", containerTool, func(o *observed) {
			o.reach.Mounts = append(o.reach.Mounts, o.reach.Mounts[5])
			m := &o.reach.Mounts[len(o.reach.Mounts)-1]
			m.MountPoint, m.Root, m.Options = "/proc/acpi", "/", "rw,nosuid"
		}, "/proc/acpi"},
		// Only the last mount at a mount point is what the sandbox sees
		// (dockerd mounts /sys/fs/cgroup read-write, runc binds it
		// read-only over itself).
		{"read-write covered by read-only", containerTool, func(o *observed) {
			cg := o.reach.Mounts[4] // /sys
			cg.MountPoint, cg.FSType, cg.Source, cg.Options = "/sys/fs/cgroup", "tmpfs", "tmpfs", "rw,nosuid"
			o.reach.Mounts = append(o.reach.Mounts, cg)
			cg.Options = "ro,nosuid"
			o.reach.Mounts = append(o.reach.Mounts, cg)
		}, ""},
		{"read-only covered by read-write", containerTool, func(o *observed) {
			cg := o.reach.Mounts[4]
			cg.MountPoint, cg.FSType, cg.Source, cg.Options = "/sys/fs/cgroup", "tmpfs", "tmpfs", "ro,nosuid"
			o.reach.Mounts = append(o.reach.Mounts, cg)
			cg.Options = "rw,nosuid"
			o.reach.Mounts = append(o.reach.Mounts, cg)
		}, "/sys/fs/cgroup"},
		{"scratch larger", containerTool, func(o *observed) { o.reach.Mounts[5].SuperOptions = "rw,size=1g" }, "/tmp size"},
		{"writable /etc", containerTool, func(o *observed) { o.reach.Walk.WritableDirs = append(o.reach.Walk.WritableDirs, "/etc") }, "/etc"},
		{"walk truncated", containerTool, func(o *observed) { o.reach.Walk.Truncated = true }, "walk"},
		{"block device", containerTool, func(o *observed) {
			o.reach.Dev = append(o.reach.Dev, o.reach.Dev[0])
			o.reach.Dev[len(o.reach.Dev)-1].Name, o.reach.Dev[len(o.reach.Dev)-1].Major = "sda", 8
		}, "/dev/sda"},
		{"docker socket", containerTool, func(o *observed) { o.reach.Walk.Sockets = []string{"/run/docker.sock"} }, "/run/docker.sock"},
		{"abstract socket", containerTool, func(o *observed) { o.reach.UnixSockets.Paths = []string{"@/containerd-shim/x.sock"} }, "@/containerd-shim/x.sock"},
		{"socket in /tmp", containerTool, func(o *observed) { o.reach.Walk.Sockets = []string{"/tmp/own.sock"} }, ""},
		{"an interface", containerTool, func(o *observed) { o.reach.Net.Netlink.Names = append(o.reach.Net.Netlink.Names, "eth0") }, "interfaces"},
		{"metadata reachable", containerTool, func(o *observed) { o.reach.Outbound[1].Result, o.reach.Outbound[1].Errno = "connected", 0 }, "metadata"},
		{"resolver answers", containerTool, func(o *observed) { o.reach.Outbound[2].Result, o.reach.Outbound[2].Errno = "no answer (rcode 3)", 0 }, "DNS"},
		{"listener accepted", containerTool, func(o *observed) { o.accepted = 1 }, "host listener"},
		{"fork never refused", containerTool, func(o *observed) { o.pids = rawPidLimit{TasksBefore: 11, Forked: 192, Max: 192} }, "processes"},
		{"more processes than the record", containerTool, func(o *observed) { o.pids.Forked = 200 }, "processes"},
		{"cgroup pids.max visible and wider", containerTool, func(o *observed) {
			o.reach.Limits.CgroupPidsMax = rawFile{Path: "/sys/fs/cgroup/pids.max", Value: "max"}
		}, "/sys/fs/cgroup/pids.max"},
		{"fork test killed the sandbox within the limit", containerTool, func(o *observed) {
			o.pidsRes = sandbox.Result{Status: sandbox.StatusOOMKilled}
			o.pids = rawPidLimit{TasksBefore: 11, Forked: 110, Max: 192}
		}, ""},
		{"fork test killed the sandbox past the limit", containerTool, func(o *observed) {
			o.pidsRes = sandbox.Result{Status: sandbox.StatusOOMKilled}
			o.pids = rawPidLimit{TasksBefore: 11, Forked: 150, Max: 192}
		}, "processes"},
		{"fork test timed out", containerTool, func(o *observed) {
			o.pidsRes = sandbox.Result{Status: sandbox.StatusTimedOut}
		}, "processes"},
		{"memory not enforced", containerTool, func(o *observed) {
			o.allocRes, o.alloc = sandbox.Result{Status: sandbox.StatusSucceeded}, rawAlloc{AllocatedMiB: 576}
		}, "memory"},
		{"memory refused by mmap", containerTool, func(o *observed) {
			o.allocRes, o.alloc = sandbox.Result{Status: sandbox.StatusSucceeded}, rawAlloc{attempt: attempt{Errno: 12, Err: "ENOMEM"}, AllocatedMiB: 480}
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := cleanObserved(t)
			tt.widen(o)
			r := evaluateDefault(tt.tool(), o)
			checkDeviations(t, r, tt.subject)
			text := r.Markdown()
			want := "\ndeviations: " + map[bool]string{true: "0", false: "1"}[tt.subject == ""] + "\n"
			if !strings.HasSuffix(text, want) {
				t.Errorf("the text report ends %q, want %q", text[max(0, len(text)-40):], want)
			}
		})
	}
}

// TestEvaluateRecordMount: the record's own mount is expected, read-only;
// a read-write one or a missing one is a deviation.
func TestEvaluateRecordMount(t *testing.T) {
	tool := containerTool()
	tool.Filesystem.Mounts = []sandbox.Mount{{Source: "/var/lib/stockade/data/sales", Target: "/data/sales"}}
	for _, tc := range []struct {
		name    string
		options string // "" for not mounted
		ok      bool
	}{
		{"read-only", "ro,nosuid,nodev,noexec", true},
		{"read-write", "rw,nosuid,nodev,noexec", false},
		{"missing", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := cleanObserved(t)
			parent := o.reach.Mounts[5] // the /tmp tmpfs
			parent.MountPoint, parent.Options, parent.SuperOptions = "/data", "rw,nosuid,nodev,noexec", "rw,size=64k,mode=755"
			o.reach.Mounts = append(o.reach.Mounts, parent)
			if tc.options != "" {
				m := o.reach.Mounts[0]
				m.MountPoint, m.Options = "/data/sales", tc.options
				o.reach.Mounts = append(o.reach.Mounts, m)
			}
			r := evaluateDefault(tool, o)
			bad := slices.ContainsFunc(r.Deviations, func(c Check) bool { return c.Subject == "/data/sales" })
			if bad == tc.ok || len(r.Deviations) != map[bool]int{true: 0, false: 1}[tc.ok] {
				t.Errorf("got deviations %v, want %s", r.Deviations, map[bool]string{true: "none", false: "one about /data/sales"}[tc.ok])
			}
		})
	}
}

// TestEvaluateHostFiles audits a sandbox with a file of the node mounted
// as the kubelet, containerd or dockerd mounts it: accepted only from the
// driver whose difference declares it (kubelet-files, docker-etc-files),
// only from where the runtime keeps it (not a hostPath at its path), and
// read-write only where declared so.
func TestEvaluateHostFiles(t *testing.T) {
	const (
		hex64     = "4f9c1b7e2d3a5c6b8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d"
		pod       = "/var/lib/kubelet/pods/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
		sandboxes = "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/" + hex64
	)
	for _, tc := range []struct {
		name, driver, point, root, options string
		ok                                 bool
	}{
		{"the kubelet's hosts on kubernetes", profile.KubernetesDriver, "/etc/hosts", pod + "/etc-hosts", "rw,relatime", true},
		{"a hostPath at /etc/hosts on kubernetes", profile.KubernetesDriver, "/etc/hosts", "/srv/node-files/hosts", "rw,relatime", false},
		{"the node's /etc/hosts on kubernetes", profile.KubernetesDriver, "/etc/hosts", "/etc/hosts", "rw,relatime", false},
		{"the kubelet's hosts on runc", "runc", "/etc/hosts", pod + "/etc-hosts", "rw,relatime", false},
		{"containerd's hostname read-only", profile.KubernetesDriver, "/etc/hostname", sandboxes + "/hostname", "ro,relatime", true},
		{"containerd's hostname read-write", profile.KubernetesDriver, "/etc/hostname", sandboxes + "/hostname", "rw,relatime", false},
		{"containerd's resolv.conf", profile.KubernetesDriver, "/etc/resolv.conf", sandboxes + "/resolv.conf", "ro,relatime", true},
		{"the termination log", profile.KubernetesDriver, profile.KubeletDir + "/termination-log", pod + "/containers/sandbox/7a1b2c3d", "rw,relatime", true},
		{"a hostPath at the termination log", profile.KubernetesDriver, profile.KubeletDir + "/termination-log", "/var/log/x", "rw,relatime", false},
		{"dockerd's hosts on docker", "docker", "/etc/hosts", "/var/lib/docker/containers/" + hex64 + "/hosts", "ro,relatime", true},
		{"a bind mount at /etc/hosts on docker", "docker", "/etc/hosts", "/home/u/hosts", "ro,relatime", false},
		{"another file of the node", profile.KubernetesDriver, "/etc/passwd", "/etc/passwd", "ro,relatime", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := cleanObserved(t)
			m := o.reach.Mounts[0]
			m.MountPoint, m.Root, m.Options = tc.point, tc.root, tc.options
			o.reach.Mounts = append(o.reach.Mounts, m)
			tool := containerTool()
			if tc.driver == "docker" {
				tool.Tier = sandbox.TierDocker
			}
			r := evaluate(profile.Default(), tc.driver, tierCaps[tool.Tier], tool, o)
			subject := tc.point
			if tc.ok {
				subject = ""
			}
			checkDeviations(t, r, subject)
		})
	}
}

// TestEvaluateFollowsProfile audits the clean sandbox's findings, widened
// or not, against a copy of the profile with one entry changed: each
// change moves the deviation it concerns, so the audit compares with the
// table and not with facts of its own.
func TestEvaluateFollowsProfile(t *testing.T) {
	declare := func(id string, tier sandbox.Tier) func(*profile.Profile) {
		return func(p *profile.Profile) {
			for i := range p.Differences {
				if p.Differences[i].ID == id {
					p.Differences[i].Tier = tier
				}
			}
		}
	}
	fuse := func(o *observed) {
		d := o.reach.Dev[0] // null
		d.Name, d.Major, d.Minor = "fuse", 10, 229
		o.reach.Dev = append(o.reach.Dev, d)
	}
	rwSys := func(o *observed) { o.reach.Mounts[4].Options = "rw,nosuid,nodev,noexec,relatime" }
	for _, tt := range []struct {
		name    string
		edit    func(*profile.Profile)
		widen   func(*observed)
		subject string // of the one deviation; "" for none
	}{
		{"another uid", func(p *profile.Profile) { p.User.UID = 1000 }, nil, "user"},
		{"a capability", func(p *profile.Profile) { p.Capabilities = []string{"CAP_NET_BIND_SERVICE"} }, nil, "capabilities"},
		{"no no_new_privs", func(p *profile.Profile) { p.NoNewPrivs = false }, nil, "no_new_privs"},
		{"a variable", func(p *profile.Profile) { p.Env = append(p.Env, "LANG=C.UTF-8") }, nil, "LANG"},
		{"another PATH", func(p *profile.Profile) { p.Env = []string{"PATH=/bin"} }, nil, "PATH"},
		{"a time namespace", func(p *profile.Profile) {
			p.Namespaces = append(p.Namespaces, profile.Namespace{Type: "time", Links: []string{"time"}})
		}, nil, "time"},
		{"the guest elsewhere", func(p *profile.Profile) { p.Guest.Path = "/.agent" }, nil, "/.stockade/guest"},
		{"no read-only /proc/sys", func(p *profile.Profile) {
			p.ReadOnlyPaths = slices.DeleteFunc(p.ReadOnlyPaths, func(s string) bool { return s == "/proc/sys" })
		}, nil, "/proc/sys"},
		{"a read-write /sys", nil, rwSys, "/sys"},
		{"a read-write /sys in a profile with one", func(p *profile.Profile) { p.Mounts[5].Options = []string{"nosuid"} }, rwSys, ""},
		{"no writable /dev/shm", func(p *profile.Profile) { p.Mounts[3].Writable = false }, nil, "/dev/shm"},
		{"no null device", func(p *profile.Profile) { p.Dev.Devices = p.Dev.Devices[1:] }, nil, "/dev/null"},
		{"another interface", func(p *profile.Profile) { p.Network.Interfaces = []string{"eth0"} }, nil, "interfaces"},
		{"the Sentry's devices", nil, fuse, "/dev/fuse"},
		{"the Sentry's devices declared for the tier", declare("dev-fuse-tun", sandbox.TierContainer), fuse, ""},
		{"no ambient set", nil, func(o *observed) { o.reach.Caps.Ambient.Errno = 22 }, "capabilities"},
		// No tier lacks the ambient set since runsc 20260715 implements it:
		// the difference the audit knows is declared here.
		{"no ambient set declared for the tier", func(p *profile.Profile) {
			p.Differences = append(p.Differences, profile.Difference{ID: "status-ambient", Tier: sandbox.TierContainer, Check: "Credentials/Capabilities"})
		}, func(o *observed) { o.reach.Caps.Ambient.Errno = 22 }, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := profile.Default()
			if tt.edit != nil {
				tt.edit(&p)
			}
			o := cleanObserved(t)
			if tt.widen != nil {
				tt.widen(o)
			}
			tool := containerTool()
			checkDeviations(t, evaluate(p, "", tierCaps[tool.Tier], tool, o), tt.subject)
		})
	}
}
