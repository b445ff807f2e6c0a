package blastradius

// The mounts section: which mount points a sandbox may have, and the
// runtimes' own files told from the node's by where they are kept.

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// mountExpectation says why mount point path, of file system fstype with
// root as the path mounted from it, may exist and whether it must be
// read-only; ok is false for a mount neither the record nor the profile
// accounts for.
func (e *evaluator) mountExpectation(path, fstype, root string) (why string, readOnly, ok bool) {
	p := &e.p
	for _, m := range e.t.Filesystem.Mounts {
		if path == m.Target {
			return "record mount of " + m.Source, slices.Contains(p.Data.Options, "ro"), true
		}
	}
	if s, found := p.ScratchAt(path); found {
		if s.SessionOnly {
			return "session workspace", false, true
		}
		return "scratch", false, true
	}
	proc, hasProc := e.kernelMount("proc")
	sys, hasSys := e.kernelMount("sysfs")
	const dev = "/dev"
	switch {
	case path == p.Data.Dir && len(e.t.Filesystem.Mounts) > 0:
		// A small tmpfs, root's, that holds the mount points.
		return "mount points of the record's mounts", false, true
	case path == "/":
		return "image root", p.ReadOnlyRoot, true
	case path == p.Guest.Path:
		return "guest agent", slices.Contains(p.Guest.Options, "ro"), true
	case hasProc && path == proc.Path:
		return "proc", slices.Contains(proc.Options, "ro"), true
	case slices.Contains(p.ReadOnlyPaths, path):
		return "read-only part of proc", true, true
	case hasProc && under(path, proc.Path) && slices.Contains(p.MaskedPaths, path):
		// A mask is /dev/null bound over a file (from the host's devtmpfs,
		// or the container's /dev tmpfs under Docker) or a read-only tmpfs
		// over a directory; anything else there is not a mask.
		switch {
		case (fstype == "devtmpfs" || fstype == "tmpfs") && root == "/null":
			return "masked part of proc (/dev/null over it)", false, true
		case fstype == "tmpfs" && root == "/":
			return "masked part of proc (an empty tmpfs over it)", true, true
		}
	case hasSys && under(path, sys.Path):
		return "sysfs", slices.Contains(sys.Options, "ro"), true
	case under(path, dev):
		for _, m := range p.Mounts {
			// Any file system for /dev itself: gVisor calls its own "dev".
			if m.Path == path && (m.Path == dev || m.Type == fstype) {
				return "minimal /dev", false, true
			}
		}
		for _, n := range p.Dev.HostNodes {
			if path == dev+"/"+n && fstype == "devtmpfs" {
				return "device node of the minimal /dev", false, true
			}
		}
	}
	for _, d := range e.p.Differences {
		if !d.Applies(e.on) {
			continue
		}
		for _, f := range d.Files {
			if f.Path == path && e.runtimeFile(path, fstype, root) {
				return "the host's file (" + d.ID + ")", !f.Writable, true
			}
		}
	}
	return "", false, false
}

// runtimeFiles are the shapes of the mountinfo roots of the files the
// runtimes mount into every container, by the path they are mounted at:
// the kubelet's (below its pods directory), containerd's (the CRI
// plugin's sandbox directory) and dockerd's (its containers directory).
// A hostPath, or any other volume, at the same path has another root.
var runtimeFiles = map[string]*regexp.Regexp{
	"/etc/hosts":                            regexp.MustCompile(`/pods/[0-9a-f-]{36}/etc-hosts$|/containers/[0-9a-f]{64}/hosts$`),
	"/etc/hostname":                         regexp.MustCompile(`/io\.containerd\.grpc\.v1\.cri/sandboxes/[0-9a-f]{64}/hostname$|/containers/[0-9a-f]{64}/hostname$`),
	"/etc/resolv.conf":                      regexp.MustCompile(`/io\.containerd\.grpc\.v1\.cri/sandboxes/[0-9a-f]{64}/resolv\.conf$|/containers/[0-9a-f]{64}/resolv\.conf$`),
	profile.KubeletDir + "/termination-log": regexp.MustCompile(`/pods/[0-9a-f-]{36}/containers/[^/]+/[^/]+$`),
}

