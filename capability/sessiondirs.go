package capability

import (
	"bytes"
	"context"
	"path"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// StatFile describes the file at path in session id's /workspace (a
// symlink as itself); the workspace itself is a directory named
// "workspace".
func (s *Service) StatFile(ctx context.Context, p Principal, id, file string) (sandbox.FileInfo, error) {
	clean, err := filePath(file)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	_, live, done, err := s.sessions.usable(ctx, p, id)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	defer done()
	return live.Stat(ctx, clean)
}

// MakeDir creates the directory at path in session id's /workspace and
// its missing parents, audited as a transfer in of the directory. An
// existing directory is ErrConflict (the E2B wire answers it false).
func (s *Service) MakeDir(ctx context.Context, p Principal, id, dir string) error {
	clean, err := filePath(dir)
	if err != nil {
		return err
	}
	ss, live, done, err := s.sessions.usable(ctx, p, id)
	if err != nil {
		return err
	}
	defer done()
	if info, err := live.Stat(ctx, clean); err == nil {
		if info.Type == sandbox.TypeDir {
			return errdefs.Publicf("directory %s already exists: %w", clean, errdefs.ErrConflict)
		}
		return errdefs.Publicf("%s exists and is not a directory: %w", clean, errdefs.ErrConflict)
	}
	if err := live.Mkdir(ctx, clean); err != nil {
		return err
	}
	return s.files.auditTransfer(ctx, p, ss, audit.TransferIn, FileInfo{Path: clean + "/"})
}

// MoveFile moves the regular file at from to to in session id's
// /workspace (its contents copied, at most MaxFileSize bytes, then the
// source removed), audited as the removal of from and a transfer in of
// to. A directory is ErrFailedPrecondition: the files path has no
// rename.
func (s *Service) MoveFile(ctx context.Context, p Principal, id, from, to string) (sandbox.FileInfo, error) {
	src, err := filePath(from)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	dst, err := filePath(to)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	ss, live, done, err := s.sessions.usable(ctx, p, id)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	defer done()
	info, err := live.Stat(ctx, src)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	if info.Type != sandbox.TypeFile {
		return sandbox.FileInfo{}, errdefs.Publicf("%s is a %s: only regular files can be moved: %w", src, info.Type, errdefs.ErrFailedPrecondition)
	}
	if src == dst {
		return info, nil
	}
	b, _, err := live.ReadFile(ctx, src, s.opts.Sessions.MaxFileSize)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	n, sum, err := live.WriteFile(ctx, dst, bytes.NewReader(b), s.opts.Sessions.MaxFileSize)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	if err := live.Remove(ctx, src); err != nil {
		return sandbox.FileInfo{}, err
	}
	if err := s.files.auditTransfer(ctx, p, ss, audit.TransferRemoved, FileInfo{Path: src}); err != nil {
		return sandbox.FileInfo{}, err
	}
	if err := s.files.auditTransfer(ctx, p, ss, audit.TransferIn, FileInfo{Path: dst, Size: n, SHA256: sum}); err != nil {
		return sandbox.FileInfo{}, err
	}
	out, err := live.Stat(ctx, dst)
	if err != nil {
		return sandbox.FileInfo{Name: path.Base(dst), Type: sandbox.TypeFile, Size: n}, nil
	}
	return out, nil
}
