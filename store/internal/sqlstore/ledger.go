package sqlstore

import (
	"context"
	"fmt"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// maxBalance bounds Available + Reserved far below int64 overflow, which
// SQLite would otherwise turn into a float.
const maxBalance = int64(1) << 60

// GrantCredits implements store.Ledger.
func (s *Store) GrantCredits(ctx context.Context, workspaceID string, amount int64, note string, audit []model.NewEvent) (model.Credits, error) {
	if amount <= 0 || amount > maxBalance {
		return model.Credits{}, errdefs.Publicf("granting %d credits: amount must be in (0, %d]: %w", amount, maxBalance, errdefs.ErrInvalidArgument)
	}
	if err := checkText("note", note, maxReason); err != nil {
		return model.Credits{}, fmt.Errorf("granting credits: %w", err)
	}
	var c model.Credits
	err := s.inTx(ctx, func(q Querier) error {
		err := q.QueryRow(ctx, `UPDATE credit_accounts SET available = available + $2
			WHERE workspace_id = $1 AND available + reserved <= $3 RETURNING available, reserved`,
			workspaceID, amount, maxBalance-amount).Scan(&c.Available, &c.Reserved)
		if err != nil {
			if err := requireWorkspace(ctx, q, workspaceID); err != nil {
				return err
			}
			if notFound(err) == errdefs.ErrNotFound {
				return errdefs.Publicf("balance would exceed %d: %w", maxBalance, errdefs.ErrInvalidArgument)
			}
			return err
		}
		if err := s.writeLedger(ctx, q, model.LedgerEntry{WorkspaceID: workspaceID, Kind: model.LedgerGrant, Amount: amount, Note: note}); err != nil {
			return err
		}
		return s.appendAudit(ctx, q, workspaceID, audit)
	})
	if err != nil {
		return model.Credits{}, fmt.Errorf("granting %d credits to workspace %q: %w", amount, workspaceID, err)
	}
	return c, nil
}

// GetCredits implements store.Ledger.
func (s *Store) GetCredits(ctx context.Context, workspaceID string) (model.Credits, error) {
	var c model.Credits
	err := s.b.Reader().QueryRow(ctx, `SELECT available, reserved FROM credit_accounts WHERE workspace_id = $1`,
		workspaceID).Scan(&c.Available, &c.Reserved)
	if err != nil {
		return model.Credits{}, s.missing(err, "credits of workspace", workspaceID)
	}
	return c, nil
}

func (s *Store) writeLedger(ctx context.Context, q Querier, e model.LedgerEntry) error {
	_, err := q.Exec(ctx, `INSERT INTO credit_ledger (id, workspace_id, kind, amount, reservation_id, execution_id, note, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		newID("led"), e.WorkspaceID, string(e.Kind), e.Amount, nstr(e.ReservationID), nstr(e.ExecutionID), e.Note, s.tm(s.clock()))
	return err
}

// reserve moves amount from Available to Reserved and records the
// reservation. The conditional UPDATE is what keeps balances exact under
// concurrency: PostgreSQL re-checks "available >= amount" after waiting for
// the account row's lock, and SQLite runs one writer at a time.
func (s *Store) reserve(ctx context.Context, q Querier, workspaceID, executionID, id string, amount int64) (model.Reservation, error) {
	var avail int64
	err := q.QueryRow(ctx, `UPDATE credit_accounts SET available = available - $2, reserved = reserved + $2
		WHERE workspace_id = $1 AND available >= $2 RETURNING available`, workspaceID, amount).Scan(&avail)
	if err != nil {
		if notFound(err) != errdefs.ErrNotFound {
			return model.Reservation{}, err
		}
		var c model.Credits
		if err := q.QueryRow(ctx, `SELECT available, reserved FROM credit_accounts WHERE workspace_id = $1`,
			workspaceID).Scan(&c.Available, &c.Reserved); err != nil {
			return model.Reservation{}, fmt.Errorf("workspace %q: %w", workspaceID, notFound(err))
		}
		return model.Reservation{}, errdefs.Publicf("insufficient credits: %d needed, %d available: %w",
			amount, c.Available, errdefs.ErrResourceExhausted)
	}
	r := model.Reservation{ID: id, WorkspaceID: workspaceID, ExecutionID: executionID, Amount: amount,
		Status: model.ReservationOpen, CreatedAt: s.clock()}
	if _, err := q.Exec(ctx, `INSERT INTO reservations (id, workspace_id, execution_id, amount, status, created_at)
		VALUES ($1, $2, $3, $4, $5, $6)`, r.ID, r.WorkspaceID, r.ExecutionID, r.Amount, string(r.Status), s.tm(r.CreatedAt)); err != nil {
		return model.Reservation{}, err
	}
	return r, s.writeLedger(ctx, q, model.LedgerEntry{WorkspaceID: workspaceID, Kind: model.LedgerReserve, Amount: amount,
		ReservationID: r.ID, ExecutionID: executionID})
}

const reservationCols = `id, workspace_id, execution_id, amount, status, created_at, settled_at`

func scanReservation(r Row) (model.Reservation, error) {
	var (
		res    model.Reservation
		status string
	)
	err := r.Scan(&res.ID, &res.WorkspaceID, &res.ExecutionID, &res.Amount, &status, scanTime(&res.CreatedAt), scanTime(&res.SettledAt))
	res.Status = model.ReservationStatus(status)
	return res, err
}

func (s *Store) getReservation(ctx context.Context, q Querier, id string) (model.Reservation, error) {
	r, err := scanReservation(q.QueryRow(ctx, `SELECT `+reservationCols+` FROM reservations WHERE id = $1`, id))
	if err != nil {
		return r, fmt.Errorf("reservation %q: %w", id, notFound(err))
	}
	return r, nil
}

// settle moves an open reservation to committed or released, exactly once:
// the "status = 'open'" condition of the UPDATE is re-checked after any lock
// wait, so of two concurrent settlements one finds nothing to update.
func (s *Store) settle(ctx context.Context, q Querier, id string, to model.ReservationStatus) (model.Reservation, error) {
	at := s.clock()
	r, err := scanReservation(q.QueryRow(ctx, `UPDATE reservations SET status = $2, settled_at = $3
		WHERE id = $1 AND status = 'open' RETURNING `+reservationCols, id, string(to), s.tm(at)))
	if err != nil {
		if notFound(err) != errdefs.ErrNotFound {
			return r, err
		}
		cur, err := s.getReservation(ctx, q, id)
		if err != nil {
			return cur, err
		}
		return cur, errdefs.Publicf("reservation %q is already %s: %w", id, cur.Status, errdefs.ErrConflict)
	}
	kind := model.LedgerCommit
	if to == model.ReservationCommitted {
		_, err = q.Exec(ctx, `UPDATE credit_accounts SET reserved = reserved - $2 WHERE workspace_id = $1`, r.WorkspaceID, r.Amount)
		if err == nil {
			_, err = q.Exec(ctx, `UPDATE tool_calls SET credits_charged = $2 WHERE execution_id = $1`, r.ExecutionID, r.Amount)
		}
	} else {
		kind = model.LedgerRelease
		_, err = q.Exec(ctx, `UPDATE credit_accounts SET reserved = reserved - $2, available = available + $2
			WHERE workspace_id = $1`, r.WorkspaceID, r.Amount)
	}
	if err != nil {
		return r, err
	}
	return r, s.writeLedger(ctx, q, model.LedgerEntry{WorkspaceID: r.WorkspaceID, Kind: kind, Amount: r.Amount,
		ReservationID: r.ID, ExecutionID: r.ExecutionID})
}

// ListLedger implements store.Ledger.
func (s *Store) ListLedger(ctx context.Context, workspaceID string, p store.PageRequest) (store.Page[model.LedgerEntry], error) {
	var a args
	where := []string{"workspace_id = " + a.add(workspaceID)}
	tail, n, err := s.timePage(&a, &where, "created_at", p)
	if err != nil {
		return store.Page[model.LedgerEntry]{}, fmt.Errorf("listing ledger of workspace %q: %w", workspaceID, err)
	}
	items, err := queryAll(ctx, s.b.Reader(), func(r Row) (model.LedgerEntry, error) {
		var (
			e    model.LedgerEntry
			kind string
		)
		err := r.Scan(&e.ID, &e.WorkspaceID, &kind, &e.Amount, scanStr(&e.ReservationID), scanStr(&e.ExecutionID),
			&e.Note, scanTime(&e.CreatedAt))
		e.Kind = model.LedgerKind(kind)
		return e, err
	}, `SELECT id, workspace_id, kind, amount, reservation_id, execution_id, note, created_at FROM credit_ledger WHERE `+
		joinWhere(where)+tail, a...)
	if err != nil {
		return store.Page[model.LedgerEntry]{}, fmt.Errorf("listing ledger of workspace %q: %w", workspaceID, s.classify(err))
	}
	return finishPage(items, n, func(e model.LedgerEntry) cursor { return timeCursor(e.CreatedAt, e.ID) }), nil
}

func timeCursor(t time.Time, id string) cursor { return cursor{key: t.UnixMicro(), id: id} }
