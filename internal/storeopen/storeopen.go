// Package storeopen opens the store a database URL names:
//
//	sqlite:/var/lib/stockade/stockade.db   the embedded default (pure Go)
//	postgres://user@host:5432/db            PostgreSQL (postgresql:// too)
package storeopen

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/store/postgres"
	"github.com/stockade-sh/stockade/store/sqlite"
)

// DefaultURL is the embedded database in dataDir.
func DefaultURL(dataDir string) string { return "sqlite:" + filepath.Join(dataDir, "stockade.db") }

// Open opens the store at url, applying migrations, with the zero Options.
// The caller must Close it.
func Open(ctx context.Context, url string) (store.Store, error) { return OpenWith(ctx, url, Options{}) }

// Options configure OpenWith.
type Options struct {
	// AnalyticsOutbox enqueues every tool_invocations row in the analytics
	// outbox: for a daemon that ships them (config.Analytics).
	AnalyticsOutbox bool
}

// OpenWith opens the store at url with o, applying migrations. The caller
// must Close it.
func OpenWith(ctx context.Context, url string, o Options) (store.Store, error) {
	switch {
	case strings.HasPrefix(url, "sqlite:"):
		path := strings.TrimPrefix(url, "sqlite:")
		if !filepath.IsAbs(path) {
			return nil, fmt.Errorf("database %q: the sqlite path must be absolute: %w", url, errdefs.ErrInvalidArgument)
		}
		return sqlite.Open(ctx, sqlite.Config{Path: path, AnalyticsOutbox: o.AnalyticsOutbox})
	case strings.HasPrefix(url, "postgres://"), strings.HasPrefix(url, "postgresql://"):
		return postgres.Open(ctx, postgres.Config{DSN: url, AnalyticsOutbox: o.AnalyticsOutbox})
	}
	return nil, fmt.Errorf("database %q: use sqlite:/path/to/file.db or postgres://...: %w", url, errdefs.ErrInvalidArgument)
}
