package tools

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// dataRoot is Options.DataRoot, cleaned and resolved. A zero dataRoot (no
// root, or one that cannot be used) refuses every mount.
type dataRoot struct {
	clean, resolved string
	err             string // why mounts are refused; "" when usable
}

// checkDataRoot resolves the data root once per validation and reports an
// unusable one, but only when some tool has mounts: without mounts the root
// does not matter.
func checkDataRoot(ts []Tool, opts Options, ps *Problems) dataRoot {
	root := resolveDataRoot(opts.DataRoot)
	if root.err == "" {
		return root
	}
	for _, t := range ts {
		if len(t.Filesystem.Mounts) > 0 {
			*ps = append(*ps, Problem{Rule: RuleDataRoot, Message: root.err})
			break
		}
	}
	return root
}

func resolveDataRoot(dir string) dataRoot {
	if dir == "" {
		return dataRoot{err: "no data root is configured, so no mount is allowed (set the data root, e.g. --data-root /var/lib/stockade/data)"}
	}
	if !filepath.IsAbs(dir) {
		return dataRoot{err: fmt.Sprintf("data root %s must be an absolute path", dir)}
	}
	clean := filepath.Clean(dir)
	resolved, err := filepath.EvalSymlinks(clean)
	if err != nil {
		return dataRoot{err: fmt.Sprintf("data root %s cannot be used: %v", dir, unwrapPathError(err))}
	}
	if rule, why := denied(resolved); rule != "" || resolved == "/" {
		if why == "" {
			why = "is the host's root filesystem"
		}
		return dataRoot{err: fmt.Sprintf("data root %s cannot be used: it %s", dir, why)}
	}
	return dataRoot{clean: clean, resolved: resolved}
}

// ResolveMounts checks the tool's mounts again, now, the trees below them
// included, and returns them with each source replaced by its symlink-free
// path under the data root. The engine binds exactly these, read-only, so
// that a symlink swapped in after the tools were loaded cannot widen the
// tool's filesystem scope, nor a socket or credentials directory put below
// a mount since be exposed. Any problem is returned as Problems. It walks
// each tree whole; a MountChecker remembers them between runs.
func ResolveMounts(t Tool, opts Options) ([]sandbox.Mount, error) {
	return NewMountChecker(opts).Resolve(t)
}

// checkMount applies the mount rules to m and returns the resolved source,
// or the problems: at most one with the source (the most specific: a socket
// before a credentials directory before a home directory before a system
// path before the data root) and one with the target.
func checkMount(m sandbox.Mount, root dataRoot) (string, Problems) {
	resolved, p := checkSource(m, root)
	var ps Problems
	if p != nil {
		ps = append(ps, *p)
	}
	if msg := checkTarget(m.Target); msg != "" {
		ps = append(ps, Problem{Rule: RuleMountTarget, Message: msg})
	}
	if len(ps) > 0 {
		return "", ps
	}
	return resolved, nil
}

