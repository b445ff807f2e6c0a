package docker

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// containerConfig expresses Stockade's security profile (profile.Default)
// in Docker's terms; see buildConfig.
func (d *Driver) containerConfig(id string, spec sandbox.Spec, l sandbox.Limits, tag string) (*container.Config, *container.HostConfig, error) {
	return buildConfig(profile.Default(), d.seccomp, id, spec, l, tag)
}

// buildConfig expresses profile p in Docker's terms, field for field with
// internal/oci's bundle, for a container of image tag with limits l;
// seccomp is p's filter as Docker's JSON. Docker's own defaults are the
// profile's for what is not set here: the kernel file systems, the
// minimal /dev and the device cgroup. A profile Docker cannot express is
// an ErrInvalidArgument.
func buildConfig(p profile.Profile, seccomp, id string, spec sandbox.Spec, l sandbox.Limits, tag string) (*container.Config, *container.HostConfig, error) {
	if spec.Network != sandbox.NetworkNone {
		return nil, nil, fmt.Errorf("network mode %q is not supported yet", spec.Network)
	}
	if len(p.Capabilities) > 0 {
		// Docker gives a user other than root added capabilities in the
		// bounding set only, not in all five.
		return nil, nil, fmt.Errorf("docker cannot give the sandbox user capabilities %v in every set: %w", p.Capabilities, errdefs.ErrInvalidArgument)
	}
	ns := map[string]bool{}
	for _, n := range p.Namespaces {
		ns[n.Type] = true
	}
	if !ns["mount"] {
		return nil, nil, fmt.Errorf("docker gives every container a mount namespace of its own; the profile has none: %w", errdefs.ErrInvalidArgument)
	}
	// own is Docker's mode for a namespace of the container's own, or the
	// host's when the profile has none of that kind.
	own := func(kind, private string) string {
		if ns[kind] {
			return private
		}
		return "host"
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
	var tmpfs map[string]string
	for _, t := range p.Scratch {
		size := l.TmpSize
		if t.SessionOnly {
			if spec.Workspace <= 0 {
				continue // no one-shot sandbox has it
			}
			size = spec.Workspace
		}
		if tmpfs == nil {
			tmpfs = map[string]string{}
		}
		// Docker's tmpfs is noexec unless told otherwise; the OCI one is not.
		tmpfs[t.Path] = strings.Join(append([]string{"rw", "exec"}, t.Options...), ",") + ",size=" + strconv.FormatInt(size, 10)
	}
	readOnly := slices.Clone(p.ReadOnlyPaths)
	for _, m := range p.Mounts {
		if m.Path == "/sys" && slices.Contains(m.Options, "ro") {
			// dockerd mounts a cgroup tmpfs below /sys read-write (for
			// root only); the profile's /sys is read-only.
			readOnly = append(readOnly, "/sys/fs/cgroup")
		}
	}
	sysctls := map[string]string{}
	for _, s := range p.Network.Sysctls {
		sysctls[s.Name] = s.Value
	}
	var ulimits []*container.Ulimit
	for _, r := range p.Rlimits {
		ulimits = append(ulimits, &container.Ulimit{Name: strings.ToLower(strings.TrimPrefix(r.Type, "RLIMIT_")), Soft: int64(r.Soft), Hard: int64(r.Hard)})
	}
	security := []string{"seccomp=" + seccomp}
	if p.NoNewPrivs {
		security = append([]string{"no-new-privileges:true"}, security...)
	}
	pids := l.Pids
	swappiness := int64(0)
	noInit := false
	cc := &container.Config{
		Image:      tag,
		Entrypoint: []string{p.Guest.Path},
		Cmd:        []string{},
		User:       strconv.FormatUint(uint64(p.User.UID), 10) + ":" + strconv.FormatUint(uint64(p.User.GID), 10),
		// The guest's own environment; the program's comes from the
		// ExecRequest. Docker adds PATH and HOSTNAME to it, nothing else.
		Env:        []string{},
		WorkingDir: "/",
		Hostname:   p.Hostname,
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
		// Without egress, a network namespace with loopback only.
		NetworkMode:    container.NetworkMode(own("network", "none")),
		IpcMode:        container.IpcMode(own("ipc", "private")),
		PidMode:        container.PidMode(own("pid", "")),
		UTSMode:        container.UTSMode(own("uts", "")),
		CgroupnsMode:   container.CgroupnsMode(own("cgroup", string(container.CgroupnsModePrivate))),
		ReadonlyRootfs: p.ReadOnlyRoot,
		MaskedPaths:    slices.Clone(p.MaskedPaths),
		ReadonlyPaths:  readOnly,
		Tmpfs:          tmpfs,
		Mounts:         mounts,
		// Docker bind-mounts /etc/resolv.conf, /etc/hosts and
		// /etc/hostname (read-only, from its data root) into every
		// container, also without a network. These keep the host's
		// resolvers and search domains out of the first.
		DNS:       []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 1})},
		DNSSearch: []string{"."},
		// dockerd opens ping sockets to every group and the ports below
		// 1024 to every process of a container with its own network
		// namespace; the profile's are the kernel's defaults, as on runc.
		Sysctls:     sysctls,
		CapDrop:     []string{"ALL"},
		SecurityOpt: security,
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
			Ulimits:          ulimits,
		},
	}
	return cc, hc, nil
}
