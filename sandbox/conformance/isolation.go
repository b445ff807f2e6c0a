package conformance

import (
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/internal/probeexec"
	"github.com/stockade-sh/stockade/sandbox"
)

// The checks of isolation between sandboxes: two at once, and one after
// another.

func (s *suite) concurrentIsolation(t *testing.T) {
	marker := "markerA-" + randHex(4)
	a := s.start(t, sandbox.Limits{})
	b := s.start(t, sandbox.Limits{})

	// A writes /tmp/<marker> and sleeps; B looks while A runs.
	_, doneA := a.startBackground(t, time.Minute, "sandbox A", "mark", "/tmp/"+marker, "5")

	var r struct {
		Self  int        `json:"self"`
		Tmp   []string   `json:"tmp"`
		Procs []procInfo `json:"procs"`
	}
	b.report(t, &r, "seeothers")
	t.Logf("sandbox B sees /tmp %v and processes %+v", r.Tmp, r.Procs)
	// The controls: B's listings show B's own file and process.
	if s.caps.Sessions && !slices.Contains(r.Tmp, filepath.Base(probeexec.Path)) {
		t.Errorf("sandbox B's /tmp %v lacks its own %s", r.Tmp, probeexec.Path)
	}
	if !slices.ContainsFunc(r.Procs, func(p procInfo) bool { return p.PID == r.Self }) {
		t.Errorf("sandbox B's processes %+v lack the probe itself (pid %d)", r.Procs, r.Self)
	}
	if slices.Contains(r.Tmp, marker) {
		t.Errorf("sandbox B sees sandbox A's /tmp/%s", marker)
	}
	for _, p := range r.Procs {
		if strings.Contains(p.Cmdline, marker) {
			t.Errorf("sandbox B sees sandbox A's process %d (%s)", p.PID, p.Cmdline)
		}
	}

	o := <-doneA
	if o.err != nil {
		t.Fatalf("sandbox A: Exec: %v", o.err)
	}
	if o.res.Status != sandbox.StatusSucceeded {
		t.Errorf("sandbox A: got status %s, want %s", o.res.Status, sandbox.StatusSucceeded)
	}
	if !s.caps.Sessions {
		return
	}
	// And the other way round: A cannot read what B writes.
	var w errno
	decode(t, b.run(t, sandbox.ExecRequest{}, "writefile", "/tmp/markerB"), &w, "writefile")
	if w.Errno != 0 {
		t.Fatalf("sandbox B writing /tmp/markerB: got %s, want success", w)
	}
	var own errno
	decode(t, b.run(t, sandbox.ExecRequest{}, "readfile", "/tmp/markerB"), &own, "readfile")
	if own.Errno != 0 {
		t.Fatalf("sandbox B reading its own /tmp/markerB: got %s, want success", own)
	}
	var rd errno
	decode(t, a.run(t, sandbox.ExecRequest{}, "readfile", "/tmp/markerB"), &rd, "readfile")
	if !rd.is(syscall.ENOENT) {
		t.Errorf("sandbox A reading B's /tmp/markerB: got %s, want ENOENT", rd)
	}
}

func (s *suite) noPersistence(t *testing.T) {
	content := "persist-" + randHex(8)
	paths := []string{"/tmp/persist", "/dev/shm/persist"}
	type readReport struct {
		errno
		Content string `json:"content"`
	}
	first := s.start(t, sandbox.Limits{})
	for _, p := range paths {
		var w errno
		decode(t, first.run(t, sandbox.ExecRequest{}, "writefile", p, content), &w, "writefile")
		if w.Errno != 0 {
			t.Errorf("first sandbox writing %s: got %s, want success", p, w)
		}
		if !s.caps.Sessions {
			continue
		}
		// The control: the reader finds what is there.
		var r readReport
		decode(t, first.run(t, sandbox.ExecRequest{}, "readfile", p), &r, "readfile")
		if r.Errno != 0 || r.Content != content {
			t.Errorf("first sandbox reading back %s: got %s %q, want %q", p, r.errno, r.Content, content)
		}
	}
	first.destroy(t)

	second := s.start(t, sandbox.Limits{})
	for _, p := range paths {
		var r readReport
		decode(t, second.run(t, sandbox.ExecRequest{}, "readfile", p), &r, "readfile")
		if !r.is(syscall.ENOENT) {
			t.Errorf("second sandbox reading %s: got %s %q, want ENOENT", p, r.errno, r.Content)
		}
	}
}
