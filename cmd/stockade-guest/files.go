package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/guest"
)

// File operations below /tmp and /workspace. Code in the sandbox runs with
// the guest's uid, between requests and (kernels, an exec) during them: it
// may plant a symlink at a path or on the way to it, and swap a directory
// for a symlink while the guest walks. Every operation therefore walks
// from a descriptor of the root, one component at a time, opening each
// directory with O_NOFOLLOW|O_DIRECTORY and checking that it opened what
// the name is (see openVerified), and acts on the last component with a
// *at call on its parent's descriptor that does not follow a symlink
// either (O_NOFOLLOW, AT_SYMLINK_NOFOLLOW, renameat and unlinkat, which
// never follow the last component). A swap during the walk makes it fail;
// it can never redirect it. openat2's RESOLVE_BENEATH would do the same in
// one call, but gVisor answers it with EPERM.

// walk opens the directory below root named by names, each component a
// directory that is no symlink; with create, missing components are made
// (mode 0755). The caller closes the descriptor.
func walk(root string, names []string, create bool) (int, string, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, codeOf(err), fmt.Errorf("opening %s: %w", root, err)
	}
	at := root
	for _, n := range names {
		next, err := openDir(fd, n)
		if errors.Is(err, unix.ENOENT) && create {
			if err = unix.Mkdirat(fd, n, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = openDir(fd, n)
			}
		}
		at += "/" + n
		if err != nil {
			code := codeOf(err)
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				code, err = notDir(fd, n)
			}
			unix.Close(fd)
			return -1, code, fmt.Errorf("opening directory %s: %w", at, err)
		}
		unix.Close(fd)
		fd = next
	}
	return fd, "", nil
}

// openDir opens the directory name in dir, refusing a symlink.
func openDir(dir int, name string) (int, error) {
	return openVerified(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC)
}

// openVerified opens name in dir with flags (which hold O_NOFOLLOW), then
// checks that what it opened is what name is now, a non-symlink: gVisor's
// openat follows a symlink despite O_NOFOLLOW when O_DIRECTORY is set
// (runsc of this repository's pinned version; Linux answers ELOOP). A
// descriptor that passes refers to a file that was linked at name in dir
// at the time of the check; a symlink swapped in or out meanwhile makes it
// fail with ELOOP.
func openVerified(dir int, name string, flags int) (int, error) {
	fd, err := unix.Openat(dir, name, flags, 0)
	if err != nil {
		return -1, err
	}
	var opened, linked unix.Stat_t
	if err := unix.Fstat(fd, &opened); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if err := unix.Fstatat(dir, name, &linked, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if linked.Mode&unix.S_IFMT == unix.S_IFLNK || opened.Dev != linked.Dev || opened.Ino != linked.Ino {
		unix.Close(fd)
		return -1, unix.ELOOP
	}
	return fd, nil
}

// notDir explains why name in dir could not be opened as a directory.
func notDir(dir int, name string) (string, error) {
	var st unix.Stat_t
	if unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return guest.ErrorSymlink, errors.New("a symlink, which is never followed")
	}
	return guest.ErrorNotDir, errors.New("not a directory")
}

// codeOf maps a system call's error to an ErrorReply code.
func codeOf(err error) string {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return guest.ErrorIO
	}
	switch errno {
	case unix.ENOENT:
		return guest.ErrorNotFound
	case unix.EEXIST:
		return guest.ErrorExists
	case unix.ENOTDIR:
		return guest.ErrorNotDir
	case unix.ELOOP:
		return guest.ErrorSymlink
	case unix.EISDIR:
		return guest.ErrorIsDir
	case unix.ENOTEMPTY:
		return guest.ErrorNotEmpty
	case unix.EACCES, unix.EPERM, unix.EROFS:
		return guest.ErrorDenied
	case unix.ENOSPC, unix.EDQUOT, unix.EFBIG:
		return guest.ErrorTooLarge
	case unix.ENAMETOOLONG, unix.EINVAL:
		return guest.ErrorInvalid
	}
	return guest.ErrorIO
}

