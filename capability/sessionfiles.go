package capability

import (
	"context"
	"fmt"
	"io"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/wire"
)

// sessionFiles moves files into and out of sessions' /workspace, each
// transfer audited.
type sessionFiles struct {
	*core
	st   eventAppender
	host *sessionHost
}

// FileInfo is a file moved into or out of a session, as the wire
// declares it.
type FileInfo = wire.FileInfo

// filePath checks a path of the files API.
func filePath(p string) (string, error) {
	clean, err := engine.WorkspacePath(p)
	if err != nil {
		return "", errdefs.Publicf("%w: %w", ErrInvalidPath, err)
	}
	return clean, nil
}

// auditTransfer appends a transfer's event to the session's workspace's
// chain.
func (s *sessionFiles) auditTransfer(ctx context.Context, p Principal, ss model.Session, dir string, f FileInfo) error {
	_, err := s.st.AppendEvent(ctx, audit.NewEvent(audit.SessionFileTransferredEvent{
		Meta:      audit.Meta{WorkspaceID: ss.WorkspaceID, Actor: p.KeyID, Reason: "file " + dir + " through the files API"},
		Direction: dir, Path: f.Path, SessionID: ss.ID, SHA256: f.SHA256, Size: f.Size}))
	if err != nil {
		return fmt.Errorf("auditing a file transfer: %w", err)
	}
	return nil
}

// PutFile writes what r yields, at most the server's MaxFileSize
// (ErrTooLarge, leaving no file), to path in session id's /workspace, and
// audits the transfer (session.file_transferred, in). Transfers are not
// charged.
func (s *sessionFiles) PutFile(ctx context.Context, p Principal, id, path string, r io.Reader) (FileInfo, error) {
	clean, err := filePath(path)
	if err != nil {
		return FileInfo{}, err
	}
	ss, live, done, err := s.host.usable(ctx, p, id)
	if err != nil {
		return FileInfo{}, err
	}
	defer done()
	n, sum, err := live.WriteFile(ctx, clean, r, s.opts.Sessions.MaxFileSize)
	if err != nil {
		return FileInfo{}, err
	}
	f := FileInfo{Path: clean, Size: n, SHA256: sum}
	return f, s.auditTransfer(ctx, p, ss, audit.TransferIn, f)
}

// GetFile reads the regular file at path in session id's /workspace, at
// most MaxFileSize bytes, and audits the transfer (out). A directory is
// ErrInvalidArgument.
func (s *sessionFiles) GetFile(ctx context.Context, p Principal, id, path string) ([]byte, FileInfo, error) {
	clean, err := filePath(path)
	if err != nil {
		return nil, FileInfo{}, err
	}
	ss, live, done, err := s.host.usable(ctx, p, id)
	if err != nil {
		return nil, FileInfo{}, err
	}
	defer done()
	if info, err := live.Stat(ctx, clean); err != nil {
		return nil, FileInfo{}, err
	} else if info.Type != sandbox.TypeFile {
		return nil, FileInfo{}, errdefs.Publicf("%s is a %s, not a file; list a directory with ?dir=: %w", clean, info.Type, errdefs.ErrInvalidArgument)
	}
	b, _, err := live.ReadFile(ctx, clean, s.opts.Sessions.MaxFileSize)
	if err != nil {
		return nil, FileInfo{}, err
	}
	f := FileInfo{Path: clean, Size: int64(len(b)), SHA256: sha256Hex(b)}
	return b, f, s.auditTransfer(ctx, p, ss, audit.TransferOut, f)
}

// ListFiles lists the directory at path in session id's /workspace.
func (s *sessionFiles) ListFiles(ctx context.Context, p Principal, id, path string) ([]sandbox.FileInfo, bool, error) {
	clean, err := filePath(path)
	if err != nil {
		return nil, false, err
	}
	_, live, done, err := s.host.usable(ctx, p, id)
	if err != nil {
		return nil, false, err
	}
	defer done()
	return live.ListDir(ctx, clean)
}

// RemoveFile removes the file, symlink or empty directory at path in
// session id's /workspace, audited (removed).
func (s *sessionFiles) RemoveFile(ctx context.Context, p Principal, id, path string) error {
	clean, err := filePath(path)
	if err != nil {
		return err
	}
	ss, live, done, err := s.host.usable(ctx, p, id)
	if err != nil {
		return err
	}
	defer done()
	if err := live.Remove(ctx, clean); err != nil {
		return err
	}
	return s.auditTransfer(ctx, p, ss, audit.TransferRemoved, FileInfo{Path: clean})
}
