package tools

import (
	"fmt"
	"path/filepath"

	"github.com/stockade-sh/stockade/internal/dataroot"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// checkDataRoot resolves the data root once per validation and reports an
// unusable one, but only when some tool has mounts: without mounts the root
// does not matter.
func checkDataRoot(ts []Tool, opts Options, ps *Problems) dataroot.Root {
	root := dataroot.Resolve(opts.DataRoot)
	err := root.Err()
	if err == nil {
		return root
	}
	for _, t := range ts {
		if len(t.Filesystem.Mounts) > 0 {
			*ps = append(*ps, Problem{Rule: RuleDataRoot, Message: err.Error()})
			break
		}
	}
	return root
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
func checkMount(m sandbox.Mount, root dataroot.Root) (string, Problems) {
	var ps Problems
	resolved, p := root.Mount(m.Source)
	if p != nil {
		ps = append(ps, Problem{Rule: mountRules[p.Kind], Message: p.Message})
	}
	if msg := checkTarget(m.Target); msg != "" {
		ps = append(ps, Problem{Rule: RuleMountTarget, Message: msg})
	}
	if len(ps) > 0 {
		return "", ps
	}
	return resolved, nil
}

// mountRules is the rule a mount source breaks for each kind of data root
// problem.
var mountRules = map[dataroot.Kind]string{
	dataroot.KindNoRoot:        RuleMountOutsideDataRoot,
	dataroot.KindSource:        RuleMountSource,
	dataroot.KindSocket:        RuleMountSocket,
	dataroot.KindCredentials:   RuleMountCredentials,
	dataroot.KindHome:          RuleMountHome,
	dataroot.KindSystem:        RuleMountSystem,
	dataroot.KindOutside:       RuleMountOutsideDataRoot,
	dataroot.KindSymlinkEscape: RuleMountSymlinkEscape,
	dataroot.KindSymlink:       RuleMountSource,
	dataroot.KindMissing:       RuleMountMissing,
	dataroot.KindTooLarge:      RuleMountTooLarge,
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
	case !dataroot.Within(target, MountParent) || target == MountParent:
		return fmt.Sprintf("mount target %s must be below %s (e.g. %s/sales)", target, MountParent, MountParent)
	}
	return ""
}