// parent validates p and opens its parent directory (creating it with
// create), returning the descriptor and the last component.
func parent(p string, create bool) (int, string, string, error) {
	root, names, err := guest.ValidatePath(p, false)
	if err != nil {
		return -1, "", guest.ErrorInvalid, err
	}
	fd, code, err := walk(root, names[:len(names)-1], create)
	return fd, names[len(names)-1], code, err
}

// tempSeq numbers the guest's temporary files.
var tempSeq atomic.Uint64

// fileWrite is a file being written: a temporary file in its directory,
// renamed into place at the end.
type fileWrite struct {
	path      string
	dir       int
	name, tmp string
	f         *os.File
	mode      uint32
	size      int64
	failed    bool // answered with an error; later frames are dropped
}

// createTemp starts a write of p: it opens p's directory (creating it) and
// creates a temporary file there that nobody else can have planted.
func createTemp(p string, mode uint32) (*fileWrite, string, error) {
	dir, name, code, err := parent(p, true)
	if err != nil {
		return nil, code, err
	}
	// The name is the guest's own; code in the sandbox may have planted
	// it (O_EXCL refuses that), and then the next is tried.
	var fd int
	var tmp string
	for i := 0; ; i++ {
		tmp = fmt.Sprintf(".stockade-write-%d-%d", tempSeq.Add(1), i)
		fd, err = unix.Openat(dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if !errors.Is(err, unix.EEXIST) || i == 16 {
			break
		}
	}
	if err != nil {
		unix.Close(dir)
		return nil, codeOf(err), fmt.Errorf("creating a file in the directory of %s: %w", p, err)
	}
	return &fileWrite{path: p, dir: dir, name: name, tmp: tmp, f: os.NewFile(uintptr(fd), tmp), mode: mode}, "", nil
}

func (w *fileWrite) write(p []byte) (string, error) {
	n, err := w.f.Write(p)
	w.size += int64(n)
	if err != nil {
		return codeOf(err), fmt.Errorf("writing %s: %w", w.path, err)
	}
	return "", nil
}

// commit gives the file its mode (the umask must not narrow it) and
// renames it into place: renameat replaces whatever is at the name, a
// symlink included, without following it.
func (w *fileWrite) commit() (string, error) {
	defer unix.Close(w.dir)
	err := w.f.Chmod(os.FileMode(w.mode))
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(w.dir, w.tmp, w.dir, w.name)
	}
	if err != nil {
		unix.Unlinkat(w.dir, w.tmp, 0)
		return codeOf(err), fmt.Errorf("writing %s: %w", w.path, err)
	}
	return "", nil
}

// abort drops the temporary file.
func (w *fileWrite) abort() {
	w.f.Close()
	unix.Unlinkat(w.dir, w.tmp, 0)
	unix.Close(w.dir)
}

// writeWhole writes a whole file at p (an exec's file).
func writeWhole(p string, data []byte, mode uint32) (string, error) {
	w, code, err := createTemp(p, mode)
	if err != nil {
		return code, err
	}
	if code, err := w.write(data); err != nil {
		w.abort()
		return code, err
	}
	return w.commit()
}

