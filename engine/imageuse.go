package engine

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/stockade-sh/stockade/sandbox"
)

// The daemon prunes the image store of the builds no ref, no live sandbox
// and no golden checkpoint uses (README, "Templates": old builds are
// pruned when no tool, pool or live session uses them). A sandbox pins
// the image it was created from (its rootfs) until it is destroyed: the
// engine counts the live sandboxes of each image digest, from the
// creation of each (a one-shot's, a session's, a pool's) to its end, and
// ImagesInUse lists them. A session sandbox carries its image's digest in
// a label (LabelImage), so that one re-attached by a restarted daemon, or
// resumed from a pause, counts for the build it runs, not the current
// one.

// LabelImage is the digest of the image a sandbox was created from.
const LabelImage = "stockade.image"

// imageUse counts the live sandboxes of each image digest.
type imageUse struct {
	mu sync.Mutex
	n  map[string]int
}

// hold counts one more sandbox of digest and returns what ends it, then
// calls release (nil: nothing); the returned func's count ends once,
// however often it is called (release is called each time, as it was).
func (u *imageUse) hold(digest string, release func()) func() {
	if digest == "" {
		if release == nil {
			return func() {}
		}
		return release
	}
	u.mu.Lock()
	if u.n == nil {
		u.n = map[string]int{}
	}
	u.n[digest]++
	u.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			u.mu.Lock()
			defer u.mu.Unlock()
			if u.n[digest]--; u.n[digest] <= 0 {
				delete(u.n, digest)
			}
		})
		if release != nil {
			release()
		}
	}
}

// digests returns the digests counted, sorted.
func (u *imageUse) digests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Sorted(maps.Keys(u.n))
}

// ImagesInUse returns the digests ("sha256:<hex>") of the images the
// engine's live sandboxes run: one-shots', sessions' (re-attached and
// resumed ones too) and the pools'. The image store must keep them
// (image.Store.Prune).
func (e *Engine) ImagesInUse() []string { return e.inUse.digests() }

// labeled is a sandbox that says its labels (the OCI drivers' do).
type labeled interface {
	Labels() map[string]string
}

// imageLabel is the image digest sb's LabelImage names, or else digest.
func imageLabel(sb sandbox.Sandbox, digest string) string {
	if l, ok := sb.(labeled); ok {
		if d := l.Labels()[LabelImage]; d != "" {
			return d
		}
	}
	return digest
}

// withImage returns labels with LabelImage set to digest (a copy).
func withImage(labels map[string]string, digest string) map[string]string {
	out := maps.Clone(labels)
	if out == nil {
		out = map[string]string{}
	}
	if digest != "" {
		out[LabelImage] = digest
	}
	return out
}

// PruneGolden removes the golden checkpoints whose image keep says is
// gone (a build pruned), and returns their directories. A checkpoint
// whose record cannot be read is left.
func (e *Engine) PruneGolden(keep func(digest string) bool) ([]string, error) {
	if e.golden.Dir == "" {
		return nil, nil
	}
	e.goldenMu.Lock()
	defer e.goldenMu.Unlock()
	templates, err := os.ReadDir(e.golden.Dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, t := range templates {
		dirs, err := os.ReadDir(filepath.Join(e.golden.Dir, t.Name()))
		if err != nil {
			continue
		}
		for _, d := range dirs {
			if strings.HasPrefix(d.Name(), ".new-") {
				continue
			}
			dir := filepath.Join(e.golden.Dir, t.Name(), d.Name())
			rec, err := readGolden(dir)
			if err != nil || keep(rec.Image) {
				continue
			}
			if err := os.RemoveAll(dir); err != nil {
				return removed, err
			}
			removed = append(removed, dir)
		}
	}
	return removed, nil
}
