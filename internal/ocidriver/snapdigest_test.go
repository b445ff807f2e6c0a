package ocidriver

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestDigestCache digests a checkpoint's image tree through the cache: a
// tree changed just now is hashed and not kept; a settled one is kept
// and then taken from the cache (a planted digest is what it returns);
// a byte of a file rewritten in place, its size and modification time
// as before, is seen (its ctime moved) and the tree hashed again; links
// are refused; the cache keeps at most maxCachedDigests trees.
func TestDigestCache(t *testing.T) {
	dir, pages := randomImage(t, 1<<20)
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub", "meta.img"), []byte("meta"), 0o600); err != nil {
		t.Fatal(err)
	}
	want, err := imageDigest(dir)
	if err != nil {
		t.Fatal(err)
	}
	old := settled
	t.Cleanup(func() { settled = old })
	// Changed "just now": within settled, an hour here.
	settled = time.Hour
	var c digestCache
	if got, err := c.digest(dir); err != nil || got != want {
		t.Fatalf("digest of a fresh tree: %q, %v; want %q", got, err, want)
	}
	if len(c.digests) != 0 {
		t.Fatalf("the digest of a tree changed just now was kept: %v", c.digests)
	}

	settled = 50 * time.Millisecond
	time.Sleep(2 * settled)
	if got, err := c.digest(dir); err != nil || got != want {
		t.Fatalf("digest of a settled tree: %q, %v; want %q", got, err, want)
	}
	stamp, _, err := imageStamp(dir)
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := c.get(stamp); !ok || d != want {
		t.Fatalf("the settled tree's digest was not kept: %q, %v", d, ok)
	}
	c.put(stamp, "sha256:planted")
	if got, err := c.digest(dir); err != nil || got != "sha256:planted" {
		t.Fatalf("digest of an unchanged tree: %q, %v; want the cached (planted) one", got, err)
	}

	fi, err := os.Stat(pages)
	if err != nil {
		t.Fatal(err)
	}
	flipByte(t, pages, 100)
	if err := os.Chtimes(pages, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	changed, err := imageDigest(dir)
	if err != nil || changed == want {
		t.Fatalf("the rewritten tree's digest: %q, %v; want another than %q", changed, err, want)
	}
	if got, err := c.digest(dir); err != nil || got != changed {
		t.Fatalf("digest of the rewritten tree: %q, %v; want %q, not the cached one", got, err, changed)
	}

	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "sub", "link")); err != nil {
		t.Fatal(err)
	}
	if got, err := c.digest(dir); err == nil {
		t.Fatalf("digest of a tree with a link: %q, want refused", got)
	}

	var full digestCache
	for i := range maxCachedDigests + 1 {
		full.put(fmt.Sprint(i), "d")
	}
	if _, ok := full.get("0"); ok || len(full.digests) != maxCachedDigests || len(full.order) != maxCachedDigests {
		t.Fatalf("a full cache kept %d digests (the oldest: %v), want %d without the oldest", len(full.digests), ok, maxCachedDigests)
	}
	if _, ok := full.get(fmt.Sprint(maxCachedDigests)); !ok {
		t.Fatal("a full cache lost the newest digest")
	}
}

