package templates

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// dataRoot is Options.DataRoot, cleaned and resolved. A dataRoot with err
// set refuses every file.
type dataRoot struct {
	clean, resolved string
	err             string
}

func resolveDataRoot(dir string) dataRoot {
	if dir == "" {
		return dataRoot{err: "no data root is configured, so a template may copy no file (set the data root, e.g. --data-root /var/lib/stockade/data)"}
	}
	if !filepath.IsAbs(dir) {
		return dataRoot{err: fmt.Sprintf("data root %s must be an absolute path", dir)}
	}
	clean := filepath.Clean(dir)
	resolved, err := filepath.EvalSymlinks(clean)
	if err != nil {
		return dataRoot{err: fmt.Sprintf("data root %s cannot be used: %v", dir, unwrapPathError(err))}
	}
	if resolved == "/" {
		return dataRoot{err: fmt.Sprintf("data root %s cannot be used: it is the host's root filesystem", dir)}
	}
	return dataRoot{clean: clean, resolved: resolved}
}

// credentialDirs hold credentials wherever they are; a file source never
// is, holds or lies inside one. They are the tools package's mount rules'.
var credentialDirs = []string{".ssh", ".aws", ".kube", ".config/gcloud", ".docker", ".gnupg"}

// checkFileSource returns why src cannot be a file's source, or "": it must
// be an absolute, clean path under the data root that, its symlinks
// resolved, still is, and name a regular file or a directory that is no
// credentials directory and holds none at its top.
func checkFileSource(src string, root dataRoot) string {
	switch {
	case src == "":
		return "the source is required: a file or directory under the data root " + root.clean
	case !filepath.IsAbs(src):
		return fmt.Sprintf("%s must be an absolute path under the data root %s", src, root.clean)
	case filepath.Clean(src) != src:
		return fmt.Sprintf("%s must be a clean path (write %s)", src, filepath.Clean(src))
	case !within(src, root.clean) && !within(src, root.resolved):
		return fmt.Sprintf("%s is outside the data root %s", src, root.clean)
	}
	if d := credentialDir(src); d != "" {
		return fmt.Sprintf("%s is or is inside a %s directory; credentials are never copied", src, d)
	}
	resolved, err := filepath.EvalSymlinks(src)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Sprintf("%s does not exist", src)
		}
		return fmt.Sprintf("%s cannot be resolved: %v", src, unwrapPathError(err))
	}
	if !within(resolved, root.resolved) {
		return fmt.Sprintf("%s resolves through a symlink to %s, outside the data root %s", src, resolved, root.clean)
	}
	if d := credentialDir(resolved); d != "" {
		return fmt.Sprintf("%s resolves to %s, inside a %s directory; credentials are never copied", src, resolved, d)
	}
	fi, err := os.Lstat(resolved)
	if err != nil {
		return fmt.Sprintf("%s cannot be read: %v", src, unwrapPathError(err))
	}
	switch {
	case fi.Mode().Type()&fs.ModeSocket != 0:
		return fmt.Sprintf("%s is a unix socket; sockets are never copied", src)
	case !fi.IsDir() && !fi.Mode().IsRegular():
		return fmt.Sprintf("%s is neither a regular file nor a directory", src)
	case fi.IsDir():
		return checkTree(src, resolved, root)
	}
	return ""
}

// maxTreeEntries bounds the entries below a directory source: past it the
// source is refused, since what the check has not seen it cannot vouch
// for. A variable so that tests can lower it.
var maxTreeEntries = 100000

// checkTree walks the directory resolved (the source src, its symlinks
// resolved) without following symlinks, and returns why it cannot be
// copied, or "": it holds a credentials directory, a socket, a device or
// a pipe, or a symlink that resolves outside the data root (a copy that
// followed it would take host files the record never named).
func checkTree(src, resolved string, root dataRoot) string {
	var why string
	n := 0
	err := filepath.WalkDir(resolved, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			why = fmt.Sprintf("%s cannot be read: %v", src, unwrapPathError(err))
			return filepath.SkipAll
		}
		if n++; n > maxTreeEntries {
			why = fmt.Sprintf("%s holds more than %d entries", src, maxTreeEntries)
			return filepath.SkipAll
		}
		rel, _ := filepath.Rel(resolved, p)
		shown := filepath.Join(src, rel)
		switch t := d.Type(); {
		case d.IsDir():
			if p != resolved && credentialDir(p) != "" {
				why = fmt.Sprintf("%s contains %s; credentials are never copied", src, rel)
				return filepath.SkipAll
			}
		case t&fs.ModeSymlink != 0:
			target, err := filepath.EvalSymlinks(p)
			switch {
			case err != nil:
				why = fmt.Sprintf("%s holds the symlink %s, which cannot be resolved", src, shown)
			case !within(target, root.resolved):
				why = fmt.Sprintf("%s holds the symlink %s to %s, outside the data root %s", src, shown, target, root.clean)
			case credentialDir(target) != "":
				why = fmt.Sprintf("%s holds the symlink %s into a credentials directory", src, shown)
			default:
				return nil
			}
			return filepath.SkipAll
		case !t.IsRegular():
			why = fmt.Sprintf("%s holds %s, which is neither a regular file, a directory nor a symlink", src, shown)
			return filepath.SkipAll
		}
		return nil
	})
	if err != nil && why == "" {
		why = fmt.Sprintf("%s cannot be read: %v", src, unwrapPathError(err))
	}
	return why
}

// credentialDir returns the credentials directory p is or lies in, or "".
func credentialDir(p string) string {
	slashed := p + "/"
	for _, d := range credentialDirs {
		if strings.Contains(slashed, "/"+d+"/") {
			return d
		}
	}
	return ""
}

// within reports whether p is dir or below it; both must be clean.
func within(p, dir string) bool {
	if dir == "" {
		return false
	}
	if dir == "/" {
		return true
	}
	return p == dir || strings.HasPrefix(p, dir+"/")
}

func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
