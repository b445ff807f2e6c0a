package sqlstore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

func joinWhere(where []string) string { return strings.Join(where, " AND ") }

// sameJSON reports whether two JSON documents hold the same value; the
// stored form may differ in spacing and key order (PostgreSQL's jsonb).
func sameJSON(a, b []byte) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return bytes.Equal(a, b)
	}
	return reflect.DeepEqual(va, vb)
}

// ReplayExecution implements store.Executions. It reads in one snapshot, so
// that the execution, its reservation and its approval agree.
func (s *Store) ReplayExecution(ctx context.Context, e store.NewExecution) (store.Admission, error) {
	if e.IdempotencyKey == "" {
		return store.Admission{}, errdefs.Publicf("replaying an execution: no idempotency key: %w", errdefs.ErrNotFound)
	}
	if err := checkText("idempotency key", e.IdempotencyKey, maxText); err != nil {
		return store.Admission{}, fmt.Errorf("replaying an execution: %w", err)
	}
	var adm store.Admission
	err := s.b.InSnapshot(ctx, func(q Querier) error {
		adm = store.Admission{}
		return s.replay(ctx, q, e, &adm)
	})
	if err != nil {
		return store.Admission{}, fmt.Errorf("replaying an execution in workspace %q: %w", e.WorkspaceID, s.classify(err))
	}
	return adm, nil
}

// replay answers a retried admission with the execution its
// idempotency key already names.
func (s *Store) replay(ctx context.Context, q Querier, e store.NewExecution, adm *store.Admission) error {
	ex, err := scanExecution(q.QueryRow(ctx, `SELECT `+executionCols+` FROM executions
		WHERE key_id = $1 AND idempotency_key = $2`, e.KeyID, e.IdempotencyKey))
	if err != nil {
		return fmt.Errorf("reading the execution of idempotency key %q: %w", e.IdempotencyKey, notFound(err))
	}
	if ex.InputSHA256 != e.InputSHA256 || !sameJSON(ex.Request, e.Request) {
		return errdefs.Publicf("idempotency key %q was used for a different request (execution %s): %w",
			e.IdempotencyKey, ex.ID, errdefs.ErrConflict)
	}
	adm.Execution, adm.Replayed = ex, true
	if ex.ReservationID != "" {
		r, err := s.getReservation(ctx, q, ex.ReservationID)
		if err != nil {
			return err
		}
		adm.Reservation = &r
	}
	if ex.ApprovalID != "" {
		a, err := scanApproval(q.QueryRow(ctx, `SELECT `+approvalCols+` FROM approval_requests WHERE id = $1`, ex.ApprovalID))
		if err != nil {
			return fmt.Errorf("approval %q: %w", ex.ApprovalID, notFound(err))
		}
		adm.Approval = &a
	}
	return nil
}

// executionCols are an execution's columns, and the amount of its
// reservation.
const executionCols = `id, workspace_id, key_id, status, runtime, tool, request, result, idempotency_key,
	input_sha256, reservation_id, approval_id, driver, created_at, started_at, finished_at,
	COALESCE((SELECT r.amount FROM reservations r WHERE r.id = executions.reservation_id), 0), session_id, COALESCE(cell, 0)`

func scanExecution(r Row) (model.Execution, error) {
	var (
		ex     model.Execution
		status string
	)
	err := r.Scan(&ex.ID, &ex.WorkspaceID, &ex.KeyID, &status, &ex.Runtime, &ex.Tool, scanJSON(&ex.Request),
		scanJSON(&ex.Result), scanStr(&ex.IdempotencyKey), &ex.InputSHA256, scanStr(&ex.ReservationID),
		scanStr(&ex.ApprovalID), &ex.Driver, scanTime(&ex.CreatedAt), scanTime(&ex.StartedAt), scanTime(&ex.FinishedAt), &ex.Credits,
		scanStr(&ex.SessionID), &ex.Cell)
	ex.Status = model.ExecutionStatus(status)
	return ex, err
}

func preview(b []byte, trunc bool) ([]byte, bool) {
	if len(b) > model.PreviewLimit {
		return b[:model.PreviewLimit], true
	}
	if b == nil {
		b = []byte{}
	}
	return b, trunc
}

// GetExecution implements store.Executions.
func (s *Store) GetExecution(ctx context.Context, workspaceID, executionID string) (model.Execution, error) {
	ex, err := scanExecution(lookupRow(ctx, s.b.Reader(), executionID, `SELECT `+executionCols+` FROM executions
		WHERE id = $1 AND workspace_id = $2`, executionID, workspaceID))
	if err != nil {
		return model.Execution{}, s.missing(err, "execution", executionID)
	}
	return ex, nil
}

