// Package sqlite is Stockade's embedded store: store.Store on a single SQLite
// file through modernc.org/sqlite (pure Go, no cgo).
//
//	st, err := sqlite.Open(ctx, sqlite.Config{Path: "/var/lib/stockade/stockade.db"})
//	if err != nil { ... }
//	defer st.Close()
//
// The database runs in WAL mode with foreign keys on. All writes of a process
// go through one connection, so transactions never interleave within the
// process; every write transaction begins IMMEDIATE, so that another process
// on the same file (the admin CLI next to the daemon) waits up to
// Config.BusyTimeout for the write lock instead of failing halfway. Reads use
// a separate pool and see the last committed state. synchronous=FULL: the
// write-ahead log is flushed to disk at every commit, so a committed
// transaction (a ledger movement, an audit event) survives a crash of the
// process and a power failure alike; NORMAL, which would lose the last
// ones at a power failure, is only for measuring what FULL costs
// (Config.Synchronous, BENCHMARKS.md).
package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/flock"
	"github.com/stockade-sh/stockade/internal/fsmode"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/store/internal/sqlstore"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Config configures Open.
type Config struct {
	// Path is the database file; it is created if missing. Required.
	Path string
	// BusyTimeout is how long a transaction waits for another process's write
	// lock before failing with ErrUnavailable. Zero means 5 s.
	BusyTimeout time.Duration
	// Readers bounds the read connections. Zero means 4.
	Readers int
	// Now is the clock for the times the store sets itself; nil means
	// time.Now.
	Now func() time.Time
	// AnalyticsOutbox enqueues every tool_invocations row in the analytics
	// outbox (store.AnalyticsOutbox), for the daemon to ship; false (the
	// admin commands, a daemon without analytics) enqueues none.
	AnalyticsOutbox bool
	// Synchronous is SQLite's synchronous setting, SyncFull or
	// SyncNormal; empty means SyncFull, under which a committed
	// transaction survives a power failure. SyncNormal may lose the last
	// commits at a power failure: bench/capability measures the two side
	// by side, and nothing else should set it.
	Synchronous string
}

// The synchronous settings of Config.Synchronous.
const (
	SyncFull   = "FULL"
	SyncNormal = "NORMAL"
)

