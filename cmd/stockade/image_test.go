package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/image"
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
