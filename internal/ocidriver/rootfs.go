package ocidriver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// mountPrivateRoot gives a sandbox its own view of the image: an overlay in
// the bundle whose lower layer is the shared image and whose upper layer is
// the bundle's. runsc's gofer creates the mount points of data mounts in the
// root it is given, on the host: on the shared image that would change the
// content-addressed image on disk. The sandbox still sees its root
// read-only (the spec says so); only the runtime writes to the upper layer.
// It returns the overlay's path.
func mountPrivateRoot(bundle, image string) (string, error) {
	if strings.ContainsAny(image, ",:") {
		return "", fmt.Errorf("image path %q cannot be an overlay layer", image)
	}
	upper, work, root := filepath.Join(bundle, "upper"), filepath.Join(bundle, "work"), filepath.Join(bundle, "rootfs")
	for _, d := range []string{upper, work, root} {
		// Chmod too: the sandbox's own user reads the overlay's root,
		// whatever the daemon's umask.
		if err := os.Mkdir(d, 0o755); err != nil {
			return "", fmt.Errorf("creating private root: %w", err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			return "", fmt.Errorf("creating private root: %w", err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", image, upper, work)
	if err := unix.Mount("overlay", root, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return "", fmt.Errorf("mounting private root overlay: %w", err)
	}
	return root, nil
}

// unmountPrivateRoot undoes mountPrivateRoot; a bundle without one is fine.
func unmountPrivateRoot(bundle string) error {
	err := unix.Unmount(filepath.Join(bundle, "rootfs"), unix.MNT_DETACH)
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return fmt.Errorf("unmounting private root: %w", err)
}