// Validate reports a Config that Open cannot use.
func (c Config) Validate() error {
	switch {
	case c.Path == "":
		return fmt.Errorf("sqlite path is required: %w", errdefs.ErrInvalidArgument)
	case c.Path == ":memory:" || strings.HasPrefix(c.Path, "file:") || strings.ContainsAny(c.Path, "?#"):
		return fmt.Errorf("sqlite path %q must be a plain file name, not a URI or :memory: (the writer and readers must share one file): %w",
			c.Path, errdefs.ErrInvalidArgument)
	case c.Synchronous != "" && c.Synchronous != SyncFull && c.Synchronous != SyncNormal:
		return fmt.Errorf("sqlite synchronous %q: use %s or %s: %w", c.Synchronous, SyncFull, SyncNormal, errdefs.ErrInvalidArgument)
	case c.BusyTimeout < 0 || c.Readers < 0:
		return fmt.Errorf("negative sqlite busy timeout or readers: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// Store is a store.Store on SQLite. It is safe for concurrent use.
type Store struct {
	*sqlstore.Store
	writer *sql.DB
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database at c.Path and applies the
// embedded migrations. The caller must Close the Store.
func Open(ctx context.Context, c Config) (*Store, error) { return open(ctx, c, 0) }

// open is Open applying the migrations up to version upTo only, or all of
// them for 0: the upgrade test makes a database of an older schema with it.
func open(ctx context.Context, c Config, upTo int) (*Store, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.BusyTimeout == 0 {
		c.BusyTimeout = 5 * time.Second
	}
	if c.Readers == 0 {
		c.Readers = 4
	}
	now := c.Now
	if now == nil {
		now = time.Now
	}
	// SQLite makes the -wal and -shm with the database's mode: the
	// database is made private before SQLite first opens it.
	if err := fsmode.PrivateFile(c.Path, c.Path+"-wal", c.Path+"-shm", c.Path+"-journal"); err != nil {
		return nil, fmt.Errorf("opening sqlite database %s: %w", c.Path, classify(err))
	}
	q := url.Values{}
	q.Set("_busy_timeout", strconv.FormatInt(c.BusyTimeout.Milliseconds(), 10))
	q.Set("_foreign_keys", "1")
	q.Set("_journal_mode", "WAL")
	q.Set("_synchronous", cmp.Or(c.Synchronous, SyncFull))
	q.Set("_txlock", "immediate")
	writer, err := sql.Open("sqlite", c.Path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("opening sqlite database %s: %w", c.Path, err)
	}
	writer.SetMaxOpenConns(1)
	writer.SetMaxIdleConns(1)
	writer.SetConnMaxLifetime(0)
	writer.SetConnMaxIdleTime(0)

	// The journal mode is set (and WAL created) by the writer before any
	// reader opens, so readers never race to convert the file.
	if err := writer.PingContext(ctx); err != nil {
		writer.Close()
		return nil, fmt.Errorf("opening sqlite database %s: %w", c.Path, classify(err))
	}
	q.Del("_txlock")
	q.Del("_journal_mode")
	q.Set("_query_only", "1")
	reader, err := sql.Open("sqlite", c.Path+"?"+q.Encode())
	if err != nil {
		writer.Close()
		return nil, fmt.Errorf("opening sqlite database %s: %w", c.Path, err)
	}
	reader.SetMaxOpenConns(c.Readers)
	reader.SetMaxIdleConns(c.Readers)

	b := newBackend(c.Path, writer, reader)
	if err := migrate(ctx, b, upTo, now()); err != nil {
		b.Close()
		return nil, fmt.Errorf("migrating sqlite database %s: %w", c.Path, classify(err))
	}
	return &Store{Store: sqlstore.New(b, sqlstore.Options{Now: now, AnalyticsOutbox: c.AnalyticsOutbox}), writer: writer}, nil
}

// migrate applies the embedded migrations. A migration that changes a
// table's constraints rebuilds the table, which SQLite allows only with
// foreign keys off (PRAGMA foreign_keys is a no-op inside a transaction,
// and dropping a table that others reference would otherwise fail): they
// are turned off on the writer's one connection around the migration, and
// every foreign key is checked before it commits.
func migrate(ctx context.Context, b *backend, upTo int, now time.Time) error {
	ms, err := sqlstore.LoadMigrations(migrations, "migrations")
	if err != nil {
		return err
	}
	if _, err := b.writer.ExecContext(ctx, "PRAGMA foreign_keys = OFF"); err != nil {
		return fmt.Errorf("turning foreign keys off for the migration: %w", err)
	}
	err = sqlstore.Migrate(ctx, b, sqlstore.UpTo(ms, upTo), "", checkForeignKeys, now)
	if _, ferr := b.writer.ExecContext(context.WithoutCancel(ctx), "PRAGMA foreign_keys = ON"); ferr != nil {
		// The connection must not serve the store without them.
		return errors.Join(err, fmt.Errorf("turning foreign keys on again: %w", ferr))
	}
	return err
}

// checkForeignKeys fails when any row references a row that is not there.
func checkForeignKeys(ctx context.Context, q sqlstore.Querier) error {
	var (
		table, parent string
		rowid, fk     int64
	)
	err := q.QueryRow(ctx, "PRAGMA foreign_key_check").Scan(&table, &rowid, &parent, &fk)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("checking foreign keys: %w", err)
	}
	return fmt.Errorf("a migration left row %d of %s referencing a missing row of %s: %w", rowid, table, parent, errdefs.ErrFailedPrecondition)
}

// UnsafeExec runs a statement on the writer connection, outside the store's
// rules. It exists for the conformance suite, which uses it to tamper with
// rows as an attacker with database access would; nothing else may call it.
func (s *Store) UnsafeExec(ctx context.Context, query string, args ...any) error {
	_, err := s.writer.ExecContext(ctx, query, args...)
	return err
}

// backend adapts database/sql on modernc.org/sqlite to sqlstore.Backend.
type backend struct {
	path                  string
	writer, reader        *sql.DB
	writeStmts, readStmts *stmtCache
}

func newBackend(path string, writer, reader *sql.DB) *backend {
	return &backend{path: path, writer: writer, reader: reader,
		writeStmts: newStmtCache(writer), readStmts: newStmtCache(reader)}
}

func (b *backend) Reader() sqlstore.Querier { return querier{q: b.reader, stmts: b.readStmts} }

func (b *backend) InTx(ctx context.Context, fn func(sqlstore.Querier) error) error {
	return inTx(ctx, b.writer, b.writeStmts, nil, fn)
}

// InSnapshot runs fn in a read transaction on a reader: in WAL mode it sees
// the database as of its first read until it ends.
func (b *backend) InSnapshot(ctx context.Context, fn func(sqlstore.Querier) error) error {
	return inTx(ctx, b.reader, b.readStmts, &sql.TxOptions{ReadOnly: true}, fn)
}

func inTx(ctx context.Context, db *sql.DB, stmts *stmtCache, opts *sql.TxOptions, fn func(sqlstore.Querier) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("beginning transaction: %w", err)
	}
	ended := false
	defer func() {
		if !ended {
			// fn panicked. Give the connection back before the panic goes
			// on: a recovered panic (net/http recovers its handlers') would
			// otherwise leave the writer's one connection in this
			// transaction, and every later write would wait for it forever.
			tx.Rollback()
			return
		}
		// Statements first seen in this transaction are prepared now that
		// it has given its connection back; preparing earlier would wait
		// for that connection, held by this very goroutine.
		stmts.prepare(ctx)
	}()
	err = fn(querier{q: tx, tx: tx, stmts: stmts})
	ended = true
	if err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("committing transaction: %w", err)
	}
	return nil
}

// Claim locks the file next to the database that marks its daemon
// (flock, exclusive): the kernel releases it when the daemon dies, however
// it dies. A SQLite database is only ever shared by processes of one host.
func (b *backend) Claim(ctx context.Context) (store.DaemonClaim, error) {
	name := b.path + ".daemon"
	release, err := flock.TryLock(name)
	if errors.Is(err, flock.ErrHeld) {
		return nil, fmt.Errorf("another stockade daemon serves the database %s (it holds %s); stop it first, or give this one its own --db: %w", b.path, name, errdefs.ErrConflict)
	}
	if err != nil {
		return nil, fmt.Errorf("claiming the database: %w", err)
	}
	return fileClaim(release), nil
}

// fileClaim is a claim held by a lock file, which only its process ends.
type fileClaim func() error

func (fileClaim) Check(context.Context) error     { return nil }
func (c fileClaim) Release(context.Context) error { return c() }

func (b *backend) Dialect() sqlstore.Dialect {
	return sqlstore.Dialect{
		ForUpdate: "",
		Time:      func(t time.Time) any { return t.UnixMicro() },
		Classify:  classify,
	}
}

func (b *backend) Close() error {
	return errors.Join(b.readStmts.close(), b.writeStmts.close(), b.reader.Close(), b.writer.Close())
}

// maxCachedStmts bounds the statement cache; the store's SQL has far fewer
// distinct texts, but list filters combine.
const maxCachedStmts = 512

// stmtCache keeps prepared statements, so that a hot statement is parsed
// once per connection rather than on every call: SQLite's parser is a large
// share of a short transaction's cost. Statements are prepared only outside
// transactions: preparing on the pool while a transaction holds the writer's
// one connection would wait for that connection forever. A statement first
// seen inside a transaction runs unprepared and is prepared after the
// transaction ends. It is safe for concurrent use.
type stmtCache struct {
	db      *sql.DB
	mu      sync.Mutex
	m       map[string]*sql.Stmt
	pending map[string]bool
}

func newStmtCache(db *sql.DB) *stmtCache {
	return &stmtCache{db: db, m: map[string]*sql.Stmt{}, pending: map[string]bool{}}
}

// cached returns the prepared statement for query, or nil. Statements
// without parameters are never cached: migrations hold several statements in
// one text.
func (c *stmtCache) cached(query string, args []any) *sql.Stmt {
	if len(args) == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.m[query]
	if s == nil && len(c.m)+len(c.pending) < maxCachedStmts {
		c.pending[query] = true
	}
	return s
}

// prepare prepares the pending statements. The caller must hold no
// connection of c.db, and prepare holds c.mu only between preparations:
// a transaction holding the writer's connection may need c.mu meanwhile. A
// statement that fails to prepare is dropped: it will fail again, with its
// error, when it runs unprepared.
func (c *stmtCache) prepare(ctx context.Context) {
	c.mu.Lock()
	var qs []string
	for q := range c.pending {
		qs = append(qs, q)
		delete(c.pending, q)
	}
	c.mu.Unlock()
	for _, q := range qs {
		s, err := c.db.PrepareContext(ctx, q)
		if err != nil {
			continue
		}
		c.mu.Lock()
		if _, dup := c.m[q]; dup {
			s.Close()
		} else {
			c.m[q] = s
		}
		c.mu.Unlock()
	}
}

func (c *stmtCache) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for q, s := range c.m {
		errs = append(errs, s.Close())
		delete(c.m, q)
	}
	return errors.Join(errs...)
}

