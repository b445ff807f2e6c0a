package image

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// GuestPath is the empty file in every image over which drivers bind-mount
// the guest agent binary, read-only.
const GuestPath = "/.stockade/guest"

// mountPoints are the directories the sandbox mounts over. They exist in
// every image, empty, with mode 0755, except the writable scratch
// directories (see mountMode).
var mountPoints = []string{"tmp", "workspace", "proc", "sys", "dev", ".stockade", "data"}

// emptied are directories whose contents are removed from every image: state
// of the build (logs, apt indexes, temporary files) that would make two
// builds differ and that nothing in a sandbox needs.
var emptied = []string{
	"tmp", "var/tmp", "proc", "sys", "dev",
	"var/log", "var/lib/apt/lists", "var/cache/apt/archives",
}

// removed are patterns (path.Match syntax) removed from every image for the
// same reason. /etc/hostname and /etc/resolv.conf are copied from the build
// host by debootstrap and are rewritten.
var removed = []string{
	"var/cache/apt/*.bin",
	"var/cache/debconf/*-old",
	"var/lib/dpkg/*-old",
	"var/cache/ldconfig/aux-cache",
	"etc/machine-id",
	"var/lib/dbus/machine-id",
	"etc/passwd-", "etc/group-", "etc/shadow-", "etc/gshadow-", "etc/subuid-", "etc/subgid-",
	"debootstrap",
}

// written are files every image gets with fixed content.
var written = []struct {
	name string
	data string
	perm fs.FileMode
}{
	{"etc/hostname", "sandbox\n", 0o644},
	{"etc/resolv.conf", "", 0o644},
	{"etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n", 0o644},
}

// harden turns the tree debootstrap left at rootfs into a runtime image: it
// removes the package managers of rt, the build's logs and caches and every
// setuid and setgid bit and file capability, rewrites the files that carry
// facts about the build host, creates the sandbox's mount points and checks
// that the unprivileged user the sandbox runs as exists. Every path is resolved inside rootfs:
// a symlink in the tree never leads harden outside it.
func harden(rootfs string, rt Runtime) error {
	// Emptying /proc, /sys and /dev must not reach the host's.
	if err := unmountUnder(rootfs); err != nil {
		return err
	}
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return fmt.Errorf("opening %s: %w", rootfs, err)
	}
	defer root.Close()

	for _, dir := range emptied {
		if err := emptyDir(root, dir); err != nil {
			return err
		}
	}
	patterns := append(append([]string(nil), removed...), rt.Strip...)
	for _, pat := range patterns {
		matches, err := fs.Glob(root.FS(), pat)
		if err != nil {
			return fmt.Errorf("expanding %q: %w", pat, err)
		}
		for _, m := range matches {
			if err := root.RemoveAll(m); err != nil {
				return fmt.Errorf("removing /%s: %w", m, err)
			}
		}
	}
	for _, w := range written {
		if err := replaceFile(root, w.name, []byte(w.data), w.perm); err != nil {
			return err
		}
	}
	if err := normalizeShadow(root); err != nil {
		return err
	}
	if err := clearPrivileges(root); err != nil {
		return err
	}
	for _, dir := range mountPoints {
		if err := ensureDir(root, dir); err != nil {
			return err
		}
	}
	if err := replaceFile(root, strings.TrimPrefix(GuestPath, "/"), nil, 0o555); err != nil {
		return err
	}
	if err := checkAccount(root, "etc/passwd", "nobody", "65534"); err != nil {
		return err
	}
	return checkAccount(root, "etc/group", "nogroup", "65534")
}

// emptyDir removes everything in dir, keeping dir itself. A missing dir is
// not an error.
func emptyDir(root *os.Root, dir string) error {
	f, err := root.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opening /%s: %w", dir, err)
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("reading /%s: %w", dir, err)
	}
	for _, n := range names {
		if err := root.RemoveAll(path.Join(dir, n)); err != nil {
			return fmt.Errorf("removing /%s: %w", path.Join(dir, n), err)
		}
	}
	return nil
}

// replaceFile makes name a regular file holding data with exactly perm,
// replacing whatever was there (a symlink is replaced, not followed).
func replaceFile(root *os.Root, name string, data []byte, perm fs.FileMode) error {
	if err := root.RemoveAll(name); err != nil {
		return fmt.Errorf("replacing /%s: %w", name, err)
	}
	if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
		return fmt.Errorf("creating /%s: %w", path.Dir(name), err)
	}
	if err := root.WriteFile(name, data, perm); err != nil {
		return fmt.Errorf("writing /%s: %w", name, err)
	}
	if err := root.Chmod(name, perm); err != nil {
		return fmt.Errorf("setting mode of /%s: %w", name, err)
	}
	return nil
}

