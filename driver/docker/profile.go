package docker

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"

	"github.com/stockade-sh/stockade/internal/oci"
	"github.com/stockade-sh/stockade/sandbox"
)

// containerConfig expresses Stockade's security profile (DESIGN.md §3) in
// Docker's terms, field for field with internal/oci's bundle. What is not set
// here is Docker's default and is deliberately so: masked and read-only
// /proc and /sys paths, the minimal /dev, the device cgroup and the /dev/shm
// tmpfs.
func (d *Driver) containerConfig(id string, spec sandbox.Spec, l sandbox.Limits, tag string) (*container.Config, *container.HostConfig, error) {
	if spec.Network != sandbox.NetworkNone {
		return nil, nil, fmt.Errorf("network mode %q is not supported yet", spec.Network)
	}
	labels := map[string]string{LabelSandbox: id}
	for k, v := range spec.Labels {
		labels[LabelPrefix+k] = v
	}
	// Only the mounts a tool's record names, read-only. Docker offers no
	// nosuid or noexec for bind mounts; no_new_privs makes setuid bits
	// inert, and the program can run interpreters anyway. Plain binds, as
	// in internal/oci: a recursive bind would carry the mounts below the
	// source along, and runc makes only the top one read-only.
	var mounts []mount.Mount
	for _, m := range spec.Mounts {
		if !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Target) {
			return nil, nil, fmt.Errorf("mount %q -> %q: paths must be absolute", m.Source, m.Target)
		}
		mounts = append(mounts, mount.Mount{
			Type: mount.TypeBind, Source: m.Source, Target: m.Target, ReadOnly: true,
			BindOptions: &mount.BindOptions{Propagation: mount.PropagationRPrivate, NonRecursive: true},
		})
	}
	pids := l.Pids
	swappiness := int64(0)
	noInit := false
	cc := &container.Config{
		Image:      tag,
		Entrypoint: []string{oci.GuestPath},
		Cmd:        []string{},
		User:       strconv.Itoa(oci.SandboxUID) + ":" + strconv.Itoa(oci.SandboxGID),
		// The guest's own environment; the program's comes from the
		// ExecRequest. Docker adds PATH and HOSTNAME to it, nothing else.
		Env:        []string{},
		WorkingDir: "/",
		Hostname:   "sandbox",
		Labels:     labels,
		// The guest speaks the framed protocol on stdin and stdout; stdin
		// closes when our attach connection does.
		AttachStdin:  true,
		AttachStdout: true,
		AttachStderr: true,
		OpenStdin:    true,
		StdinOnce:    true,
		Tty:          false,
	}
	hc := &container.HostConfig{
		NetworkMode:    "none",
		IpcMode:        "private",
		PidMode:        "", // a private PID namespace
		UTSMode:        "", // a private UTS namespace
		CgroupnsMode:   container.CgroupnsModePrivate,
		ReadonlyRootfs: true,
		// Docker's read-only paths, and the cgroup tmpfs, which dockerd
		// mounts read-write (for root only, but the profile says
		// read-only). Docker's masked paths stay its defaults.
		ReadonlyPaths: append(slices.Clone(oci.ReadonlyPaths), "/sys/fs/cgroup"),
		Tmpfs: map[string]string{
			"/tmp": "rw,exec,nosuid,nodev,mode=1777,size=" + strconv.FormatInt(l.TmpSize, 10),
		},
		Mounts: mounts,
		// Docker bind-mounts /etc/resolv.conf, /etc/hosts and
		// /etc/hostname (read-only, from its data root) into every
		// container, also without a network. These keep the host's
		// resolvers and search domains out of the first.
		DNS:       []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 1})},
		DNSSearch: []string{"."},
		// dockerd opens ping sockets to every group and the ports below
		// 1024 to every process of a container with its own network
		// namespace; these are the kernel's defaults, as on runc.
		Sysctls: map[string]string{
			"net.ipv4.ping_group_range":           "1 0",
			"net.ipv4.ip_unprivileged_port_start": "1024",
		},
		CapDrop:     []string{"ALL"},
		SecurityOpt: []string{"no-new-privileges:true", "seccomp=" + d.seccomp},
		Privileged:  false,
		Init:        &noInit, // the guest is PID 1 and reaps children itself
		AutoRemove:  false,   // Destroy removes it, after reading its state
		// Output is the guest's protocol: it is streamed, never logged.
		LogConfig:     container.LogConfig{Type: "none"},
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyDisabled},
		Resources: container.Resources{
			Memory:           l.Memory,
			MemorySwap:       l.Memory, // memory+swap equal to memory: no swap
			MemorySwappiness: &swappiness,
			NanoCPUs:         int64(l.CPU * 1e9),
			PidsLimit:        &pids,
			Ulimits: []*container.Ulimit{
				{Name: "nofile", Soft: 1024, Hard: 1024},
				{Name: "core", Soft: 0, Hard: 0},
			},
		},
	}
	return cc, hc, nil
}
