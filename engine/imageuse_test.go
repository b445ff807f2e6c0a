package engine

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestImagesInUse checks that the engine counts the image of each live
// sandbox: a pool's, a session's (labelled with it), a one-shot's while
// it runs; and forgets each once it is destroyed.
func TestImagesInUse(t *testing.T) {
	e := runcTemplateEngine(t, WithPools(PoolOptions{Pools: []PoolSpec{{Tool: "analytics", Size: 1}}}))
	img, _, err := testTemplates().ResolveTemplate("analytics")
	if err != nil {
		t.Fatal(err)
	}
	shelly, _, err := testTemplates().ResolveTemplate("shelly")
	if err != nil {
		t.Fatal(err)
	}
	if got := e.ImagesInUse(); len(got) != 0 {
		t.Fatalf("before any sandbox: got %v, want none", got)
	}
	stop, err := e.StartPools(context.Background(), map[string]string{LabelOwner: poolOwner})
	if err != nil {
		t.Fatal(err)
	}
	waitReady(t, e, 1)
	if got := e.ImagesInUse(); !slices.Equal(got, []string{img.Digest}) {
		t.Errorf("with a pool sandbox: got %v, want [%s]", got, img.Digest)
	}
	stop()
	if got := e.ImagesInUse(); len(got) != 0 {
		t.Errorf("after the pool drained: got %v, want none", got)
	}
	s, err := openTemplate(t, e, "shelly", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := e.ImagesInUse(); !slices.Equal(got, []string{shelly.Digest}) {
		t.Errorf("with a session: got %v, want [%s]", got, shelly.Digest)
	}
	if l, ok := s.sb.(labeled); !ok || l.Labels()[LabelImage] != shelly.Digest {
		t.Errorf("the session sandbox's labels: want %s=%s", LabelImage, shelly.Digest)
	}
	sb, err := e.NewSandbox(t.Context(), Request{Tool: "analytics"})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.ImagesInUse(); len(got) != 2 {
		t.Errorf("with a one-shot's sandbox too: got %v, want two images", got)
	}
	if err := sb.Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := e.ImagesInUse(); len(got) != 0 {
		t.Errorf("after the session closed: got %v, want none", got)
	}
}

// TestPruneGolden checks that PruneGolden removes the checkpoints whose
// image is gone and keeps the others and those being made.
func TestPruneGolden(t *testing.T) {
	dir := t.TempDir()
	e := &Engine{golden: GoldenOptions{Dir: dir}}
	write := func(rel, image string) string {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(goldenRecord{Template: filepath.Dir(rel), Image: image})
		if err := os.WriteFile(filepath.Join(p, goldenRecordFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	kept := write("gold/aaaa-1", "sha256:kept")
	gone := write("gold/bbbb-1", "sha256:gone")
	making := write("gold/.new-1", "sha256:gone")
	removed, err := e.PruneGolden(func(d string) bool { return d == "sha256:kept" })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{gone}) {
		t.Errorf("removed %v, want [%s]", removed, gone)
	}
	for _, p := range []string{kept, making} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v, want it kept", p, err)
		}
	}
	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Errorf("%s: %v, want it removed", gone, err)
	}
}
