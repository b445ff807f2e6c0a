package conformance

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/sandbox"
)

// The checks of basic behaviour: exit codes, stdin, the program's
// environment, and a sandbox that serves more than one Exec.

func (s *suite) exitCode(t *testing.T) {
	b := s.start(t, sandbox.Limits{})
	res := b.run(t, sandbox.ExecRequest{}, "exit", "3")
	if res.Status != sandbox.StatusFailed || res.ExitCode != 3 {
		t.Errorf("exit 3: got status %s exit code %d, want %s 3", res.Status, res.ExitCode, sandbox.StatusFailed)
	}
	if !bytes.Contains(res.Stdout, []byte(`"exit":3`)) {
		t.Errorf("exit 3: got stdout %q, want the probe's report", tail(res.Stdout))
	}
	b = s.start(t, sandbox.Limits{})
	res = b.run(t, sandbox.ExecRequest{}, "exit", "0")
	if res.Status != sandbox.StatusSucceeded || res.ExitCode != 0 {
		t.Errorf("exit 0: got status %s exit code %d, want %s 0", res.Status, res.ExitCode, sandbox.StatusSucceeded)
	}
}

func (s *suite) stdin(t *testing.T) {
	want := "line one\nline two with \x00 a NUL\n" + strings.Repeat("z", 100<<10)
	b := s.start(t, sandbox.Limits{})
	var r struct {
		Stdin string `json:"stdin"`
		Bytes int    `json:"bytes"`
	}
	decode(t, b.run(t, sandbox.ExecRequest{Stdin: []byte(want)}, "stdin"), &r, "stdin")
	if r.Stdin != want {
		t.Errorf("got %d bytes of stdin, want %d bytes", r.Bytes, len(want))
	}
	b = s.start(t, sandbox.Limits{})
	decode(t, b.run(t, sandbox.ExecRequest{}, "stdin"), &r, "stdin")
	if r.Bytes != 0 {
		t.Errorf("nil Stdin: got %d bytes of stdin, want 0", r.Bytes)
	}
}

func (s *suite) environment(t *testing.T) {
	type envReport struct {
		Environ []string `json:"environ"`
	}
	// shellVars are added by the shell that unpacks the probe when the
	// driver has no sessions; they are not the driver's doing.
	clean := func(env []string) []string {
		if s.caps.Sessions {
			return env
		}
		return slices.DeleteFunc(env, func(kv string) bool {
			k, _, _ := strings.Cut(kv, "=")
			return k == "SHLVL" || k == "PWD" || k == "PATH"
		})
	}
	b := s.start(t, sandbox.Limits{})
	var r envReport
	decode(t, b.run(t, sandbox.ExecRequest{}, "env"), &r, "env")
	if got := clean(r.Environ); len(got) != 0 {
		t.Errorf("nil Env: got environment %q, want it empty", got)
	}
	want := []string{"EMPTY=", "FOO=bar baz"}
	b = s.start(t, sandbox.Limits{})
	decode(t, b.run(t, sandbox.ExecRequest{Env: want}, "env"), &r, "env")
	got := clean(r.Environ)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("Env %q: got environment %q, want exactly it", want, got)
	}
}

func (s *suite) sessions(t *testing.T) {
	if !s.caps.Sessions {
		t.Logf("driver %s does not report sessions: one Exec per sandbox", s.h.Driver.Name())
		return
	}
	b := s.start(t, sandbox.Limits{}) // start has already run one Exec
	content := "session-" + randHex(8)
	var w errno
	decode(t, b.run(t, sandbox.ExecRequest{}, "writefile", "/tmp/session", content), &w, "writefile")
	if w.Errno != 0 {
		t.Fatalf("writing /tmp/session: got %s, want success", w)
	}
	var r struct {
		errno
		Content string `json:"content"`
	}
	decode(t, b.run(t, sandbox.ExecRequest{}, "readfile", "/tmp/session"), &r, "readfile")
	if r.Errno != 0 || r.Content != content {
		t.Errorf("third Exec reading /tmp/session: got %s %q, want the second Exec's %q", r.errno, r.Content, content)
	}
}
