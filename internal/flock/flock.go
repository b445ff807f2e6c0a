// Package flock takes exclusive and shared advisory locks on files with flock(2). The
// kernel releases such a lock when its holder closes the file or dies,
// however it dies, so a crashed holder never leaves one behind.
package flock

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// ErrHeld is TryLock's error when another open file holds the lock (in
// another process, or in this one through another open).
var ErrHeld = errors.New("locked by another holder")

// TryLock opens name, creating it (mode 0600) if missing, and takes an
// exclusive lock on it without waiting. release closes the file, which
// releases the lock.
func TryLock(name string) (release func() error, err error) {
	return tryLock(name, syscall.LOCK_EX)
}

// TryLockShared opens name, creating it (mode 0600) if missing, and takes
// a shared lock on it without waiting: many holders may share it, and
// TryLock fails (ErrHeld) while any does. release closes the file.
func TryLockShared(name string) (release func() error, err error) {
	return tryLock(name, syscall.LOCK_SH)
}

// tryLock takes the lock how (LOCK_EX or LOCK_SH) on name without waiting.
func tryLock(name string, how int) (release func() error, err error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w", name, ErrHeld)
		}
		return nil, fmt.Errorf("locking %s: %w", name, err)
	}
	return f.Close, nil
}
