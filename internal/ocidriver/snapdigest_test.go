package ocidriver

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
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
	dir := t.TempDir()
	data := make([]byte, 1<<20)
	rand.Read(data)
	pages := filepath.Join(dir, "pages.img")
	if err := os.WriteFile(pages, data, 0o600); err != nil {
		t.Fatal(err)
	}
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
	var c digestCache
	if got, err := c.digest(dir); err != nil || got != want {
		t.Fatalf("digest of a fresh tree: %q, %v; want %q", got, err, want)
	}
	if len(c.digests) != 0 {
		t.Fatalf("the digest of a tree changed just now was kept: %v", c.digests)
	}

	old := settled
	settled = 50 * time.Millisecond
	t.Cleanup(func() { settled = old })
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
	f, err := os.OpenFile(pages, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{data[100] ^ 0xff}, 100); err != nil {
		t.Fatal(err)
	}
	f.Close()
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
