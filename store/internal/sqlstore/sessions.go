package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// maxSessions bounds a policy's MaxSessions.
const maxSessions = 1 << 20

const sessionCols = `id, workspace_id, key_id, tool, runtime, driver, sandbox_id, network, state, end_reason,
	approval, approval_id, approved_by, idle_timeout_ms, workspace_bytes, cells, idempotency_key, request_sha256,
	created_at, expires_at, last_active_at, ended_at, paused_at, checkpoint_bytes, end_detail`

func scanSession(r Row) (model.Session, error) {
	var (
		ss                      model.Session
		state, reason, approval string
		idleMS                  int64
	)
	err := r.Scan(&ss.ID, &ss.WorkspaceID, &ss.KeyID, &ss.Tool, &ss.Runtime, &ss.Driver, &ss.SandboxID, &ss.Network,
		&state, scanStr(&reason), &approval, scanStr(&ss.ApprovalID), scanStr(&ss.ApprovedBy), &idleMS, &ss.WorkspaceBytes,
		&ss.Cells, scanStr(&ss.IdempotencyKey), &ss.RequestSHA256, scanTime(&ss.CreatedAt), scanTime(&ss.ExpiresAt),
		scanTime(&ss.LastActiveAt), scanTime(&ss.EndedAt), scanTime(&ss.PausedAt), &ss.CheckpointBytes, &ss.EndDetail)
	ss.State, ss.EndReason, ss.Approval = model.SessionState(state), model.SessionEndReason(reason), model.ApprovalMode(approval)
	ss.IdleTimeout = time.Duration(idleMS) * time.Millisecond
	return ss, err
}

// checkNewSession checks the record of a session to open.
func checkNewSession(n store.NewSession) error {
	for _, f := range []struct{ name, v string }{
		{"session id", n.ID}, {"workspace id", n.WorkspaceID}, {"key id", n.KeyID}, {"tool", n.Tool},
		{"runtime", n.Runtime}, {"driver", n.Driver}, {"sandbox id", n.SandboxID},
	} {
		if err := checkRequired(f.name, f.v, maxText); err != nil {
			return err
		}
	}
	if err := checkText("idempotency key", n.IdempotencyKey, maxText); err != nil {
		return err
	}
	if err := checkSHA256Hex("request sha256", n.RequestSHA256); err != nil {
		return err
	}
	switch {
	case n.Approval != model.ApprovalRequired && n.Approval != model.ApprovalNone && n.Approval != model.ApprovalPerSession:
		return errdefs.Publicf("approval mode %q: %w", n.Approval, errdefs.ErrInvalidArgument)
	case n.ApprovalID != "" && n.Approval != model.ApprovalPerSession:
		return errdefs.Publicf("an approval covers a new session only under per_session, not %q: %w", n.Approval, errdefs.ErrInvalidArgument)
	case n.IdleTimeout < time.Millisecond:
		return errdefs.Publicf("idle timeout %v: must be at least 1ms: %w", n.IdleTimeout, errdefs.ErrInvalidArgument)
	case n.ExpiresAt.IsZero():
		return errdefs.Publicf("a session needs its expiry: %w", errdefs.ErrInvalidArgument)
	case n.WorkspaceBytes < 0 || n.MaxLive < 0:
		return errdefs.Publicf("negative workspace size or session bound: %w", errdefs.ErrInvalidArgument)
	}
	if err := checkText("approval id", n.ApprovalID, maxText); err != nil {
		return err
	}
	return checkEvents(n.Audit)
}

