package wheel

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/csv"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/stockade-sh/stockade/errdefs"
)

// Install unpacks the pure-python wheel at wheelPath into the tree at root:
// its library into sitePackages (an absolute path in the tree, such as
// /usr/local/lib/python3.13/dist-packages), its .data/ scripts into
// /usr/local/bin with "#!python" rewritten to "#!/usr/bin/python3", its
// .data/ data under /usr/local, and a command in /usr/local/bin for each
// console or gui script of entry_points.txt, as pip would. It writes the
// dist-info's INSTALLER ("stockade") and a RECORD of what it wrote.
//
// Install refuses, with a public error naming the wheel: a wheel built for
// a platform; a METADATA whose Name or Version is not the file name's; an
// entry that could land outside those directories (absolute, "..", a
// symbolic link, a device) or that is not the size or hash the wheel's
// RECORD says; C headers; more than its bounds of entries and bytes; and
// a file that exists in the tree with other content. Nothing is written
// through a symbolic link leading out of root. Directories are 0755,
// files 0644 (0755 when the archive marks them executable), scripts 0755,
// owned by root when Install runs as root. On error what Install wrote is
// removed.
func Install(wheelPath, root, sitePackages string) (Installed, error) {
	file := filepath.Base(wheelPath)
	fn, err := parseFileName(file)
	if err != nil {
		return Installed{}, err
	}
	if err := fn.checkPure(file); err != nil {
		return Installed{}, err
	}
	sp := path.Clean(sitePackages)
	if !path.IsAbs(sitePackages) || sp == "/" || strings.Contains(sitePackages, "..") {
		return Installed{}, fmt.Errorf("installing wheel %q: site-packages %q is not an absolute path in the tree: %w", file, sitePackages, errdefs.ErrInvalidArgument)
	}
	sp = strings.TrimPrefix(sp, "/")

	f, err := os.Open(wheelPath)
	if err != nil {
		return Installed{}, fmt.Errorf("opening wheel: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Installed{}, fmt.Errorf("opening wheel: %w", err)
	}
	if !st.Mode().IsRegular() || st.Size() > maxWheelBytes {
		return Installed{}, errdefs.Publicf("wheel %q: not a regular file of at most %d MiB: %w", file, maxWheelBytes>>20, errdefs.ErrInvalidArgument)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return Installed{}, fmt.Errorf("reading wheel: %w", err)
	}
	zr, err := zip.NewReader(f, st.Size())
	if err != nil {
		return Installed{}, errorf(file, "not a zip archive")
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return Installed{}, fmt.Errorf("opening the tree to install wheel %q into: %w", file, err)
	}
	defer r.Close()
	in := &installer{file: file, fn: fn, zr: zr, root: r, sp: sp, asRoot: os.Geteuid() == 0}
	if err := in.run(); err != nil {
		in.rollback()
		return Installed{}, err
	}
	return Installed{Name: in.name, Version: in.version, SHA256: hex.EncodeToString(h.Sum(nil)), File: file}, nil
}

// installer is one Install's state.
type installer struct {
	file   string
	fn     fileName
	zr     *zip.Reader
	root   *os.Root
	sp     string // site-packages, relative to root
	asRoot bool   // chown what is written to root

	name, version string
	distInfo      string // the dist-info directory's name
	written       int64  // bytes unpacked so far
	created       []string
	record        [][]string // RECORD lines of what was written
}

// plannedEntry is an archive entry with where it goes.
type plannedEntry struct {
	f    *zip.File
	name string // the entry's checked name, without a trailing slash
	rel  string
	kind kind
	dir  bool
}

func (in *installer) run() error {
	if len(in.zr.File) > maxEntries {
		return errorf(in.file, "more than %d entries", maxEntries)
	}
	plan, err := in.plan()
	if err != nil {
		return err
	}
	if err := in.checkMetadata(); err != nil {
		return err
	}
	rec, err := in.readWheelRecord()
	if err != nil {
		return err
	}
	for _, e := range plan {
		if e.kind == skipped {
			continue
		}
		if e.dir {
			if err := in.mkdirAll(e.rel); err != nil {
				return err
			}
			continue
		}
		if err := in.extract(e, rec); err != nil {
			return err
		}
	}
	if err := in.consoleScripts(); err != nil {
		return err
	}
	return in.writeDistInfo()
}

// plan checks every entry's name and type and maps it to its target
// before anything is written.
func (in *installer) plan() ([]plannedEntry, error) {
	for _, f := range in.zr.File {
		top, rest, _ := strings.Cut(f.Name, "/")
		if !strings.HasSuffix(top, ".dist-info") || rest == "" {
			continue
		}
		if in.distInfo != "" && in.distInfo != top {
			return nil, errorf(in.file, "two .dist-info directories: %q and %q", in.distInfo, top)
		}
		in.distInfo = top
	}
	if in.distInfo == "" {
		return nil, errorf(in.file, "no .dist-info directory")
	}
	stem := strings.TrimSuffix(in.distInfo, ".dist-info")
	d, v, _ := strings.Cut(stem, "-")
	if normalize(d) != normalize(in.fn.Dist) || !sameVersion(escapeVersion(v), escapeVersion(in.fn.Version)) {
		return nil, errorf(in.file, "its metadata directory %q is not the file name's %q", in.distInfo, in.fn.Dist+"-"+in.fn.Version+".dist-info")
	}
	// The .data directory is named as the .dist-info one is.
	dataStem := stem + ".data"
	var plan []plannedEntry
	seen := make(map[string]bool, len(in.zr.File))
	var declared uint64
	for _, f := range in.zr.File {
		elems, err := entryPath(in.file, f.Name)
		if err != nil {
			return nil, err
		}
		name := path.Join(elems...)
		mode := f.Mode()
		dir := strings.HasSuffix(f.Name, "/") || mode.IsDir()
		switch {
		case mode&fs.ModeSymlink != 0:
			return nil, errorf(in.file, "entry %q is a symbolic link", name)
		case !dir && !mode.IsRegular():
			return nil, errorf(in.file, "entry %q is not a file or a directory", name)
		}
		if seen[name] {
			return nil, errorf(in.file, "entry %q appears twice", name)
		}
		seen[name] = true
		declared += f.UncompressedSize64
		if declared > maxUnpackedBytes {
			return nil, errorf(in.file, "unpacks to more than %d MiB", maxUnpackedBytes>>20)
		}
		rel, k, err := target(in.file, elems, in.sp, dataStem, dir)
		if err != nil {
			return nil, err
		}
		if elems[0] == in.distInfo && len(elems) == 2 {
			switch elems[1] {
			case "RECORD", "RECORD.jws", "RECORD.p7s", "INSTALLER":
				k = skipped // replaced by what Install writes
			}
		}
		plan = append(plan, plannedEntry{f: f, name: name, rel: rel, kind: k, dir: dir})
	}
	return plan, nil
}

// escapeVersion is a version as a wheel's file name writes it.
func escapeVersion(v string) string { return strings.ReplaceAll(v, "-", "_") }

// open returns an entry of the dist-info directory, or nil.
func (in *installer) open(name string) *zip.File {
	for _, f := range in.zr.File {
		if f.Name == in.distInfo+"/"+name {
			return f
		}
	}
	return nil
}

// readMeta reads a bounded dist-info file.
func (in *installer) readMeta(name string, limit int64, required bool) ([]byte, error) {
	f := in.open(name)
	if f == nil {
		if required {
			return nil, errorf(in.file, "no %s/%s", in.distInfo, name)
		}
		return nil, nil
	}
	rc, err := f.Open()
	if err != nil {
		return nil, errorf(in.file, "reading %s: %s", name, zipProblem(err))
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, errorf(in.file, "reading %s: %s", name, zipProblem(err))
	}
	if int64(len(b)) > limit {
		return nil, errorf(in.file, "%s is larger than %d bytes", name, limit)
	}
	return b, nil
}

// checkMetadata reads METADATA's Name and Version, which must be the file
// name's, and WHEEL's Wheel-Version, which must be 1.x.
func (in *installer) checkMetadata() error {
	b, err := in.readMeta("METADATA", maxMetaBytes, true)
	if err != nil {
		return err
	}
	h, err := readHeaders(bytes.NewReader(b))
	if err != nil {
		return errorf(in.file, "METADATA: %s", err.Error())
	}
	in.name, in.version = h["name"], h["version"]
	if in.name == "" || in.version == "" {
		return errorf(in.file, "METADATA has no Name or no Version")
	}
	if normalize(in.name) != normalize(in.fn.Dist) {
		return errorf(in.file, "METADATA names %q, the file name %q", in.name, in.fn.Dist)
	}
	if !sameVersion(escapeVersion(in.version), escapeVersion(in.fn.Version)) {
		return errorf(in.file, "METADATA says version %q, the file name %q", in.version, in.fn.Version)
	}
	b, err = in.readMeta("WHEEL", maxMetaBytes, true)
	if err != nil {
		return err
	}
	h, err = readHeaders(bytes.NewReader(b))
	if err != nil {
		return errorf(in.file, "WHEEL: %s", err.Error())
	}
	if v := h["wheel-version"]; v != "1" && !strings.HasPrefix(v, "1.") {
		return errorf(in.file, "Wheel-Version %q is not 1.x", v)
	}
	return nil
}

// readWheelRecord reads the wheel's RECORD, whose hashes and sizes the
// unpacked files must match; a wheel without one installs unchecked (it
// is pinned by its own hash).
func (in *installer) readWheelRecord() (map[string]recordEntry, error) {
	b, err := in.readMeta("RECORD", maxRecordBytes, false)
	if err != nil || b == nil {
		return nil, err
	}
	rec, err := readRecord(bytes.NewReader(b))
	if err != nil {
		return nil, errorf(in.file, "RECORD: %s", err.Error())
	}
	return rec, nil
}

// mkdirAll makes rel's directories that do not exist, 0755 and root's.
func (in *installer) mkdirAll(rel string) error {
	elems := strings.Split(rel, "/")
	for i := range elems {
		p := path.Join(elems[:i+1]...)
		st, err := in.root.Stat(p)
		if err == nil {
			if !st.IsDir() {
				return errorf(in.file, "/%s exists in the image and is not a directory", p)
			}
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return in.treeError(p, err)
		}
		if err := in.root.Mkdir(p, 0o755); err != nil {
			return in.treeError(p, err)
		}
		in.created = append(in.created, p)
		if err := in.root.Chmod(p, 0o755); err != nil {
			return in.treeError(p, err)
		}
		if in.asRoot {
			if err := in.root.Lchown(p, 0, 0); err != nil {
				return in.treeError(p, err)
			}
		}
	}
	return nil
}

// treeError is a failure writing to the tree. One that a link leading out
// of the tree causes is the wheel's (or the image's) and says so.
func (in *installer) treeError(rel string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "escapes") {
		return errorf(in.file, "/%s is reached through a link leading out of the image", rel)
	}
	return fmt.Errorf("installing wheel %q: %w", in.file, err)
}