func checkSource(m sandbox.Mount, root dataRoot) (string, *Problem) {
	bad := func(rule, format string, a ...any) (string, *Problem) {
		return "", &Problem{Rule: rule, Message: fmt.Sprintf(format, a...)}
	}
	src := m.Source
	switch {
	case src == "":
		return bad(RuleMountSource, "mount source is required (target %s)", m.Target)
	case !filepath.IsAbs(src):
		return bad(RuleMountSource, "mount source %s must be an absolute path", src)
	}
	clean := filepath.Clean(src)
	if rule, why := denied(clean); rule != "" {
		return bad(rule, "mount source %s %s", src, why)
	}
	if root.err != "" {
		return bad(RuleMountOutsideDataRoot, "mount source %s cannot be checked: there is no usable data root", src)
	}
	if !within(clean, root.clean) && !within(clean, root.resolved) {
		return bad(RuleMountOutsideDataRoot, "mount source %s is outside the data root %s", src, root.clean)
	}
	resolved, err := filepath.EvalSymlinks(clean)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return bad(RuleMountMissing, "mount source %s does not exist", src)
		}
		return bad(RuleMountMissing, "mount source %s cannot be resolved: %v", src, unwrapPathError(err))
	}
	if rule, why := denied(resolved); rule != "" {
		return bad(rule, "mount source %s resolves to %s, which %s", src, resolved, why)
	}
	if !within(resolved, root.resolved) {
		return bad(RuleMountSymlinkEscape, "mount source %s resolves through a symlink to %s, outside the data root %s", src, resolved, root.clean)
	}
	fi, err := os.Lstat(resolved)
	if err != nil {
		return bad(RuleMountMissing, "mount source %s cannot be read: %v", src, unwrapPathError(err))
	}
	switch {
	case fi.Mode().Type()&fs.ModeSocket != 0:
		return bad(RuleMountSocket, "mount source %s is a unix socket; sockets are never mounted", src)
	case !fi.IsDir() && !fi.Mode().IsRegular():
		return bad(RuleMountSource, "mount source %s is neither a directory nor a regular file", src)
	case fi.IsDir():
		// A directory that holds credentials is as bad as the credentials.
		for _, name := range credentialDirs {
			if _, err := os.Lstat(filepath.Join(resolved, name)); err == nil {
				return bad(RuleMountCredentials, "mount source %s contains %s; credentials are never mounted", src, name)
			}
		}
	}
	return resolved, nil
}

// credentialDirs are directories that hold credentials wherever they are.
var credentialDirs = []string{".ssh", ".aws", ".kube", ".config/gcloud", ".docker", ".gnupg"}

// denied returns the rule a host path breaks by what it is, and why, or "".
func denied(p string) (rule, why string) {
	base := filepath.Base(p)
	switch {
	case base == "docker.sock":
		return RuleMountSocket, "is the Docker socket (root on the host)"
	case base == "containerd.sock" || strings.HasPrefix(base, "containerd.sock."):
		return RuleMountSocket, "is the containerd socket (root on the host)"
	case strings.HasSuffix(base, ".sock"):
		return RuleMountSocket, "is a unix socket; sockets are never mounted"
	}
	slashed := p + "/"
	for _, d := range credentialDirs {
		if strings.Contains(slashed, "/"+d+"/") {
			return RuleMountCredentials, fmt.Sprintf("is or is inside a %s directory; credentials are never mounted", d)
		}
	}
	for _, h := range []string{"/root", "/home"} {
		if within(p, h) {
			return RuleMountHome, "is a home directory or inside one; home directories hold credentials and are never mounted"
		}
	}
	for _, s := range []string{"/proc", "/sys", "/dev", "/var/run", "/run", "/var/lib/docker", "/var/lib/containerd"} {
		if within(p, s) {
			return RuleMountSystem, fmt.Sprintf("is inside %s, which is never mounted", s)
		}
	}
	return "", ""
}

// MountParent is the directory every mount target lies under: the
// profile's (profile.Data). The sandbox gets a small tmpfs there, on which
// the runtime creates the mount points: creating them in the image would
// change the shared, content-addressed image on disk.
const MountParent = profile.DataDir

// checkTarget returns why target cannot be a mount target, or "".
func checkTarget(target string) string {
	switch {
	case target == "":
		return "mount target is required"
	case !filepath.IsAbs(target):
		return fmt.Sprintf("mount target %s must be an absolute path", target)
	case filepath.Clean(target) != target:
		return fmt.Sprintf("mount target %s must be a clean path (write %s)", target, filepath.Clean(target))
	case target == "/":
		return "mount target / would replace the sandbox's root filesystem"
	case !within(target, MountParent) || target == MountParent:
		return fmt.Sprintf("mount target %s must be below %s (e.g. %s/sales)", target, MountParent, MountParent)
	}
	return ""
}

// within reports whether p is dir or below it; both must be clean.
func within(p, dir string) bool {
	if dir == "" {
		return false
	}
	if dir == "/" {
		return true
	}
	return p == dir || strings.HasPrefix(p, dir+"/")
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