// OpenSession implements store.Sessions.
func (s *Store) OpenSession(ctx context.Context, n store.NewSession) (model.Session, bool, error) {
	if err := checkNewSession(n); err != nil {
		return model.Session{}, false, fmt.Errorf("opening a session: %w", err)
	}
	var (
		ss       model.Session
		replayed bool
	)
	err := s.inTx(ctx, func(q Querier) error {
		replayed = false
		var keyWS string
		if err := q.QueryRow(ctx, `SELECT workspace_id FROM api_keys WHERE id = $1`, n.KeyID).Scan(&keyWS); err != nil || keyWS != n.WorkspaceID {
			if err != nil && notFound(err) != errdefs.ErrNotFound {
				return err
			}
			return errdefs.Publicf("key %q does not belong to workspace %q: %w", n.KeyID, n.WorkspaceID, errdefs.ErrInvalidArgument)
		}
		if n.IdempotencyKey != "" {
			prev, err := scanSession(q.QueryRow(ctx, `SELECT `+sessionCols+` FROM sessions WHERE key_id = $1 AND idempotency_key = $2`,
				n.KeyID, n.IdempotencyKey))
			if err == nil {
				if prev.RequestSHA256 != n.RequestSHA256 {
					return errdefs.Publicf("idempotency key %q was used for a different request (session %s): %w", n.IdempotencyKey, prev.ID, errdefs.ErrConflict)
				}
				ss, replayed = prev, true
				return nil
			}
			if notFound(err) != errdefs.ErrNotFound {
				return err
			}
		}
		if n.MaxLive > 0 {
			// The workspace's row is locked first, so that two openings in
			// one workspace count one after the other (PostgreSQL; SQLite
			// has one writer).
			if _, err := q.Exec(ctx, `SELECT id FROM workspaces WHERE id = $1`+s.d.ForUpdate, n.WorkspaceID); err != nil {
				return err
			}
			var live int
			if err := q.QueryRow(ctx, `SELECT COUNT(*) FROM sessions WHERE workspace_id = $1 AND state <> 'ended'`, n.WorkspaceID).Scan(&live); err != nil {
				return err
			}
			if live >= n.MaxLive {
				return errdefs.Publicf("workspace %q has %d live sessions, its most: %w", n.WorkspaceID, live, errdefs.ErrResourceExhausted)
			}
		}
		var approvedBy string
		if n.ApprovalID != "" {
			var ws, status string
			err := q.QueryRow(ctx, `SELECT workspace_id, status, decided_by FROM approval_requests WHERE id = $1`, n.ApprovalID).
				Scan(&ws, &status, scanStr(&approvedBy))
			if err != nil && notFound(err) != errdefs.ErrNotFound {
				return err
			}
			if err != nil || ws != n.WorkspaceID || status != string(model.ApprovalApproved) || approvedBy == "" {
				return errdefs.Publicf("approval %q is not an approved approval of workspace %q: %w", n.ApprovalID, n.WorkspaceID, errdefs.ErrInvalidArgument)
			}
		}
		now := s.at(n.At)
		ss = model.Session{
			ID: n.ID, WorkspaceID: n.WorkspaceID, KeyID: n.KeyID, Tool: n.Tool, Runtime: n.Runtime, Driver: n.Driver,
			SandboxID: n.SandboxID, Network: n.Network, State: model.SessionActive, Approval: n.Approval,
			ApprovalID: n.ApprovalID, ApprovedBy: approvedBy,
			IdleTimeout: n.IdleTimeout.Truncate(time.Millisecond), CreatedAt: now, ExpiresAt: store.TruncateTime(n.ExpiresAt),
			LastActiveAt: now, WorkspaceBytes: n.WorkspaceBytes, IdempotencyKey: n.IdempotencyKey, RequestSHA256: n.RequestSHA256,
		}
		if _, err := q.Exec(ctx, `INSERT INTO sessions (id, workspace_id, key_id, tool, runtime, driver, sandbox_id, network,
			state, approval, idle_timeout_ms, workspace_bytes, cells, idempotency_key, request_sha256, created_at, expires_at,
			last_active_at, approval_id, approved_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 0, $13, $14,
			$15, $16, $17, $18, $19)`,
			ss.ID, ss.WorkspaceID, ss.KeyID, ss.Tool, ss.Runtime, ss.Driver, ss.SandboxID, ss.Network, string(ss.State),
			string(ss.Approval), ss.IdleTimeout.Milliseconds(), ss.WorkspaceBytes, nstr(ss.IdempotencyKey), ss.RequestSHA256,
			s.tm(ss.CreatedAt), s.tm(ss.ExpiresAt), s.tm(ss.LastActiveAt), nstr(ss.ApprovalID), nstr(ss.ApprovedBy)); err != nil {
			return err
		}
		_, err := s.appendEvents(ctx, q, ss.WorkspaceID, "", n.Audit)
		return err
	})
	if err != nil {
		return model.Session{}, false, fmt.Errorf("opening session %q in workspace %q: %w", n.ID, n.WorkspaceID, err)
	}
	return ss, replayed, nil
}

