// Package fsmode is the one rule for the modes of what Stockade keeps on
// its host: the data directory (the SQLite database and its -wal and -shm,
// the audit witness, the image store, the package cache, the guest agent,
// checkpoints), the state directory (bundles, shims, the runtimes' state)
// and the checkpoint and witness directories where they are configured
// elsewhere. They hold every workspace's code, outputs and key hashes, so
// no user but their owner, root, may read, write or list them: files are
// 0600 and directories 0700, made so when created and fixed by Fix when an
// older install left them open.
//
// The exceptions are what a sandbox must reach from its own user
// namespace, whose ids are no host user's (Exceptions lists each with its
// reason): the directories on the way to an image's tree, to the guest
// agent and to the tools' data root may be traversed by anyone but listed
// by no one (0711), and the trees themselves are public (a Debian root
// filesystem, the agent embedded in the stockade binary).
//
//	if err := os.MkdirAll(dir, fsmode.Dir); err != nil { ... }
//	if err := fsmode.Fix(fsmode.Layout{DataDir: "/var/lib/stockade", StateDir: "/run/stockade"}); err != nil { ... }
package fsmode

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
)

const (
	// File is the mode of a file Stockade keeps.
	File fs.FileMode = 0o600
	// Dir is the mode of a directory Stockade keeps.
	Dir fs.FileMode = 0o700
	// Traverse is the mode of a directory on the way to what a sandbox's
	// user namespace opens (Exceptions): anyone may pass through it,
	// nobody but root may list or change it.
	Traverse fs.FileMode = 0o711
)

// Exception is a path below one of a Layout's roots whose mode is not
// File or Dir, and why.
type Exception struct {
	// Root is the Layout root the pattern is relative to.
	Root Root
	// Pattern is a path relative to the root, each element a path.Match
	// pattern; "." is the root itself.
	Pattern string
	// Mode is the path's mode; zero leaves the path's own mode (the
	// runtime's or the kernel's).
	Mode fs.FileMode
	// Opaque paths are not looked below: what is in them is not
	// Stockade's to set (an image's tree, the operator's data, a
	// runtime's state).
	Opaque bool
	// Why says what needs the exception.
	Why string
}

// Root names a directory of a Layout.
type Root int

const (
	// DataDir is Layout.DataDir.
	DataDir Root = iota
	// StateDir is Layout.StateDir.
	StateDir
	// other is a Layout's Private directories, which have no exceptions.
	other Root = -1
)

// Exceptions are the paths whose mode is not File or Dir. Every other
// path below a Layout's roots is File or Dir.
var Exceptions = []Exception{
	{DataDir, ".", Traverse, false, "runc's sandboxes open their image and the guest agent from their own user namespace, which must pass through it"},
	{DataDir, "images", Traverse, false, "on the way to the images' trees"},
	{DataDir, "images/sha256", Traverse, false, "on the way to the images' trees"},
	{DataDir, "images/sha256/*", Traverse, false, "on the way to the image's tree"},
	{DataDir, "images/tmp", Dir, true, "builds in progress: their trees become images (Traverse, and their own modes) when published"},
	{DataDir, "images/sha256/*/rootfs", 0, true, "the image's tree: a public Debian root filesystem, which the sandbox's own user reads; its modes are part of its digest"},
	{DataDir, "cache/layers/*/rootfs", 0, true, "a template build's cached Debian layer: a copy of an image's tree with packages installed, whose modes become the template image's"},
	{DataDir, "cache", Traverse, false, "on the way to apt's download directories (cache/apt), which apt's methods write as _apt"},
	{DataDir, "cache/apt", Traverse, true, "apt's index lists of the Debian mirror for template builds and a build's downloads (public data), kept in apt's own modes: its methods write their partial/ directories as _apt, through here"},
	{DataDir, "bin", Traverse, false, "on the way to the guest agent"},
	{DataDir, "bin/.guest-*", 0, false, "a guest agent being installed (0600, then 0555 as it is renamed)"},
	{DataDir, "bin/stockade-guest-*", 0o555, false, "the guest agent, executed in every sandbox; it is the one embedded in the stockade binary"},
	{DataDir, "data", Traverse, true, "the default data root (data_root, Layout.DataRoot): tools mount data from below it into sandboxes; what is in it is the operator's"},
	{StateDir, "userns", Dir, true, "pins of the user namespaces of sandbox networks: bind mounts of nsfs files, whose mode is the kernel's"},
	{StateDir, "*/state", 0, true, "the runtime's (runc's, runsc's) own state, which it creates and keeps (runsc: 0711), below the driver's 0700 directory"},
	{StateDir, "*/bundles/*/rootfs", 0, true, "a sandbox's private root, an overlay of its image: the sandbox's own user reads it"},
	{StateDir, "*/bundles/*/upper", 0, true, "the upper layer of a sandbox's private root"},
	{StateDir, "*/bundles/*/work", 0, true, "the work directory of a sandbox's private root overlay"},
	{StateDir, "*/bundles/*/resolv.conf", 0o644, false, "bind-mounted into the sandbox, whose own user reads it; its bundle directory is 0700"},
}

