package engine

import (
	"context"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// Mkdir creates the directory p below /workspace and its missing
// parents; an existing directory is success, an existing file
// ErrConflict.
func (s *Session) Mkdir(ctx context.Context, p string) error {
	p, err := WorkspacePath(p)
	if err != nil {
		return err
	}
	if info, err := s.files.Stat(ctx, p); err == nil {
		if info.Type != sandbox.TypeDir {
			return errdefs.Publicf("%s exists and is not a directory: %w", p, errdefs.ErrConflict)
		}
		return nil
	}
	return s.files.Mkdir(ctx, p, 0o755)
}
