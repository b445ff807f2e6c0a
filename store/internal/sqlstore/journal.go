package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// checkRecord checks the record of an execution to admit.
func checkRecord(e store.NewExecution) error {
	for _, f := range []struct{ name, v string }{
		{"workspace id", e.WorkspaceID}, {"key id", e.KeyID}, {"runtime", e.Runtime}, {"tool", e.Tool},
	} {
		if err := checkRequired(f.name, f.v, maxText); err != nil {
			return err
		}
	}
	if err := checkText("execution id", e.ID, maxText); err != nil {
		return err
	}
	if err := checkText("idempotency key", e.IdempotencyKey, maxText); err != nil {
		return err
	}
	if err := checkText("session id", e.SessionID, maxText); err != nil {
		return err
	}
	if len(e.Request) == 0 {
		return fmt.Errorf("request is required: %w", errdefs.ErrInvalidArgument)
	}
	if err := checkJSON("request", e.Request); err != nil {
		return err
	}
	return checkSHA256Hex("input sha256", e.InputSHA256)
}

// checkStep checks what every step must be, admission or not.
func checkStep(s model.Step) error {
	switch {
	case !s.To.Valid():
		return fmt.Errorf("step to %q: not a status: %w", s.To, errdefs.ErrInvalidArgument)
	case (s.Invocation != nil) != s.To.Terminal():
		return fmt.Errorf("step to %s: a tool_invocations row goes with an end, and only with one: %w", s.To, errdefs.ErrInvalidArgument)
	case s.Invocation != nil && s.Invocation.Status != s.To:
		return fmt.Errorf("step to %s with a tool_invocations row of status %s: %w", s.To, s.Invocation.Status, errdefs.ErrInvalidArgument)
	case s.Invocation != nil && (s.Invocation.Queued < 0 || s.Invocation.Ran < 0):
		return fmt.Errorf("step to %s: negative durations in its tool_invocations row: %w", s.To, errdefs.ErrInvalidArgument)
	case s.To == model.StatusRunning && s.Driver == "":
		return fmt.Errorf("a start needs the driver it runs on: %w", errdefs.ErrInvalidArgument)
	}
	if err := checkText("driver", s.Driver, maxText); err != nil {
		return err
	}
	if err := checkJSON("result", s.Result); err != nil {
		return err
	}
	if err := checkText("reason", s.Approval.Reason, maxReason); err != nil {
		return err
	}
	if err := checkText("deciding key", s.Approval.DecidedBy, maxText); err != nil {
		return err
	}
	return checkEvents(s.Audit)
}

