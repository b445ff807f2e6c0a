package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/store"
)

const approvalCols = `id, execution_id, workspace_id, status, card, requested_at, expires_at, decided_by, decided_at, reason`

func scanApproval(r Row) (store.Approval, error) {
	var (
		a      store.Approval
		status string
	)
	err := r.Scan(&a.ID, &a.ExecutionID, &a.WorkspaceID, &status, scanJSON(&a.Card), scanTime(&a.RequestedAt),
		scanTime(&a.ExpiresAt), scanStr(&a.DecidedBy), scanTime(&a.DecidedAt), &a.Reason)
	a.Status = store.ApprovalStatus(status)
	return a, err
}

// GetApproval implements store.Approvals.
func (s *Store) GetApproval(ctx context.Context, workspaceID, approvalID string) (store.Approval, error) {
	a, err := scanApproval(lookupRow(ctx, s.b.Reader(), approvalID, `SELECT `+approvalCols+` FROM approval_requests
		WHERE id = $1 AND workspace_id = $2`, approvalID, workspaceID))
	if err != nil {
		return store.Approval{}, fmt.Errorf("getting approval %q: %w", approvalID, s.classify(notFound(err)))
	}
	return a, nil
}

// ListApprovals implements store.Approvals.
func (s *Store) ListApprovals(ctx context.Context, workspaceID string, f store.ApprovalFilter) (store.Page[store.Approval], error) {
	var a args
	where := []string{"workspace_id = " + a.add(workspaceID)}
	if len(f.Statuses) > 0 {
		where = append(where, "status IN "+in(&a, f.Statuses))
	}
	tail, n, err := s.timePage(&a, &where, "requested_at", f.PageRequest)
	if err != nil {
		return store.Page[store.Approval]{}, fmt.Errorf("listing approvals: %w", err)
	}
	items, err := queryAll(ctx, s.b.Reader(), scanApproval,
		`SELECT `+approvalCols+` FROM approval_requests WHERE `+joinWhere(where)+tail, a...)
	if err != nil {
		return store.Page[store.Approval]{}, fmt.Errorf("listing approvals of workspace %q: %w", workspaceID, s.classify(err))
	}
	return finishPage(items, n, func(a store.Approval) cursor { return timeCursor(a.RequestedAt, a.ID) }), nil
}

// DecideApproval implements store.Approvals.
func (s *Store) DecideApproval(ctx context.Context, d store.Decision) (store.Approval, store.Execution, error) {
	if err := checkText("reason", d.Reason, maxReason); err != nil {
		return store.Approval{}, store.Execution{}, fmt.Errorf("deciding approval %q: %w", d.ApprovalID, err)
	}
	if err := checkEvents(d.Audit); err != nil {
		return store.Approval{}, store.Execution{}, fmt.Errorf("deciding approval %q: %w", d.ApprovalID, err)
	}
	var (
		a  store.Approval
		ex store.Execution
	)
	err := s.inTx(ctx, func(q Querier) (err error) {
		a, err = scanApproval(lookupRow(ctx, q, d.ApprovalID, `SELECT `+approvalCols+` FROM approval_requests
			WHERE id = $1 AND workspace_id = $2`+s.d.ForUpdate, d.ApprovalID, d.WorkspaceID))
		if err != nil {
			return notFound(err)
		}
		if err := s.checkDecider(ctx, q, d); err != nil {
			return err
		}
		now := s.clock()
		switch {
		case a.Status != store.ApprovalPending:
			return fmt.Errorf("approval is already %s: %w", a.Status, errdefs.ErrConflict)
		case !now.Before(a.ExpiresAt):
			return fmt.Errorf("approval expired at %s: %w", a.ExpiresAt.Format(time.RFC3339), errdefs.ErrConflict)
		}
		a.Status, a.DecidedBy, a.DecidedAt, a.Reason = store.ApprovalDenied, d.DecidedBy, now, d.Reason
		if d.Approve {
			a.Status = store.ApprovalApproved
		}
		if _, err := q.Exec(ctx, `UPDATE approval_requests SET status = $2, decided_by = $3, decided_at = $4, reason = $5
			WHERE id = $1`, a.ID, string(a.Status), a.DecidedBy, s.tm(a.DecidedAt), a.Reason); err != nil {
			return err
		}
		if ex, err = s.lockExecution(ctx, q, a.ExecutionID); err != nil {
			return err
		}
		if ex.Status != store.StatusAwaitingApproval {
			return fmt.Errorf("execution %s is %s, not awaiting approval: %w", ex.ID, ex.Status, errdefs.ErrConflict)
		}
		if ex.KeyID == d.DecidedBy {
			return fmt.Errorf("the key that invoked cannot decide its own approval: %w", errdefs.ErrPermissionDenied)
		}
		if d.Approve {
			ex.Status = store.StatusQueued
			if _, err := q.Exec(ctx, `UPDATE executions SET status = $2 WHERE id = $1`, ex.ID, string(ex.Status)); err != nil {
				return err
			}
			if _, err := q.Exec(ctx, `UPDATE tool_calls SET status = $2 WHERE execution_id = $1`, ex.ID, string(ex.Status)); err != nil {
				return err
			}
		} else if ex, err = s.endExecution(ctx, q, ex, ending{status: store.StatusDenied, at: now}); err != nil {
			return err
		}
		_, err = s.appendEvents(ctx, q, ex.WorkspaceID, ex.ID, d.Audit)
		return err
	})
	if err != nil {
		return store.Approval{}, store.Execution{}, fmt.Errorf("deciding approval %q: %w", d.ApprovalID, err)
	}
	return a, ex, nil
}

