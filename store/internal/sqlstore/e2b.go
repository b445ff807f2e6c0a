package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/store"
)

// maxE2BMetadata bounds the stored metadata of an E2B sandbox.
const maxE2BMetadata = 64 << 10

var _ store.E2BSandboxes = (*Store)(nil)

const e2bCols = `session_id, workspace_id, key_id, role, template, metadata, envs, on_timeout, end_at, created_at`

func scanE2B(r Row) (store.E2BSandbox, error) {
	var (
		sb         store.E2BSandbox
		meta, envs string
	)
	if err := r.Scan(&sb.SessionID, &sb.WorkspaceID, &sb.KeyID, &sb.Role, &sb.Template, &meta, &envs, &sb.OnTimeout, scanTime(&sb.EndAt), scanTime(&sb.CreatedAt)); err != nil {
		return sb, err
	}
	if err := json.Unmarshal([]byte(meta), &sb.Metadata); err != nil {
		return sb, fmt.Errorf("decoding the metadata of e2b sandbox %q: %w", sb.SessionID, err)
	}
	if err := json.Unmarshal([]byte(envs), &sb.Envs); err != nil {
		return sb, fmt.Errorf("decoding the envs of e2b sandbox %q: %w", sb.SessionID, err)
	}
	return sb, nil
}

// PutE2BSandbox implements store.E2BSandboxes.
func (s *Store) PutE2BSandbox(ctx context.Context, sb store.E2BSandbox) error {
	for _, f := range []struct{ name, v string }{
		{"session id", sb.SessionID}, {"workspace id", sb.WorkspaceID}, {"key id", sb.KeyID}, {"role", sb.Role}, {"template", sb.Template},
	} {
		if err := checkRequired(f.name, f.v, maxText); err != nil {
			return err
		}
	}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	if sb.Envs == nil {
		sb.Envs = map[string]string{}
	}
	switch sb.OnTimeout {
	case "":
		sb.OnTimeout = "kill"
	case "kill", "pause":
	default:
		return errdefs.Publicf("on_timeout %q is not kill or pause: %w", sb.OnTimeout, errdefs.ErrInvalidArgument)
	}
	meta, err := json.Marshal(sb.Metadata)
	if err != nil {
		return fmt.Errorf("encoding e2b metadata: %w", err)
	}
	envs, err := json.Marshal(sb.Envs)
	if err != nil {
		return fmt.Errorf("encoding e2b envs: %w", err)
	}
	if len(meta) > maxE2BMetadata || len(envs) > maxE2BMetadata {
		return errdefs.Publicf("metadata or envs of more than %d bytes: %w", maxE2BMetadata, errdefs.ErrInvalidArgument)
	}
	if sb.EndAt.IsZero() {
		return errdefs.Publicf("an e2b sandbox needs its end: %w", errdefs.ErrInvalidArgument)
	}
	if sb.CreatedAt.IsZero() {
		sb.CreatedAt = s.clock()
	}
	return s.inTx(ctx, func(q Querier) error {
		_, err := q.Exec(ctx, `INSERT INTO e2b_sandboxes (`+e2bCols+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
			sb.SessionID, sb.WorkspaceID, sb.KeyID, sb.Role, sb.Template, string(meta), string(envs), sb.OnTimeout, s.tm(sb.EndAt), s.tm(sb.CreatedAt))
		return err
	})
}

// GetE2BSandbox implements store.E2BSandboxes.
func (s *Store) GetE2BSandbox(ctx context.Context, sessionID string) (store.E2BSandbox, error) {
	sb, err := scanE2B(lookupRow(ctx, s.b.Reader(), sessionID, `SELECT `+e2bCols+` FROM e2b_sandboxes WHERE session_id = $1`, sessionID))
	if errors.Is(err, sql.ErrNoRows) {
		return store.E2BSandbox{}, errdefs.Publicf("sandbox %q not found: %w", sessionID, errdefs.ErrNotFound)
	}
	if err != nil {
		return store.E2BSandbox{}, fmt.Errorf("getting e2b sandbox %q: %w", sessionID, s.classify(err))
	}
	return sb, nil
}

// SetE2BEndAt implements store.E2BSandboxes.
func (s *Store) SetE2BEndAt(ctx context.Context, workspaceID, sessionID string, end time.Time) error {
	if end.IsZero() {
		return errdefs.Publicf("an e2b sandbox needs its end: %w", errdefs.ErrInvalidArgument)
	}
	return s.inTx(ctx, func(q Querier) error {
		n, err := q.Exec(ctx, `UPDATE e2b_sandboxes SET end_at = $1 WHERE session_id = $2 AND workspace_id = $3`, s.tm(end), sessionID, workspaceID)
		if err != nil {
			return err
		}
		if n == 0 {
			return errdefs.Publicf("sandbox %q not found: %w", sessionID, errdefs.ErrNotFound)
		}
		return nil
	})
}

// ListE2BSandboxes implements store.E2BSandboxes.
func (s *Store) ListE2BSandboxes(ctx context.Context, workspaceID string, limit int) ([]store.E2BSandbox, error) {
	if limit <= 0 || limit > 1000 {
		limit = 1000
	}
	return s.e2bRows(ctx, `SELECT `+e2bCols+` FROM e2b_sandboxes WHERE workspace_id = $1 ORDER BY created_at DESC, session_id DESC LIMIT $2`, workspaceID, limit)
}

// DueE2BSandboxes implements store.E2BSandboxes.
func (s *Store) DueE2BSandboxes(ctx context.Context, at time.Time, limit int) ([]store.E2BSandbox, error) {
	if limit <= 0 || limit > 1000 {
		limit = 1000
	}
	return s.e2bRows(ctx, `SELECT `+e2bQualified+` FROM e2b_sandboxes e JOIN sessions s ON s.id = e.session_id
		WHERE e.end_at <= $1 AND s.state = 'active' ORDER BY e.end_at LIMIT $2`, s.tm(at), limit)
}

// e2bQualified is e2bCols qualified by the table's alias e.
const e2bQualified = `e.session_id, e.workspace_id, e.key_id, e.role, e.template, e.metadata, e.envs, e.on_timeout, e.end_at, e.created_at`

func (s *Store) e2bRows(ctx context.Context, query string, args ...any) ([]store.E2BSandbox, error) {
	rows, err := s.b.Reader().Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("listing e2b sandboxes: %w", s.classify(err))
	}
	defer rows.Close()
	var out []store.E2BSandbox
	for rows.Next() {
		sb, err := scanE2B(rows)
		if err != nil {
			return nil, fmt.Errorf("listing e2b sandboxes: %w", s.classify(err))
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing e2b sandboxes: %w", s.classify(err))
	}
	return out, nil
}