// zipProblem is a zip reader's error as a public sentence.
func zipProblem(err error) string {
	switch {
	case errors.Is(err, zip.ErrChecksum):
		return "checksum error"
	case errors.Is(err, zip.ErrAlgorithm):
		return "unsupported compression method"
	default:
		return "corrupt archive"
	}
}

// digester returns a hash for a RECORD algorithm.
func digester(algo string) hash.Hash {
	switch algo {
	case "sha256":
		return sha256.New()
	case "sha384":
		return sha512.New384()
	case "sha512":
		return sha512.New()
	}
	return nil
}

// extract writes one file entry, checked against the wheel's RECORD.
func (in *installer) extract(e plannedEntry, rec map[string]recordEntry) error {
	var want recordEntry
	var check hash.Hash
	var algo string
	if rec != nil {
		want = rec[e.f.Name]
		if want.Hash != "" {
			algo, _, _ = strings.Cut(want.Hash, "=")
			if check = digester(algo); check == nil {
				return errorf(in.file, "RECORD: hash %q of %q is not sha256, sha384 or sha512", algo, e.name)
			}
		}
	}
	rc, err := e.f.Open()
	if err != nil {
		return errorf(in.file, "entry %q: %s", e.name, zipProblem(err))
	}
	defer rc.Close()
	read := &countingReader{r: &io.LimitedReader{R: rc, N: maxUnpackedBytes - in.written + 1}}
	var src io.Reader = read
	if check != nil {
		src = io.TeeReader(src, check)
	}
	mode := fs.FileMode(0o644)
	if e.kind == script || e.f.Mode()&0o100 != 0 {
		mode = 0o755
	}
	if e.kind == script {
		src = rewriteShebang(src)
	}
	if _, err := in.writeFile(e.rel, src, mode); err != nil {
		return err
	}
	in.written += read.n
	if in.written > maxUnpackedBytes {
		return errorf(in.file, "unpacks to more than %d MiB", maxUnpackedBytes>>20)
	}
	if check != nil && recordHash(algo, check.Sum(nil)) != want.Hash {
		return errorf(in.file, "entry %q does not have the hash its RECORD says", e.name)
	}
	if check != nil && want.Size >= 0 && read.n != want.Size {
		return errorf(in.file, "entry %q is not the size its RECORD says", e.name)
	}
	return nil
}

