package sandboxkit_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/internal/testenv"
)

func TestHealthCache(t *testing.T) {
	var calls atomic.Int32
	result := make(chan error, 10)
	c := &sandboxkit.HealthCache{TTL: 50 * time.Millisecond, Check: func(ctx context.Context) error {
		calls.Add(1)
		return <-result
	}}
	broken := errors.New("broken")

	// The first callers wait for one shared check.
	var wg sync.WaitGroup
	errs := make([]error, 5)
	for i := range errs {
		wg.Go(func() { errs[i] = c.Health(t.Context()) })
	}
	time.Sleep(20 * time.Millisecond)
	result <- broken
	wg.Wait()
	for i, err := range errs {
		if err != broken {
			t.Errorf("caller %d: got %v, want %v", i, err, broken)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("checks: got %d, want 1 for concurrent first callers", n)
	}
	// Within the TTL: the cached answer, no check.
	if err := c.Health(t.Context()); err != broken || calls.Load() != 1 {
		t.Fatalf("within the TTL: got %v after %d checks, want %v after 1", err, calls.Load(), broken)
	}
	// After it: the old answer at once, and a check in the background
	// whose answer the next call gets.
	time.Sleep(60 * time.Millisecond)
	result <- nil
	if err := c.Health(t.Context()); err != broken {
		t.Fatalf("after the TTL: got %v, want the old answer %v", err, broken)
	}
	for deadline := time.Now().Add(5 * time.Second); c.Health(t.Context()) != nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the background check's answer never came")
		}
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("checks: got %d, want 2", n)
	}
	// Set replaces the answer.
	c.Set(broken)
	if err := c.Health(t.Context()); err != broken {
		t.Errorf("after Set: got %v, want %v", err, broken)
	}
}

func TestHealthCacheCallerGivesUp(t *testing.T) {
	release := make(chan struct{})
	c := &sandboxkit.HealthCache{Check: func(ctx context.Context) error {
		<-release
		return nil
	}}
	defer close(release)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := c.Health(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want the caller's deadline", err)
	}
}

func TestCheckGuest(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tt := range []struct {
		name, path string
		want       string // "" for good
	}{
		{"the guest", testenv.Guest(t), ""},
		{"missing", filepath.Join(dir, "missing"), "cannot be opened"},
		{"a directory", dir, "is not an executable file"},
		{"not executable", file("noexec", "\x7fELF", 0o644), "is not an executable file"},
		{"one byte", file("one", "x", 0o755), "is not an ELF executable"},
		{"a script", file("script", "#!/bin/sh\nexit 0\n", 0o755), "is not an ELF executable"},
		{"dynamically linked", "/bin/ls", "is dynamically linked"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := sandboxkit.CheckGuest(tt.path)
			if tt.want == "" {
				if err != nil {
					t.Errorf("got %v, want nil", err)
				}
				return
			}
			if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want ErrUnavailable containing %q", err, tt.want)
			}
		})
	}
}
