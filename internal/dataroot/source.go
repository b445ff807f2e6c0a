package dataroot

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// use is how a consumer shares a path with a sandbox, and what follows
// from it: the rules and the words of its problems.
type use struct {
	noun string // how a message names the path, before it: "mount source "
	verb string // what is never done to what is denied: "mounted"
	// copy: the path is copied without following links (a template's
	// file), so it must be clean, neither it nor anything below it may
	// be a symlink, and its whole tree is checked here.
	copy bool
}

var (
	mountUse = use{noun: "mount source ", verb: "mounted"}
	fileUse  = use{verb: "copied", copy: true}
)

// Mount checks src as a tool's mount source and returns it with its
// symlinks resolved, or the problem: src must be an absolute path under
// the root that, its symlinks resolved, still is, and name a regular file
// or a directory that is no credentials directory and holds none at its
// top; neither src nor what it resolves to may be denied (a socket, a
// home, credentials, kernel or runtime directory). Symlinks inside the
// root are followed: the mount binds what they resolve to. The tree below
// a directory is not walked (tools does, remembering it between runs).
func (r Root) Mount(src string) (string, *Problem) {
	if src == "" {
		return "", problem(KindSource, "mount source is required")
	}
	return r.check(src, mountUse)
}

// A Source is a template file's source as Root.File found it.
type Source struct {
	// Root is the data root with its symlinks resolved: open it with
	// os.OpenRoot and read Rel below it.
	Root string
	// Path is the source with its symlinks resolved; it lies in Root.
	Path string
	// Rel is Path relative to Root ("." for the root itself), with no
	// symlink anywhere in it when it was checked.
	Rel string
	// Dir is set when the source is a directory (copied whole).
	Dir bool
}

// File checks src as a template file's source, now, and returns where it
// lies, or the problem: the rules of Mount, and more, since the file is
// copied into an image with lstat semantics (what a link points to is
// never read): src must be clean; it must not be a symlink itself (name
// what it points to); a directory is walked whole and may hold only
// directories and regular files, no symlink (even one within the root),
// socket, device or pipe, no credentials directory at any depth, and at
// most 100,000 entries. Only the directories on the way to src, below the
// root, may be symlinks within it; Rel has them resolved.
func (r Root) File(src string) (Source, *Problem) {
	if src == "" {
		return Source{}, problem(KindSource, "the source is required: a file or directory under the data root %s", r.clean)
	}
	resolved, p := r.check(src, fileUse)
	if p != nil {
		return Source{}, p
	}
	fi, err := os.Lstat(resolved)
	if err != nil {
		return Source{}, problem(KindMissing, "%s cannot be read: %v", src, unwrapPathError(err))
	}
	if fi.IsDir() {
		if p := r.checkCopyTree(src, resolved); p != nil {
			return Source{}, p
		}
	}
	rel, err := filepath.Rel(r.resolved, resolved)
	if err != nil {
		return Source{}, problem(KindOutside, "%s is outside the data root %s", src, r.clean)
	}
	return Source{Root: r.resolved, Path: resolved, Rel: rel, Dir: fi.IsDir()}, nil
}

// CheckFile resolves the data root dataRoot and checks src under it as a
// template file's source, now, as templates.Validate did when the
// declaration was loaded (Root.File). The image builder calls it before
// it reads the source, then reads only through os.OpenRoot(s.Root) and
// s.Rel, refusing links as it goes, so that a symlink swapped in since
// cannot make it copy a host file the declaration never named. The error
// is a *Problem (errdefs.ErrFailedPrecondition) whose message names host
// paths.
func CheckFile(dataRoot, src string) (Source, error) {
	r := Resolve(dataRoot)
	if err := r.Err(); err != nil {
		return Source{}, err
	}
	s, p := r.File(src)
	if p != nil {
		return Source{}, p
	}
	return s, nil
}

