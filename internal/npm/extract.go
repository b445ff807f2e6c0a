package npm

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/stockade-sh/stockade/errdefs"
)

// extractor unpacks one package's tarball into its directory.
type extractor struct {
	root    *os.Root
	dir     string // the package's directory, relative to root
	what    string // name@version, for errors
	asRoot  bool
	budget  int64 // bytes it may write
	written int64
	entries int
}

// extract unpacks a gzipped tarball. Its first path element ("package/"
// in what npm publishes, another name in some old tarballs) is stripped,
// as npm strips it.
func (x *extractor) extract(r io.Reader) error {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return x.errorf("its tarball is not gzipped")
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return x.errorf("its tarball is corrupt")
		}
		x.entries++
		if x.entries > maxTarEntries {
			return x.errorf("its tarball has more than %d entries", maxTarEntries)
		}
		rel, err := x.entryPath(h.Name)
		if err != nil {
			return err
		}
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse:
			if rel == "" {
				return x.errorf("its tarball has a file at its top")
			}
			if err := x.file(rel, tr, h); err != nil {
				return err
			}
		case tar.TypeDir:
			if rel != "" {
				if err := x.mkdirs(rel); err != nil {
					return err
				}
			}
		case tar.TypeSymlink, tar.TypeLink:
			// npm does not unpack links; neither do we.
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			return x.errorf("entry %q of its tarball is a device or a fifo", h.Name)
		default:
			// Other types (GNU volume headers, ...) carry no file.
		}
	}
}

func (x *extractor) errorf(format string, args ...any) error {
	return errdefs.Publicf("npm_packages: %s: %s: %w", x.what, fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
}

// entryPath checks a tarball entry's name and returns it relative to the
// package's directory, its first element stripped. Empty and "." elements
// are dropped; an absolute name or a ".." element is refused.
func (x *extractor) entryPath(name string) (string, error) {
	if len(name) > 4096 || !utf8.ValidString(name) || strings.ContainsRune(name, 0) {
		return "", x.errorf("an entry of its tarball has a name that cannot be unpacked")
	}
	if strings.HasPrefix(name, "/") {
		return "", x.errorf("entry %q of its tarball is an absolute path", name)
	}
	var elems []string
	for _, e := range strings.Split(name, "/") {
		switch e {
		case "..":
			return "", x.errorf("entry %q of its tarball points outside the package (..)", name)
		case "", ".":
			continue
		}
		elems = append(elems, e)
	}
	if len(elems) <= 1 {
		return "", nil
	}
	return strings.Join(elems[1:], "/"), nil
}

// mkdirs makes the package's subdirectory rel and its parents, 0755.
func (x *extractor) mkdirs(rel string) error {
	elems := strings.Split(rel, "/")
	for i := range elems {
		p := x.dir + "/" + strings.Join(elems[:i+1], "/")
		st, err := x.root.Lstat(p)
		if err == nil {
			if !st.IsDir() {
				return x.errorf("its tarball has %q as a file and a directory", strings.Join(elems[:i+1], "/"))
			}
			continue
		}
		if err := x.root.Mkdir(p, 0o755); err != nil {
			return treeError(p, err)
		}
		if err := x.root.Chmod(p, 0o755); err != nil {
			return treeError(p, err)
		}
		if x.asRoot {
			if err := x.root.Lchown(p, 0, 0); err != nil {
				return treeError(p, err)
			}
		}
	}
	return nil
}

// file writes one file of the tarball; a later entry of the same name
// replaces an earlier one, as tar has it.
func (x *extractor) file(rel string, r io.Reader, h *tar.Header) error {
	if h.Size > x.budget-x.written {
		return x.errorf("it unpacks to more than %d MiB", x.budget>>20)
	}
	if dir := path.Dir(rel); dir != "." {
		if err := x.mkdirs(dir); err != nil {
			return err
		}
	}
	p := x.dir + "/" + rel
	if st, err := x.root.Lstat(p); err == nil && !st.Mode().IsRegular() {
		return x.errorf("its tarball has %q as a file and a directory", rel)
	}
	mode := fs.FileMode(0o644)
	if h.Mode&0o111 != 0 {
		mode = 0o755
	}
	f, err := x.root.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return treeError(p, err)
	}
	n, err := io.Copy(f, io.LimitReader(r, x.budget-x.written+1))
	x.written += n
	if err != nil {
		f.Close()
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return treeError(p, err) // writing, not reading
		}
		return x.errorf("its tarball is corrupt")
	}
	if x.written > x.budget {
		f.Close()
		return x.errorf("it unpacks to more than %d MiB", x.budget>>20)
	}
	err = f.Chmod(mode)
	if err == nil && x.asRoot {
		err = f.Chown(0, 0)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return treeError(p, err)
	}
	return nil
}