// writeFrame serves the frames of a file write: the header, its data and
// its end. A failed write is answered at once; the frames that follow it
// are dropped.
func (a *agent) writeFrame(f guest.Frame) {
	w := a.writes[f.ID]
	switch f.Type {
	case guest.FrameWrite:
		var req guest.WriteRequest
		if w != nil {
			a.replyError(f.ID, guest.ErrorInvalid, "a second write header")
			return
		}
		if !a.decode(f, &req) {
			a.writes[f.ID] = &fileWrite{failed: true}
			return
		}
		mode := req.Mode
		if mode == 0 {
			mode = 0o644
		}
		if mode > 0o7777 {
			a.writes[f.ID] = &fileWrite{failed: true}
			a.replyError(f.ID, guest.ErrorInvalid, fmt.Sprintf("mode %#o has bits outside 07777", mode))
			return
		}
		w, code, err := createTemp(req.Path, mode)
		if err != nil {
			a.writes[f.ID] = &fileWrite{failed: true}
			a.replyError(f.ID, code, err.Error())
			return
		}
		a.writes[f.ID] = w
	case guest.FrameData:
		if w == nil || w.failed {
			return
		}
		if code, err := w.write(f.Payload); err != nil {
			w.abort()
			a.writes[f.ID] = &fileWrite{failed: true}
			a.replyError(f.ID, code, err.Error())
		}
	case guest.FrameEnd:
		delete(a.writes, f.ID)
		if w == nil || w.failed {
			return
		}
		if code, err := w.commit(); err != nil {
			a.replyError(f.ID, code, err.Error())
			return
		}
		a.sendJSON(guest.FrameResult, f.ID, guest.WriteResult{Size: w.size})
	}
}

// fileOp serves a read, list, stat, remove or mkdir.
func (a *agent) fileOp(f guest.Frame) {
	var (
		code string
		err  error
		res  any
	)
	switch f.Type {
	case guest.FrameRead:
		var req guest.ReadRequest
		if !a.decode(f, &req) {
			return
		}
		res, code, err = a.readFile(f.ID, req)
	case guest.FrameMkdir:
		var req guest.MkdirRequest
		if !a.decode(f, &req) {
			return
		}
		res, code, err = struct{}{}, "", nil
		if c, e := mkdir(req); e != nil {
			code, err = c, e
		}
	default:
		var req guest.PathRequest
		if !a.decode(f, &req) {
			return
		}
		switch f.Type {
		case guest.FrameList:
			res, code, err = list(req.Path)
		case guest.FrameStat:
			res, code, err = stat(req.Path)
		case guest.FrameRemove:
			res = struct{}{}
			code, err = remove(req.Path)
		}
	}
	if err != nil {
		a.replyError(f.ID, code, err.Error())
		return
	}
	a.sendJSON(guest.FrameResult, f.ID, res)
}

// readFile sends up to req.Max bytes of a regular file as FrameData.
func (a *agent) readFile(id uint32, req guest.ReadRequest) (any, string, error) {
	if req.Max < 0 {
		return nil, guest.ErrorInvalid, errors.New("negative size bound")
	}
	dir, name, code, err := parent(req.Path, false)
	if err != nil {
		return nil, code, err
	}
	// O_NONBLOCK: opening a FIFO must not wait for a writer (it is
	// refused below).
	fd, err := openVerified(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC)
	unix.Close(dir)
	if err != nil {
		return nil, codeOf(err), fmt.Errorf("opening %s: %w", req.Path, err)
	}
	f := os.NewFile(uintptr(fd), req.Path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, codeOf(err), fmt.Errorf("stat %s: %w", req.Path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, guest.ErrorNotRegular, fmt.Errorf("%s is not a regular file", req.Path)
	}
	res := guest.ReadResult{Size: st.Size, Mode: st.Mode & 0o7777}
	buf := make([]byte, guest.MaxChunk)
	var sent int64
	for sent < req.Max {
		n, err := f.Read(buf[:min(int64(len(buf)), req.Max-sent)])
		if n > 0 {
			a.send(guest.FrameData, id, buf[:n])
			sent += int64(n)
		}
		if err == io.EOF {
			return res, "", nil
		}
		if err != nil {
			return nil, codeOf(err), fmt.Errorf("reading %s: %w", req.Path, err)
		}
	}
	// At the bound: one more byte says whether the file is longer.
	if n, _ := f.Read(buf[:1]); n > 0 {
		res.Truncated = true
	}
	return res, "", nil
}

// entry describes name in dir without following a symlink.
func entry(dir int, name string) (guest.Entry, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return guest.Entry{}, err
	}
	e := guest.Entry{Name: name, Size: st.Size, Mode: st.Mode & 0o7777, MTime: st.Mtim.Nano()}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Type = guest.TypeFile
	case unix.S_IFDIR:
		e.Type = guest.TypeDir
	case unix.S_IFLNK:
		e.Type = guest.TypeSymlink
	default:
		e.Type = guest.TypeOther
	}
	return e, nil
}

