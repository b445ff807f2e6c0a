// Package imagetar writes a runtime image's root filesystem, with the
// guest agent in place, as a tar stream: what the docker driver imports
// into its engine and the kubernetes driver into a node's containerd.
package imagetar

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/sandbox/profile"
)

// tmpfsMountPoints are the directories of the image that sandboxes mount a
// tmpfs (or a pod's memory-backed volume) on.
var tmpfsMountPoints = map[string]bool{"tmp": true, "workspace": true}

// WriteTree writes the tree at rootfs to tw, in lexical order, keeping
// types, modes, owners, symlink targets, hard links and modification
// times (Python checks its bytecode caches against them), with the tmpfs
// mount points made mode 1777 and the guest binary at guestPath in place
// of the image's empty profile.GuestPath file; sockets are left out. The
// caller adds what else it needs and closes tw.
func WriteTree(tw *tar.Writer, rootfs, guestPath string) error {
	guestName := strings.TrimPrefix(profile.GuestPath, "/")
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{}
	sawGuest := false
	err := filepath.WalkDir(rootfs, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(rootfs, p)
		if err != nil || rel == "." {
			return err
		}
		name := filepath.ToSlash(rel)
		if name == guestName {
			sawGuest = true
			return writeGuest(tw, name, guestPath)
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSocket != 0 {
			return nil
		}
		var target string
		if fi.Mode()&fs.ModeSymlink != 0 {
			if target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, target)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		hdr.Name = name
		if fi.IsDir() {
			hdr.Name += "/"
			if tmpfsMountPoints[name] {
				// runc gives a tmpfs the mode of the directory it is
				// mounted on, whatever its mode= option says; the
				// profile's tmpfs mounts are world-writable and sticky.
				hdr.Mode = 0o1777
			}
		}
		hdr.Uname, hdr.Gname = "", ""
		hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
		st, _ := fi.Sys().(*syscall.Stat_t)
		if st != nil {
			hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
			if fi.Mode().IsRegular() && st.Nlink > 1 {
				key := inode{uint64(st.Dev), st.Ino}
				if first, ok := links[key]; ok {
					hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
				} else {
					links[key] = name
				}
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("archiving %s: %w", rootfs, err)
	}
	if !sawGuest {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: filepath.Dir(guestName) + "/", Mode: 0o755}); err != nil {
			return err
		}
		if err := writeGuest(tw, guestName, guestPath); err != nil {
			return err
		}
	}
	return nil
}

// guestModTime is the modification time of the guest binary in every tree
// WriteTree writes: a fixed one, not the installed file's, so that the
// same guest gives the same bytes wherever and whenever it was installed
// (the kubernetes driver names a registry's image by the digest of this
// stream: content-addressed, computed by both `stockade image push` and
// the daemon).
var guestModTime = time.Unix(0, 0).UTC()

// writeGuest adds the guest binary as name, root-owned and mode 0555.
func writeGuest(tw *tar.Writer, name, guestPath string) error {
	f, err := os.Open(guestPath)
	if err != nil {
		return fmt.Errorf("opening guest agent: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("opening guest agent: %w", err)
	}
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg, Name: name, Mode: 0o555, Size: fi.Size(), ModTime: guestModTime,
	}); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, f, fi.Size()); err != nil {
		return fmt.Errorf("archiving guest agent: %w", err)
	}
	return nil
}