// TestDigestSharedWhileUnsettled digests a tree changed just now (not
// kept) from many goroutines at once, as a fork's restores do: they share
// one reading of it and all get its digest; a call after them reads it
// again, since nothing was kept.
func TestDigestSharedWhileUnsettled(t *testing.T) {
	old := settled
	t.Cleanup(func() { settled = old })
	settled = time.Hour
	dir, _ := randomImage(t, 8<<20)
	want, err := imageDigest(dir)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		reads int
	)
	release := make(chan struct{})
	oldHash := hashImage
	hashImage = func(d string) (string, error) {
		mu.Lock()
		reads++
		mu.Unlock()
		<-release
		return oldHash(d)
	}
	t.Cleanup(func() { hashImage = oldHash })
	var (
		c  digestCache
		wg sync.WaitGroup
	)
	got := make([]string, 8)
	for i := range got {
		wg.Go(func() {
			d, err := c.digest(dir)
			if err != nil {
				t.Error(err)
			}
			got[i] = d
		})
	}
	// Let every call stamp the tree and find the first one reading it.
	time.Sleep(200 * time.Millisecond)
	close(release)
	wg.Wait()
	for i, d := range got {
		if d != want {
			t.Errorf("call %d: got %q, want %q", i, d, want)
		}
	}
	if reads != 1 {
		t.Errorf("concurrent digests read the tree %d times, want 1", reads)
	}
	if _, err := c.digest(dir); err != nil || reads != 2 {
		t.Errorf("a later digest of the unsettled tree: %v, %d reads; want it read again", err, reads)
	}
}

// TestSealDigestKept digests a tree written just now as a checkpoint's
// seal does: it waits for the tree to settle, reads it once, and keeps
// its digest, so that restores after it (a fork's) read nothing; a byte
// rewritten in place after the seal is still seen.
func TestSealDigestKept(t *testing.T) {
	dir, pages := randomImage(t, 1<<20)
	want, err := imageDigest(dir)
	if err != nil {
		t.Fatal(err)
	}
	reads := 0
	oldHash := hashImage
	hashImage = func(d string) (string, error) { reads++; return oldHash(d) }
	t.Cleanup(func() { hashImage = oldHash })
	var c digestCache
	if got, err := c.sealDigest(dir); err != nil || got != want {
		t.Fatalf("sealDigest: %q, %v; want %q", got, err, want)
	}
	for range 3 {
		if got, err := c.digest(dir); err != nil || got != want {
			t.Fatalf("digest after the seal: %q, %v; want %q", got, err, want)
		}
	}
	if reads != 1 {
		t.Errorf("the tree was read %d times for a seal and three restores, want once", reads)
	}
	// A write well after the seal's stamp: its ctime is later by the
	// coarse clock too.
	time.Sleep(50 * time.Millisecond)
	flipByte(t, pages, 0)
	if got, err := c.digest(dir); err != nil || got == want {
		t.Errorf("digest after a byte was rewritten: %q, %v; want a new digest", got, err)
	}
}

// randomImage is a new image tree of one file, pages.img, of size random
// bytes: its directory and the file's path.
func randomImage(t *testing.T, size int) (dir, pages string) {
	t.Helper()
	dir = t.TempDir()
	data := make([]byte, size)
	rand.Read(data)
	pages = filepath.Join(dir, "pages.img")
	if err := os.WriteFile(pages, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, pages
}

// flipByte rewrites the byte at off of the file p in place, its size as
// before.
func flipByte(t *testing.T, p string, off int64) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{b[0] ^ 0xff}, off); err != nil {
		t.Fatal(err)
	}
}

// TestSettledSince: a tree settles settled after its last change by the
// ctime clock, or settledCoarse after it where its ctime has no fraction
// of a second (a file system that keeps whole seconds).
func TestSettledSince(t *testing.T) {
	fine := time.Unix(1_700_000_000, 123_456_789)
	whole := time.Unix(1_700_000_000, 0)
	for _, c := range []struct {
		changed time.Time
		after   time.Duration
		want    bool
	}{
		{fine, settled / 2, false},
		{fine, settled, true},
		{whole, settled, false},
		{whole, settledCoarse - time.Millisecond, false},
		{whole, settledCoarse, true},
		{fine, -time.Second, false}, // a ctime ahead of the clock
	} {
		if got := settledSince(c.changed.Add(c.after), c.changed); got != c.want {
			t.Errorf("changed %v, %v later: settled %v, want %v", c.changed, c.after, got, c.want)
		}
	}
	if d := time.Since(ctimeClock()); d < 0 || d > time.Second {
		t.Errorf("the ctime clock is %v from the wall clock", d)
	}
}
