package sandboxkit

import (
	"cmp"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
)

// HealthTTL is how long a driver's health answer is reused. Health is asked
// before every invocation; a runtime that breaks is noticed within this
// long, and one that is mended too.
const HealthTTL = 5 * time.Second

// HealthCache runs a health check at most once per TTL and answers every
// caller in between from its last result. The first call waits for the
// check; once there is a result, a call after the TTL gets that result at
// once and starts a fresh check in the background, so that the hot path
// never waits for a runtime to answer. Concurrent callers share the check
// in flight. The check runs detached from any caller's context, bounded by
// Timeout; a caller whose ctx ends first gets ctx's error. Set the fields
// before first use; safe for concurrent use.
type HealthCache struct {
	// Check finds the driver's health: nil for healthy.
	Check func(ctx context.Context) error
	// TTL is how long a result is reused; zero means HealthTTL.
	TTL time.Duration
	// Timeout bounds one check; zero means 30 s.
	Timeout time.Duration

	mu      sync.Mutex
	have    bool      // err and at are a result
	err     error     // the last result
	at      time.Time // when it was found
	running chan struct{}
}

// Health returns the cached result, checking first when there is none.
func (c *HealthCache) Health(ctx context.Context) error {
	c.mu.Lock()
	if c.have {
		err := c.err
		if time.Since(c.at) >= cmp.Or(c.TTL, HealthTTL) {
			c.startLocked(ctx)
		}
		c.mu.Unlock()
		return err
	}
	done := c.startLocked(ctx)
	c.mu.Unlock()
	select {
	case <-done:
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.err
	case <-ctx.Done():
		return fmt.Errorf("checking the driver's health: %w", ctx.Err())
	}
}

// Set records err as the current result, as if a check had just found it
// (a driver's self-test does).
func (c *HealthCache) Set(err error) {
	c.mu.Lock()
	c.have, c.err, c.at = true, err, time.Now()
	c.mu.Unlock()
}

// startLocked starts a check unless one is running and returns the channel
// closed when it ends. c.mu is held.
func (c *HealthCache) startLocked(ctx context.Context) chan struct{} {
	if c.running != nil {
		return c.running
	}
	done := make(chan struct{})
	c.running = done
	go func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cmp.Or(c.Timeout, 30*time.Second))
		err := c.Check(cctx)
		cancel()
		c.mu.Lock()
		c.have, c.err, c.at, c.running = true, err, time.Now(), nil
		c.mu.Unlock()
		close(done)
	}()
	return done
}

// elfMachine is the ELF machine of each GOARCH the guest is built for.
var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// CheckGuest checks that path holds a guest agent this host can run as a
// sandbox's PID 1: an executable, statically linked ELF file for the host's
// architecture. It reads only the file's headers, so it does not prove that
// the agent works; a sandbox whose guest greets does (a driver's
// self-test). A failure is ErrUnavailable.
func CheckGuest(path string) error {
	fail := func(why string) error {
		return fmt.Errorf("guest agent %s %s; install a good one (`make guest` builds it, and the daemon installs the copy embedded in it when the guest path is not configured): %w", path, why, errdefs.ErrUnavailable)
	}
	f, err := os.Open(path)
	if err != nil {
		return fail(fmt.Sprintf("cannot be opened (%v)", err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return fail("is not an executable file")
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return fail(fmt.Sprintf("is not an ELF executable (%v)", err))
	}
	switch {
	case ef.Class != elf.ELFCLASS64 || ef.Machine != elfMachine[runtime.GOARCH]:
		return fail(fmt.Sprintf("is built for %s %s, not for this host (%s)", ef.Class, ef.Machine, runtime.GOARCH))
	case ef.Type != elf.ET_EXEC && ef.Type != elf.ET_DYN:
		return fail(fmt.Sprintf("is an ELF %s, not an executable", ef.Type))
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			return fail("is dynamically linked; the guest must be static (CGO_ENABLED=0)")
		}
	}
	return nil
}