func stat(p string) (any, string, error) {
	root, names, err := guest.ValidatePath(p, true)
	if err != nil {
		return nil, guest.ErrorInvalid, err
	}
	if len(names) == 0 {
		fd, code, err := walk(root, nil, false)
		if err != nil {
			return nil, code, err
		}
		defer unix.Close(fd)
		e, err := entry(fd, ".")
		e.Name = root[1:]
		if err != nil {
			return nil, codeOf(err), fmt.Errorf("stat %s: %w", p, err)
		}
		return e, "", nil
	}
	dir, name, code, err := parent(p, false)
	if err != nil {
		return nil, code, err
	}
	defer unix.Close(dir)
	e, err := entry(dir, name)
	if err != nil {
		return nil, codeOf(err), fmt.Errorf("stat %s: %w", p, err)
	}
	return e, "", nil
}

func list(p string) (any, string, error) {
	root, names, err := guest.ValidatePath(p, true)
	if err != nil {
		return nil, guest.ErrorInvalid, err
	}
	fd, code, err := walk(root, names, false)
	if err != nil {
		return nil, code, err
	}
	d := os.NewFile(uintptr(fd), p)
	defer d.Close()
	all, err := d.Readdirnames(guest.MaxListEntries + 1)
	if err != nil && err != io.EOF {
		return nil, codeOf(err), fmt.Errorf("listing %s: %w", p, err)
	}
	res := guest.ListResult{Entries: []guest.Entry{}}
	if len(all) > guest.MaxListEntries {
		all, res.Truncated = all[:guest.MaxListEntries], true
	}
	for _, n := range all {
		// An entry removed meanwhile is left out.
		if e, err := entry(fd, n); err == nil {
			res.Entries = append(res.Entries, e)
		}
	}
	return res, "", nil
}

func remove(p string) (string, error) {
	dir, name, code, err := parent(p, false)
	if err != nil {
		return code, err
	}
	defer unix.Close(dir)
	var st unix.Stat_t
	if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return codeOf(err), fmt.Errorf("removing %s: %w", p, err)
	}
	flags := 0
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		flags = unix.AT_REMOVEDIR
	}
	if err := unix.Unlinkat(dir, name, flags); err != nil {
		return codeOf(err), fmt.Errorf("removing %s: %w", p, err)
	}
	return "", nil
}

func mkdir(req guest.MkdirRequest) (string, error) {
	mode := req.Mode
	if mode == 0 {
		mode = 0o755
	}
	if mode > 0o7777 {
		return guest.ErrorInvalid, fmt.Errorf("mode %#o has bits outside 07777", mode)
	}
	dir, name, code, err := parent(req.Path, true)
	if err != nil {
		return code, err
	}
	defer unix.Close(dir)
	err = unix.Mkdirat(dir, name, mode)
	if errors.Is(err, unix.EEXIST) {
		fd, oerr := openDir(dir, name)
		if oerr != nil {
			_, oerr = notDir(dir, name)
			return guest.ErrorExists, fmt.Errorf("creating directory %s: exists, %v", req.Path, oerr)
		}
		unix.Close(fd)
		return "", nil
	}
	if err != nil {
		return codeOf(err), fmt.Errorf("creating directory %s: %w", req.Path, err)
	}
	// The umask must not narrow the mode asked for.
	if fd, err := openDir(dir, name); err == nil {
		unix.Fchmod(fd, mode)
		unix.Close(fd)
	}
	return "", nil
}