// Layout names the directories Stockade keeps on a host.
type Layout struct {
	// DataDir is the data directory (config.Config.DataDir).
	DataDir string
	// StateDir is the state directory (config.Config.StateDir).
	StateDir string
	// Private are more directories whose whole contents are File and Dir:
	// the checkpoint and witness directories where they are configured
	// outside DataDir. A path that is inside DataDir adds nothing.
	Private []string
	// DataRoot is the tools' data root (config.Config.MountRoot), inside
	// DataDir or not: tools mount data from below it into sandboxes, so
	// it is Traverse, and what is in it is the operator's, not looked at.
	DataRoot string
}

// Fix walks l's directories and gives every path the mode the rule says,
// for an install made before the rule: it never follows a symbolic link,
// and leaves what is missing and what is on a read-only file system (an
// image store mounted read-only, which no one can change). It reports
// every path it could not fix; the caller decides whether that stops it
// (a daemon must not serve over a database others may read).
func Fix(l Layout) error {
	var errs []error
	l.walk(func(p string, fi fs.FileInfo, want fs.FileMode) {
		if fi.Mode().Perm() == want {
			return
		}
		if err := os.Chmod(p, want); err != nil && !errors.Is(err, syscall.EROFS) {
			errs = append(errs, fmt.Errorf("making %s mode %#o: %w", p, want, err))
		}
	}, func(err error) { errs = append(errs, err) })
	return errors.Join(errs...)
}

// PrivateTree makes every directory below and at dir Dir and every file
// File: for a tree another program wrote with modes of its own (runsc's
// checkpoint of a sandbox's memory).
func PrivateTree(dir string) error { return Fix(Layout{Private: []string{dir}}) }

// Check lists the paths below l's directories whose mode is not the one
// the rule says, each with its mode and the one wanted.
func Check(l Layout) []string {
	var bad []string
	l.walk(func(p string, fi fs.FileInfo, want fs.FileMode) {
		if fi.Mode().Perm() != want {
			bad = append(bad, fmt.Sprintf("%s: mode %#o, want %#o", p, fi.Mode().Perm(), want))
		}
	}, func(err error) { bad = append(bad, err.Error()) })
	return bad
}

// walk calls visit for every path of l whose mode the rule sets, with the
// mode it wants, and fail for every error but a missing path.
func (l Layout) walk(visit func(p string, fi fs.FileInfo, want fs.FileMode), fail func(error)) {
	w := walker{dataRoot: filepath.Clean(l.DataRoot), visit: visit, fail: fail}
	if l.DataRoot == "" {
		w.dataRoot = ""
	}
	if l.DataDir != "" {
		w.tree(l.DataDir, DataDir)
	}
	if l.StateDir != "" {
		w.tree(l.StateDir, StateDir)
	}
	for _, dir := range l.Private {
		if dir != "" && !within(dir, l.DataDir) {
			w.tree(dir, other)
		}
	}
	if w.dataRoot != "" && !within(w.dataRoot, l.DataDir) {
		w.tree(w.dataRoot, other)
	}
}

// walker walks a Layout's trees.
type walker struct {
	dataRoot string
	visit    func(string, fs.FileInfo, fs.FileMode)
	fail     func(error)
}

// tree visits the tree at dir, whose paths the exceptions of root rule.
func (w walker) tree(dir string, root Root) {
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				w.fail(err)
			}
			if d != nil && d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				w.fail(err)
			}
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		want, opaque := Want(root, filepath.ToSlash(rel), fi.IsDir())
		if p == w.dataRoot {
			want, opaque = Traverse, true
		}
		if want != 0 {
			w.visit(p, fi, want)
		}
		if opaque && fi.IsDir() {
			return fs.SkipDir
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		w.fail(err)
	}
}

// Want returns the mode the rule gives the path rel below a directory of
// root (zero: the path keeps its own), and whether what is below it is
// not Stockade's to set.
func Want(root Root, rel string, dir bool) (mode fs.FileMode, opaque bool) {
	for _, e := range Exceptions {
		if e.Root == root && match(e.Pattern, rel) {
			return e.Mode, e.Opaque
		}
	}
	if dir {
		return Dir, false
	}
	return File, false
}

// match reports whether rel matches pattern element by element.
func match(pattern, rel string) bool {
	ps, rs := strings.Split(pattern, "/"), strings.Split(rel, "/")
	if len(ps) != len(rs) {
		return false
	}
	for i := range ps {
		if ok, err := path.Match(ps[i], rs[i]); err != nil || !ok {
			return false
		}
	}
	return true
}

// within reports whether p is dir or below it.
func within(p, dir string) bool {
	if dir == "" {
		return false
	}
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// PrivateFile makes the file p, creating it empty if missing, File: for
// a file whose later companions take its mode (SQLite makes a
// database's -wal and -shm with the database's mode, so the database is
// made private before SQLite first opens it). The companions that
// exist already are made File too.
func PrivateFile(p string, companions ...string) error {
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, File)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := fixOpen(f, p); err != nil {
		return err
	}
	for _, c := range companions {
		cf, err := os.OpenFile(c, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		err = fixOpen(cf, c)
		cf.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// fixOpen makes the open file f, at p, File.
func fixOpen(f *os.File, p string) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Mode().Perm() == File {
		return nil
	}
	if err := f.Chmod(File); err != nil {
		return fmt.Errorf("making %s mode %#o: %w", p, File, err)
	}
	return nil
}