// EndSession implements store.Sessions.
func (s *Store) EndSession(ctx context.Context, id string, e store.SessionEnd) (model.Session, error) {
	if !e.Reason.Valid() {
		return model.Session{}, errdefs.Publicf("ending session %q: reason %q: %w", id, e.Reason, errdefs.ErrInvalidArgument)
	}
	if err := checkText("end detail", e.Detail, maxReason); err != nil {
		return model.Session{}, fmt.Errorf("ending session %q: %w", id, err)
	}
	if err := checkEvents(e.Audit); err != nil {
		return model.Session{}, fmt.Errorf("ending session %q: %w", id, err)
	}
	var ss model.Session
	err := s.inTx(ctx, func(q Querier) (err error) {
		if ss, err = scanSession(lookupRow(ctx, q, id, `SELECT `+sessionCols+` FROM sessions WHERE id = $1`+s.d.ForUpdate, id)); err != nil {
			return notFound(err)
		}
		if ss.State == model.SessionEnded {
			return errdefs.Publicf("session ended (%s) at %s: %w", ss.EndReason, ss.EndedAt.Format(time.RFC3339), errdefs.ErrConflict)
		}
		ss.State, ss.EndReason, ss.EndDetail, ss.EndedAt, ss.PausedAt, ss.CheckpointBytes = model.SessionEnded, e.Reason, e.Detail, s.at(e.At), time.Time{}, 0
		n, err := q.Exec(ctx, `UPDATE sessions SET state = 'ended', end_reason = $2, end_detail = $3, ended_at = $4, paused_at = NULL, checkpoint_bytes = 0
			WHERE id = $1 AND state <> 'ended'`, id, string(ss.EndReason), ss.EndDetail, s.tm(ss.EndedAt))
		if err != nil {
			return err
		}
		if n != 1 {
			return errdefs.Publicf("session ended meanwhile: %w", errdefs.ErrConflict)
		}
		_, err = s.appendEvents(ctx, q, ss.WorkspaceID, "", e.Audit)
		return err
	})
	if err != nil {
		return model.Session{}, fmt.Errorf("ending session %q: %w", id, err)
	}
	return ss, nil
}

// PauseSession implements store.Sessions.
func (s *Store) PauseSession(ctx context.Context, id string, p store.SessionPause) (model.Session, error) {
	if p.CheckpointBytes < 0 {
		return model.Session{}, errdefs.Publicf("pausing session %q: checkpoint bytes %d: %w", id, p.CheckpointBytes, errdefs.ErrInvalidArgument)
	}
	if err := checkEvents(p.Audit); err != nil {
		return model.Session{}, fmt.Errorf("pausing session %q: %w", id, err)
	}
	var ss model.Session
	err := s.inTx(ctx, func(q Querier) (err error) {
		if ss, err = scanSession(lookupRow(ctx, q, id, `SELECT `+sessionCols+` FROM sessions WHERE id = $1`+s.d.ForUpdate, id)); err != nil {
			return notFound(err)
		}
		if ss.State != model.SessionActive {
			return errdefs.Publicf("session is %s: %w", ss.State, errdefs.ErrConflict)
		}
		if busy, err := s.pendingCell(ctx, q, id); err != nil {
			return err
		} else if busy != "" {
			return errdefs.Publicf("session is busy: cell execution %s has not ended: %w", busy, errdefs.ErrConflict)
		}
		ss.State, ss.PausedAt, ss.CheckpointBytes = model.SessionPaused, s.at(p.At), p.CheckpointBytes
		if _, err := q.Exec(ctx, `UPDATE sessions SET state = 'paused', paused_at = $2, checkpoint_bytes = $3 WHERE id = $1`,
			id, s.tm(ss.PausedAt), ss.CheckpointBytes); err != nil {
			return err
		}
		_, err = s.appendEvents(ctx, q, ss.WorkspaceID, "", p.Audit)
		return err
	})
	if err != nil {
		return model.Session{}, fmt.Errorf("pausing session %q: %w", id, err)
	}
	return ss, nil
}

// ResumeSession implements store.Sessions.
func (s *Store) ResumeSession(ctx context.Context, id string, r store.SessionResume) (model.Session, error) {
	if err := checkRequired("sandbox id", r.SandboxID, maxText); err != nil {
		return model.Session{}, fmt.Errorf("resuming session %q: %w", id, err)
	}
	if err := checkEvents(r.Audit); err != nil {
		return model.Session{}, fmt.Errorf("resuming session %q: %w", id, err)
	}
	var ss model.Session
	err := s.inTx(ctx, func(q Querier) (err error) {
		if ss, err = scanSession(lookupRow(ctx, q, id, `SELECT `+sessionCols+` FROM sessions WHERE id = $1`+s.d.ForUpdate, id)); err != nil {
			return notFound(err)
		}
		if ss.State != model.SessionPaused {
			return errdefs.Publicf("session is %s: %w", ss.State, errdefs.ErrConflict)
		}
		at := s.at(r.At)
		ss.State, ss.SandboxID, ss.PausedAt, ss.CheckpointBytes = model.SessionActive, r.SandboxID, time.Time{}, 0
		if at.After(ss.LastActiveAt) {
			ss.LastActiveAt = at
		}
		if _, err := q.Exec(ctx, `UPDATE sessions SET state = 'active', sandbox_id = $2, paused_at = NULL, checkpoint_bytes = 0,
			last_active_at = $3 WHERE id = $1`, id, ss.SandboxID, s.tm(ss.LastActiveAt)); err != nil {
			return err
		}
		_, err = s.appendEvents(ctx, q, ss.WorkspaceID, "", r.Audit)
		return err
	})
	if err != nil {
		return model.Session{}, fmt.Errorf("resuming session %q: %w", id, err)
	}
	return ss, nil
}