// check applies the rules common to mounts and copies to src, in order of
// the most specific problem first (a denied path before the data root, a
// symlink's escape before its type), and returns src resolved.
func (r Root) check(src string, u use) (string, *Problem) {
	bad := func(k Kind, format string, a ...any) (string, *Problem) {
		return "", problem(k, u.noun+format, a...)
	}
	clean := filepath.Clean(src)
	switch {
	case !filepath.IsAbs(src) && r.clean == "":
		return bad(KindSource, "%s must be an absolute path", src)
	case !filepath.IsAbs(src):
		return bad(KindSource, "%s must be an absolute path under the data root %s", src, r.clean)
	case u.copy && clean != src:
		return bad(KindSource, "%s must be a clean path (write %s)", src, clean)
	}
	if k, why := denied(clean, u.verb); k != "" {
		return bad(k, "%s %s", src, why)
	}
	if r.Err() != nil {
		return bad(KindNoRoot, "%s cannot be checked: there is no usable data root", src)
	}
	if !Within(clean, r.clean) && !Within(clean, r.resolved) {
		return bad(KindOutside, "%s is outside the data root %s", src, r.clean)
	}
	resolved, err := filepath.EvalSymlinks(clean)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return bad(KindMissing, "%s does not exist", src)
		}
		return bad(KindMissing, "%s cannot be resolved: %v", src, unwrapPathError(err))
	}
	if k, why := denied(resolved, u.verb); k != "" {
		return bad(k, "%s resolves to %s, which %s", src, resolved, why)
	}
	if !Within(resolved, r.resolved) {
		return bad(KindSymlinkEscape, "%s resolves through a symlink to %s, outside the data root %s", src, resolved, r.clean)
	}
	if u.copy {
		if fi, err := os.Lstat(clean); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return bad(KindSymlink, "%s is a symlink to %s; a copy never follows links: name %s", src, resolved, resolved)
		}
	}
	fi, err := os.Lstat(resolved)
	if err != nil {
		return bad(KindMissing, "%s cannot be read: %v", src, unwrapPathError(err))
	}
	switch {
	case fi.Mode().Type()&fs.ModeSocket != 0:
		return bad(KindSocket, "%s is a unix socket; sockets are never %s", src, u.verb)
	case !fi.IsDir() && !fi.Mode().IsRegular():
		return bad(KindSource, "%s is neither a regular file nor a directory", src)
	case fi.IsDir():
		// A directory that holds credentials is as bad as the credentials.
		for _, name := range credentialDirs {
			if _, err := os.Lstat(filepath.Join(resolved, name)); err == nil {
				return bad(KindCredentials, "%s contains %s; credentials are never %s", src, name, u.verb)
			}
		}
	}
	return resolved, nil
}

// maxTreeEntries bounds the entries below a directory to copy: past it the
// source is refused, since what the check has not seen it cannot vouch
// for. A variable so that tests can lower it.
var maxTreeEntries = 100000

// checkCopyTree walks the directory resolved (the source src, its symlinks
// resolved) without following symlinks, and returns why it cannot be
// copied, or nil: it holds a credentials directory, a symlink (whether
// within the data root or not), a socket, a device or a pipe, or too many
// entries.
func (r Root) checkCopyTree(src, resolved string) *Problem {
	var p *Problem
	n := 0
	err := filepath.WalkDir(resolved, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			p = problem(KindMissing, "%s cannot be read: %v", src, unwrapPathError(err))
			return filepath.SkipAll
		}
		if n++; n > maxTreeEntries {
			p = problem(KindTooLarge, "%s holds more than %d entries", src, maxTreeEntries)
			return filepath.SkipAll
		}
		rel, _ := filepath.Rel(resolved, path)
		shown := filepath.Join(src, rel)
		switch t := d.Type(); {
		case d.IsDir():
			if path != resolved && IsCredentialDir(rel) {
				p = problem(KindCredentials, "%s contains %s; credentials are never copied", src, rel)
				return filepath.SkipAll
			}
			return nil
		case t.IsRegular():
			return nil
		case t&fs.ModeSymlink != 0:
			p = r.linkProblem(src, shown, path)
		case t&fs.ModeSocket != 0:
			p = problem(KindSocket, "%s holds the unix socket %s; sockets are never copied", src, shown)
		default:
			p = problem(KindSource, "%s holds %s, which is neither a regular file nor a directory", src, shown)
		}
		return filepath.SkipAll
	})
	if err != nil && p == nil {
		p = problem(KindMissing, "%s cannot be read: %v", src, unwrapPathError(err))
	}
	return p
}

// linkProblem words the refusal of the symlink link, shown as shown, in
// the directory src: where it leads decides the kind.
func (r Root) linkProblem(src, shown, link string) *Problem {
	target, err := filepath.EvalSymlinks(link)
	switch {
	case err != nil:
		return problem(KindSymlink, "%s holds the symlink %s, which cannot be resolved; a copy never follows links", src, shown)
	case !Within(target, r.resolved):
		return problem(KindSymlinkEscape, "%s holds the symlink %s to %s, outside the data root %s", src, shown, target, r.clean)
	case credentialDir(target) != "":
		return problem(KindCredentials, "%s holds the symlink %s into a credentials directory; credentials are never copied", src, shown)
	}
	return problem(KindSymlink, "%s holds the symlink %s to %s; a copy never follows links: replace it with what it points to", src, shown, target)
}
