// Package dataroot is the one rule for the host files Stockade lets into a
// sandbox: a tool's data mounts (tools) and a template's files, copied
// into its image (templates at load, image at build). Both must lie under
// the data root, the one directory the operator names for them (config's
// data_root), once their symlinks are resolved; neither is, holds or
// lies in a credentials directory, a home directory, a unix socket or a
// kernel or runtime directory, and the data root itself may be none of
// these.
//
//	root := dataroot.Resolve(opts.DataRoot)
//	if err := root.Err(); err != nil { ... }
//	resolved, p := root.Mount(m.Source)   // a tool's mount
//	src, p := root.File(f.Source)          // a template's file
//
// A template's files are checked again when its image is built
// (CheckFile), since the tree may change after the declaration was loaded.
package dataroot

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/stockade-sh/stockade/errdefs"
)

// Kind is what a Problem is about. A consumer maps each to its own rule
// (tools' mount-* rules).
type Kind string

// The kinds of Problem.
const (
	// KindNoRoot: the data root is not configured or cannot be used.
	KindNoRoot Kind = "no-root"
	// KindSource: the path is malformed (empty, relative, unclean where
	// a clean one is required) or neither a regular file nor a directory.
	KindSource Kind = "source"
	// KindSocket: the path is, or a tree holds, a unix socket.
	KindSocket Kind = "socket"
	// KindCredentials: the path is, lies in or holds a credentials
	// directory (.ssh, .aws, ...).
	KindCredentials Kind = "credentials"
	// KindHome: the path is a home directory or lies in one.
	KindHome Kind = "home"
	// KindSystem: the path lies in a kernel or runtime directory (/proc,
	// /run, /var/lib/docker, ...).
	KindSystem Kind = "system"
	// KindOutside: the path, as written, is not under the data root.
	KindOutside Kind = "outside"
	// KindSymlinkEscape: the path or an entry below it resolves through
	// a symlink to somewhere outside the data root.
	KindSymlinkEscape Kind = "symlink-escape"
	// KindSymlink: a file to copy is, or a directory to copy holds, a
	// symlink. Copies never follow links (see Root.File).
	KindSymlink Kind = "symlink"
	// KindMissing: the path does not exist or cannot be resolved or read.
	KindMissing Kind = "missing"
	// KindTooLarge: a directory to copy holds more entries than are
	// checked.
	KindTooLarge Kind = "too-large"
)

// A Problem is why a path may not be shared with a sandbox. Its message
// names host paths: it is the operator's, not a client's. As an error it
// is of class errdefs.ErrFailedPrecondition (the host's files, not the
// request, are at fault).
type Problem struct {
	Kind    Kind
	Message string
}

func (p *Problem) Error() string { return p.Message }

// Unwrap returns the problem's class.
func (p *Problem) Unwrap() error { return errdefs.ErrFailedPrecondition }

func problem(k Kind, format string, a ...any) *Problem {
	return &Problem{Kind: k, Message: fmt.Sprintf(format, a...)}
}

// Root is a data root, cleaned and with its symlinks resolved. The zero
// Root, and one whose Err is not nil, refuses every path.
type Root struct {
	clean, resolved string
	err             *Problem
}

// Resolve resolves the data root dir: it must be an absolute path to a
// directory that, its symlinks resolved, is not the host's root nor
// anything denied (a home, credentials, kernel or runtime directory, a
// socket). Err says why not.
func Resolve(dir string) Root {
	if dir == "" {
		return Root{err: problem(KindNoRoot, "no data root is configured, so no tool may mount data and no template may copy a file (set the data root, e.g. --data-root /var/lib/stockade/data)")}
	}
	if !filepath.IsAbs(dir) {
		return Root{err: problem(KindNoRoot, "data root %s must be an absolute path", dir)}
	}
	clean := filepath.Clean(dir)
	resolved, err := filepath.EvalSymlinks(clean)
	if err != nil {
		return Root{err: problem(KindNoRoot, "data root %s cannot be used: %v", dir, unwrapPathError(err))}
	}
	if _, why := denied(resolved, "shared"); why != "" || resolved == "/" {
		if why == "" {
			why = "is the host's root filesystem"
		}
		return Root{err: problem(KindNoRoot, "data root %s cannot be used: it %s", dir, why)}
	}
	return Root{clean: clean, resolved: resolved}
}

// Err is why the root cannot be used, a *Problem of KindNoRoot, or nil.
func (r Root) Err() error {
	if r.err != nil {
		return r.err
	}
	if r.resolved == "" {
		return problem(KindNoRoot, "no data root is configured")
	}
	return nil
}

// Clean is the data root as configured, cleaned.
func (r Root) Clean() string { return r.clean }

// Resolved is the data root with its symlinks resolved.
func (r Root) Resolved() string { return r.resolved }

// credentialDirs are directories that hold credentials wherever they are.
var credentialDirs = []string{".ssh", ".aws", ".kube", ".config/gcloud", ".docker", ".gnupg"}

// IsCredentialDir reports whether the directory p (absolute or relative)
// is a credentials directory: whether it ends in .ssh, .aws, .kube,
// .config/gcloud, .docker or .gnupg.
func IsCredentialDir(p string) bool {
	for _, c := range credentialDirs {
		if strings.HasSuffix("/"+p, "/"+c) {
			return true
		}
	}
	return false
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

// denied returns the kind of host path p is by what it is, never to be
// shared, and why (ending in "never " + verb), or "", "".
func denied(p, verb string) (Kind, string) {
	base := filepath.Base(p)
	switch {
	case base == "docker.sock":
		return KindSocket, "is the Docker socket (root on the host)"
	case base == "containerd.sock" || strings.HasPrefix(base, "containerd.sock."):
		return KindSocket, "is the containerd socket (root on the host)"
	case strings.HasSuffix(base, ".sock"):
		return KindSocket, "is a unix socket; sockets are never " + verb
	}
	if d := credentialDir(p); d != "" {
		return KindCredentials, fmt.Sprintf("is or is inside a %s directory; credentials are never %s", d, verb)
	}
	for _, h := range []string{"/root", "/home"} {
		if Within(p, h) {
			return KindHome, "is a home directory or inside one; home directories hold credentials and are never " + verb
		}
	}
	for _, s := range []string{"/proc", "/sys", "/dev", "/var/run", "/run", "/var/lib/docker", "/var/lib/containerd"} {
		if Within(p, s) {
			return KindSystem, fmt.Sprintf("is inside %s, which is never %s", s, verb)
		}
	}
	return "", ""
}

// Within reports whether p is dir or below it; both must be clean.
func Within(p, dir string) bool {
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
