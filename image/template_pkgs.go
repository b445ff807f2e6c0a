package image

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/wheel"
)

// Wheels and npm packages are fetched on the host (from the operator's
// wheelhouse, the configured index and registry only), verified against
// their pinned hashes, and unpacked into the tree by Go code that never
// writes outside it: no pip and no npm run, at build time or after.

func (s *Store) wheelCacheDir() string { return filepath.Join(s.root, "cache", "wheels") }

// installWheels installs the template's python wheels into the tree's
// /usr/local/lib/python3.X/dist-packages, which Debian's python has on
// its path (X from the tree's python).
func (b *templateBuild) installWheels(ctx context.Context, rootfs string) ([]TemplateWheel, error) {
	py, err := pythonVersion(rootfs)
	if err != nil {
		return nil, err
	}
	site := "/usr/local/lib/" + py + "/dist-packages"
	var out []TemplateWheel
	for i, w := range b.t.PythonWheels {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		b.prog.packages(i, len(b.t.PythonWheels))
		p, err := wheel.Fetch(ctx, w, b.opts.Sources.Wheelhouse, b.opts.Sources.PythonIndex, b.s.wheelCacheDir())
		if err != nil {
			return nil, err
		}
		inst, err := wheel.Install(p, rootfs, site)
		if err != nil {
			return nil, err
		}
		out = append(out, TemplateWheel{Name: inst.Name, Version: inst.Version, SHA256: inst.SHA256})
	}
	b.prog.packages(len(b.t.PythonWheels), len(b.t.PythonWheels))
	slices.SortFunc(out, func(a, b TemplateWheel) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// pythonMinor matches the versioned python of a tree's /usr/bin.
var pythonMinor = regexp.MustCompile(`^python3\.([0-9]+)$`)

// pythonVersion returns "python3.X", the newest python 3 of the tree.
func pythonVersion(rootfs string) (string, error) {
	// Maintainer scripts have run in the tree: look in it through a root.
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return "", fmt.Errorf("opening %s: %w", rootfs, classify(err))
	}
	defer root.Close()
	matches, _ := fs.Glob(root.FS(), "usr/bin/python3.*")
	best := -1
	for _, m := range matches {
		if sm := pythonMinor.FindStringSubmatch(filepath.Base(m)); sm != nil {
			if n, err := strconv.Atoi(sm[1]); err == nil && n > best {
				best = n
			}
		}
	}
	if best < 0 {
		return "", errdefs.Publicf("python_wheels: the image has no python 3 to install them for: %w", errdefs.ErrInvalidArgument)
	}
	return fmt.Sprintf("python3.%d", best), nil
}
