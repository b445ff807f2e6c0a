package image

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestBuildProgress builds with a bootstrap that replays a real
// debootstrap run's output (testdata/debootstrap-shell.log, of `stockade
// image build -v shell`) in chunks that split its lines, and checks that
// Progress follows the stages with their package counts and reports the
// tree's size while the bootstrap still runs.
func TestBuildProgress(t *testing.T) {
	transcript, err := os.ReadFile("testdata/debootstrap-shell.log")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		got    []Progress
		sized  = make(chan struct{})
		signal sync.Once
	)
	opts := BuildOptions{Progress: func(p Progress) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, p)
		if p.Bytes > 0 && p.Stage == "configuring" {
			signal.Do(func() { close(sized) })
		}
	}}
	s := newFakeStore(t)
	s.bootstrap = func(ctx context.Context, rootfs string, rt Runtime, opts BuildOptions) error {
		fakeRootfs(t, rootfs, rt, "")
		if err := os.WriteFile(filepath.Join(rootfs, "payload"), make([]byte, 1<<20), 0o644); err != nil {
			return err
		}
		for b := transcript; len(b) > 0; {
			n := min(len(b), 100)
			if _, err := opts.Log.Write(b[:n]); err != nil {
				return err
			}
			b = b[n:]
		}
		// The size is measured while debootstrap runs, not only at its end.
		select {
		case <-sized:
		case <-time.After(5 * sizeEvery):
			t.Errorf("no size reported within %s of the bootstrap's start", 5*sizeEvery)
		}
		return nil
	}
	m := s.mustBuild(t, "shell", opts)

	mu.Lock()
	defer mu.Unlock()
	var stages []string
	last := map[string]Progress{}
	for i, p := range got {
		if p.Runtime != "shell" {
			t.Fatalf("progress %d: runtime %q, want shell", i, p.Runtime)
		}
		if i > 0 && p.Elapsed < got[i-1].Elapsed {
			t.Errorf("progress %d: elapsed %v went back from %v", i, p.Elapsed, got[i-1].Elapsed)
		}
		if len(stages) == 0 || stages[len(stages)-1] != p.Stage {
			stages = append(stages, p.Stage)
		}
		last[p.Stage] = p
	}
	want := []string{"fetching", "extracting", "unpacking", "configuring", "unpacking", "configuring", "hardening", "hashing"}
	if !slices.Equal(stages, want) {
		t.Errorf("stages: got %v, want %v", stages, want)
	}
	for _, w := range []struct {
		stage           string
		packages, total int
	}{{"fetching", 79, 0}, {"extracting", 78, 79}, {"unpacking", 79, 79}, {"configuring", 79, 79}} {
		if p := last[w.stage]; p.Packages != w.packages || p.Total != w.total {
			t.Errorf("%s ended at %d of %d packages, want %d of %d", w.stage, p.Packages, p.Total, w.packages, w.total)
		}
	}
	if end := got[len(got)-1]; end.Bytes != m.SizeBytes {
		t.Errorf("last progress: %d bytes, want the image's %d", end.Bytes, m.SizeBytes)
	}
}
