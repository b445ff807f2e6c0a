package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
)

// TestProgressPrinter checks the lines image build prints as a build
// moves on: one when a stage starts, then at most one per interval.
func TestProgressPrinter(t *testing.T) {
	var b strings.Builder
	print := progressPrinter(&b, time.Hour)
	for _, p := range []image.Progress{
		{Runtime: "python", Stage: "fetching", Elapsed: time.Second},
		{Runtime: "python", Stage: "fetching", Packages: 3, Elapsed: 2 * time.Second},
		{Runtime: "python", Stage: "unpacking", Packages: 43, Total: 120, Bytes: 212 << 20, Elapsed: 47 * time.Second},
		{Runtime: "python", Stage: "unpacking", Packages: 44, Total: 120, Bytes: 213 << 20, Elapsed: 48 * time.Second},
		{Runtime: "python", Stage: "hashing", Bytes: 546 << 20, Elapsed: 95 * time.Second},
	} {
		print(p)
	}
	want := "python: fetching (1s)\n" +
		"python: unpacking 43 of 120 packages, 212.0 MiB so far (47s)\n" +
		"python: hashing, 546.0 MiB so far (1m35s)\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	b.Reset()
	every := progressPrinter(&b, 0)
	every(image.Progress{Runtime: "shell", Stage: "configuring", Packages: 1, Total: 79})
	every(image.Progress{Runtime: "shell", Stage: "configuring", Packages: 2, Total: 79})
	if n := strings.Count(b.String(), "\n"); n != 2 {
		t.Errorf("with no interval: got %q, want both lines", b.String())
	}
}

// TestImageDataDir checks that the image commands find the images where
// every other command does: --data-dir, else STOCKADE_DATA_DIR.
func TestImageDataDir(t *testing.T) {
	testenv.Image(t, "shell") // the test images, in testenv.DataDir()
	empty, images := t.TempDir(), testenv.DataDir()
	list := func(t *testing.T, args ...string) []image.Manifest {
		t.Helper()
		code, stdout, stderr := runCLI(t, nil, append([]string{"image", "list", "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("image list: exit %d: %s", code, stderr)
		}
		var ms []image.Manifest
		if err := json.Unmarshal([]byte(stdout), &ms); err != nil {
			t.Fatalf("image list --json: %v: %q", err, stdout)
		}
		return ms
	}
	t.Run("flag", func(t *testing.T) {
		if ms := list(t, "--data-dir", empty); len(ms) != 0 {
			t.Errorf("--data-dir %s: got %d images, want none", empty, len(ms))
		}
		if ms := list(t, "--data-dir", images); len(ms) == 0 {
			t.Errorf("--data-dir %s: got no images", images)
		}
	})
	t.Run("environment", func(t *testing.T) {
		t.Setenv("STOCKADE_DATA_DIR", empty)
		if ms := list(t); len(ms) != 0 {
			t.Errorf("STOCKADE_DATA_DIR=%s: got %d images, want none", empty, len(ms))
		}
		t.Setenv("STOCKADE_DATA_DIR", images)
		if ms := list(t); len(ms) == 0 {
			t.Errorf("STOCKADE_DATA_DIR=%s: got no images", images)
		}
	})
	if code, _, _ := runCLI(t, nil, "image", "list", "--root", empty); code != 2 {
		t.Errorf("--root: got exit %d, want 2 (the flag is --data-dir)", code)
	}
}
