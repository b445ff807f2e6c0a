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
	"github.com/stockade-sh/stockade/store"
)

func joinWhere(where []string) string { return strings.Join(where, " AND ") }

// CreateExecution implements store.Executions, as the admission its
// fields describe.
func (s *Store) CreateExecution(ctx context.Context, e store.NewExecution) (store.Admission, error) {
	if e.Credits < 0 || e.Credits > maxBalance {
		return store.Admission{}, fmt.Errorf("creating execution: credits %d out of range: %w", e.Credits, errdefs.ErrInvalidArgument)
	}
	st := store.Step{To: store.StatusQueued, Audit: e.Audit}
	if e.Credits > 0 {
		st.Credits = store.CreditMove{Kind: store.LedgerReserve, Amount: e.Credits}
	}
	if a := e.Approval; a != nil {
		st.To, st.Approval = store.StatusAwaitingApproval, store.ApprovalChange{To: store.ApprovalPending, Card: a.Card, ExpiresAt: a.ExpiresAt}
	}
	return s.Admit(ctx, e, st)
}

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
		return store.Admission{}, fmt.Errorf("replaying an execution: no idempotency key: %w", errdefs.ErrNotFound)
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

// replay answers a retried CreateExecution with the execution its
// idempotency key already names.
func (s *Store) replay(ctx context.Context, q Querier, e store.NewExecution, adm *store.Admission) error {
	ex, err := scanExecution(q.QueryRow(ctx, `SELECT `+executionCols+` FROM executions
		WHERE workspace_id = $1 AND idempotency_key = $2`, e.WorkspaceID, e.IdempotencyKey))
	if err != nil {
		return fmt.Errorf("reading the execution of idempotency key %q: %w", e.IdempotencyKey, notFound(err))
	}
	if ex.InputSHA256 != e.InputSHA256 || !sameJSON(ex.Request, e.Request) {
		return fmt.Errorf("idempotency key %q was used for a different request (execution %s): %w",
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
	COALESCE((SELECT r.amount FROM reservations r WHERE r.id = executions.reservation_id), 0)`

func scanExecution(r Row) (store.Execution, error) {
	var (
		ex     store.Execution
		status string
	)
	err := r.Scan(&ex.ID, &ex.WorkspaceID, &ex.KeyID, &status, &ex.Runtime, &ex.Tool, scanJSON(&ex.Request),
		scanJSON(&ex.Result), scanStr(&ex.IdempotencyKey), &ex.InputSHA256, scanStr(&ex.ReservationID),
		scanStr(&ex.ApprovalID), &ex.Driver, scanTime(&ex.CreatedAt), scanTime(&ex.StartedAt), scanTime(&ex.FinishedAt), &ex.Credits)
	ex.Status = store.ExecutionStatus(status)
	return ex, err
}

// lockExecution reads an execution and locks its row for the transaction.
func (s *Store) lockExecution(ctx context.Context, q Querier, id string) (store.Execution, error) {
	ex, err := scanExecution(q.QueryRow(ctx, `SELECT `+executionCols+` FROM executions WHERE id = $1`+s.d.ForUpdate, id))
	if err != nil {
		return ex, fmt.Errorf("execution %q: %w", id, notFound(err))
	}
	return ex, nil
}

// StartExecution implements store.Executions.
func (s *Store) StartExecution(ctx context.Context, executionID, driver string) (store.Execution, error) {
	if err := checkText("driver", driver, maxText); err != nil {
		return store.Execution{}, fmt.Errorf("starting execution %q: %w", executionID, err)
	}
	var ex store.Execution
	err := s.inTx(ctx, func(q Querier) (err error) {
		ex, err = s.lockExecution(ctx, q, executionID)
		if err != nil {
			return err
		}
		if ex.Status != store.StatusQueued {
			return fmt.Errorf("execution is %s, not queued: %w", ex.Status, errdefs.ErrConflict)
		}
		ex.Status, ex.StartedAt, ex.Driver = store.StatusRunning, s.clock(), driver
		if _, err := q.Exec(ctx, `UPDATE executions SET status = $2, started_at = $3, driver = $4 WHERE id = $1`,
			ex.ID, string(ex.Status), s.tm(ex.StartedAt), ex.Driver); err != nil {
			return err
		}
		_, err = q.Exec(ctx, `UPDATE tool_calls SET status = $2, started_at = $3, driver = $4 WHERE execution_id = $1`,
			ex.ID, string(ex.Status), s.tm(ex.StartedAt), ex.Driver)
		return err
	})
	if err != nil {
		return store.Execution{}, fmt.Errorf("starting execution %q: %w", executionID, err)
	}
	return ex, nil
}

// FinishExecution implements store.Executions.
func (s *Store) FinishExecution(ctx context.Context, o store.Outcome) (store.Execution, error) {
	if !o.Status.Terminal() {
		return store.Execution{}, fmt.Errorf("finishing execution %q: %q is not a terminal status: %w",
			o.ExecutionID, o.Status, errdefs.ErrInvalidArgument)
	}
	if err := checkJSON("result", o.Result); err != nil {
		return store.Execution{}, fmt.Errorf("finishing execution %q: %w", o.ExecutionID, err)
	}
	if err := checkText("driver", o.Driver, maxText); err != nil {
		return store.Execution{}, fmt.Errorf("finishing execution %q: %w", o.ExecutionID, err)
	}
	if err := checkEvents(o.Audit); err != nil {
		return store.Execution{}, fmt.Errorf("finishing execution %q: %w", o.ExecutionID, err)
	}
	var ex store.Execution
	err := s.inTx(ctx, func(q Querier) (err error) {
		ex, err = s.lockExecution(ctx, q, o.ExecutionID)
		if err != nil {
			return err
		}
		switch ex.Status {
		case store.StatusQueued, store.StatusRunning:
		case store.StatusAwaitingApproval:
			return fmt.Errorf("execution is awaiting approval; it ends through DecideApproval or ExpireApprovals: %w", errdefs.ErrConflict)
		default:
			return fmt.Errorf("execution already ended %s: %w", ex.Status, errdefs.ErrConflict)
		}
		ex, err = s.endExecution(ctx, q, ex, ending{
			status: o.Status, result: o.Result, exitCode: o.ExitCode,
			stdout: o.Stdout, stderr: o.Stderr, stdoutTrunc: o.StdoutTruncated, stderrTrunc: o.StderrTruncated,
			driver: o.Driver, at: o.FinishedAt,
		})
		if err != nil {
			return err
		}
		_, err = s.appendEvents(ctx, q, ex.WorkspaceID, ex.ID, o.Audit)
		return err
	})
	if err != nil {
		return store.Execution{}, fmt.Errorf("finishing execution %q: %w", o.ExecutionID, err)
	}
	return ex, nil
}

// ending is how an execution ends.
type ending struct {
	status         store.ExecutionStatus
	result         json.RawMessage
	exitCode       *int
	stdout, stderr []byte
	stdoutTrunc    bool
	stderrTrunc    bool
	driver         string
	at             time.Time
	// noResult releases the reservation whatever the status: an execution
	// that produced no result is never charged.
	noResult bool
}

func preview(b []byte, trunc bool) ([]byte, bool) {
	if len(b) > store.PreviewLimit {
		return b[:store.PreviewLimit], true
	}
	if b == nil {
		b = []byte{}
	}
	return b, trunc
}

// endExecution moves a live, locked execution to a terminal status: it
// settles the open reservation (committed only when the execution started
// and the status is charged), completes the tool_calls row and writes the
// tool_invocations row. The caller holds the execution's row lock.
func (s *Store) endExecution(ctx context.Context, q Querier, ex store.Execution, en ending) (store.Execution, error) {
	at := store.TruncateTime(en.at)
	if at.IsZero() {
		at = s.clock()
	}
	started := ex.Status == store.StatusRunning
	var credits int64
	if ex.ReservationID != "" {
		r, err := scanReservation(q.QueryRow(ctx, `SELECT `+reservationCols+` FROM reservations WHERE id = $1`+s.d.ForUpdate,
			ex.ReservationID))
		if err != nil {
			return ex, fmt.Errorf("reservation %q: %w", ex.ReservationID, notFound(err))
		}
		if r.Status == store.ReservationOpen {
			to := store.ReservationReleased
			if started && en.status.Charged() && !en.noResult {
				to = store.ReservationCommitted
			}
			if r, err = s.settle(ctx, q, r.ID, to); err != nil {
				return ex, err
			}
		}
		if r.Status == store.ReservationCommitted {
			credits = r.Amount
		}
	}
	ex.Status, ex.FinishedAt = en.status, at
	if len(en.result) > 0 {
		ex.Result = en.result
	}
	if en.driver != "" {
		ex.Driver = en.driver
	}
	if _, err := q.Exec(ctx, `UPDATE executions SET status = $2, result = $3, finished_at = $4, driver = $5 WHERE id = $1`,
		ex.ID, string(ex.Status), njson(ex.Result), s.tm(at), ex.Driver); err != nil {
		return ex, err
	}
	stdout, stdoutTrunc := preview(en.stdout, en.stdoutTrunc)
	stderr, stderrTrunc := preview(en.stderr, en.stderrTrunc)
	if _, err := q.Exec(ctx, `UPDATE tool_calls SET status = $2, exit_code = $3, stdout_preview = $4, stderr_preview = $5,
		stdout_truncated = $6, stderr_truncated = $7, driver = $8, credits_charged = $9, finished_at = $10
		WHERE execution_id = $1`,
		ex.ID, string(ex.Status), nint(en.exitCode), stdout, stderr, stdoutTrunc, stderrTrunc, ex.Driver, credits, s.tm(at)); err != nil {
		return ex, err
	}
	queued, ran := at.Sub(ex.CreatedAt), time.Duration(0)
	if !ex.StartedAt.IsZero() {
		queued, ran = ex.StartedAt.Sub(ex.CreatedAt), at.Sub(ex.StartedAt)
	}
	invID := newID("inv")
	if _, err := q.Exec(ctx, `INSERT INTO tool_invocations (id, execution_id, workspace_id, tool, runtime, status, driver,
		queued_us, ran_us, credits, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
		invID, ex.ID, ex.WorkspaceID, ex.Tool, ex.Runtime, string(ex.Status), ex.Driver,
		max(queued, 0).Microseconds(), max(ran, 0).Microseconds(), credits, s.tm(at)); err != nil {
		return ex, err
	}
	return ex, s.enqueueInvocation(ctx, q, invID)
}

// GetExecution implements store.Executions.
func (s *Store) GetExecution(ctx context.Context, workspaceID, executionID string) (store.Execution, error) {
	ex, err := scanExecution(lookupRow(ctx, s.b.Reader(), executionID, `SELECT `+executionCols+` FROM executions
		WHERE id = $1 AND workspace_id = $2`, executionID, workspaceID))
	if err != nil {
		return store.Execution{}, fmt.Errorf("getting execution %q: %w", executionID, s.classify(notFound(err)))
	}
	return ex, nil
}

// ListExecutions implements store.Executions.
func (s *Store) ListExecutions(ctx context.Context, workspaceID string, f store.ExecutionFilter) (store.Page[store.Execution], error) {
	return listByTime(ctx, s, "executions", executionCols, scanExecution, workspaceID, f.Statuses, f.Since, f.Until, f.PageRequest,
		func(e store.Execution) cursor { return timeCursor(e.CreatedAt, e.ID) })
}

// listByTime pages through one of a workspace's tables that are listed
// newest first by created_at and filtered by status and time.
func listByTime[T any](ctx context.Context, s *Store, table, cols string, scan func(Row) (T, error), workspaceID string,
	statuses []store.ExecutionStatus, since, until time.Time, pr store.PageRequest, key func(T) cursor) (store.Page[T], error) {
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

// RecoverInterrupted implements store.Executions. Each execution is ended in
// its own transaction, taking row locks in the same order as
// FinishExecution, so that recovery cannot deadlock with a live writer.
func (s *Store) RecoverInterrupted(ctx context.Context, result json.RawMessage, audit func(store.Execution) []store.NewEvent) ([]store.Execution, error) {
	if err := checkJSON("result", result); err != nil {
		return nil, fmt.Errorf("recovering interrupted executions: %w", err)
	}
	ids, err := queryAll(ctx, s.b.Reader(), func(r Row) (string, error) {
		var id string
		return id, r.Scan(&id)
	}, `SELECT id FROM executions WHERE status IN ('queued', 'running') ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("listing interrupted executions: %w", s.classify(err))
	}
	var ended []store.Execution
	for _, id := range ids {
		var ex store.Execution
		err := s.inTx(ctx, func(q Querier) (err error) {
			ex, err = s.lockExecution(ctx, q, id)
			if err != nil {
				return err
			}
			if ex.Status != store.StatusQueued && ex.Status != store.StatusRunning {
				ex = store.Execution{}
				return nil
			}
			ex, err = s.endExecution(ctx, q, ex, ending{status: store.StatusFailed, result: result, noResult: true})
			if err != nil || audit == nil {
				return err
			}
			es := audit(ex)
			if err := checkEvents(es); err != nil {
				return err
			}
			_, err = s.appendEvents(ctx, q, ex.WorkspaceID, ex.ID, es)
			return err
		})
		if err != nil {
			return ended, fmt.Errorf("recovering execution %q: %w", id, err)
		}
		if ex.ID != "" {
			ended = append(ended, ex)
		}
	}
	return ended, nil
}

const toolCallCols = `id, execution_id, workspace_id, tool, runtime, input_sha256, status, exit_code, stdout_preview,
	stderr_preview, stdout_truncated, stderr_truncated, driver, credits_charged, created_at, started_at, finished_at`

func scanToolCall(r Row) (store.ToolCall, error) {
	var (
		tc     store.ToolCall
		status string
	)
	err := r.Scan(&tc.ID, &tc.ExecutionID, &tc.WorkspaceID, &tc.Tool, &tc.Runtime, &tc.InputSHA256, &status,
		scanIntPtr(&tc.ExitCode), &tc.StdoutPreview, &tc.StderrPreview, &tc.StdoutTruncated, &tc.StderrTruncated,
		&tc.Driver, &tc.CreditsCharged, scanTime(&tc.CreatedAt), scanTime(&tc.StartedAt), scanTime(&tc.FinishedAt))
	tc.Status = store.ExecutionStatus(status)
	return tc, err
}

// GetToolCall implements store.Executions.
func (s *Store) GetToolCall(ctx context.Context, workspaceID, executionID string) (store.ToolCall, error) {
	tc, err := scanToolCall(lookupRow(ctx, s.b.Reader(), executionID, `SELECT `+toolCallCols+` FROM tool_calls
		WHERE execution_id = $1 AND workspace_id = $2`, executionID, workspaceID))
	if err != nil {
		return store.ToolCall{}, fmt.Errorf("getting tool call of execution %q: %w", executionID, s.classify(notFound(err)))
	}
	return tc, nil
}

// ListToolCalls implements store.Executions.
func (s *Store) ListToolCalls(ctx context.Context, workspaceID string, f store.ToolCallFilter) (store.Page[store.ToolCall], error) {
	return listByTime(ctx, s, "tool_calls", toolCallCols, scanToolCall, workspaceID, f.Statuses, f.Since, f.Until, f.PageRequest,
		func(t store.ToolCall) cursor { return timeCursor(t.CreatedAt, t.ID) })
}

const toolInvocationCols = `id, execution_id, workspace_id, tool, runtime, status, driver, queued_us, ran_us, credits, created_at`

// ListToolInvocations implements store.Executions.
func (s *Store) ListToolInvocations(ctx context.Context, workspaceID string, f store.ToolCallFilter) (store.Page[store.ToolInvocation], error) {
	return listByTime(ctx, s, "tool_invocations", toolInvocationCols,
		func(r Row) (store.ToolInvocation, error) { return scanToolInvocation(r) }, workspaceID, f.Statuses, f.Since, f.Until, f.PageRequest,
		func(t store.ToolInvocation) cursor { return timeCursor(t.CreatedAt, t.ID) })
}

// scanToolInvocation scans toolInvocationCols, then the columns after them
// into extra.
func scanToolInvocation(r Row, extra ...any) (store.ToolInvocation, error) {
	var (
		ti          store.ToolInvocation
		status      string
		queued, ran int64
	)
	err := r.Scan(append([]any{&ti.ID, &ti.ExecutionID, &ti.WorkspaceID, &ti.Tool, &ti.Runtime, &status, &ti.Driver,
		&queued, &ran, &ti.Credits, scanTime(&ti.CreatedAt)}, extra...)...)
	ti.Status = store.ExecutionStatus(status)
	ti.Queued, ti.Ran = time.Duration(queued)*time.Microsecond, time.Duration(ran)*time.Microsecond
	return ti, err
}
