package engine

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
)

// aheadPreparer is a Snapshotter that creates a sandbox ahead for a
// checkpoint, which a later Restore of it starts into, skipping the
// runtime's start (ocidriver.Snapshotting; BENCHMARKS.md, "Templates").
type aheadPreparer interface {
	// PrepareRestore makes a ready slot for the checkpoint in dir, unless
	// one is ready; ErrResourceExhausted when the driver holds its most.
	PrepareRestore(ctx context.Context, dir string) error
	// DropPrepared ends every ready slot and makes none from then on.
	DropPrepared(ctx context.Context) error
	// AheadFailure returns, once, why the latest restore into a slot
	// failed (it restored the usual way), or nil.
	AheadFailure() error
}

// prepareGolden makes a ready slot for g's checkpoint in the background,
// when g's driver makes them: the next session of g's template restores
// into it. A golden restore and MakeGolden call it, so that one slot per
// golden template waits, and is made again once taken. Engine.Wait waits
// for it. A slot that cannot be made costs nothing but the next
// session's speed: its restore goes the usual way.
func (e *Engine) prepareGolden(g *golden) {
	p, ok := g.snap.(aheadPreparer)
	if !ok || e.golden.NoAhead {
		return
	}
	if err := p.AheadFailure(); err != nil {
		e.log.Warn("a golden restore could not start in its sandbox created ahead; it restored the usual way", "template", g.tm.Name, "err", err)
	}
	e.closing.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := p.PrepareRestore(ctx, filepath.Join(g.dir, goldenCheckpoint))
		if err != nil && !errdefs.IsResourceExhausted(err) && !errdefs.IsFailedPrecondition(err) {
			e.log.Warn("creating a sandbox ahead for a golden checkpoint; its next session restores the usual way", "template", g.tm.Name, "err", err)
		}
	})
}

// DropReadySlots ends the sandboxes created ahead for golden restores
// (prepareGolden) in every driver that makes them, which make none from
// then on. The daemon calls it as it stops; one that dies leaves them to
// the next daemon's Reattach.
func (e *Engine) DropReadySlots(ctx context.Context) error {
	var errs []error
	for _, d := range e.drivers {
		if p, ok := d.(aheadPreparer); ok {
			errs = append(errs, p.DropPrepared(ctx))
		}
	}
	return errors.Join(errs...)
}
