package netns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"

	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/internal/fsmode"
	"github.com/stockade-sh/stockade/internal/oci"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// A namespace is named by bind-mounting it at a file (RunDir/NAME, and
// UserRunDir/NAME for its user namespace), as `ip netns add` does: the
// mount keeps it alive with no process in it, and the runtimes join it by
// that path. deleteNamed undoes it.

// ensureShared makes dir (RunDir or UserRunDir) a shared mount point, as
// iproute2 does for RunDir, so that unmounting a namespace's bind mount
// reaches the copies that mount namespaces made since (runc's and
// runsc's): otherwise they would keep the namespace alive.
func ensureShared(dir string) error {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared[dir] {
		return nil
	}
	// RunDir is iproute2's, which makes it 0755; UserRunDir is
	// Stockade's, root-only as its state directory.
	mode := fsmode.Dir
	if dir == RunDir {
		mode = 0o755
	}
	if err := os.MkdirAll(dir, mode); err != nil {
		return err
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) {
		// Not a mount point yet: make it one, then shared.
		if err = unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
			err = unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
		}
	}
	if err != nil {
		return fmt.Errorf("making %s a shared mount: %w", dir, err)
	}
	shared[dir] = true
	return nil
}

var (
	sharedMu sync.Mutex
	shared   = map[string]bool{}
)

// newNamed creates a network namespace and bind-mounts it at path, on a
// thread of its own that never returns to the Go scheduler in the wrong
// namespace.
func newNamed(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		mountErr := unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "none", unix.MS_BIND, "")
		if err := vnetns.Set(orig); err != nil {
			// Stay locked: the thread dies with this goroutine.
			errc <- errors.Join(mountErr, fmt.Errorf("returning to the host namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		if mountErr != nil {
			mountErr = fmt.Errorf("bind-mounting the namespace: %w", mountErr)
		}
		errc <- mountErr
	}()
	if err := <-errc; err != nil {
		_ = os.Remove(path)
		return err
	}
	return nil
}

// newNamedInUserNS creates a user namespace that maps root and the
// sandbox user to base and base+1, and a network namespace that belongs to
// it, and bind-mounts them at userPath and netPath. A process has to hold
// them while they are bind-mounted: the runtime cannot unshare a user
// namespace in a process with threads, so a child does, cat from
// coreutils, which waits for the end of its stdin.
func newNamedInUserNS(userPath, netPath string, base uint32) (err error) {
	var made []string
	defer func() {
		if err != nil {
			for _, p := range made {
				_ = deleteNamed(p)
			}
		}
	}()
	for _, p := range []string{userPath, netPath} {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
		if err != nil {
			return err
		}
		f.Close()
		made = append(made, p)
	}
	user := profile.Default().User
	idMap := func(id uint32) []syscall.SysProcIDMap {
		var m []syscall.SysProcIDMap
		for _, l := range oci.IDMappings(base, id) {
			m = append(m, syscall.SysProcIDMap{ContainerID: int(l.ContainerID), HostID: int(l.HostID), Size: int(l.Size)})
		}
		return m
	}
	// If the daemon dies before closing stdin, cat sees its end and exits.
	holder := exec.Command("/bin/cat")
	holder.Env = []string{}
	holder.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET,
		UidMappings: idMap(user.UID),
		GidMappings: idMap(user.GID),
		// As in the user namespaces runc makes: setgroups stays allowed
		// (for whoever holds CAP_SETGID there, which no sandbox process
		// does).
		GidMappingsEnableSetgroups: true,
	}
	stdin, err := holder.StdinPipe()
	if err != nil {
		return err
	}
	if err := holder.Start(); err != nil {
		stdin.Close()
		return fmt.Errorf("starting the holder of a user namespace (/bin/cat): %w", err)
	}
	for _, ns := range []struct{ kind, path string }{{"user", userPath}, {"net", netPath}} {
		if err = unix.Mount(fmt.Sprintf("/proc/%d/ns/%s", holder.Process.Pid, ns.kind), ns.path, "none", unix.MS_BIND, ""); err != nil {
			err = fmt.Errorf("bind-mounting the %s namespace: %w", ns.kind, err)
			break
		}
	}
	stdin.Close()
	if werr := holder.Wait(); werr != nil && err == nil {
		err = fmt.Errorf("the holder of a user namespace: %w", werr)
	}
	return err
}

// deleteNamed unmounts and removes a namespace's bind mount; a missing one
// is success.
func deleteNamed(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	return nil
}
