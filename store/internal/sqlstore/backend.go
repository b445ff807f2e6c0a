// Package sqlstore implements store.Store once, over any SQL database that a
// Backend adapts: store/sqlite and store/postgres differ only in their
// Backend, their Dialect and their migrations. Keeping one implementation of
// the transactional logic is what makes the two behave alike; the shared
// conformance suite (store/storetest) proves the dialects right.
//
// The SQL here uses $1-style parameters, which both PostgreSQL and SQLite
// (through modernc.org/sqlite) accept, and only syntax both understand, with
// Dialect.ForUpdate for the row locks PostgreSQL needs and SQLite's single
// writer makes unnecessary.
package sqlstore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/store"
)

// Querier runs statements on a connection pool or inside a transaction.
type Querier interface {
	// Exec runs a statement and returns the number of rows it affected.
	Exec(ctx context.Context, query string, args ...any) (int64, error)
	Query(ctx context.Context, query string, args ...any) (Rows, error)
	// QueryRow's Scan returns sql.ErrNoRows when the query found nothing.
	QueryRow(ctx context.Context, query string, args ...any) Row
}

// Rows is a result set; the caller must Close it.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Row is a single-row result.
type Row interface {
	Scan(dest ...any) error
}

// Backend adapts one database.
type Backend interface {
	// Reader runs statements outside any transaction, for reads.
	Reader() Querier
	// InTx runs fn in a read-write transaction, committing it when fn
	// returns nil and rolling it back otherwise. The transaction must make
	// concurrent InTx calls safe: the SQL relies on Dialect.ForUpdate and on
	// conditional UPDATEs being re-checked after a lock wait (PostgreSQL's
	// READ COMMITTED), or on writers being serialised (SQLite).
	InTx(ctx context.Context, fn func(q Querier) error) error
	// InSnapshot runs fn in a read-only transaction that sees one consistent
	// snapshot of the database.
	InSnapshot(ctx context.Context, fn func(q Querier) error) error
	// Claim takes the database's daemon claim (store.Store.ClaimDaemon).
	Claim(ctx context.Context) (store.DaemonClaim, error)
	Dialect() Dialect
	Close() error
}

// Dialect is what differs in the SQL of two backends.
type Dialect struct {
	// ForUpdate is appended to a SELECT of rows the transaction goes on to
	// change: " FOR UPDATE" or "" where writers are serialised anyway.
	ForUpdate string
	// Time turns a non-zero time (UTC, microseconds) into a parameter for a
	// timestamp column.
	Time func(time.Time) any
	// Classify wraps a driver error in its errdefs class (unique violation:
	// ErrConflict; foreign key: ErrNotFound; check: ErrFailedPrecondition;
	// busy or unreachable: ErrUnavailable) and returns other errors as they
	// are.
	Classify func(error) error
}

// Store implements store.Store over a Backend.
type Store struct {
	b      Backend
	d      Dialect
	now    func() time.Time
	outbox bool
}

var _ store.Store = (*Store)(nil)

// Options configure New.
type Options struct {
	// Now is the clock for times the caller does not give; nil means
	// time.Now.
	Now func() time.Time
	// AnalyticsOutbox enqueues every tool_invocations row in the analytics
	// outbox (store.AnalyticsOutbox); false enqueues none.
	AnalyticsOutbox bool
}

// New returns a Store over b. The Store owns b and closes it in Close.
func New(b Backend, o Options) *Store {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Store{b: b, d: b.Dialect(), now: o.Now, outbox: o.AnalyticsOutbox}
}

// Close closes the backend.
func (s *Store) Close() error { return s.b.Close() }

// ClaimDaemon implements store.Store.
func (s *Store) ClaimDaemon(ctx context.Context) (store.DaemonClaim, error) { return s.b.Claim(ctx) }

func (s *Store) clock() time.Time { return store.TruncateTime(s.now()) }

// inTx runs fn in a write transaction and classifies driver errors.
func (s *Store) inTx(ctx context.Context, fn func(q Querier) error) error {
	return s.classify(s.b.InTx(ctx, fn))
}

func (s *Store) classify(err error) error {
	if err == nil {
		return nil
	}
	return s.d.Classify(err)
}

// tm converts a time parameter; the zero time is NULL.
func (s *Store) tm(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return s.d.Time(store.TruncateTime(t))
}

// nstr converts a string parameter; the empty string is NULL.
func nstr(v string) any {
	if v == "" {
		return nil
	}
	return v
}

// njson converts a JSON parameter; empty is NULL.
func njson(v json.RawMessage) any {
	if len(v) == 0 {
		return nil
	}
	return string(v)
}

// args builds a parameter list alongside the SQL that references it.
type args []any

// add appends v and returns its placeholder.
func (a *args) add(v any) string {
	*a = append(*a, v)
	return "$" + strconv.Itoa(len(*a))
}

// in appends every value and returns "($i, $j, ...)".
func in[T ~string](a *args, vs []T) string {
	ph := make([]string, len(vs))
	for i, v := range vs {
		ph[i] = a.add(string(v))
	}
	return "(" + strings.Join(ph, ", ") + ")"
}

// timeScan scans a nullable timestamp stored either as a timestamp or as
// integer microseconds since the epoch.
type timeScan struct{ t *time.Time }

