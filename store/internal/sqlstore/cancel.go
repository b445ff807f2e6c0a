package sqlstore

import (
	"context"
	"fmt"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/store"
)

// CancelExecution implements store.Executions. It locks the approval
// request before the execution, as DecideApproval and ExpireApprovals do,
// so that a cancel racing with a decision or an expiry cannot deadlock
// with it: whichever commits first wins, and the other finds the execution
// no longer awaiting approval.
func (s *Store) CancelExecution(ctx context.Context, c store.Cancellation) (store.Execution, error) {
	if err := checkText("reason", c.Reason, maxReason); err != nil {
		return store.Execution{}, fmt.Errorf("cancelling execution %q: %w", c.ExecutionID, err)
	}
	if err := checkJSON("result", c.Result); err != nil {
		return store.Execution{}, fmt.Errorf("cancelling execution %q: %w", c.ExecutionID, err)
	}
	var ex store.Execution
	err := s.inTx(ctx, func(q Querier) (err error) {
		ex, err = scanExecution(lookupRow(ctx, q, c.ExecutionID, `SELECT `+executionCols+` FROM executions
			WHERE id = $1 AND workspace_id = $2`, c.ExecutionID, c.WorkspaceID))
		if err != nil {
			return notFound(err)
		}
		if err := s.checkCanceller(ctx, q, c, ex); err != nil {
			return err
		}
		var a store.Approval
		if ex.ApprovalID != "" {
			if a, err = scanApproval(q.QueryRow(ctx, `SELECT `+approvalCols+` FROM approval_requests WHERE id = $1`+s.d.ForUpdate,
				ex.ApprovalID)); err != nil {
				return fmt.Errorf("approval %q: %w", ex.ApprovalID, notFound(err))
			}
		}
		if ex, err = s.lockExecution(ctx, q, ex.ID); err != nil {
			return err
		}
		switch to, ok := ex.Status.Cancel(); {
		case !ok:
			return fmt.Errorf("execution already ended %s: %w", ex.Status, errdefs.ErrConflict)
		case to != store.StatusCancelled:
			return fmt.Errorf("execution is %s; only the daemon running it can end it: %w", ex.Status, errdefs.ErrFailedPrecondition)
		}
		if a.Status == store.ApprovalPending {
			if _, err := q.Exec(ctx, `UPDATE approval_requests SET status = $2, reason = $3 WHERE id = $1`,
				a.ID, string(store.ApprovalCancelled), c.Reason); err != nil {
				return err
			}
		}
		var es []store.NewEvent
		if c.Audit != nil {
			es = c.Audit(ex)
			if err := checkEvents(es); err != nil {
				return err
			}
		}
		if ex, err = s.endExecution(ctx, q, ex, ending{status: store.StatusCancelled, result: c.Result}); err != nil {
			return err
		}
		_, err = s.appendEvents(ctx, q, ex.WorkspaceID, ex.ID, es)
		return err
	})
	if err != nil {
		return store.Execution{}, fmt.Errorf("cancelling execution %q: %w", c.ExecutionID, err)
	}
	return ex, nil
}

// checkCanceller enforces, beneath the engine's own checks, that only the
// key that invoked or an active admin key of the workspace cancels.
func (s *Store) checkCanceller(ctx context.Context, q Querier, c store.Cancellation, ex store.Execution) error {
	k, err := scanKey(q.QueryRow(ctx, `SELECT `+keyCols+` FROM api_keys WHERE id = $1`, c.By))
	switch {
	case err != nil && notFound(err) != errdefs.ErrNotFound:
		return err
	case err != nil || k.WorkspaceID != ex.WorkspaceID:
		return fmt.Errorf("cancelling key %q is not a key of workspace %q: %w", c.By, ex.WorkspaceID, errdefs.ErrPermissionDenied)
	case !k.RevokedAt.IsZero():
		return fmt.Errorf("cancelling key %q is revoked: %w", c.By, errdefs.ErrPermissionDenied)
	case k.ID != ex.KeyID && k.Role != store.RoleAdmin:
		return fmt.Errorf("only the key that invoked or an admin key may cancel an execution: %w", errdefs.ErrPermissionDenied)
	}
	return nil
}