// checkDecider enforces, beneath the API's own checks, that only an active
// approver or admin key of the workspace decides.
func (s *Store) checkDecider(ctx context.Context, q Querier, d store.Decision) error {
	k, err := scanKey(q.QueryRow(ctx, `SELECT `+keyCols+` FROM api_keys WHERE id = $1`, d.DecidedBy))
	switch {
	case err != nil && notFound(err) != errdefs.ErrNotFound:
		return err
	case err != nil || k.WorkspaceID != d.WorkspaceID:
		return fmt.Errorf("deciding key %q is not a key of workspace %q: %w", d.DecidedBy, d.WorkspaceID, errdefs.ErrPermissionDenied)
	case !k.RevokedAt.IsZero():
		return fmt.Errorf("deciding key %q is revoked: %w", d.DecidedBy, errdefs.ErrPermissionDenied)
	case k.Role != store.RoleApprover && k.Role != store.RoleAdmin:
		return fmt.Errorf("a key with role %s cannot decide approvals: %w", k.Role, errdefs.ErrPermissionDenied)
	}
	return nil
}

// ExpireApprovals implements store.Approvals. Each approval expires in its
// own transaction, locking the approval before its execution as
// DecideApproval does, and appending its events last, as every writer does.
func (s *Store) ExpireApprovals(ctx context.Context, now time.Time, audit func(store.Approval) []store.NewEvent) ([]store.Approval, error) {
	now = store.TruncateTime(now)
	ids, err := queryAll(ctx, s.b.Reader(), func(r Row) (string, error) {
		var id string
		return id, r.Scan(&id)
	}, `SELECT id FROM approval_requests WHERE status = 'pending' AND expires_at <= $1 ORDER BY expires_at, id`, s.tm(now))
	if err != nil {
		return nil, fmt.Errorf("listing expired approvals: %w", s.classify(err))
	}
	var expired []store.Approval
	for _, id := range ids {
		var a store.Approval
		err := s.inTx(ctx, func(q Querier) (err error) {
			a, err = scanApproval(q.QueryRow(ctx, `SELECT `+approvalCols+` FROM approval_requests WHERE id = $1`+s.d.ForUpdate, id))
			if err != nil {
				return notFound(err)
			}
			if a.Status != store.ApprovalPending || a.ExpiresAt.After(now) {
				a = store.Approval{}
				return nil
			}
			a.Status, a.Reason = store.ApprovalExpired, "expired without a decision"
			if _, err := q.Exec(ctx, `UPDATE approval_requests SET status = $2, reason = $3 WHERE id = $1`,
				a.ID, string(a.Status), a.Reason); err != nil {
				return err
			}
			ex, err := s.lockExecution(ctx, q, a.ExecutionID)
			if err != nil {
				return err
			}
			if ex.Status == store.StatusAwaitingApproval {
				if _, err := s.endExecution(ctx, q, ex, ending{status: store.StatusApprovalExpired, at: now}); err != nil {
					return err
				}
			}
			if audit == nil {
				return nil
			}
			es := audit(a)
			if err := checkEvents(es); err != nil {
				return err
			}
			_, err = s.appendEvents(ctx, q, a.WorkspaceID, a.ExecutionID, es)
			return err
		})
		if err != nil {
			return expired, fmt.Errorf("expiring approval %q: %w", id, err)
		}
		if a.ID != "" {
			expired = append(expired, a)
		}
	}
	return expired, nil
}
