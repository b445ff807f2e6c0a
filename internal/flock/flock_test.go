package flock

import (
	"errors"
	"path/filepath"
	"testing"
)

func TestTryLock(t *testing.T) {
	name := filepath.Join(t.TempDir(), "lock")
	release, err := TryLock(name)
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	// A second open file, even in this process, does not get the lock.
	if _, err := TryLock(name); !errors.Is(err, ErrHeld) {
		t.Fatalf("second TryLock while held: got %v, want ErrHeld", err)
	}
	if err := release(); err != nil {
		t.Fatalf("release: %v", err)
	}
	again, err := TryLock(name)
	if err != nil {
		t.Fatalf("TryLock after release: %v", err)
	}
	again()
	if _, err := TryLock(filepath.Join(t.TempDir(), "missing", "lock")); err == nil || errors.Is(err, ErrHeld) {
		t.Fatalf("TryLock in a missing directory: got %v, want an open error", err)
	}
}

// TestTryLockShared checks that shared holders share the lock, and that
// the exclusive lock waits for none of them: it fails while any holds it.
func TestTryLockShared(t *testing.T) {
	name := filepath.Join(t.TempDir(), "lock")
	a, err := TryLockShared(name)
	if err != nil {
		t.Fatalf("TryLockShared: %v", err)
	}
	b, err := TryLockShared(name)
	if err != nil {
		t.Fatalf("a second TryLockShared: %v, want the lock shared", err)
	}
	if _, err := TryLock(name); !errors.Is(err, ErrHeld) {
		t.Fatalf("TryLock while shared: got %v, want ErrHeld", err)
	}
	a()
	if _, err := TryLock(name); !errors.Is(err, ErrHeld) {
		t.Fatalf("TryLock while one still shares it: got %v, want ErrHeld", err)
	}
	b()
	release, err := TryLock(name)
	if err != nil {
		t.Fatalf("TryLock once no one shares it: %v", err)
	}
	if _, err := TryLockShared(name); !errors.Is(err, ErrHeld) {
		t.Fatalf("TryLockShared while held: got %v, want ErrHeld", err)
	}
	release()
}
