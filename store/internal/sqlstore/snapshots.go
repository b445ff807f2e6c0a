package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

const snapshotCols = `id, workspace_id, session_id, key_id, name, tool, runtime, driver, dir, bytes, created_at, expires_at`

func scanSnapshot(r Row) (model.Snapshot, error) {
	var sn model.Snapshot
	err := r.Scan(&sn.ID, &sn.WorkspaceID, &sn.SessionID, &sn.KeyID, &sn.Name, &sn.Tool, &sn.Runtime, &sn.Driver, &sn.Dir,
		&sn.Bytes, scanTime(&sn.CreatedAt), scanTime(&sn.ExpiresAt))
	return sn, err
}

// CreateSnapshot implements store.Snapshots.
func (s *Store) CreateSnapshot(ctx context.Context, n store.NewSnapshot) (model.Snapshot, error) {
	for _, f := range []struct{ name, v string }{
		{"snapshot id", n.ID}, {"workspace id", n.WorkspaceID}, {"session id", n.SessionID}, {"key id", n.KeyID},
		{"tool", n.Tool}, {"runtime", n.Runtime}, {"driver", n.Driver},
	} {
		if err := checkRequired(f.name, f.v, maxText); err != nil {
			return model.Snapshot{}, fmt.Errorf("recording a snapshot: %w", err)
		}
	}
	switch {
	case checkText("snapshot name", n.Name, maxText) != nil:
		return model.Snapshot{}, checkText("snapshot name", n.Name, maxText)
	case n.Dir == "" || len(n.Dir) > maxReason:
		return model.Snapshot{}, fmt.Errorf("recording a snapshot: its directory: %w", errdefs.ErrInvalidArgument)
	case n.Bytes < 0 || n.ExpiresAt.IsZero():
		return model.Snapshot{}, fmt.Errorf("recording a snapshot: its size and expiry: %w", errdefs.ErrInvalidArgument)
	}
	if err := checkEvents(n.Audit); err != nil {
		return model.Snapshot{}, err
	}
	var sn model.Snapshot
	err := s.inTx(ctx, func(q Querier) error {
		var ws string
		if err := q.QueryRow(ctx, `SELECT workspace_id FROM sessions WHERE id = $1`, n.SessionID).Scan(&ws); err != nil || ws != n.WorkspaceID {
			if err != nil && notFound(err) != errdefs.ErrNotFound {
				return err
			}
			return errdefs.Publicf("session %s: %w", n.SessionID, errdefs.ErrNotFound)
		}
		now := s.at(n.At)
		sn = model.Snapshot{ID: n.ID, WorkspaceID: n.WorkspaceID, SessionID: n.SessionID, KeyID: n.KeyID, Name: n.Name,
			Tool: n.Tool, Runtime: n.Runtime, Driver: n.Driver, Dir: n.Dir, Bytes: n.Bytes, CreatedAt: now,
			ExpiresAt: store.TruncateTime(n.ExpiresAt)}
		if _, err := q.Exec(ctx, `INSERT INTO snapshots (`+snapshotCols+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
			sn.ID, sn.WorkspaceID, sn.SessionID, sn.KeyID, sn.Name, sn.Tool, sn.Runtime, sn.Driver, sn.Dir, sn.Bytes,
			s.tm(sn.CreatedAt), s.tm(sn.ExpiresAt)); err != nil {
			return err
		}
		_, err := s.appendEvents(ctx, q, sn.WorkspaceID, "", n.Audit)
		return err
	})
	if err != nil {
		return model.Snapshot{}, fmt.Errorf("recording snapshot %q of session %q: %w", n.ID, n.SessionID, err)
	}
	return sn, nil
}

// GetSnapshot implements store.Snapshots.
func (s *Store) GetSnapshot(ctx context.Context, workspaceID, id string) (model.Snapshot, error) {
	sn, err := scanSnapshot(s.b.Reader().QueryRow(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE id = $1 AND workspace_id = $2`, id, workspaceID))
	if err != nil {
		return sn, s.missing(err, "snapshot", id)
	}
	return sn, nil
}

// ListSnapshots implements store.Snapshots.
func (s *Store) ListSnapshots(ctx context.Context, workspaceID, sessionID string) ([]model.Snapshot, error) {
	out, err := queryAll(ctx, s.b.Reader(), scanSnapshot, `SELECT `+snapshotCols+` FROM snapshots
		WHERE workspace_id = $1 AND session_id = $2 ORDER BY created_at DESC, id DESC LIMIT $3`, workspaceID, sessionID, store.MaxPageLimit)
	if err != nil {
		return nil, fmt.Errorf("listing the snapshots of session %q: %w", sessionID, s.classify(err))
	}
	return out, nil
}

// DeleteSnapshot implements store.Snapshots.
func (s *Store) DeleteSnapshot(ctx context.Context, workspaceID, id string, audit []model.NewEvent) (model.Snapshot, error) {
	if err := checkEvents(audit); err != nil {
		return model.Snapshot{}, err
	}
	var sn model.Snapshot
	err := s.inTx(ctx, func(q Querier) error {
		var err error
		sn, err = scanSnapshot(q.QueryRow(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE id = $1 AND workspace_id = $2`, id, workspaceID))
		if err != nil {
			return s.missing(err, "snapshot", id)
		}
		if _, err := q.Exec(ctx, `DELETE FROM snapshots WHERE id = $1`, id); err != nil {
			return err
		}
		_, err = s.appendEvents(ctx, q, workspaceID, "", audit)
		return err
	})
	if err != nil {
		return model.Snapshot{}, fmt.Errorf("deleting snapshot %q: %w", id, err)
	}
	return sn, nil
}

// ListExpiredSnapshots implements store.Snapshots.
func (s *Store) ListExpiredSnapshots(ctx context.Context, now time.Time) ([]model.Snapshot, error) {
	out, err := queryAll(ctx, s.b.Reader(), scanSnapshot, `SELECT `+snapshotCols+` FROM snapshots
		WHERE expires_at <= $1 ORDER BY expires_at, id LIMIT $2`, s.tm(now), store.MaxPageLimit)
	if err != nil {
		return nil, fmt.Errorf("listing expired snapshots: %w", s.classify(err))
	}
	return out, nil
}

// HasSnapshot implements store.Snapshots.
func (s *Store) HasSnapshot(ctx context.Context, id string) (bool, error) {
	var n int
	if err := s.b.Reader().QueryRow(ctx, `SELECT COUNT(*) FROM snapshots WHERE id = $1`, id).Scan(&n); err != nil {
		return false, fmt.Errorf("looking up snapshot %q: %w", id, s.classify(err))
	}
	return n > 0, nil
}
