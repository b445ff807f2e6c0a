package ocidriver

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/errdefs"
)

// imageDigest is the SHA-256 of the tree under dir: each entry's path,
// type and size, and each regular file's content, in lexical order. A
// symbolic link or any other kind of file is refused, as is a file not
// owned by this process's user.
func imageDigest(dir string) (string, error) {
	h := sha256.New()
	err := walkImage(dir, func(p, rel string, fi fs.FileInfo, _ *syscall.Stat_t) error {
		if fi.IsDir() {
			fmt.Fprintf(h, "d %q\n", rel)
			return nil
		}
		f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		fmt.Fprintf(h, "f %q %d\n", rel, fi.Size())
		if n, err := io.Copy(h, f); err != nil || n != fi.Size() {
			return fmt.Errorf("reading %s: %d of %d bytes: %v: %w", p, n, fi.Size(), err, errdefs.ErrFailedPrecondition)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("digesting the checkpoint's image: %w", err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// imageStamp is the SHA-256 of what the host says of each entry of the
// tree under dir, its content unread: each entry's path and type, and
// each regular file's size, mode, device, inode, and times of its last
// modification and last change. Its refusals are imageDigest's.
//
// A file's content cannot change without its change time (ctime)
// moving on: every write, truncation, chmod or rename of it sets it to
// the clock, and no system call sets it to a chosen value. The clock it
// is set from is coarse (a scheduler tick), so two writes within a tick
// may leave one ctime; but a file last changed well before the stamp was
// taken (changed is the latest ctime of the tree) cannot be written again
// without its ctime changing. A tree whose stamp is one taken before its
// digest was computed, then, holds the content that digest was computed
// from, which digestCache uses.
func imageStamp(dir string) (stamp string, changed time.Time, err error) {
	h := sha256.New()
	err = walkImage(dir, func(_, rel string, fi fs.FileInfo, st *syscall.Stat_t) error {
		if fi.IsDir() {
			fmt.Fprintf(h, "d %q\n", rel)
			return nil
		}
		fmt.Fprintf(h, "f %q %d %o %d %d %d.%09d %d.%09d\n", rel, st.Size, st.Mode, st.Dev, st.Ino,
			st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
		if c := time.Unix(st.Ctim.Sec, st.Ctim.Nsec); c.After(changed) {
			changed = c
		}
		return nil
	})
	if err != nil {
		return "", changed, fmt.Errorf("examining the checkpoint's image: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), changed, nil
}

// walkImage calls fn for each entry of the tree under dir in lexical
// order, with its path relative to dir, refusing what imageDigest
// refuses.
func walkImage(dir string, fn func(p, rel string, fi fs.FileInfo, st *syscall.Stat_t) error) error {
	return filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := e.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		switch {
		case !ok || int(st.Uid) != os.Geteuid():
			return fmt.Errorf("%s is not owned by uid %d: %w", p, os.Geteuid(), errdefs.ErrFailedPrecondition)
		case !e.IsDir() && !e.Type().IsRegular():
			return fmt.Errorf("%s is not a regular file or directory: %w", p, errdefs.ErrFailedPrecondition)
		}
		return fn(p, rel, fi, st)
	})
}

// digestCache remembers the digests of checkpoint images this process
// computed (or wrote), by the stamp (imageStamp) their trees had before
// the digest was taken, so that restoring one image many times (a golden
// checkpoint, docs/design.md) reads its memory file once to check it,
// not on every restore: a restore costs what loading the image costs,
// and hashing a 70 MiB memory file was a fifth of a golden restore.
// Whatever differs in the tree since (a file rewritten, replaced,
// touched or added) changes the stamp, and the image is hashed again.
//
// Restores of one tree that run at once (a fork's sessions, restored
// from a snapshot just saved, which is not settled yet) share one
// reading of it: a call whose stamp is that of a digest being computed
// waits for it instead of reading the tree again (inflight). That adds
// no window the check lacks anyway: a digest is of the content read
// after its stamp, and the runtime reads the image after the check.
type digestCache struct {
	mu       sync.Mutex
	digests  map[string]string // stamp -> digest
	order    []string          // stamps, oldest first
	inflight map[string]*digestCall
}

// digestCall is a digest being computed, done once it is.
type digestCall struct {
	done   chan struct{}
	digest string
	err    error
}

// maxCachedDigests bounds digestCache: the golden checkpoints in use and
// the paused sessions' checkpoints saved lately.
const maxCachedDigests = 256

// get is the digest of the tree whose stamp is stamp, if known.
func (c *digestCache) get(stamp string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.digests[stamp]
	return d, ok
}

// put records that the tree of stamp has digest, forgetting the oldest
// record when the cache is full.
func (c *digestCache) put(stamp, digest string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.digests == nil {
		c.digests = map[string]string{}
	}
	if _, ok := c.digests[stamp]; ok {
		c.digests[stamp] = digest
		return
	}
	if len(c.order) >= maxCachedDigests {
		delete(c.digests, c.order[0])
		c.order = c.order[1:]
	}
	c.digests[stamp] = digest
	c.order = append(c.order, stamp)
}

// hashImage is imageDigest; a variable for tests, which count its calls.
var hashImage = imageDigest

// settled is how long before a stamp is taken a tree must have last
// changed for digestCache to keep its digest, by the clock a file
// system sets a ctime from (CLOCK_REALTIME_COARSE, which moves once a
// tick, and stands still while the tick stalls): a write after the
// stamp then gets a later ctime (imageStamp). A tree whose last ctime
// has no fraction of a second is on a file system that keeps whole
// seconds, and must be older than settledCoarse. Variables for tests.
var (
	settled       = 20 * time.Millisecond
	settledCoarse = 2 * time.Second
)

// ctimeClock reads the clock a local file system sets a ctime from.
func ctimeClock() time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_REALTIME_COARSE, &ts); err != nil {
		return time.Time{} // nothing is kept
	}
	return time.Unix(ts.Unix())
}

// settledSince says whether a tree last changed at changed had settled
// at now (ctimeClock's, taken before its stamp).
func settledSince(now, changed time.Time) bool {
	if changed.Nanosecond() == 0 {
		return now.Sub(changed) >= settledCoarse
	}
	return now.Sub(changed) >= settled
}

// sealDigest is the digest of the image tree under dir that was just
// written (a checkpoint being sealed), kept in the cache: it waits until
// the tree has settled (a tick or so; at most 5 times settled) and then
// reads it, so that the
// restores that follow (a fork's, at once) find its digest instead of
// reading the tree again. A fork of 8 sessions from a 140 MiB snapshot
// read it twice, about 120 ms each here, both on the fork's path.
func (c *digestCache) sealDigest(dir string) (string, error) {
	_, changed, err := imageStamp(dir)
	if err != nil {
		return "", err
	}
	// At most a few times settled: a clock that does not move on (a
	// stalled tick, a ctime ahead of it) leaves the digest uncached.
	for range 5 {
		if settledSince(ctimeClock(), changed) {
			break
		}
		time.Sleep(settled)
	}
	return c.digest(dir)
}

// digest is the digest of the image tree under dir (imageDigest), from
// the cache when its stamp is one the cache knows. The stamp is taken
// before the content is read, so a change made while it is read is seen
// by the next call; the digest of a tree changed less than settled
// before is not kept.
func (c *digestCache) digest(dir string) (string, error) {
	now := ctimeClock()
	stamp, changed, err := imageStamp(dir)
	if err != nil {
		return "", err
	}
	if d, ok := c.get(stamp); ok {
		return d, nil
	}
	key := dir + "\x00" + stamp
	c.mu.Lock()
	if call, ok := c.inflight[key]; ok {
		c.mu.Unlock()
		<-call.done
		return call.digest, call.err
	}
	if c.inflight == nil {
		c.inflight = map[string]*digestCall{}
	}
	call := &digestCall{done: make(chan struct{})}
	c.inflight[key] = call
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.inflight, key)
		c.mu.Unlock()
		close(call.done)
	}()
	call.digest, call.err = hashImage(dir)
	if call.err != nil {
		return "", call.err
	}
	if settledSince(now, changed) {
		c.put(stamp, call.digest)
	}
	return call.digest, nil
}