// PendingCell implements store.Sessions.
func (s *Store) PendingCell(ctx context.Context, sessionID string) (string, error) {
	id, err := s.pendingCell(ctx, s.b.Reader(), sessionID)
	if err != nil {
		return "", fmt.Errorf("looking up the pending cell of session %q: %w", sessionID, s.classify(err))
	}
	return id, nil
}

// pendingCell returns the id of session id's cell that has not ended, or
// "" when it has none.
func (s *Store) pendingCell(ctx context.Context, q Querier, id string) (string, error) {
	var busy string
	err := q.QueryRow(ctx, `SELECT id FROM executions WHERE session_id = $1 AND status IN ('awaiting_approval', 'queued', 'running')`, id).Scan(&busy)
	if notFound(err) == errdefs.ErrNotFound {
		return "", nil
	}
	return busy, err
}

// admitCell makes ex, whose record e names a session, that session's next
// cell: the session must be the workspace's and active, and have no cell
// that has not ended. A retry of a cell already admitted (its idempotency
// key) is answered with the first one instead, and replayed is set.
func (s *Store) admitCell(ctx context.Context, q Querier, e store.NewExecution, ex *model.Execution, now time.Time, adm *store.Admission) (replayed bool, err error) {
	ss, err := scanSession(lookupRow(ctx, q, e.SessionID, `SELECT `+sessionCols+` FROM sessions WHERE id = $1`+s.d.ForUpdate, e.SessionID))
	if err != nil || ss.WorkspaceID != e.WorkspaceID {
		if err == nil || notFound(err) == errdefs.ErrNotFound {
			return false, errdefs.Publicf("session %q not found: %w", e.SessionID, errdefs.ErrNotFound)
		}
		return false, err
	}
	if e.IdempotencyKey != "" {
		var prev string
		err := q.QueryRow(ctx, `SELECT id FROM executions WHERE key_id = $1 AND idempotency_key = $2`, e.KeyID, e.IdempotencyKey).Scan(&prev)
		if err == nil {
			return true, s.replay(ctx, q, e, adm)
		}
		if notFound(err) != errdefs.ErrNotFound {
			return false, err
		}
	}
	switch ss.State {
	case model.SessionPaused:
		return false, errdefs.Publicf("session %s is paused; resume it: %w", ss.ID, errdefs.ErrFailedPrecondition)
	case model.SessionEnded:
		return false, errdefs.Publicf("session %s ended (%s) at %s: %w", ss.ID, ss.EndReason, ss.EndedAt.Format(time.RFC3339), errdefs.ErrFailedPrecondition)
	}
	if busy, err := s.pendingCell(ctx, q, ss.ID); err != nil {
		return false, err
	} else if busy != "" {
		return false, errdefs.Publicf("session %s is busy: cell execution %s has not ended: %w", ss.ID, busy, errdefs.ErrConflict)
	}
	ex.SessionID, ex.Cell = ss.ID, ss.Cells+1
	_, err = q.Exec(ctx, `UPDATE sessions SET cells = $2, last_active_at = $3 WHERE id = $1`, ss.ID, ex.Cell, s.tm(now))
	return false, err
}

// touchSession records, for a step of a cell, the session's activity and,
// when the step says so, the approval that now covers it.
func (s *Store) touchSession(ctx context.Context, q Querier, ex model.Execution, st model.Step, at time.Time) error {
	if ex.SessionID == "" {
		if st.CoverSession {
			return errdefs.Publicf("execution %s is no cell of a session to cover: %w", ex.ID, errdefs.ErrInvalidArgument)
		}
		return nil
	}
	if _, err := q.Exec(ctx, `UPDATE sessions SET last_active_at = $2 WHERE id = $1 AND last_active_at < $2`, ex.SessionID, s.tm(at)); err != nil {
		return err
	}
	if !st.CoverSession {
		return nil
	}
	_, err := q.Exec(ctx, `UPDATE sessions SET approval_id = $2, approved_by = $3 WHERE id = $1 AND approval_id IS NULL`,
		ex.SessionID, ex.ApprovalID, st.Approval.DecidedBy)
	return err
}