// countingReader counts what is read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// writeFile creates rel (and its directories) with the content of src and
// records it. A file that exists with the same content is left as it is
// (a namespace package's __init__.py shared by two wheels); with other
// content it is an error.
func (in *installer) writeFile(rel string, src io.Reader, mode fs.FileMode) (int64, error) {
	if err := in.mkdirAll(path.Dir(rel)); err != nil {
		return 0, err
	}
	f, err := in.root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if errors.Is(err, fs.ErrExist) {
		return in.sameFile(rel, src)
	}
	if err != nil {
		return 0, in.treeError(rel, err)
	}
	in.created = append(in.created, rel)
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), src)
	if err != nil {
		f.Close()
		if n > maxUnpackedBytes-in.written {
			return 0, errorf(in.file, "unpacks to more than %d MiB", maxUnpackedBytes>>20)
		}
		return 0, errorf(in.file, "entry for /%s: %s", rel, zipProblem(err))
	}
	if n > maxUnpackedBytes-in.written {
		f.Close()
		return 0, errorf(in.file, "unpacks to more than %d MiB", maxUnpackedBytes>>20)
	}
	err = f.Chmod(mode)
	if err == nil && in.asRoot {
		err = f.Chown(0, 0)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, in.treeError(rel, err)
	}
	in.addRecord(rel, recordHash("sha256", h.Sum(nil)), n)
	return n, nil
}

