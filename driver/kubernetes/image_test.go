package kubernetes

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/sandbox"
)

// TestArchiveTerminationLogDir holds what keeps the kubelet's termination
// message file out of the sandbox's reach: the image has its mount point
// in a directory of root's, mode 0700.
func TestArchiveTerminationLogDir(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0::/:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	guest := filepath.Join(t.TempDir(), "guest")
	if err := os.WriteFile(guest, []byte("guest"), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := writeTree(&buf, root, guest); err != nil {
		t.Fatal(err)
	}
	got := map[string]*tar.Header{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
	}
	if got["etc/passwd"] == nil {
		t.Fatalf("the archive has no etc/passwd, so the check cannot see the image's entries: %v", got)
	}
	dir, file := got[strings.TrimPrefix(TerminationLogDir, "/")+"/"], got[strings.TrimPrefix(TerminationLogPath, "/")]
	if dir == nil || dir.Typeflag != tar.TypeDir || dir.Mode&0o777 != 0o700 || dir.Uid != 0 {
		t.Errorf("%s: got %+v, want root's directory, mode 0700", TerminationLogDir, dir)
	}
	if file == nil || file.Typeflag != tar.TypeReg || file.Uid != 0 {
		t.Errorf("%s: got %+v, want root's file (the mount point)", TerminationLogPath, file)
	}
}

// TestDigestCache holds that a slow hash of one image keeps neither the
// Creates of another image nor a caller whose ctx ends waiting, that
// concurrent calls of an image share one hash, and that a failed hash is
// tried again by a later call.
func TestDigestCache(t *testing.T) {
	release := make(chan struct{})
	calls := map[string]int{}
	var mu sync.Mutex
	fail := errors.New("disk error")
	c := &digestCache{hash: func(img sandbox.Image, _ string) (string, error) {
		mu.Lock()
		calls[img.Name]++
		n := calls[img.Name]
		mu.Unlock()
		switch {
		case img.Name == "slow":
			<-release
		case img.Name == "flaky" && n == 1:
			return "", fail
		}
		return "sha256:" + img.Name, nil
	}}
	img := func(name string) sandbox.Image {
		return sandbox.Image{Name: name, Digest: "sha256:" + strings.Repeat(name[:1], 64)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.digest(ctx, img("slow"), "", "g"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slow image with a 100ms ctx: %v, want its deadline", err)
	}
	done := make(chan error, 1)
	go func() {
		d, err := c.digest(context.Background(), img("slow"), "", "g")
		if err == nil && d != "sha256:slow" {
			err = fmt.Errorf("digest %s", d)
		}
		done <- err
	}()
	if d, err := c.digest(context.Background(), img("quick"), "", "g"); err != nil || d != "sha256:quick" {
		t.Fatalf("another image while one hashes: %s, %v", d, err)
	}
	if _, err := c.digest(context.Background(), img("flaky"), "", "g"); !errors.Is(err, fail) {
		t.Fatalf("first hash of flaky: %v, want %v", err, fail)
	}
	if d, err := c.digest(context.Background(), img("flaky"), "", "g"); err != nil || d != "sha256:flaky" {
		t.Fatalf("flaky again: %s, %v", d, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d, err := c.digest(context.Background(), img("slow"), "", "g"); err != nil || d != "sha256:slow" {
		t.Fatalf("slow once hashed: %s, %v", d, err)
	}
	if calls["slow"] != 1 || calls["quick"] != 1 || calls["flaky"] != 2 {
		t.Fatalf("hashes by image: %v; want slow and quick once, flaky twice", calls)
	}
}