func (ts timeScan) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*ts.t = time.Time{}
	case int64:
		*ts.t = time.UnixMicro(v).UTC()
	case time.Time:
		*ts.t = store.TruncateTime(v)
	default:
		return fmt.Errorf("scanning a timestamp from %T", src)
	}
	return nil
}

func scanTime(t *time.Time) timeScan { return timeScan{t} }

// strScan scans nullable text, NULL as "".
type strScan struct{ s *string }

func (ss strScan) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*ss.s = ""
	case string:
		*ss.s = v
	case []byte:
		*ss.s = string(v)
	default:
		return fmt.Errorf("scanning text from %T", src)
	}
	return nil
}

func scanStr(s *string) strScan { return strScan{s} }

// jsonScan scans nullable JSON text, NULL as nil.
type jsonScan struct{ j *json.RawMessage }

func (js jsonScan) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*js.j = nil
	case string:
		*js.j = json.RawMessage(v)
	case []byte:
		*js.j = append(json.RawMessage(nil), v...)
	default:
		return fmt.Errorf("scanning JSON from %T", src)
	}
	return nil
}

func scanJSON(j *json.RawMessage) jsonScan { return jsonScan{j} }

// intPtrScan scans a nullable integer into *int.
type intPtrScan struct{ p **int }

func (is intPtrScan) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*is.p = nil
	case int64:
		n := int(v)
		*is.p = &n
	case int32:
		n := int(v)
		*is.p = &n
	default:
		return fmt.Errorf("scanning an integer from %T", src)
	}
	return nil
}

func scanIntPtr(p **int) intPtrScan { return intPtrScan{p} }

func nint(p *int) any {
	if p == nil {
		return nil
	}
	return int64(*p)
}

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newID returns prefix_ followed by 128 random bits.
func newID(prefix string) string {
	var b [16]byte
	rand.Read(b[:])
	return prefix + "_" + idEncoding.EncodeToString(b[:])
}

// cursor is the position after the last item of a page: its sort key (time
// in microseconds, or seq) and id.
type cursor struct {
	key int64
	id  string
}

func (c cursor) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.key, 10) + "." + c.id))
}

func parseCursor(s string) (cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return cursor{}, errdefs.Publicf("decoding page cursor: %w", errdefs.ErrInvalidArgument)
	}
	k, id, ok := strings.Cut(string(b), ".")
	n, err := strconv.ParseInt(k, 10, 64)
	if !ok || err != nil || checkText("cursor", id, maxText) != nil {
		return cursor{}, errdefs.Publicf("decoding page cursor: %w", errdefs.ErrInvalidArgument)
	}
	return cursor{key: n, id: id}, nil
}

func limitOf(p store.PageRequest) int {
	switch {
	case p.Limit <= 0:
		return store.DefaultPageLimit
	case p.Limit > store.MaxPageLimit:
		return store.MaxPageLimit
	}
	return p.Limit
}

// timePage adds the keyset condition of a newest-first page ordered by
// (col DESC, id DESC) and returns the ORDER BY ... LIMIT clause.
func (s *Store) timePage(a *args, where *[]string, col string, p store.PageRequest) (string, int, error) {
	n := limitOf(p)
	if p.Cursor != "" {
		c, err := parseCursor(p.Cursor)
		if err != nil {
			return "", 0, err
		}
		t := s.d.Time(time.UnixMicro(c.key).UTC())
		t1, t2, id := a.add(t), a.add(t), a.add(c.id)
		*where = append(*where, fmt.Sprintf("(%s < %s OR (%s = %s AND id < %s))", col, t1, col, t2, id))
	}
	return fmt.Sprintf(" ORDER BY %s DESC, id DESC LIMIT %d", col, n+1), n, nil
}

// timeRange adds Since <= col < Until.
func (s *Store) timeRange(a *args, where *[]string, col string, since, until time.Time) {
	if !since.IsZero() {
		*where = append(*where, col+" >= "+a.add(s.d.Time(store.TruncateTime(since))))
	}
	if !until.IsZero() {
		*where = append(*where, col+" < "+a.add(s.d.Time(store.TruncateTime(until))))
	}
}

// finishPage trims the extra row fetched to detect a next page.
func finishPage[T any](items []T, n int, key func(T) cursor) store.Page[T] {
	if len(items) <= n {
		return store.Page[T]{Items: items}
	}
	items = items[:n]
	return store.Page[T]{Items: items, Next: key(items[n-1]).String()}
}

// queryAll runs a query and scans every row with scan.
func queryAll[T any](ctx context.Context, q Querier, scan func(Row) (T, error), query string, a ...any) ([]T, error) {
	rows, err := q.Query(ctx, query, a...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// notFound turns sql.ErrNoRows into ErrNotFound.
func notFound(err error) error {
	if err == sql.ErrNoRows {
		return errdefs.ErrNotFound
	}
	return err
}

// missing is the error of a lookup of one row of kind (execution, key)
// by id that err answered: `execution "ex_1" not found`, which a client
// may read (it names only what the client asked for), when no row
// matched; else the database's error, classified, which it may not.
func (s *Store) missing(err error, kind, id string) error {
	if notFound(err) == errdefs.ErrNotFound {
		if len(id) > 80 {
			id = id[:80] + "..."
		}
		return errdefs.Publicf("%s %q not found: %w", kind, id, errdefs.ErrNotFound)
	}
	return fmt.Errorf("getting %s %q: %w", kind, id, s.classify(err))
}
