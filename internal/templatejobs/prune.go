package templatejobs

import (
	"log/slog"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
)

// InUse is what the daemon's sandboxes use (engine.Engine): the images
// they run, and the golden checkpoints, of images that may be gone.
type InUse interface {
	ImagesInUse() []string
	PruneGolden(keep func(digest string) bool) ([]string, error)
}

// Pruner prunes the image store of the daemon (README, "Templates": old
// builds are pruned when no tool, pool or live session uses them): the
// images no ref points to and no live sandbox runs (a session's, a
// pool's, a one-shot's), then the golden checkpoints whose image is gone.
// The daemon prunes at its start, once its sessions are re-attached, and
// after each build job that made a build (Options.Prune); it holds the
// store meanwhile (image.Store.Hold), so that `stockade image prune` is
// refused.
type Pruner struct {
	Store  *image.Store
	Engine InUse
	// Keep, if set, lists more images to keep: those paused sessions'
	// checkpoints restore from.
	Keep func() []string
	// Logger receives what was pruned; nil is slog.Default().
	Logger *slog.Logger
}

// Prune prunes once. The store's lock held by another operation (a build)
// is no error: the build's job prunes after it.
func (p Pruner) Prune() error {
	log := p.Logger
	if log == nil {
		log = slog.Default()
	}
	keep := p.Engine.ImagesInUse()
	if p.Keep != nil {
		keep = append(keep, p.Keep()...)
	}
	pruned, err := p.Store.Prune(keep)
	for _, d := range pruned {
		log.Info("pruned an image no ref or sandbox uses", "digest", d)
	}
	if errdefs.IsUnavailable(err) {
		return nil
	}
	if err != nil {
		return err
	}
	dirs, err := p.Engine.PruneGolden(p.Store.Has)
	for _, d := range dirs {
		log.Info("pruned a golden checkpoint of an image gone", "dir", d)
	}
	return err
}
