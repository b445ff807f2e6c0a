package sqlite

import "context"

// OpenAt is Open migrating the database up to version v only.
func OpenAt(ctx context.Context, c Config, v int) (*Store, error) { return open(ctx, c, v) }

// SynchronousSetting is the writer connection's PRAGMA synchronous (1
// NORMAL, 2 FULL).
func (s *Store) SynchronousSetting(ctx context.Context) (int, error) {
	var n int
	err := s.writer.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&n)
	return n, err
}
