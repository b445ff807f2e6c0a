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