// sameFile compares an existing file with src.
func (in *installer) sameFile(rel string, src io.Reader) (int64, error) {
	hNew := sha256.New()
	n, err := io.Copy(hNew, src)
	if err != nil {
		return 0, errorf(in.file, "entry for /%s: %s", rel, zipProblem(err))
	}
	f, err := in.root.Open(rel)
	if err != nil {
		return 0, in.treeError(rel, err)
	}
	defer f.Close()
	hOld := sha256.New()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return 0, errorf(in.file, "/%s exists in the image and is not a file", rel)
	}
	if _, err := io.Copy(hOld, io.LimitReader(f, maxUnpackedBytes)); err != nil {
		return 0, in.treeError(rel, err)
	}
	if !bytes.Equal(hOld.Sum(nil), hNew.Sum(nil)) {
		return 0, errorf(in.file, "/%s exists in the image with other content", rel)
	}
	in.addRecord(rel, recordHash("sha256", hNew.Sum(nil)), n)
	return n, nil
}

// addRecord adds a written file to the RECORD Install writes: its path
// relative to site-packages, as pip writes it.
func (in *installer) addRecord(rel, hash string, size int64) {
	p, err := filepath.Rel("/"+in.sp, "/"+rel)
	if err != nil {
		p = "/" + rel
	}
	in.record = append(in.record, []string{filepath.ToSlash(p), hash, fmt.Sprint(size)})
}

// consoleScripts writes a command for each console and gui script of
// entry_points.txt.
func (in *installer) consoleScripts() error {
	b, err := in.readMeta("entry_points.txt", maxMetaBytes, false)
	if err != nil || b == nil {
		return err
	}
	scripts, err := readEntryPoints(in.file, bytes.NewReader(b))
	if err != nil {
		return err
	}
	for _, s := range scripts {
		if _, err := in.writeFile(path.Join(scriptsDir, s.Name), bytes.NewReader(s.text()), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// writeDistInfo writes INSTALLER and RECORD into the dist-info directory.
func (in *installer) writeDistInfo() error {
	di := path.Join(in.sp, in.distInfo)
	if _, err := in.writeFile(path.Join(di, "INSTALLER"), strings.NewReader("stockade\n"), 0o644); err != nil {
		return err
	}
	var buf bytes.Buffer
	w := csv.NewWriter(&buf)
	for _, l := range in.record {
		_ = w.Write(l) // a bytes.Buffer does not fail
	}
	_ = w.Write([]string{path.Join(in.distInfo, "RECORD"), "", ""})
	w.Flush()
	_, err := in.writeFile(path.Join(di, "RECORD"), &buf, 0o644)
	return err
}

// rollback removes what Install created, files before their directories.
func (in *installer) rollback() {
	for i := len(in.created) - 1; i >= 0; i-- {
		_ = in.root.Remove(in.created[i])
	}
}