// checkAdmission checks the first step of an execution.
func checkAdmission(s model.Step) error {
	if err := checkStep(s); err != nil {
		return err
	}
	waits := s.To == model.StatusAwaitingApproval
	switch {
	case s.To != model.StatusQueued && !waits:
		return fmt.Errorf("an admission to %s: an execution starts queued or awaiting approval: %w", s.To, errdefs.ErrInvalidArgument)
	case waits != (s.Approval.To == model.ApprovalPending):
		return fmt.Errorf("an admission to %s with approval change %q: a request awaits approval exactly when it has one pending: %w",
			s.To, s.Approval.To, errdefs.ErrInvalidArgument)
	case s.Credits.Kind != "" && s.Credits.Kind != model.LedgerReserve:
		return fmt.Errorf("an admission can only reserve credits, not %s them: %w", s.Credits.Kind, errdefs.ErrInvalidArgument)
	case s.Credits.Kind == model.LedgerReserve && (s.Credits.Amount <= 0 || s.Credits.Amount > maxBalance):
		return fmt.Errorf("reserving %d credits: amount must be in (0, %d]: %w", s.Credits.Amount, maxBalance, errdefs.ErrInvalidArgument)
	case s.Credits.Kind == "" && s.Credits.Amount != 0:
		return fmt.Errorf("credits %d without a movement: %w", s.Credits.Amount, errdefs.ErrInvalidArgument)
	case s.Driver != "" || len(s.Result) > 0 || s.Output.ExitCode != nil || len(s.Output.Stdout) > 0 || len(s.Output.Stderr) > 0:
		return fmt.Errorf("an admission has no driver, result or output yet: %w", errdefs.ErrInvalidArgument)
	case s.CoverSession:
		return fmt.Errorf("an admission decides no approval, so covers no session: %w", errdefs.ErrInvalidArgument)
	}
	if waits {
		if len(s.Approval.Card) == 0 {
			return fmt.Errorf("approval card is required: %w", errdefs.ErrInvalidArgument)
		}
		if err := checkJSON("approval card", s.Approval.Card); err != nil {
			return err
		}
		if s.Approval.ExpiresAt.IsZero() {
			return fmt.Errorf("approval expiry is required: %w", errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// checkTransition checks a step of an execution that exists.
func checkTransition(s model.Step) error {
	if err := checkStep(s); err != nil {
		return err
	}
	switch {
	case !s.From.Valid() || s.From.Terminal():
		return fmt.Errorf("step from %q: an execution moves on only from a live status: %w", s.From, errdefs.ErrInvalidArgument)
	case s.To == s.From:
		return fmt.Errorf("step from %s to itself: %w", s.From, errdefs.ErrInvalidArgument)
	case s.Credits.Kind != "" && s.Credits.Kind != model.LedgerCommit && s.Credits.Kind != model.LedgerRelease:
		return fmt.Errorf("a step of an admitted execution commits or releases its reservation, it does not %s: %w", s.Credits.Kind, errdefs.ErrInvalidArgument)
	case s.Credits.Kind != "" && !s.To.Terminal():
		return fmt.Errorf("a step to %s settles no reservation: it is settled when the execution ends: %w", s.To, errdefs.ErrInvalidArgument)
	case s.Approval.To == model.ApprovalPending:
		return fmt.Errorf("an approval request is created with its execution: %w", errdefs.ErrInvalidArgument)
	case s.CoverSession && s.Approval.To != model.ApprovalApproved:
		return fmt.Errorf("a step that covers a session approves its approval request: %w", errdefs.ErrInvalidArgument)
	case s.Approval.To != "" && !s.Approval.To.Valid():
		return fmt.Errorf("approval change to %q: not a status: %w", s.Approval.To, errdefs.ErrInvalidArgument)
	case (s.Approval.To == model.ApprovalApproved || s.Approval.To == model.ApprovalDenied) != (s.Approval.DecidedBy != ""):
		return fmt.Errorf("an approval change to %q by %q: a decision, and only a decision, names its decider: %w",
			s.Approval.To, s.Approval.DecidedBy, errdefs.ErrInvalidArgument)
	case !s.To.Terminal() && (len(s.Result) > 0 || s.Output.ExitCode != nil || len(s.Output.Stdout) > 0 || len(s.Output.Stderr) > 0):
		return fmt.Errorf("a step to %s has no result or output: the execution has not ended: %w", s.To, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Admit implements store.Journal.
func (s *Store) Admit(ctx context.Context, e store.NewExecution, st model.Step) (store.Admission, error) {
	if err := checkRecord(e); err != nil {
		return store.Admission{}, fmt.Errorf("admitting an execution: %w", err)
	}
	if err := checkAdmission(st); err != nil {
		return store.Admission{}, fmt.Errorf("admitting an execution: %w", err)
	}
	var adm store.Admission
	err := s.inTx(ctx, func(q Querier) error {
		adm = store.Admission{}
		var keyWS string
		if err := q.QueryRow(ctx, `SELECT workspace_id FROM api_keys WHERE id = $1`, e.KeyID).Scan(&keyWS); err != nil || keyWS != e.WorkspaceID {
			if err != nil && notFound(err) != errdefs.ErrNotFound {
				return err
			}
			return fmt.Errorf("key %q does not belong to workspace %q: %w", e.KeyID, e.WorkspaceID, errdefs.ErrInvalidArgument)
		}
		now := s.at(st.At)
		ex := model.Execution{
			ID: e.ID, WorkspaceID: e.WorkspaceID, KeyID: e.KeyID, Status: st.To,
			Runtime: e.Runtime, Tool: e.Tool, Request: e.Request, IdempotencyKey: e.IdempotencyKey,
			InputSHA256: e.InputSHA256, CreatedAt: now,
		}
		if ex.ID == "" {
			ex.ID = newID("ex")
		}
		if st.Credits.Kind == model.LedgerReserve {
			ex.ReservationID, ex.Credits = newID("res"), st.Credits.Amount
		}
		if st.Approval.To == model.ApprovalPending {
			ex.ApprovalID = newID("apr")
		}
		if e.SessionID != "" {
			replayed, err := s.admitCell(ctx, q, e, &ex, now, &adm)
			if err != nil || replayed {
				return err
			}
		}
		// ON CONFLICT on the idempotency key waits for a concurrent insert of
		// the same key to commit, then writes nothing: the retry is answered
		// with the first execution below instead of failing.
		n, err := q.Exec(ctx, `INSERT INTO executions (id, workspace_id, key_id, status, runtime, tool, request,
			idempotency_key, input_sha256, reservation_id, approval_id, driver, created_at, session_id, cell)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, '', $12, $13, $14)
			ON CONFLICT (key_id, idempotency_key) DO NOTHING`,
			ex.ID, ex.WorkspaceID, ex.KeyID, string(ex.Status), ex.Runtime, ex.Tool, string(ex.Request),
			nstr(ex.IdempotencyKey), ex.InputSHA256, nstr(ex.ReservationID), nstr(ex.ApprovalID), s.tm(now),
			nstr(ex.SessionID), ncell(ex.Cell))
		if err != nil {
			return err
		}
		if n == 0 {
			return s.replay(ctx, q, e, &adm)
		}
		if ex.ReservationID != "" {
			r, err := s.reserve(ctx, q, ex.WorkspaceID, ex.ID, ex.ReservationID, ex.Credits)
			if err != nil {
				return err
			}
			adm.Reservation = &r
		}
		if _, err := q.Exec(ctx, `INSERT INTO tool_calls (id, execution_id, workspace_id, tool, runtime, input_sha256,
			status, stdout_preview, stderr_preview, stdout_truncated, stderr_truncated, driver, credits_charged, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, '', 0, $12)`,
			newID("tc"), ex.ID, ex.WorkspaceID, ex.Tool, ex.Runtime, ex.InputSHA256, string(ex.Status),
			[]byte{}, []byte{}, false, false, s.tm(now)); err != nil {
			return err
		}
		if ex.ApprovalID != "" {
			a := model.Approval{ID: ex.ApprovalID, ExecutionID: ex.ID, WorkspaceID: ex.WorkspaceID,
				Status: model.ApprovalPending, Card: st.Approval.Card, RequestedAt: now,
				ExpiresAt: store.TruncateTime(st.Approval.ExpiresAt)}
			if _, err := q.Exec(ctx, `INSERT INTO approval_requests (id, execution_id, workspace_id, status, card,
				requested_at, expires_at, reason) VALUES ($1, $2, $3, $4, $5, $6, $7, '')`,
				a.ID, a.ExecutionID, a.WorkspaceID, string(a.Status), string(a.Card), s.tm(a.RequestedAt), s.tm(a.ExpiresAt)); err != nil {
				return err
			}
			adm.Approval = &a
		}
		adm.Execution = ex
		_, err = s.appendEvents(ctx, q, ex.WorkspaceID, ex.ID, st.Audit)
		return err
	})
	if err != nil {
		return store.Admission{}, fmt.Errorf("admitting an execution in workspace %q: %w", e.WorkspaceID, err)
	}
	return adm, nil
}

// at is the time of a step: t, or the store's clock when t is zero.
func (s *Store) at(t time.Time) time.Time {
	if t.IsZero() {
		return s.clock()
	}
	return store.TruncateTime(t)
}

// Apply implements store.Journal. It locks the execution's approval
// request before the execution, as Admit creates them, so that two steps
// of one execution cannot deadlock: the second waits for the first, then
// finds the execution moved on.
func (s *Store) Apply(ctx context.Context, id string, st model.Step) (model.Execution, error) {
	if err := checkTransition(st); err != nil {
		return model.Execution{}, fmt.Errorf("applying a step of execution %q: %w", id, err)
	}
	var ex model.Execution
	err := s.inTx(ctx, func(q Querier) (err error) {
		if st.Approval.To != "" {
			if err := s.closeApproval(ctx, q, id, st); err != nil {
				return err
			}
		}
		if ex, err = scanExecution(lookupRow(ctx, q, id, `SELECT `+executionCols+` FROM executions WHERE id = $1`+s.d.ForUpdate, id)); err != nil {
			return notFound(err)
		}
		if ex.Status != st.From {
			return errdefs.Publicf("execution %s is %s, not %s: %w", ex.ID, ex.Status, st.From, errdefs.ErrConflict)
		}
		at := s.at(st.At)
		ex.Status = st.To
		switch {
		case st.To == model.StatusRunning:
			ex.StartedAt, ex.Driver = at, st.Driver
		case st.To.Terminal():
			ex.FinishedAt = at
			if len(st.Result) > 0 {
				ex.Result = st.Result
			}
			if st.Driver != "" {
				ex.Driver = st.Driver
			}
		}
		n, err := q.Exec(ctx, `UPDATE executions SET status = $2, result = $3, driver = $4, started_at = $5, finished_at = $6
			WHERE id = $1 AND status = $7`,
			ex.ID, string(ex.Status), njson(ex.Result), ex.Driver, s.tm(ex.StartedAt), s.tm(ex.FinishedAt), string(st.From))
		if err != nil {
			return err
		}
		if n != 1 {
			return errdefs.Publicf("execution %s moved on from %s meanwhile: %w", ex.ID, st.From, errdefs.ErrConflict)
		}
		charged, err := s.settleFor(ctx, q, ex, st)
		if err != nil {
			return err
		}
		if err := s.touchSession(ctx, q, ex, st, at); err != nil {
			return err
		}
		if err := s.recordCall(ctx, q, ex, st, charged); err != nil {
			return err
		}
		_, err = s.appendEvents(ctx, q, ex.WorkspaceID, ex.ID, st.Audit)
		return err
	})
	if err != nil {
		return model.Execution{}, fmt.Errorf("applying a step of execution %q from %s to %s: %w", id, st.From, st.To, err)
	}
	return ex, nil
}

// closeApproval applies st's change of execution id's approval request,
// which must be pending.
func (s *Store) closeApproval(ctx context.Context, q Querier, id string, st model.Step) error {
	var approvalID string
	if err := lookupRow(ctx, q, id, `SELECT approval_id FROM executions WHERE id = $1`, id).Scan(scanStr(&approvalID)); err != nil {
		return fmt.Errorf("execution %q: %w", id, notFound(err))
	}
	if approvalID == "" {
		return fmt.Errorf("execution %q has no approval request to close %s: %w", id, st.Approval.To, errdefs.ErrInvalidArgument)
	}
	a, err := scanApproval(q.QueryRow(ctx, `SELECT `+approvalCols+` FROM approval_requests WHERE id = $1`+s.d.ForUpdate, approvalID))
	if err != nil {
		return fmt.Errorf("approval %q: %w", approvalID, notFound(err))
	}
	if a.Status != model.ApprovalPending {
		return errdefs.Publicf("approval %s is already %s: %w", a.ID, a.Status, errdefs.ErrConflict)
	}
	var decidedAt time.Time
	if st.Approval.DecidedBy != "" {
		// The capability layer refuses a late decision too; this holds
		// under the request's lock, against a decision that raced the
		// expiry.
		decidedAt = s.at(st.At)
		if !decidedAt.Before(a.ExpiresAt) {
			return errdefs.Publicf("approval %s expired at %s, before the decision: %w", a.ID, a.ExpiresAt.Format(time.RFC3339), errdefs.ErrConflict)
		}
	}
	_, err = q.Exec(ctx, `UPDATE approval_requests SET status = $2, decided_by = $3, decided_at = $4, reason = $5
		WHERE id = $1 AND status = 'pending'`,
		a.ID, string(st.Approval.To), nstr(st.Approval.DecidedBy), s.tm(decidedAt), st.Approval.Reason)
	return err
}

// settleFor settles ex's reservation as st says and returns what it
// charged. An execution that ends must leave no reservation open.
func (s *Store) settleFor(ctx context.Context, q Querier, ex model.Execution, st model.Step) (int64, error) {
	if ex.ReservationID == "" {
		if st.Credits.Kind != "" {
			return 0, fmt.Errorf("execution %s has no reservation to %s: %w", ex.ID, st.Credits.Kind, errdefs.ErrInvalidArgument)
		}
		return 0, nil
	}
	switch st.Credits.Kind {
	case model.LedgerCommit:
		r, err := s.settle(ctx, q, ex.ReservationID, model.ReservationCommitted)
		return r.Amount, err
	case model.LedgerRelease:
		_, err := s.settle(ctx, q, ex.ReservationID, model.ReservationReleased)
		return 0, err
	}
	if !st.To.Terminal() {
		return 0, nil
	}
	r, err := s.getReservation(ctx, q, ex.ReservationID)
	if err != nil {
		return 0, err
	}
	if r.Status == model.ReservationOpen {
		return 0, fmt.Errorf("execution %s ends %s with its reservation still open: commit or release it: %w", ex.ID, st.To, errdefs.ErrInvalidArgument)
	}
	return 0, nil
}

// recordCall mirrors ex, as st left it, on its tool_calls row and, when it
// ended, writes its tool_invocations row.
func (s *Store) recordCall(ctx context.Context, q Querier, ex model.Execution, st model.Step, charged int64) error {
	switch {
	case st.To == model.StatusRunning:
		_, err := q.Exec(ctx, `UPDATE tool_calls SET status = $2, started_at = $3, driver = $4 WHERE execution_id = $1`,
			ex.ID, string(ex.Status), s.tm(ex.StartedAt), ex.Driver)
		return err
	case !st.To.Terminal():
		_, err := q.Exec(ctx, `UPDATE tool_calls SET status = $2 WHERE execution_id = $1`, ex.ID, string(ex.Status))
		return err
	}
	if st.Invocation.Credits != charged {
		return fmt.Errorf("the tool_invocations row of execution %s says %d credits, the step charges %d: %w",
			ex.ID, st.Invocation.Credits, charged, errdefs.ErrInvalidArgument)
	}
	stdout, stdoutTrunc := preview(st.Output.Stdout, st.Output.StdoutTruncated)
	stderr, stderrTrunc := preview(st.Output.Stderr, st.Output.StderrTruncated)
	if _, err := q.Exec(ctx, `UPDATE tool_calls SET status = $2, exit_code = $3, stdout_preview = $4, stderr_preview = $5,
		stdout_truncated = $6, stderr_truncated = $7, driver = $8, credits_charged = $9, finished_at = $10
		WHERE execution_id = $1`,
		ex.ID, string(ex.Status), nint(st.Output.ExitCode), stdout, stderr, stdoutTrunc, stderrTrunc, ex.Driver, charged,
		s.tm(ex.FinishedAt)); err != nil {
		return err
	}
	inv := *st.Invocation
	invID := newID("inv")
	if _, err := q.Exec(ctx, `INSERT INTO tool_invocations (id, execution_id, workspace_id, tool, runtime, status, driver,
		queued_us, ran_us, credits, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
		invID, ex.ID, ex.WorkspaceID, inv.Tool, inv.Runtime, string(inv.Status), inv.Driver,
		inv.Queued.Microseconds(), inv.Ran.Microseconds(), inv.Credits, s.tm(ex.FinishedAt)); err != nil {
		return err
	}
	return s.enqueueInvocation(ctx, q, invID)
}

// ListLiveExecutions implements store.Executions.
func (s *Store) ListLiveExecutions(ctx context.Context) ([]model.Execution, error) {
	out, err := queryAll(ctx, s.b.Reader(), scanExecution, `SELECT `+executionCols+` FROM executions
		WHERE status IN ('queued', 'running') ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("listing live executions: %w", s.classify(err))
	}
	return out, nil
}

// ListDueApprovals implements store.Approvals.
func (s *Store) ListDueApprovals(ctx context.Context, now time.Time) ([]model.Approval, error) {
	out, err := queryAll(ctx, s.b.Reader(), scanApproval, `SELECT `+approvalCols+` FROM approval_requests
		WHERE status = 'pending' AND expires_at <= $1 ORDER BY expires_at, id`, s.tm(store.TruncateTime(now)))
	if err != nil {
		return nil, fmt.Errorf("listing approvals due to expire: %w", s.classify(err))
	}
	return out, nil
}
