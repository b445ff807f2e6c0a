package e2b

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/stockade-sh/stockade/internal/fsmode"
)

// SecretPath is the file of the secret the sandboxes' access tokens
// derive from, for the database at url: next to a SQLite file (as its
// witness is), in the data directory for PostgreSQL. The same secret
// gives the same tokens across restarts, so that a sandbox connected to
// again, or resumed, keeps the token its SDK holds.
func SecretPath(url, dataDir string) string {
	if path, ok := strings.CutPrefix(url, "sqlite:"); ok {
		return path + ".e2b-secret"
	}
	return filepath.Join(dataDir, "e2b.secret")
}

// LoadSecret reads the secret at p, creating it (32 random bytes, hex,
// mode 0600) the first time.
func LoadSecret(p string) ([]byte, error) {
	b, err := os.ReadFile(p)
	if err == nil {
		s, derr := hex.DecodeString(strings.TrimSpace(string(b)))
		if derr != nil || len(s) < 32 {
			return nil, fmt.Errorf("e2b: %s is not a secret of at least 32 hex-encoded bytes", p)
		}
		return s, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("e2b: reading the secret: %w", err)
	}
	s := make([]byte, 32)
	if _, err := rand.Read(s); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fsmode.File)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return LoadSecret(p)
		}
		return nil, fmt.Errorf("e2b: writing the secret: %w", err)
	}
	if _, err := f.WriteString(hex.EncodeToString(s) + "\n"); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("e2b: writing the secret: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("e2b: writing the secret: %w", err)
	}
	return s, nil
}
