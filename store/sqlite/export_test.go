package sqlite

import "context"

// OpenAt is Open migrating the database up to version v only.
func OpenAt(ctx context.Context, c Config, v int) (*Store, error) { return open(ctx, c, v) }