// runtimeFile says whether the mount at path, of file system fstype
// with root as the path mounted from it, is the file the runtime mounts
// there, not another file of the host's. Under gVisor the Sentry shows
// such a file's root as "/" (a gofer mount of the file itself), which
// tells it from no other file: there only its file system is checked,
// and the conformance suite's write attempts (NoHostMounts) stand for
// the rest.
func (e *evaluator) runtimeFile(path, fstype, root string) bool {
	if e.on.Tier == sandbox.TierGVisor && root == "/" {
		return fstype == "9p" || fstype == "gofer"
	}
	re, ok := runtimeFiles[path]
	return ok && re.MatchString(root)
}

// kernelMount returns the profile's mount of file system fstype.
func (e *evaluator) kernelMount(fstype string) (profile.Mount, bool) {
	i := slices.IndexFunc(e.p.Mounts, func(m profile.Mount) bool { return m.Type == fstype })
	if i < 0 {
		return profile.Mount{}, false
	}
	return e.p.Mounts[i], true
}

func (e *evaluator) mounts() Section {
	b := newSection("mounts", "Mounts")
	b.s.Table = [][]string{{"mount point", "type", "source", "options", "accounted for as"}}
	seen := map[string]bool{}
	// A mount point mounted again is covered: only its last mount (the
	// mount table is in mount order) is what the sandbox sees. dockerd,
	// for one, mounts /sys/fs/cgroup read-write and runc then binds it
	// read-only over itself.
	top := map[string]int{}
	for i, m := range e.r.Mounts {
		top[m.MountPoint] = i
	}
	for i, m := range e.r.Mounts {
		seen[m.MountPoint] = true
		why, ro, ok := e.mountExpectation(m.MountPoint, m.FSType, m.Root)
		isRO := hasOption(m.Options, "ro")
		label := why
		if !ok {
			label = "nothing: not in the record"
		}
		if top[m.MountPoint] != i {
			b.s.Table = append(b.s.Table, []string{m.MountPoint, m.FSType, m.Source, m.Options, "covered by a later mount"})
			continue
		}
		b.s.Table = append(b.s.Table, []string{m.MountPoint, m.FSType, m.Source, m.Options, label})
		switch {
		case !ok:
			b.check(m.MountPoint, fmt.Sprintf("mounted (%s from %s, %s)", m.FSType, m.Source, m.Options),
				"only the image root, "+strings.Join(e.scratch(), ", ")+", proc with its masked and read-only parts, the minimal /dev, /sys, the guest agent and the record's mounts (with "+e.p.Data.Dir+" under them)", false)
		case ro && !isRO:
			b.check(m.MountPoint, "mounted read-write ("+m.Options+")", why+", read-only", false)
		case ro && (m.MountPoint == "/" || m.MountPoint == "/sys" || !under(m.MountPoint, "/sys")):
			b.check(m.MountPoint, "read-only", why+", read-only", true)
		}
	}
	for _, m := range e.t.Filesystem.Mounts {
		if !seen[m.Target] {
			b.check(m.Target, "not mounted", "the record's mount of "+m.Source, false)
		}
	}
	for _, s := range e.p.Scratch {
		if size, ok := tmpfsSize(e.r, s.Path); ok {
			b.check(s.Path+" size", sandbox.FormatSize(size), sandbox.FormatSize(e.limits.TmpSize)+" (the record's scratch)", size == e.limits.TmpSize)
		}
	}
	return b.s
}

// scratch returns the paths of the profile's scratch mounts.
func (e *evaluator) scratch() []string {
	var out []string
	for _, s := range e.p.Scratch {
		out = append(out, s.Path)
	}
	return out
}

// tmpfsSize reads the size of the tmpfs at path from its mount options.
func tmpfsSize(r *rawReach, path string) (int64, bool) {
	for _, m := range r.Mounts {
		if m.MountPoint != path {
			continue
		}
		for _, o := range strings.Split(m.SuperOptions, ",") {
			if v, ok := strings.CutPrefix(o, "size="); ok {
				return parseKernelSize(v)
			}
		}
	}
	return 0, false
}

// parseKernelSize parses a tmpfs size option: bytes, or k, m, g suffixed.
func parseKernelSize(s string) (int64, bool) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "k"):
		mult, s = 1<<10, strings.TrimSuffix(s, "k")
	case strings.HasSuffix(s, "m"):
		mult, s = 1<<20, strings.TrimSuffix(s, "m")
	case strings.HasSuffix(s, "g"):
		mult, s = 1<<30, strings.TrimSuffix(s, "g")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	return n * mult, true
}
