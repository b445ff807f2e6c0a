package image

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/flock"
	"github.com/stockade-sh/stockade/internal/fsmode"
)

// A daemon's sandboxes run from the store's images, and only the daemon
// knows which (engine.Engine.ImagesInUse): it prunes the store itself
// (Prune with what they use), and holds the store (Hold) while it runs,
// so that a prune by hand (PruneIdle, `stockade image prune`) is refused
// meanwhile. The hold is a shared lock on <root>/images/daemons.lock:
// daemons sharing a store each hold it.

// Hold marks the store as used by a running daemon until release.
func (s *Store) Hold() (release func(), err error) {
	if err := os.MkdirAll(s.imagesDir(), fsmode.Traverse); err != nil {
		return nil, fmt.Errorf("creating image store: %w", classify(err))
	}
	r, err := flock.TryLockShared(s.holdFile())
	if errors.Is(err, flock.ErrHeld) {
		return nil, fmt.Errorf("the image store is being pruned (%s is locked); try again: %w", s.holdFile(), errdefs.ErrUnavailable)
	}
	if err != nil {
		return nil, fmt.Errorf("holding the image store: %w", classify(err))
	}
	return func() { r() }, nil
}

// PruneIdle is Prune for a process that runs no sandbox itself (the CLI):
// it is refused, ErrFailedPrecondition, while a daemon holds the store,
// whose sandboxes may run from the images no ref points to (it prunes
// them itself when no sandbox uses them). Without a daemon, the caller
// must make sure no sandbox runs from them.
func (s *Store) PruneIdle() ([]string, error) {
	if err := os.MkdirAll(s.imagesDir(), fsmode.Traverse); err != nil {
		return nil, fmt.Errorf("creating image store: %w", classify(err))
	}
	release, err := flock.TryLock(s.holdFile())
	if errors.Is(err, flock.ErrHeld) {
		return nil, errdefs.Publicf("a stockade daemon uses the image store in %s: it prunes the images its sandboxes no longer use after each template build and at its start; stop it to prune by hand: %w",
			s.root, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return nil, fmt.Errorf("locking the image store: %w", classify(err))
	}
	defer release()
	return s.Prune(nil)
}

// Has says whether the store holds the image of digest ("sha256:<hex>").
func (s *Store) Has(digest string) bool {
	hexd, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || !hexDigest.MatchString(hexd) {
		return false
	}
	_, err := os.Stat(s.imageDir(hexd))
	return err == nil
}

func (s *Store) holdFile() string { return filepath.Join(s.imagesDir(), "daemons.lock") }
