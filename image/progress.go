package image

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"time"
)

// Progress is how far a Build has got, for people watching it.
type Progress struct {
	// Runtime is the image being built.
	Runtime string
	// Stage is what the build does now: debootstrap's "fetching" (from
	// the mirror or the package cache), "extracting", "unpacking" and
	// "configuring", then "hardening" and "hashing".
	Stage string
	// Packages is how many packages the stage has done, of Total; Total is
	// 0 until the packages are known (when fetching ends).
	Packages, Total int
	// Bytes is the apparent size of the tree so far.
	Bytes int64
	// Elapsed is the time since the build started.
	Elapsed time.Duration
}

// sizeEvery is how often the tree's size is measured while debootstrap
// fills it.
const sizeEvery = 2 * time.Second

// progress turns a build's steps and debootstrap's output (written to it
// line by line) into calls of f, one at a time: one per stage, per package
// and per size measured. A nil f makes it a sink. It is safe for
// concurrent use.
type progress struct {
	f     func(Progress)
	start time.Time

	mu      sync.Mutex
	p       Progress
	partial []byte
	fetched map[string]bool // packages debootstrap fetched
	done    map[string]bool // "stage package" of each package a stage did
	count   map[string]int  // packages done, by stage
}

func newProgress(f func(Progress), runtime string) *progress {
	return &progress{f: f, start: time.Now(), p: Progress{Runtime: runtime, Stage: "fetching"},
		fetched: map[string]bool{}, done: map[string]bool{}, count: map[string]int{}}
}

// Write takes debootstrap's output; complete lines of its "I: " messages
// move the progress on.
func (r *progress) Write(b []byte) (int, error) {
	if r.f == nil {
		return len(b), nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.partial = append(r.partial, b...)
	for {
		i := bytes.IndexByte(r.partial, '\n')
		if i < 0 {
			break
		}
		r.line(string(r.partial[:i]))
		r.partial = r.partial[i+1:]
	}
	if len(r.partial) > 4096 {
		r.partial = r.partial[:0] // not a line of debootstrap's
	}
	return len(b), nil
}

// line reads one line of debootstrap's output. Its messages are
// "I: Retrieving NAME VERSION" (or "I: Validating NAME VERSION" for a
// package found in the cache), "I: Extracting NAME...", "I: Unpacking
// NAME..." and "I: Configuring NAME...", with lines such as "I: Unpacking
// required packages..." between stages. The required packages are
// unpacked and configured first, then the base ones: a stage that comes
// back counts on from where it was.
func (r *progress) line(l string) {
	verb, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(l), "I: "), " ")
	if !ok {
		return
	}
	name, _, _ := strings.Cut(strings.TrimSuffix(rest, "..."), " ")
	stage := map[string]string{"Retrieving": "fetching", "Validating": "fetching", "Extracting": "extracting",
		"Unpacking": "unpacking", "Configuring": "configuring"}[verb]
	switch name {
	case "", "InRelease", "Packages", "Release", "required", "the", "base":
		// The archive's indexes, and the lines that open a stage.
		return
	}
	if stage == "" {
		return
	}
	if stage == "fetching" {
		r.fetched[name] = true
	}
	if k := stage + " " + name; !r.done[k] {
		r.done[k] = true
		r.count[stage]++
	}
	r.p.Stage, r.p.Packages, r.p.Total = stage, r.count[stage], len(r.fetched)
	if stage == "fetching" {
		r.p.Total = 0 // not known until fetching ends
	}
	r.emit()
}

// stage starts a stage of the build's own, after debootstrap.
func (r *progress) stage(name string) {
	if r.f == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.p.Stage, r.p.Packages, r.p.Total = name, 0, 0
	r.emit()
}

// packages records that the stage has done n of total packages.
func (r *progress) packages(n, total int) {
	if r.f == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.p.Packages, r.p.Total = n, total
	r.emit()
}

// size records the tree's size.
func (r *progress) size(n int64) {
	if r.f == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.p.Bytes = n
	r.emit()
}

// emit calls f with the progress; the caller holds r.mu.
func (r *progress) emit() {
	r.p.Elapsed = time.Since(r.start)
	r.f(r.p)
}

// measure records the size of the tree under dir every sizeEvery until
// ctx is done.
func (r *progress) measure(ctx context.Context, dir string) {
	if r.f == nil {
		return
	}
	t := time.NewTicker(sizeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.size(apparentSize(dir))
		}
	}
}
