package wiring

import (
	"os"
	"path/filepath"

	"github.com/stockade-sh/stockade/internal/ocidriver"
)

// PausedImages lists the digests of the images the paused sessions'
// checkpoints under dir (config.Config.CheckpointDir, one directory each)
// restore from: the daemon's image store keeps them.
func PausedImages(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		if d, err := ocidriver.CheckpointImage(filepath.Join(dir, e.Name())); err == nil && d != "" {
			out = append(out, d)
		}
	}
	return out
}
