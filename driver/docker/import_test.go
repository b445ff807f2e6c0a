package docker_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/docker"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// TestImportWaitsWithItsContext runs imports against a fake engine that
// holds an import until the test releases it: a second import waiting for
// the first gives up with its own context.
func TestImportWaitsWithItsContext(t *testing.T) {
	arrived := make(chan struct{}, 4)
	release := make(chan struct{})
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/_ping"):
			w.Header().Set("Api-Version", "1.41")
			w.Write([]byte("OK"))
		case strings.HasSuffix(r.URL.Path, "/json"):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"message":"No such image"}`))
		case strings.HasSuffix(r.URL.Path, "/images/create"):
			arrived <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
			}
		default:
			http.NotFound(w, r)
		}
	}))
	defer fake.Close()
	guest := filepath.Join(t.TempDir(), "guest")
	if err := os.WriteFile(guest, []byte("a guest"), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := docker.New(docker.Config{Host: "tcp://" + strings.TrimPrefix(fake.URL, "http://"), GuestPath: guest})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	img := sandbox.Image{Name: "shell", Digest: "sha256:" + strings.Repeat("1", 64), Rootfs: t.TempDir()}

	first := make(chan error, 1)
	go func() {
		_, err := d.ImportImage(t.Context(), img)
		first <- err
	}()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the first import never reached the engine")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	second := make(chan error, 1)
	go func() {
		_, err := d.ImportImage(ctx, img)
		second <- err
	}()
	select {
	case err := <-second:
		if err == nil || !strings.Contains(err.Error(), "waiting for another import") || !errors.Is(err, context.DeadlineExceeded) || !errdefs.IsUnavailable(err) {
			t.Errorf("a second import while the first runs: got %v, want it to give up with its context (unavailable)", err)
		}
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("a second import waited for the first past its own context")
	}
	close(release)
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("the first import did not end once the engine answered")
	}
}
