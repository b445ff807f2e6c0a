package sqlstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/store"
)

// enqueueInvocation enqueues a tool_invocations row written by the caller's
// transaction, when the outbox is on: the entry commits or rolls back with
// the row.
func (s *Store) enqueueInvocation(ctx context.Context, q Querier, invocationID string) error {
	if !s.outbox {
		return nil
	}
	_, err := q.Exec(ctx, `INSERT INTO analytics_outbox (invocation_id, enqueued_at) VALUES ($1, $2)`,
		invocationID, s.tm(s.clock()))
	return err
}

// outboxOrder is the outbox's order, oldest first; the index
// analytics_outbox_age serves it.
const outboxOrder = ` ORDER BY enqueued_at, invocation_id`

// ListOutbox implements store.AnalyticsOutbox.
func (s *Store) ListOutbox(ctx context.Context, limit int) ([]store.OutboxEntry, error) {
	switch {
	case limit <= 0:
		limit = store.DefaultOutboxBatch
	case limit > store.MaxOutboxBatch:
		limit = store.MaxOutboxBatch
	}
	entries, err := queryAll(ctx, s.b.Reader(), func(r Row) (store.OutboxEntry, error) {
		var e store.OutboxEntry
		ti, err := scanToolInvocation(r, scanTime(&e.EnqueuedAt))
		e.Invocation = ti
		return e, err
	}, `SELECT `+toolInvocationCols+`, enqueued_at FROM analytics_outbox
		JOIN tool_invocations ON tool_invocations.id = analytics_outbox.invocation_id`+outboxOrder+fmt.Sprintf(" LIMIT %d", limit))
	if err != nil {
		return nil, fmt.Errorf("listing the analytics outbox: %w", s.classify(err))
	}
	return entries, nil
}

// DeleteOutbox implements store.AnalyticsOutbox.
func (s *Store) DeleteOutbox(ctx context.Context, invocationIDs []string) (int64, error) {
	if len(invocationIDs) > store.MaxOutboxBatch {
		return 0, fmt.Errorf("deleting %d outbox entries, more than %d at once: %w",
			len(invocationIDs), store.MaxOutboxBatch, errdefs.ErrInvalidArgument)
	}
	var a args
	var ph []string
	for _, id := range invocationIDs {
		// An id that is not valid text was never enqueued (and PostgreSQL
		// would refuse the whole statement).
		if checkText("invocation id", id, maxText) == nil {
			ph = append(ph, a.add(id))
		}
	}
	if len(ph) == 0 {
		return 0, nil
	}
	var n int64
	err := s.inTx(ctx, func(q Querier) (err error) {
		n, err = q.Exec(ctx, `DELETE FROM analytics_outbox WHERE invocation_id IN (`+strings.Join(ph, ", ")+`)`, a...)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("deleting %d analytics outbox entries: %w", len(ph), err)
	}
	return n, nil
}

// TrimOutbox implements store.AnalyticsOutbox. It looks first, outside any
// transaction, and takes the write lock only when there is something to
// drop: the shipper calls it every round, and SQLite's writer is the one
// the invocations' transactions need.
func (s *Store) TrimOutbox(ctx context.Context, maxRows int64, before time.Time) (int64, error) {
	st, err := s.OutboxStats(ctx)
	if err != nil {
		return 0, err
	}
	tooMany := maxRows > 0 && st.Rows > maxRows
	tooOld := !before.IsZero() && st.Rows > 0 && st.Oldest.Before(store.TruncateTime(before))
	if !tooMany && !tooOld {
		return 0, nil
	}
	var dropped int64
	err = s.inTx(ctx, func(q Querier) error {
		dropped = 0
		if !before.IsZero() {
			n, err := q.Exec(ctx, `DELETE FROM analytics_outbox WHERE enqueued_at < $1`, s.tm(before))
			if err != nil {
				return err
			}
			dropped += n
		}
		if maxRows <= 0 {
			return nil
		}
		var rows int64
		if err := q.QueryRow(ctx, `SELECT count(*) FROM analytics_outbox`).Scan(&rows); err != nil {
			return err
		}
		if rows <= maxRows {
			return nil
		}
		n, err := q.Exec(ctx, `DELETE FROM analytics_outbox WHERE invocation_id IN
			(SELECT invocation_id FROM analytics_outbox`+outboxOrder+` LIMIT $1)`, rows-maxRows)
		dropped += n
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("trimming the analytics outbox: %w", err)
	}
	return dropped, nil
}

// OutboxStats implements store.AnalyticsOutbox.
func (s *Store) OutboxStats(ctx context.Context) (store.OutboxStats, error) {
	var st store.OutboxStats
	if err := s.b.Reader().QueryRow(ctx, `SELECT count(*), min(enqueued_at) FROM analytics_outbox`).
		Scan(&st.Rows, scanTime(&st.Oldest)); err != nil {
		return store.OutboxStats{}, fmt.Errorf("counting the analytics outbox: %w", s.classify(err))
	}
	return st, nil
}
