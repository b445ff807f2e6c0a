package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/flock"
	"github.com/stockade-sh/stockade/internal/fsmode"
)

// lockPoll is how often a waiting Build retries the store's lock.
const lockPoll = 200 * time.Millisecond

// lock takes the store's exclusive lock, waiting for it until ctx is done.
// It creates the store's directories. The lock is an flock, so it is
// released when the process dies.
func (s *Store) lock(ctx context.Context) (unlock func(), err error) {
	for {
		unlock, err := s.tryLock()
		if !errdefs.IsUnavailable(err) {
			return unlock, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the image store lock: %w", ctx.Err())
		case <-time.After(lockPoll):
		}
	}
}

// tryLock takes the store's exclusive lock, or fails with ErrUnavailable if
// another operation holds it.
func (s *Store) tryLock() (unlock func(), err error) {
	// The images' trees are reached through the store's directories from
	// the sandboxes' user namespaces, apt's download directories by its
	// _apt user (fsmode.Exceptions).
	for _, d := range []string{s.imagesDir(), s.blobsDir(), filepath.Dir(s.aptDir())} {
		if err := os.MkdirAll(d, fsmode.Traverse); err != nil {
			return nil, fmt.Errorf("creating image store: %w", classify(err))
		}
		// Explicitly: a process's umask (077 for a daemon) would narrow
		// what MkdirAll creates.
		if err := os.Chmod(d, fsmode.Traverse); err != nil {
			return nil, fmt.Errorf("creating image store: %w", classify(err))
		}
	}
	if err := os.MkdirAll(s.refsDir(), fsmode.Dir); err != nil {
		return nil, fmt.Errorf("creating image store: %w", classify(err))
	}
	if err := os.MkdirAll(s.tmpDir(), fsmode.Dir); err != nil {
		return nil, fmt.Errorf("creating image store: %w", classify(err))
	}
	name := filepath.Join(s.imagesDir(), "lock")
	release, err := flock.TryLock(name)
	if errors.Is(err, flock.ErrHeld) {
		return nil, fmt.Errorf("another stockade process is changing the image store (%s is locked): %w", name, errdefs.ErrUnavailable)
	}
	if err != nil {
		return nil, fmt.Errorf("locking the image store: %w", classify(err))
	}
	return func() { release() }, nil
}

// writeFileAtomic replaces dir/name with data: it writes a temporary file in
// dir, flushes it, renames it over name and flushes dir.
func writeFileAtomic(dir, name string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(dir, "."+name+".tmp-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(dir)
}

// writeFileSync writes a new file and flushes it.
func writeFileSync(name string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// syncDir flushes the directory entries of dir, making renames in it
// durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("syncing %s: %w", dir, classify(err))
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, classify(err))
	}
	return nil
}
