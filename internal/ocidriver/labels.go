package ocidriver

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
)

// Labels returns the sandbox's labels: those it was created with, and a
// binding's (a copy).
func (s *sbx) Labels() map[string]string {
	s.bindMu.Lock()
	defer s.bindMu.Unlock()
	return maps.Clone(s.labels)
}

// CheckpointImage returns the digest of the image the sandbox saved in
// checkpoint directory dir runs from (its record's), which a restore
// needs: the image store must keep it while the checkpoint may be
// restored (a paused session's). The record is not authenticated here: a
// forged one can only keep an image longer.
func CheckpointImage(dir string) (string, error) {
	f, err := os.Open(filepath.Join(dir, snapshotRecordFile))
	if err != nil {
		return "", err
	}
	defer f.Close()
	var rec snapshotRecord
	if err := json.NewDecoder(io.LimitReader(f, maxSnapshotRecord)).Decode(&rec); err != nil {
		return "", fmt.Errorf("reading the checkpoint record in %s: %w", dir, err)
	}
	return rec.Image.Digest, nil
}