// classify wraps SQLite's constraint and locking errors in errdefs classes.
func classify(err error) error {
	var se *msqlite.Error
	if !errors.As(err, &se) {
		return err
	}
	switch se.Code() {
	case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
		return fmt.Errorf("%w: %w", errdefs.ErrConflict, err)
	case sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY:
		return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
	case sqlite3.SQLITE_CONSTRAINT_CHECK:
		return fmt.Errorf("%w: %w", errdefs.ErrFailedPrecondition, err)
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return fmt.Errorf("database is locked by another writer: %w: %w", errdefs.ErrUnavailable, err)
	}
	return err
}

// querier adapts *sql.DB and *sql.Tx to sqlstore.Querier, running cached
// prepared statements where it can.
type querier struct {
	q interface {
		ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
		QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
		QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	}
	// tx is set inside a transaction, whose statements must run on its
	// connection.
	tx    *sql.Tx
	stmts *stmtCache
}

// stmt returns the prepared form of query for this querier, or nil. Outside
// a transaction it prepares a statement it has not seen yet.
func (q querier) stmt(ctx context.Context, query string, args []any) (*sql.Stmt, error) {
	s := q.stmts.cached(query, args)
	if s == nil && q.tx == nil && len(args) > 0 {
		q.stmts.prepare(ctx)
		s = q.stmts.cached(query, args)
	}
	if s == nil || q.tx == nil {
		return s, nil
	}
	return q.tx.StmtContext(ctx, s), nil
}

func (q querier) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	var (
		res sql.Result
		err error
	)
	switch s, perr := q.stmt(ctx, query, args); {
	case perr != nil:
		return 0, perr
	case s != nil:
		res, err = s.ExecContext(ctx, args...)
	default:
		res, err = q.q.ExecContext(ctx, query, args...)
	}
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (q querier) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	var (
		rows *sql.Rows
		err  error
	)
	switch s, perr := q.stmt(ctx, query, args); {
	case perr != nil:
		return nil, perr
	case s != nil:
		rows, err = s.QueryContext(ctx, args...)
	default:
		rows, err = q.q.QueryContext(ctx, query, args...)
	}
	if err != nil {
		return nil, err
	}
	return sqlRows{rows}, nil
}

func (q querier) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	switch s, err := q.stmt(ctx, query, args); {
	case err != nil:
		return errRow{err}
	case s != nil:
		return s.QueryRowContext(ctx, args...)
	}
	return q.q.QueryRowContext(ctx, query, args...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { r.Rows.Close() }
