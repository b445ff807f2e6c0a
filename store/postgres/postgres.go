// Package postgres is Stockade's production store: store.Store on PostgreSQL
// through pgx (pgxpool).
//
//	st, err := postgres.Open(ctx, postgres.Config{DSN: "postgres://stockade@db/stockade"})
//	if err != nil { ... }
//	defer st.Close()
//
// Write transactions run at READ COMMITTED and take row locks (SELECT ... FOR
// UPDATE, and conditional UPDATEs that PostgreSQL re-checks after waiting for
// a row lock) in one fixed order: execution or approval, reservation, credit
// account, audit chain head. That keeps concurrent reservations exact and
// rules out deadlocks among the store's own transactions. Migrations run at
// Open under a transaction-scoped advisory lock, so several daemons starting
// at once migrate once.
package postgres

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/store/internal/sqlstore"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationLock is the advisory lock key that serialises migrations.
const migrationLock = `SELECT pg_advisory_xact_lock(7428130391)`

// daemonLock is the key of the daemon's claim: a session advisory lock on
// the store's schema, so that deployments in different schemas of one
// database do not exclude each other.
const daemonLock = `hashtextextended('stockade.daemon:' || current_schema(), 0)`

// Config configures Open.
type Config struct {
	// DSN is a libpq-style URL or key=value string. Required. Runtime
	// parameters such as search_path may be given in it.
	DSN string
	// MaxConns bounds the pool. Zero means pgxpool's default (the larger of
	// 4 and the number of CPUs).
	MaxConns int32
	// Now is the clock for the times the store sets itself; nil means
	// time.Now.
	Now func() time.Time
	// AnalyticsOutbox enqueues every tool_invocations row in the analytics
	// outbox (store.AnalyticsOutbox), for the daemon to ship; false (the
	// admin commands, a daemon without analytics) enqueues none.
	AnalyticsOutbox bool
}

// Validate reports a Config that Open cannot use.
func (c Config) Validate() error {
	if c.DSN == "" {
		return fmt.Errorf("postgres DSN is required: %w", errdefs.ErrInvalidArgument)
	}
	if c.MaxConns < 0 {
		return fmt.Errorf("negative postgres MaxConns: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// Store is a store.Store on PostgreSQL. It is safe for concurrent use.
type Store struct {
	*sqlstore.Store
	pool *pgxpool.Pool
}

var _ store.Store = (*Store)(nil)

// Open connects to c.DSN and applies the embedded migrations. The caller
// must Close the Store.
func Open(ctx context.Context, c Config) (*Store, error) { return open(ctx, c, 0) }

// open is Open applying the migrations up to version upTo only, or all of
// them for 0: the upgrade test makes a database of an older schema with it.
func open(ctx context.Context, c Config, upTo int) (*Store, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	pc, err := pgxpool.ParseConfig(c.DSN)
	if err != nil {
		return nil, fmt.Errorf("parsing postgres DSN: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	if c.MaxConns > 0 {
		pc.MaxConns = c.MaxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connecting to postgres: %w", classify(err))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to postgres at %s:%d: %w", pc.ConnConfig.Host, pc.ConnConfig.Port, classify(err))
	}
	now := c.Now
	if now == nil {
		now = time.Now
	}
	b := &backend{pool: pool}
	ms, err := sqlstore.LoadMigrations(migrations, "migrations")
	if err == nil {
		err = sqlstore.Migrate(ctx, b, sqlstore.UpTo(ms, upTo), migrationLock, nil, now())
	}
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("migrating postgres database: %w", classify(err))
	}
	return &Store{Store: sqlstore.New(b, sqlstore.Options{Now: now, AnalyticsOutbox: c.AnalyticsOutbox}), pool: pool}, nil
}

// UnsafeExec runs a statement outside the store's rules. It exists for the
// conformance suite, which uses it to tamper with rows as an attacker with
// database access would; nothing else may call it.
func (s *Store) UnsafeExec(ctx context.Context, query string, args ...any) error {
	_, err := s.pool.Exec(ctx, query, args...)
	return err
}

// backend adapts pgxpool to sqlstore.Backend.
type backend struct{ pool *pgxpool.Pool }

func (b *backend) Reader() sqlstore.Querier { return querier{b.pool} }

func (b *backend) InTx(ctx context.Context, fn func(sqlstore.Querier) error) error {
	return b.inTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, fn)
}

func (b *backend) InSnapshot(ctx context.Context, fn func(sqlstore.Querier) error) error {
	return b.inTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, fn)
}

func (b *backend) inTx(ctx context.Context, opts pgx.TxOptions, fn func(sqlstore.Querier) error) error {
	tx, err := b.pool.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("beginning transaction: %w", err)
	}
	// The rollback's context must outlive a cancelled ctx, or the
	// connection would go back to the pool mid-transaction; it also runs
	// when fn panics, so that no row lock outlives the panic. After a
	// commit it is a no-op.
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := fn(querier{tx}); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("committing transaction: %w", err)
	}
	return nil
}

