package image

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"github.com/stockade-sh/stockade/errdefs"
)

// Reading a build's tree from the host. Once a build sandbox has run over
// a tree (maintainer scripts, npm install scripts, as root in a writable
// root), what is in it is the sandbox's: any name may be a symlink to a
// host path, a FIFO that blocks its reader or a file without end. Every
// host read of such a tree goes through an os.Root of it (no path lookup
// leaves the tree), takes regular files only, opened without blocking,
// and reads at most a bound.

// Bounds of the files the host reads from a build's tree.
const (
	// maxStatusBytes bounds the dpkg status database.
	maxStatusBytes = 64 << 20
	// maxPackageJSONBytes bounds an npm package's package.json.
	maxPackageJSONBytes = 16 << 20
)

// readTreeFile reads name, relative to root, which must be a regular file
// (not a symlink, FIFO or device) of at most limit bytes.
func readTreeFile(root *os.Root, name string, limit int64) ([]byte, error) {
	fi, err := root.Lstat(name)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("/%s is a %v, not a regular file: %w", name, fi.Mode().Type(), errdefs.ErrFailedPrecondition)
	}
	// O_NONBLOCK: a FIFO swapped in since the Lstat does not block the
	// open; the Stat below then refuses it.
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return nil, err
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("/%s is a %v, not a regular file: %w", name, fi.Mode().Type(), errdefs.ErrFailedPrecondition)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("/%s is larger than %d MiB: %w", name, limit>>20, errdefs.ErrFailedPrecondition)
	}
	return data, nil
}

// treePackages returns the packages the dpkg database of the tree at
// rootfs lists as installed, by name, with their versions.
func treePackages(rootfs string) (map[string]string, error) {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", rootfs, classify(err))
	}
	defer root.Close()
	status, err := readTreeFile(root, "var/lib/dpkg/status", maxStatusBytes)
	if err != nil {
		if errdefs.IsFailedPrecondition(err) {
			return nil, fmt.Errorf("reading the package database: %w", err)
		}
		return nil, fmt.Errorf("reading the package database: %w", classify(err))
	}
	pkgs, err := installedPackages(status)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
	}
	return pkgs, nil
}

// apparentSize is the size of the regular files under dir, as far as they
// can be read while a build changes the tree. The walk stays in dir: a
// directory swapped for a symlink is not followed out of it.
func apparentSize(dir string) int64 {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0
	}
	defer root.Close()
	var n int64
	_ = fs.WalkDir(root.FS(), ".", func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
