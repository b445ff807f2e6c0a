package sqlstore

import (
	"context"
	"fmt"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// AppendEvent implements store.Audit.
func (s *Store) AppendEvent(ctx context.Context, e model.NewEvent) (model.Event, error) {
	if err := checkEvent(e); err != nil {
		return model.Event{}, fmt.Errorf("appending audit event: %w", err)
	}
	var out []model.Event
	err := s.inTx(ctx, func(q Querier) (err error) {
		if e.WorkspaceID != "" {
			if err := requireWorkspace(ctx, q, e.WorkspaceID); err != nil {
				return err
			}
		}
		out, err = s.appendEvents(ctx, q, e.WorkspaceID, e.ExecutionID, []model.NewEvent{e})
		return err
	})
	if err != nil {
		return model.Event{}, fmt.Errorf("appending %s event to the chain of workspace %q: %w", e.Type, e.WorkspaceID, err)
	}
	return out[0], nil
}

// AppendBroadcast implements store.Audit. The workspaces are read in the
// transaction, in id order, and their chain heads locked in that order, so
// that two broadcasts cannot deadlock.
func (s *Store) AppendBroadcast(ctx context.Context, e model.NewEvent, copyOf func(model.Event) model.NewEvent) (model.Event, error) {
	if e.WorkspaceID != "" {
		return model.Event{}, fmt.Errorf("broadcasting a %s event: it belongs to the unattributed chain, not workspace %q: %w", e.Type, e.WorkspaceID, errdefs.ErrInvalidArgument)
	}
	if err := checkEvent(e); err != nil {
		return model.Event{}, fmt.Errorf("broadcasting an audit event: %w", err)
	}
	var out model.Event
	err := s.inTx(ctx, func(q Querier) error {
		evs, err := s.appendEvents(ctx, q, "", e.ExecutionID, []model.NewEvent{e})
		if err != nil {
			return err
		}
		out = evs[0]
		ids, err := queryAll(ctx, q, func(r Row) (string, error) {
			var id string
			return id, r.Scan(&id)
		}, `SELECT id FROM workspaces ORDER BY id`)
		if err != nil {
			return err
		}
		for _, id := range ids {
			c := copyOf(out)
			if err := checkEvent(c); err != nil {
				return err
			}
			if _, err := s.appendEvents(ctx, q, id, c.ExecutionID, []model.NewEvent{c}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return model.Event{}, fmt.Errorf("broadcasting a %s event to every workspace: %w", e.Type, err)
	}
	return out, nil
}

// appendEvents links events into workspaceID's chain, overriding their
// workspace and execution ids. It locks the chain head for the rest of the
// transaction, which is what serialises appends per workspace: a concurrent
// appender waits on the head row (PostgreSQL) or the single writer (SQLite),
// then reads the head this transaction leaves. UNIQUE (workspace_id, seq)
// turns any fork that got past the lock into a failed transaction. Callers
// append last in a transaction, to hold the head lock briefly.
// appendAudit checks and appends es (none is fine) to workspaceID's chain
// in q, the transaction of the change they record.
func (s *Store) appendAudit(ctx context.Context, q Querier, workspaceID string, es []model.NewEvent) error {
	if len(es) == 0 {
		return nil
	}
	if err := checkEvents(es); err != nil {
		return err
	}
	_, err := s.appendEvents(ctx, q, workspaceID, "", es)
	return err
}

func (s *Store) appendEvents(ctx context.Context, q Querier, workspaceID, executionID string, es []model.NewEvent) ([]model.Event, error) {
	if len(es) == 0 {
		return nil, nil
	}
	head, err := s.lockHead(ctx, q, workspaceID)
	if err != nil {
		return nil, err
	}
	out := make([]model.Event, 0, len(es))
	for _, ne := range es {
		ev := model.Event{
			ID: newID("evt"), WorkspaceID: workspaceID, Seq: head.Seq + 1,
			Type: ne.Type, Code: ne.Code, Actor: ne.Actor, Reason: ne.Reason, ExecutionID: executionID,
			Data: ne.Data, Time: store.TruncateTime(ne.Time), PrevHash: head.Hash,
		}
		if ev.Time.IsZero() {
			ev.Time = s.clock()
		}
		ev.Hash = store.ChainHash(ev)
		if _, err := q.Exec(ctx, `INSERT INTO audit_events (id, workspace_id, seq, type, code, actor, reason,
			execution_id, data, occurred_at, prev_hash, hash) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
			ev.ID, ev.WorkspaceID, ev.Seq, ev.Type, ev.Code, ev.Actor, ev.Reason, ev.ExecutionID, njson(ev.Data),
			s.tm(ev.Time), ev.PrevHash, ev.Hash); err != nil {
			return nil, err
		}
		head.Seq, head.Hash = ev.Seq, ev.Hash
		out = append(out, ev)
	}
	if _, err := q.Exec(ctx, `UPDATE audit_chain_heads SET seq = $2, hash = $3 WHERE workspace_id = $1`,
		workspaceID, head.Seq, head.Hash); err != nil {
		return nil, err
	}
	return out, nil
}

// lockHead reads and locks a chain's head row, creating it for the
// unattributed chain on first use.
func (s *Store) lockHead(ctx context.Context, q Querier, workspaceID string) (model.ChainHead, error) {
	h := model.ChainHead{WorkspaceID: workspaceID}
	read := func() error {
		return q.QueryRow(ctx, `SELECT seq, hash FROM audit_chain_heads WHERE workspace_id = $1`+s.d.ForUpdate,
			workspaceID).Scan(&h.Seq, &h.Hash)
	}
	err := read()
	if notFound(err) == errdefs.ErrNotFound {
		if _, err := q.Exec(ctx, `INSERT INTO audit_chain_heads (workspace_id, seq, hash) VALUES ($1, 0, '')
			ON CONFLICT (workspace_id) DO NOTHING`, workspaceID); err != nil {
			return h, err
		}
		err = read()
	}
	if err != nil {
		return h, fmt.Errorf("locking the chain head: %w", err)
	}
	return h, nil
}

const eventCols = `id, workspace_id, seq, type, code, actor, reason, execution_id, data, occurred_at, prev_hash, hash`

func scanEvent(r Row) (model.Event, error) {
	var e model.Event
	err := r.Scan(&e.ID, &e.WorkspaceID, &e.Seq, &e.Type, &e.Code, &e.Actor, &e.Reason, &e.ExecutionID,
		scanJSON(&e.Data), scanTime(&e.Time), &e.PrevHash, &e.Hash)
	return e, err
}

// ListEvents implements store.Audit.
func (s *Store) ListEvents(ctx context.Context, workspaceID string, f store.EventFilter) (store.Page[model.Event], error) {
	for _, v := range append([]string{f.ExecutionID}, f.Types...) {
		if err := checkText("event filter", v, maxText); err != nil {
			return store.Page[model.Event]{}, fmt.Errorf("listing events: %w", err)
		}
	}
	var a args
	where := []string{"workspace_id = " + a.add(workspaceID)}
	if len(f.Types) > 0 {
		where = append(where, "type IN "+in(&a, f.Types))
	}
	if f.ExecutionID != "" {
		where = append(where, "execution_id = "+a.add(f.ExecutionID))
	}
	s.timeRange(&a, &where, "occurred_at", f.Since, f.Until)
	n := limitOf(f.PageRequest)
	if f.Cursor != "" {
		c, err := parseCursor(f.Cursor)
		if err != nil {
			return store.Page[model.Event]{}, fmt.Errorf("listing events: %w", err)
		}
		where = append(where, "seq < "+a.add(c.key))
	}
	items, err := queryAll(ctx, s.b.Reader(), scanEvent, fmt.Sprintf(`SELECT `+eventCols+` FROM audit_events WHERE %s
		ORDER BY seq DESC LIMIT %d`, joinWhere(where), n+1), a...)
	if err != nil {
		return store.Page[model.Event]{}, fmt.Errorf("listing events of workspace %q: %w", workspaceID, s.classify(err))
	}
	return finishPage(items, n, func(e model.Event) cursor { return cursor{key: e.Seq} }), nil
}

// ChainHead implements store.Audit.
func (s *Store) ChainHead(ctx context.Context, workspaceID string) (model.ChainHead, error) {
	h, err := s.readHead(ctx, s.b.Reader(), workspaceID)
	if err != nil {
		return model.ChainHead{}, fmt.Errorf("reading the chain head of workspace %q: %w", workspaceID, s.classify(err))
	}
	return h, nil
}

func (s *Store) readHead(ctx context.Context, q Querier, workspaceID string) (model.ChainHead, error) {
	h := model.ChainHead{WorkspaceID: workspaceID}
	err := q.QueryRow(ctx, `SELECT seq, hash FROM audit_chain_heads WHERE workspace_id = $1`, workspaceID).Scan(&h.Seq, &h.Hash)
	if notFound(err) == errdefs.ErrNotFound {
		if workspaceID != "" {
			if err := requireWorkspace(ctx, q, workspaceID); err != nil {
				return h, err
			}
		}
		return h, nil
	}
	return h, err
}

// verifyBatch bounds the rows VerifyChain holds in memory at once.
const verifyBatch = 1000

// VerifyChain implements store.Audit. It reads the head and the rows in one
// snapshot, so that appends racing with it cannot look like tampering.
func (s *Store) VerifyChain(ctx context.Context, workspaceID string, witnessed ...model.ChainHead) (bool, *model.BrokenLink, error) {
	v := store.NewChainVerifier(workspaceID)
	for _, w := range witnessed {
		v.Witnessed(w)
	}
	ok, broken, _, err := s.walkChain(ctx, workspaceID, 0, v)
	if err != nil {
		return false, nil, fmt.Errorf("verifying the chain of workspace %q: %w", workspaceID, s.classify(err))
	}
	return ok, broken, nil
}

// VerifyChainFrom implements store.Audit, in one snapshot as VerifyChain.
func (s *Store) VerifyChainFrom(ctx context.Context, from model.ChainHead) (model.ChainHead, *model.BrokenLink, error) {
	ok, broken, head, err := s.walkChain(ctx, from.WorkspaceID, from.Seq, store.NewChainVerifierFrom(from))
	if err != nil {
		return model.ChainHead{}, nil, fmt.Errorf("verifying the chain of workspace %q from seq %d: %w", from.WorkspaceID, from.Seq, s.classify(err))
	}
	if !ok {
		return model.ChainHead{}, broken, nil
	}
	return head, nil, nil
}

// walkChain feeds v the events of the chain from seq first on, and the
// chain's recorded head, read in one snapshot.
func (s *Store) walkChain(ctx context.Context, workspaceID string, first int64, v *store.ChainVerifier) (ok bool, broken *model.BrokenLink, head model.ChainHead, err error) {
	err = s.b.InSnapshot(ctx, func(q Querier) error {
		head, err = s.readHead(ctx, q, workspaceID)
		if err != nil {
			return err
		}
		// A full walk starts below any seq, so that a row inserted with
		// seq 0 or less shows too.
		after := int64(-1 << 62)
		if first > 1 {
			after = first - 1
		}
		for {
			batch, err := queryAll(ctx, q, scanEvent, fmt.Sprintf(`SELECT `+eventCols+` FROM audit_events
				WHERE workspace_id = $1 AND seq > $2 ORDER BY seq LIMIT %d`, verifyBatch), workspaceID, after)
			if err != nil {
				return err
			}
			for _, e := range batch {
				if !v.Add(e) {
					ok, broken = v.Finish(head)
					return nil
				}
				after = e.Seq
			}
			if len(batch) < verifyBatch {
				break
			}
		}
		ok, broken = v.Finish(head)
		return nil
	})
	return ok, broken, head, err
}