// Claim takes the session advisory lock daemonLock on a connection of its
// own, outside the pool, held until Release. PostgreSQL releases it when
// that connection ends, with the daemon or with the server; Check notices
// and takes it again.
func (b *backend) Claim(ctx context.Context) (store.DaemonClaim, error) {
	c := &advisoryClaim{cfg: b.pool.Config().ConnConfig}
	if err := c.take(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// advisoryClaim is the daemon claim on PostgreSQL.
type advisoryClaim struct {
	cfg *pgx.ConnConfig

	mu       sync.Mutex
	conn     *pgx.Conn // nil once lost and not taken again
	released bool
}

// take connects and takes the lock. Called with mu held, or before c is
// shared.
func (c *advisoryClaim) take(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, c.cfg.Copy())
	if err != nil {
		return fmt.Errorf("claiming the database: %w", classify(err))
	}
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+daemonLock+`)`).Scan(&ok); err != nil || !ok {
		conn.Close(context.WithoutCancel(ctx))
		if err != nil {
			return fmt.Errorf("claiming the database: %w", classify(err))
		}
		return fmt.Errorf("another stockade daemon serves this database (it holds the advisory lock %s); stop it first, or give this one its own database or schema: %w", daemonLock, errdefs.ErrConflict)
	}
	c.conn = conn
	return nil
}

// claimCheckTimeout bounds a check of the claim: a connection that does
// not answer a ping within it (half open, say) is taken for lost.
const claimCheckTimeout = 5 * time.Second

func (c *advisoryClaim) Check(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return fmt.Errorf("the database claim was released: %w", errdefs.ErrFailedPrecondition)
	}
	// A cancelled caller says nothing of the claim: it is kept.
	if err := ctx.Err(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, claimCheckTimeout)
	defer cancel()
	if c.conn != nil {
		err := c.conn.Ping(ctx)
		if err == nil {
			return nil
		}
		if context.Cause(ctx) != context.DeadlineExceeded && ctx.Err() != nil {
			return ctx.Err() // the caller's cancel, mid-ping
		}
		// The connection, and the lock with it, is gone (or does not
		// answer, which is the same for another daemon).
		c.conn.Close(context.WithoutCancel(ctx))
		c.conn = nil
	}
	return c.take(ctx)
}

func (c *advisoryClaim) Release(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.released = true
	if c.conn == nil {
		return nil
	}
	// Closing the connection releases the lock too, but only once the
	// server has ended its backend, some time after Close returns: a
	// daemon restarted at once would find the claim still held. Unlocking
	// first releases it before Release returns; on a connection that does
	// not answer, closing it is all there is.
	ctx, cancel := context.WithTimeout(ctx, claimCheckTimeout)
	defer cancel()
	var unlocked bool
	err := c.conn.QueryRow(ctx, `SELECT pg_advisory_unlock(`+daemonLock+`)`).Scan(&unlocked)
	if err == nil && !unlocked {
		err = fmt.Errorf("releasing the database claim: the lock was not held: %w", errdefs.ErrFailedPrecondition)
	}
	err = errors.Join(err, c.conn.Close(ctx))
	c.conn = nil
	return err
}

func (b *backend) Dialect() sqlstore.Dialect {
	return sqlstore.Dialect{
		ForUpdate: " FOR UPDATE",
		Time:      func(t time.Time) any { return t },
		Classify:  classify,
	}
}

func (b *backend) Close() error {
	b.pool.Close()
	return nil
}

// classify wraps PostgreSQL's constraint, concurrency and connection errors
// in errdefs classes.
func classify(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "23505": // unique_violation
			return fmt.Errorf("%w: %w", errdefs.ErrConflict, err)
		case "23503": // foreign_key_violation
			return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
		case "23514": // check_violation
			return fmt.Errorf("%w: %w", errdefs.ErrFailedPrecondition, err)
		case "22021", "22P05": // character_not_in_repertoire (invalid UTF-8, NUL), untranslatable_character
			return fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
		case "40001", "40P01", "55P03": // serialization_failure, deadlock_detected, lock_not_available
			return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
		}
		if len(pe.Code) == 5 && (pe.Code[:2] == "08" || pe.Code[:2] == "57") { // connection exception, operator intervention
			return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
		}
		return err
	}
	var (
		ce *pgconn.ConnectError
		ne net.Error
	)
	// A connection refused, timed out, or cut in the middle of a query
	// (the server stopped): the database is unavailable, not broken.
	if errors.As(err, &ce) || pgconn.Timeout(err) || errors.As(err, &ne) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	}
	return err
}

// querier adapts *pgxpool.Pool and pgx.Tx to sqlstore.Querier.
type querier struct {
	q interface {
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	}
}

func (q querier) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := q.q.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func (q querier) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	return q.q.Query(ctx, query, args...)
}

func (q querier) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	return row{q.q.QueryRow(ctx, query, args...)}
}

// row maps pgx.ErrNoRows to sql.ErrNoRows, the store's "nothing found".
type row struct{ r pgx.Row }

func (r row) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return sql.ErrNoRows
	}
	return err
}