// ensureDir makes name a directory with mode 0755, replacing anything else
// of that name.
func ensureDir(root *os.Root, name string) error {
	fi, err := root.Lstat(name)
	switch {
	case err == nil && !fi.IsDir():
		if err := root.Remove(name); err != nil {
			return fmt.Errorf("replacing /%s: %w", name, err)
		}
		fallthrough
	case errors.Is(err, fs.ErrNotExist):
		if err := root.MkdirAll(name, 0o755); err != nil {
			return fmt.Errorf("creating /%s: %w", name, err)
		}
	case err != nil:
		return fmt.Errorf("inspecting /%s: %w", name, err)
	}
	if err := root.Chmod(name, mountMode(name)); err != nil {
		return fmt.Errorf("setting mode of /%s: %w", name, err)
	}
	return nil
}

// mountMode is the mode of a mount point. /tmp and /workspace are 1777:
// runc (1.1) gives a tmpfs the mode of the directory it is mounted on and
// ignores the mount's mode= option, and the sandbox user (65534) must be
// able to write there.
func mountMode(name string) os.FileMode {
	if name == "tmp" || name == "workspace" {
		return 0o777 | os.ModeSticky
	}
	return 0o755
}

// normalizeShadow blanks the date of the last password change in
// /etc/shadow, which pwconv sets to the day of the build. An empty field
// disables password ageing; no account in an image has a password.
func normalizeShadow(root *os.Root) error {
	data, err := root.ReadFile("etc/shadow")
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading /etc/shadow: %w", err)
	}
	lines := bytes.Split(data, []byte("\n"))
	for i, l := range lines {
		f := bytes.Split(l, []byte(":"))
		if len(f) > 2 {
			f[2] = nil
			lines[i] = bytes.Join(f, []byte(":"))
		}
	}
	out := bytes.Join(lines, []byte("\n"))
	if bytes.Equal(out, data) {
		return nil
	}
	// WriteFile truncates the existing file, keeping its owner and mode.
	if err := root.WriteFile("etc/shadow", out, 0o640); err != nil {
		return fmt.Errorf("writing /etc/shadow: %w", err)
	}
	return nil
}

// clearPrivileges removes the setuid and setgid bits and the file capabilities
// (the security.capability extended attribute) of every regular file. The
// sandbox runs with no_new_privs, so they could not raise privileges
// anyway; without them the image holds no privileged programs at all.
func clearPrivileges(root *os.Root) error {
	return fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("walking /%s: %w", p, err)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return fmt.Errorf("inspecting /%s: %w", p, err)
		}
		if err := clearCaps(root, p); err != nil {
			return err
		}
		if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) == 0 {
			return nil
		}
		if err := root.Chmod(p, fi.Mode()&(fs.ModePerm|fs.ModeSticky)); err != nil {
			return fmt.Errorf("clearing setuid of /%s: %w", p, err)
		}
		return nil
	})
}

// capsXattr is the extended attribute holding a file's capabilities.
const capsXattr = "security.capability"

// clearCaps removes the file capabilities of the regular file name. A file
// system without extended attributes has none to remove.
func clearCaps(root *os.Root, name string) error {
	// O_NONBLOCK: the walk saw a regular file, but the open must not wait
	// on a FIFO put there since.
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("opening /%s: %w", name, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("/%s is no longer a regular file", name)
	}
	_, err = unix.Fgetxattr(int(f.Fd()), capsXattr, nil)
	switch {
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ENOTSUP):
		return nil
	case err != nil:
		return fmt.Errorf("reading the capabilities of /%s: %w", name, err)
	}
	if err := unix.Fremovexattr(int(f.Fd()), capsXattr); err != nil && !errors.Is(err, unix.ENODATA) {
		return fmt.Errorf("removing the capabilities of /%s: %w", name, err)
	}
	return nil
}

// checkAccount reports an error unless the colon-separated database file
// (passwd or group) has an entry name whose id is id.
func checkAccount(root *os.Root, file, name, id string) error {
	data, err := root.ReadFile(file)
	if err != nil {
		return fmt.Errorf("reading /%s: %w", file, err)
	}
	for l := range strings.Lines(string(data)) {
		f := strings.Split(strings.TrimRight(l, "\n"), ":")
		if len(f) >= 3 && f[0] == name {
			if f[2] != id {
				return fmt.Errorf("/%s: %s has id %s, want %s", file, name, f[2], id)
			}
			return nil
		}
	}
	return fmt.Errorf("/%s has no entry for %s (%s)", file, name, id)
}