// ListExecutions implements store.Executions.
func (s *Store) ListExecutions(ctx context.Context, workspaceID string, f store.ExecutionFilter) (store.Page[model.Execution], error) {
	return listByTime(ctx, s, "executions", executionCols, scanExecution, workspaceID, f.Statuses, f.Since, f.Until, f.PageRequest,
		func(e model.Execution) cursor { return timeCursor(e.CreatedAt, e.ID) })
}

// listByTime pages through one of a workspace's tables that are listed
// newest first by created_at and filtered by status and time.
func listByTime[T any](ctx context.Context, s *Store, table, cols string, scan func(Row) (T, error), workspaceID string,
	statuses []model.ExecutionStatus, since, until time.Time, pr store.PageRequest, key func(T) cursor) (store.Page[T], error) {
	var a args
	where := []string{"workspace_id = " + a.add(workspaceID)}
	if len(statuses) > 0 {
		where = append(where, "status IN "+in(&a, statuses))
	}
	s.timeRange(&a, &where, "created_at", since, until)
	tail, n, err := s.timePage(&a, &where, "created_at", pr)
	if err != nil {
		return store.Page[T]{}, fmt.Errorf("listing %s: %w", table, err)
	}
	items, err := queryAll(ctx, s.b.Reader(), scan, `SELECT `+cols+` FROM `+table+` WHERE `+joinWhere(where)+tail, a...)
	if err != nil {
		return store.Page[T]{}, fmt.Errorf("listing %s of workspace %q: %w", table, workspaceID, s.classify(err))
	}
	return finishPage(items, n, key), nil
}

const toolCallCols = `id, execution_id, workspace_id, tool, runtime, input_sha256, status, exit_code, stdout_preview,
	stderr_preview, stdout_truncated, stderr_truncated, driver, credits_charged, created_at, started_at, finished_at`

func scanToolCall(r Row) (model.ToolCall, error) {
	var (
		tc     model.ToolCall
		status string
	)
	err := r.Scan(&tc.ID, &tc.ExecutionID, &tc.WorkspaceID, &tc.Tool, &tc.Runtime, &tc.InputSHA256, &status,
		scanIntPtr(&tc.ExitCode), &tc.StdoutPreview, &tc.StderrPreview, &tc.StdoutTruncated, &tc.StderrTruncated,
		&tc.Driver, &tc.CreditsCharged, scanTime(&tc.CreatedAt), scanTime(&tc.StartedAt), scanTime(&tc.FinishedAt))
	tc.Status = model.ExecutionStatus(status)
	return tc, err
}

// GetToolCall implements store.Executions.
func (s *Store) GetToolCall(ctx context.Context, workspaceID, executionID string) (model.ToolCall, error) {
	tc, err := scanToolCall(lookupRow(ctx, s.b.Reader(), executionID, `SELECT `+toolCallCols+` FROM tool_calls
		WHERE execution_id = $1 AND workspace_id = $2`, executionID, workspaceID))
	if err != nil {
		return model.ToolCall{}, s.missing(err, "tool call of execution", executionID)
	}
	return tc, nil
}

// ListToolCalls implements store.Executions.
func (s *Store) ListToolCalls(ctx context.Context, workspaceID string, f store.ToolCallFilter) (store.Page[model.ToolCall], error) {
	return listByTime(ctx, s, "tool_calls", toolCallCols, scanToolCall, workspaceID, f.Statuses, f.Since, f.Until, f.PageRequest,
		func(t model.ToolCall) cursor { return timeCursor(t.CreatedAt, t.ID) })
}

const toolInvocationCols = `id, execution_id, workspace_id, tool, runtime, status, driver, queued_us, ran_us, credits, created_at`

// ListToolInvocations implements store.Executions.
func (s *Store) ListToolInvocations(ctx context.Context, workspaceID string, f store.ToolCallFilter) (store.Page[model.ToolInvocation], error) {
	return listByTime(ctx, s, "tool_invocations", toolInvocationCols,
		func(r Row) (model.ToolInvocation, error) { return scanToolInvocation(r) }, workspaceID, f.Statuses, f.Since, f.Until, f.PageRequest,
		func(t model.ToolInvocation) cursor { return timeCursor(t.CreatedAt, t.ID) })
}

// scanToolInvocation scans toolInvocationCols, then the columns after them
// into extra.
func scanToolInvocation(r Row, extra ...any) (model.ToolInvocation, error) {
	var (
		ti          model.ToolInvocation
		status      string
		queued, ran int64
	)
	err := r.Scan(append([]any{&ti.ID, &ti.ExecutionID, &ti.WorkspaceID, &ti.Tool, &ti.Runtime, &status, &ti.Driver,
		&queued, &ran, &ti.Credits, scanTime(&ti.CreatedAt)}, extra...)...)
	ti.Status = model.ExecutionStatus(status)
	ti.Queued, ti.Ran = time.Duration(queued)*time.Microsecond, time.Duration(ran)*time.Microsecond
	return ti, err
}
