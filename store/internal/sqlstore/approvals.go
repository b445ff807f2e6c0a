package sqlstore

import (
	"context"
	"fmt"

	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

const approvalCols = `id, execution_id, workspace_id, status, card, requested_at, expires_at, decided_by, decided_at, reason`

func scanApproval(r Row) (model.Approval, error) {
	var (
		a      model.Approval
		status string
	)
	err := r.Scan(&a.ID, &a.ExecutionID, &a.WorkspaceID, &status, scanJSON(&a.Card), scanTime(&a.RequestedAt),
		scanTime(&a.ExpiresAt), scanStr(&a.DecidedBy), scanTime(&a.DecidedAt), &a.Reason)
	a.Status = model.ApprovalStatus(status)
	return a, err
}

// GetApproval implements store.Approvals.
func (s *Store) GetApproval(ctx context.Context, workspaceID, approvalID string) (model.Approval, error) {
	a, err := scanApproval(lookupRow(ctx, s.b.Reader(), approvalID, `SELECT `+approvalCols+` FROM approval_requests
		WHERE id = $1 AND workspace_id = $2`, approvalID, workspaceID))
	if err != nil {
		return model.Approval{}, s.missing(err, "approval", approvalID)
	}
	return a, nil
}

// ListApprovals implements store.Approvals.
func (s *Store) ListApprovals(ctx context.Context, workspaceID string, f store.ApprovalFilter) (store.Page[model.Approval], error) {
	var a args
	where := []string{"workspace_id = " + a.add(workspaceID)}
	if len(f.Statuses) > 0 {
		where = append(where, "status IN "+in(&a, f.Statuses))
	}
	tail, n, err := s.timePage(&a, &where, "requested_at", f.PageRequest)
	if err != nil {
		return store.Page[model.Approval]{}, fmt.Errorf("listing approvals: %w", err)
	}
	items, err := queryAll(ctx, s.b.Reader(), scanApproval,
		`SELECT `+approvalCols+` FROM approval_requests WHERE `+joinWhere(where)+tail, a...)
	if err != nil {
		return store.Page[model.Approval]{}, fmt.Errorf("listing approvals of workspace %q: %w", workspaceID, s.classify(err))
	}
	return finishPage(items, n, func(a model.Approval) cursor { return timeCursor(a.RequestedAt, a.ID) }), nil
}
