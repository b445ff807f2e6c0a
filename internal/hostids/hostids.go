// Package hostids hands out the host ids of sandboxes' user namespaces
// (sandbox.FirstHostID, sandbox.HostIDSlots) so that no two live sandboxes
// share a range, whichever process, driver instance or egress network
// asked for it.
//
// The allocation state lives on the host, not in a process: one file per
// slot in use, named by its base id, in a directory under /run shared by
// the daemon and every `stockade run`. A slot's file names its holder, the
// path that exists as long as the ids are in use (a sandbox's bundle, the
// bind mount of an egress user namespace). A slot is in use while the
// process that claimed it holds an exclusive flock on its file, and after
// that process is gone for as long as the holder exists: a sandbox that
// outlived a crashed daemon keeps its ids until the reaper removes its
// bundle. /run is a tmpfs, emptied when the host reboots, when every
// sandbox is gone too.
//
//	a := hostids.Default()
//	lease, err := a.Allocate(bundleDir) // bundleDir exists
//	// map root to lease.Base, the sandbox user to lease.Base+1
//	defer lease.Release() // after bundleDir is removed
package hostids

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// DefaultDir is where the slots of the default allocator are kept.
const DefaultDir = "/run/stockade/hostids"

// Allocator hands out slots of two host ids: Base for root inside the
// sandbox, Base+1 for the sandbox user. Allocators with the same Dir and
// range share their slots, in one process or many. The zero value is not
// usable; use Default or fill every field.
type Allocator struct {
	// Dir holds one file per slot in use.
	Dir string
	// First is the first host id of the range, Slots its number of
	// slots: the range is [First, First+2*Slots).
	First uint32
	Slots uint32
}

// Default is the allocator every driver shares unless configured
// otherwise: DefaultDir, over sandbox.FirstHostID and sandbox.HostIDSlots.
func Default() *Allocator {
	return &Allocator{Dir: DefaultDir, First: sandbox.FirstHostID, Slots: sandbox.HostIDSlots}
}

// Lease is a slot claimed by this process. The caller must Release it once
// its holder is gone.
type Lease struct {
	Base uint32

	mu   sync.Mutex
	f    *os.File // locked; nil once released
	path string
}

// Allocate claims a free slot for holder, an absolute path that exists
// for as long as the ids are in use. It probes slots from a random one on,
// so that a released range is seldom handed out again at once; it fails
// with ErrResourceExhausted when every slot is in use.
func (a *Allocator) Allocate(holder string) (*Lease, error) {
	if err := a.check(holder); err != nil {
		return nil, err
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	start := binary.LittleEndian.Uint32(b[:]) % a.Slots
	for i := range a.Slots {
		base := a.First + 2*((start+i)%a.Slots)
		l, err := a.claim(base, holder)
		if err != nil {
			return nil, err
		}
		if l != nil {
			return l, nil
		}
	}
	return nil, fmt.Errorf("all %d user namespace id ranges from %d are in use (see %s): %w", a.Slots, a.First, a.Dir, errdefs.ErrResourceExhausted)
}

// Adopt records that holder, found on the host, uses the slot at base
// (a bundle left by a process that died, whose ids its config.json maps),
// so that the slot is not handed out while holder exists. No lock is kept:
// the holder's existence keeps the slot. It fails with ErrConflict when
// another live process or another existing holder has the slot.
func (a *Allocator) Adopt(base uint32, holder string) error {
	if err := a.check(holder); err != nil {
		return err
	}
	if !a.inRange(base) {
		return fmt.Errorf("host id %d is not a slot of the range from %d: %w", base, a.First, errdefs.ErrInvalidArgument)
	}
	l, err := a.claim(base, holder)
	if err != nil {
		return err
	}
	if l == nil {
		return fmt.Errorf("host ids %d and %d are in use by another sandbox: %w", base, base+1, errdefs.ErrConflict)
	}
	// Unlocked, the file keeps the slot while holder exists.
	l.mu.Lock()
	defer l.mu.Unlock()
	err = l.f.Close()
	l.f = nil
	return err
}

// Forget frees the slot at base if holder, now gone, holds it and no live
// process does: the end of an adopted slot (a bundle the reaper removed).
func (a *Allocator) Forget(base uint32, holder string) error {
	if !a.inRange(base) {
		return nil
	}
	path := a.path(base)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opening %s: %w", path, err)
	}
	defer f.Close()
	if !lockCurrent(f, path) {
		return nil
	}
	if h, _ := readHolder(f); h == holder {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("freeing host ids %d: %w", base, err)
		}
	}
	return nil
}

// Release frees the slot. It is idempotent.
func (l *Lease) Release() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	// Removed while locked: a process that opened the file before the
	// removal finds, once it gets the lock, that the path no longer
	// names its file, and tries again. Emptied first: on ext4 the last
	// close of a removed file that still holds the data written to it
	// takes 0.15-0.3 ms, of an empty one a few microseconds, and Release
	// is on the path of every sandbox's Destroy.
	_ = l.f.Truncate(0)
	err := os.Remove(l.path)
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	if err != nil {
		return fmt.Errorf("freeing host ids %d: %w", l.Base, err)
	}
	return nil
}

func (a *Allocator) check(holder string) error {
	if a.Dir == "" || a.Slots == 0 || a.First == 0 || uint64(a.First)+2*uint64(a.Slots) > 1<<32 {
		return fmt.Errorf("host id allocator %+v: a directory and a range within 32 bits are required: %w", *a, errdefs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(holder) {
		return fmt.Errorf("host id holder %q must be an absolute path: %w", holder, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (a *Allocator) inRange(base uint32) bool {
	return base >= a.First && (base-a.First)%2 == 0 && (base-a.First)/2 < a.Slots
}

func (a *Allocator) path(base uint32) string {
	return filepath.Join(a.Dir, strconv.FormatUint(uint64(base), 10))
}

// claim takes the slot at base for holder and returns it locked, or nil
// when it is in use.
func (a *Allocator) claim(base uint32, holder string) (*Lease, error) {
	if err := os.MkdirAll(a.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", a.Dir, err)
	}
	path := a.path(base)
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("opening %s: %w", path, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, nil // a live process holds it
			}
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if !isCurrent(f, path) {
			f.Close() // released and removed meanwhile: try again
			continue
		}
		if h, err := readHolder(f); err != nil || (h != "" && exists(h)) {
			f.Close()
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", path, err)
			}
			return nil, nil // left by a process that died, still in use
		}
		if err := f.Truncate(0); err == nil {
			_, err = f.WriteAt([]byte(holder+"\n"), 0)
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("writing %s: %w", path, err)
		}
		return &Lease{Base: base, f: f, path: path}, nil
	}
}

// lockCurrent takes f's lock without waiting and reports whether it got it
// on the file that path still names.
func lockCurrent(f *os.File, path string) bool {
	return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil && isCurrent(f, path)
}

// isCurrent reports whether path still names the open file f.
func isCurrent(f *os.File, path string) bool {
	var open, named unix.Stat_t
	return unix.Fstat(int(f.Fd()), &open) == nil && unix.Stat(path, &named) == nil && open.Ino == named.Ino && open.Dev == named.Dev
}

// readHolder reads the holder a slot's file names; "" for none.
func readHolder(f *os.File) (string, error) {
	b := make([]byte, 4096)
	n, err := f.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	return strings.TrimSpace(string(b[:n])), nil
}

// exists reports whether path may exist: only a path known to be missing
// frees a slot.
func exists(path string) bool {
	_, err := os.Lstat(path)
	return !errors.Is(err, os.ErrNotExist)
}
