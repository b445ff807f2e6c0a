package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"path"
	"strings"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// WorkspacePath returns the path in the sandbox of p, a path of a
// session's files: absolute below /workspace, or relative to it. A path
// with a NUL, a ".." component, or outside /workspace is
// ErrInvalidArgument.
func WorkspacePath(p string) (string, error) {
	switch {
	case p == "":
		return "", errdefs.Publicf("a path is required: %w", errdefs.ErrInvalidArgument)
	case strings.ContainsRune(p, 0):
		return "", errdefs.Publicf("path %q has a NUL byte: %w", p, errdefs.ErrInvalidArgument)
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return "", errdefs.Publicf("path %q has a \"..\" component: %w", p, errdefs.ErrInvalidArgument)
		}
	}
	if !strings.HasPrefix(p, "/") {
		p = WorkspaceDir + "/" + p
	}
	p = path.Clean(p)
	if p != WorkspaceDir && !strings.HasPrefix(p, WorkspaceDir+"/") {
		return "", errdefs.Publicf("path %q is outside %s: %w", p, WorkspaceDir, errdefs.ErrInvalidArgument)
	}
	return p, nil
}

// WriteFile writes what r yields, at most max bytes (ErrTooLarge past
// it, leaving no file), to p below /workspace and returns its size and
// SHA-256 (hex).
func (s *Session) WriteFile(ctx context.Context, p string, r io.Reader, max int64) (int64, string, error) {
	p, err := WorkspacePath(p)
	if err != nil {
		return 0, "", err
	}
	h := sha256.New()
	n, err := s.files.WriteFile(ctx, p, 0o644, io.TeeReader(r, h), max)
	if err != nil {
		return 0, "", err
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// ReadFile reads the regular file p below /workspace: at most max bytes
// (a longer one is ErrTooLarge).
func (s *Session) ReadFile(ctx context.Context, p string, max int64) ([]byte, sandbox.FileInfo, error) {
	p, err := WorkspacePath(p)
	if err != nil {
		return nil, sandbox.FileInfo{}, err
	}
	b, info, err := s.files.ReadFile(ctx, p, max)
	if err != nil {
		return nil, info, err
	}
	if info.Size > int64(len(b)) {
		return nil, info, errdefs.Publicf("%s is %d bytes, more than the limit of %d: %w", p, info.Size, max, errdefs.ErrTooLarge)
	}
	return b, info, nil
}

// ListDir lists the directory p below /workspace (or /workspace itself).
func (s *Session) ListDir(ctx context.Context, p string) ([]sandbox.FileInfo, bool, error) {
	p, err := WorkspacePath(p)
	if err != nil {
		return nil, false, err
	}
	return s.files.ListDir(ctx, p)
}

// Stat describes the file p below /workspace, a symlink as itself.
func (s *Session) Stat(ctx context.Context, p string) (sandbox.FileInfo, error) {
	p, err := WorkspacePath(p)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	return s.files.Stat(ctx, p)
}

// Remove removes the file, symlink or empty directory p below
// /workspace (not /workspace itself).
func (s *Session) Remove(ctx context.Context, p string) error {
	p, err := WorkspacePath(p)
	if err != nil {
		return err
	}
	if p == WorkspaceDir {
		return errdefs.Publicf("%s itself cannot be removed: %w", WorkspaceDir, errdefs.ErrInvalidArgument)
	}
	return s.files.Remove(ctx, p)
}