// GetSession implements store.Sessions.
func (s *Store) GetSession(ctx context.Context, workspaceID, id string) (model.Session, error) {
	ss, err := scanSession(lookupRow(ctx, s.b.Reader(), id, `SELECT `+sessionCols+` FROM sessions WHERE id = $1 AND workspace_id = $2`, id, workspaceID))
	if errors.Is(err, sql.ErrNoRows) {
		// Another workspace's session is not found either.
		return model.Session{}, errdefs.Publicf("session %q not found in the workspace: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return model.Session{}, fmt.Errorf("getting session %q: %w", id, s.classify(err))
	}
	return ss, nil
}

// ReplaySession implements store.Sessions.
func (s *Store) ReplaySession(ctx context.Context, keyID, key string) (model.Session, error) {
	if key == "" {
		return model.Session{}, errdefs.Publicf("replaying a session: no idempotency key: %w", errdefs.ErrNotFound)
	}
	ss, err := scanSession(lookupRow(ctx, s.b.Reader(), key, `SELECT `+sessionCols+` FROM sessions WHERE key_id = $1 AND idempotency_key = $2`,
		keyID, key))
	if err != nil {
		return model.Session{}, fmt.Errorf("replaying the session of idempotency key %q: %w", key, s.classify(notFound(err)))
	}
	return ss, nil
}

// ListSessions implements store.Sessions.
func (s *Store) ListSessions(ctx context.Context, workspaceID string, f store.SessionFilter) (store.Page[model.Session], error) {
	var a args
	where := []string{"workspace_id = " + a.add(workspaceID)}
	if len(f.States) > 0 {
		where = append(where, "state IN "+in(&a, f.States))
	}
	tail, n, err := s.timePage(&a, &where, "created_at", f.PageRequest)
	if err != nil {
		return store.Page[model.Session]{}, fmt.Errorf("listing sessions: %w", err)
	}
	items, err := queryAll(ctx, s.b.Reader(), scanSession, `SELECT `+sessionCols+` FROM sessions WHERE `+joinWhere(where)+tail, a...)
	if err != nil {
		return store.Page[model.Session]{}, fmt.Errorf("listing sessions of workspace %q: %w", workspaceID, s.classify(err))
	}
	return finishPage(items, n, func(ss model.Session) cursor { return timeCursor(ss.CreatedAt, ss.ID) }), nil
}

// ListActiveSessions implements store.Sessions.
func (s *Store) ListActiveSessions(ctx context.Context) ([]model.Session, error) {
	out, err := queryAll(ctx, s.b.Reader(), scanSession, `SELECT `+sessionCols+` FROM sessions WHERE state = 'active' ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("listing active sessions: %w", s.classify(err))
	}
	return out, nil
}

// ListPausedSessions implements store.Sessions.
func (s *Store) ListPausedSessions(ctx context.Context) ([]model.Session, error) {
	out, err := queryAll(ctx, s.b.Reader(), scanSession, `SELECT `+sessionCols+` FROM sessions WHERE state = 'paused' ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("listing paused sessions: %w", s.classify(err))
	}
	return out, nil
}

// CheckpointBytes implements store.Sessions.
func (s *Store) CheckpointBytes(ctx context.Context, workspaceID string) (int64, int, error) {
	var (
		bytes int64
		n     int
	)
	if err := s.b.Reader().QueryRow(ctx, `SELECT CAST(COALESCE(SUM(checkpoint_bytes), 0) AS BIGINT)
		+ (SELECT CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM snapshots WHERE workspace_id = $1), COUNT(*)
		FROM sessions WHERE workspace_id = $1 AND state = 'paused'`,
		workspaceID).Scan(&bytes, &n); err != nil {
		return 0, 0, fmt.Errorf("summing the checkpoints of workspace %q: %w", workspaceID, s.classify(err))
	}
	return bytes, n, nil
}

// CountActiveSessions implements store.Sessions.
func (s *Store) CountActiveSessions(ctx context.Context, workspaceID string) (int, error) {
	var n int
	if err := s.b.Reader().QueryRow(ctx, `SELECT COUNT(*) FROM sessions WHERE workspace_id = $1 AND state <> 'ended'`, workspaceID).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting the active sessions of workspace %q: %w", workspaceID, s.classify(err))
	}
	return n, nil
}

// ncell converts a cell number; 0 (no session) is NULL.
func ncell(n int) any {
	if n == 0 {
		return nil
	}
	return int64(n)
}
