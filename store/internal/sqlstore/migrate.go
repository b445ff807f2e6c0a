package sqlstore

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
)

// Migration is one versioned schema change, read from a file named
// NNNN_description.sql.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// LoadMigrations reads the *.sql files of dir in fsys, ordered by version.
// Versions must be unique and positive.
func LoadMigrations(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("reading migrations: %w", err)
	}
	var ms []Migration
	seen := map[int]string{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		num, _, _ := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must start with a positive version number: %w", e.Name(), errdefs.ErrInvalidArgument)
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrations %s and %s share version %d: %w", prev, e.Name(), v, errdefs.ErrInvalidArgument)
		}
		seen[v] = e.Name()
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("reading migration %s: %w", e.Name(), err)
		}
		ms = append(ms, Migration{Version: v, Name: e.Name(), SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	return ms, nil
}

// UpTo returns the migrations of ms up to version v, or ms for 0.
func UpTo(ms []Migration, v int) []Migration {
	if v == 0 {
		return ms
	}
	var out []Migration
	for _, m := range ms {
		if m.Version <= v {
			out = append(out, m)
		}
	}
	return out
}

// Migrate applies the migrations not yet recorded in schema_migrations, in
// one transaction. lock, when not empty, is run first in that transaction to
// keep two processes from migrating at once; check, when not nil, runs last
// in it once a migration was applied, and an error from it undoes them all.
// A database that records a version this binary does not know was migrated
// by a newer Stockade and is refused with ErrFailedPrecondition.
func Migrate(ctx context.Context, b Backend, ms []Migration, lock string, check func(context.Context, Querier) error, now time.Time) error {
	return b.InTx(ctx, func(q Querier) error {
		if lock != "" {
			if _, err := q.Exec(ctx, lock); err != nil {
				return fmt.Errorf("taking the migration lock: %w", err)
			}
		}
		if _, err := q.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)`); err != nil {
			return fmt.Errorf("creating schema_migrations: %w", err)
		}
		applied, err := queryAll(ctx, q, func(r Row) (int, error) {
			var v int
			return v, r.Scan(&v)
		}, `SELECT version FROM schema_migrations ORDER BY version`)
		if err != nil {
			return fmt.Errorf("reading schema_migrations: %w", err)
		}
		done := map[int]bool{}
		for _, v := range applied {
			done[v] = true
		}
		known := 0
		if len(ms) > 0 {
			known = ms[len(ms)-1].Version
		}
		if len(applied) > 0 && applied[len(applied)-1] > known {
			return fmt.Errorf("the database is at schema version %d, newer than this binary's %d; upgrade Stockade: %w",
				applied[len(applied)-1], known, errdefs.ErrFailedPrecondition)
		}
		applies := false
		for _, m := range ms {
			if done[m.Version] {
				continue
			}
			if _, err := q.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("applying migration %s: %w", m.Name, err)
			}
			if _, err := q.Exec(ctx, `INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)`,
				m.Version, m.Name, now.UTC().Format(time.RFC3339Nano)); err != nil {
				return fmt.Errorf("recording migration %s: %w", m.Name, err)
			}
			applies = true
		}
		if applies && check != nil {
			return check(ctx, q)
		}
		return nil
	})
}
