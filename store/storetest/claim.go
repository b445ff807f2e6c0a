package storetest

import (
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/store"
)

// ClaimDaemon checks store.Store.ClaimDaemon through two stores on one
// database: the second cannot claim it while the first holds it, and can
// once the first releases it.
func ClaimDaemon(t *testing.T, a, b store.Store) {
	t.Helper()
	ctx := t.Context()
	claim, err := a.ClaimDaemon(ctx)
	if err != nil {
		t.Fatalf("first claim: %v", err)
	}
	if err := claim.Check(ctx); err != nil {
		t.Fatalf("Check of a held claim: %v", err)
	}
	_, err = b.ClaimDaemon(ctx)
	wantClass(t, "a second claim while the first is held", err, errdefs.ErrConflict)
	if err := claim.Release(t.Context()); err != nil {
		t.Fatalf("release: %v", err)
	}
	second, err := b.ClaimDaemon(ctx)
	if err != nil {
		t.Fatalf("a claim after the release: %v", err)
	}
	if err := second.Release(t.Context()); err != nil {
		t.Fatalf("second release: %v", err)
	}
}
