package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/internal/probeexec"
	"github.com/stockade-sh/stockade/sandbox"
)

// Building the probe, delivering it into a sandbox of a check (box) and
// reading its reports.

var (
	probeOnce sync.Once
	probeBin  []byte
	probeGz   []byte
	probeErr  error
)

// BuildProbe builds the probe (static, stripped) once per test binary and
// returns the executable.
func BuildProbe(t testing.TB) []byte {
	t.Helper()
	probeOnce.Do(func() { probeBin, probeGz, probeErr = buildProbe() })
	if probeErr != nil {
		t.Fatalf("building the conformance probe: %v", probeErr)
	}
	return probeBin
}

// probeGzip returns the probe gzip-compressed. A static Go program is larger
// than sandbox.MaxCodeSize (about 1.9 MB against 1 MiB) and drivers refuse
// bigger code files, so the probe travels compressed (about 0.8 MB) and is
// unpacked in the sandbox by the image's busybox (see box.install).
func probeGzip(t testing.TB) []byte {
	t.Helper()
	BuildProbe(t)
	return probeGz
}

func buildProbe() (bin, gz []byte, err error) {
	dir, err := probeSourceDir()
	if err != nil {
		return nil, nil, err
	}
	tmp, err := os.MkdirTemp("", "stockade-probe-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, "probe")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, nil, fmt.Errorf("go build in %s: %v\n%s", dir, err, b)
	}
	bin, err = os.ReadFile(out)
	if err != nil {
		return nil, nil, err
	}
	gz, err = probeexec.Compress(bin)
	return bin, gz, err
}

// probeSourceDir finds ./probe next to this file, or through `go list` when
// the test binary was built with -trimpath.
func probeSourceDir() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		dir := filepath.Join(filepath.Dir(file), "probe")
		if _, err := os.Stat(filepath.Join(dir, "main.go")); err == nil {
			return dir, nil
		}
	}
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", "github.com/stockade-sh/stockade/sandbox/conformance/probe").Output()
	if err != nil {
		return "", fmt.Errorf("locating the probe's source with go list: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// box is one sandbox of a check.
type box struct {
	s  *suite
	sb sandbox.Sandbox
}

// start creates a sandbox with lim, registers its destruction, and, when the
// driver has sessions, installs the probe in it.
func (s *suite) start(t *testing.T, lim sandbox.Limits) *box {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	sb, err := s.h.Driver.Create(ctx, sandbox.Spec{
		Image:  s.h.Image,
		Limits: lim,
		Labels: map[string]string{"stockade.test": "conformance"},
	})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	b := &box{s: s, sb: sb}
	t.Cleanup(func() { b.destroy(t) })
	if s.caps.Sessions {
		b.install(t)
	}
	return b
}

// install unpacks the probe to probePath with a first Exec, so that the
// checks' Execs run it directly, as the guest runs user code: with exactly
// the requested environment and no shell in between.
func (b *box) install(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := probeexec.Install(ctx, b.sb, b.s.probe, probeexec.Busybox); err != nil {
		t.Fatal(err)
	}
}

// request makes the ExecRequest that runs the probe with args.
func (b *box) request(req sandbox.ExecRequest, args ...string) sandbox.ExecRequest {
	if b.s.caps.Sessions {
		// The probe is already in place.
		return probeexec.Request(req, args...)
	}
	// Without sessions the probe is unpacked and exec'd by a shell in the
	// same Exec. The shell adds SHLVL, PWD and PATH to the environment
	// (see environment).
	return probeexec.InlineRequest(req, b.s.probe, args...)
}

// exec runs the probe with args; usable from any goroutine.
func (b *box) exec(ctx context.Context, req sandbox.ExecRequest, args ...string) (*sandbox.Result, error) {
	limit := req.Timeout
	if limit == 0 {
		limit = sandbox.DefaultLimits().Timeout
	}
	ctx, cancel := context.WithTimeout(ctx, limit+time.Minute)
	defer cancel()
	return sandbox.Run(ctx, b.sb, b.request(req, args...))
}

// run runs the probe with args and fails t if the driver returns an error.
func (b *box) run(t *testing.T, req sandbox.ExecRequest, args ...string) *sandbox.Result {
	t.Helper()
	res, err := b.exec(t.Context(), req, args...)
	if err != nil {
		t.Fatalf("Exec probe %s: %v", strings.Join(args, " "), err)
	}
	return res
}

// report runs the probe with args and decodes its JSON report into v.
func (b *box) report(t *testing.T, v any, args ...string) {
	t.Helper()
	b.reportWith(t, sandbox.ExecRequest{}, v, args...)
}

// reportWith is report with the ExecRequest req.
func (b *box) reportWith(t *testing.T, req sandbox.ExecRequest, v any, args ...string) {
	t.Helper()
	decode(t, b.run(t, req, args...), v, args...)
}

// decode checks that the probe succeeded and decodes the last line of its
// stdout into v.
func decode(t *testing.T, res *sandbox.Result, v any, args ...string) {
	t.Helper()
	if err := probeexec.Decode(res, v); err != nil {
		t.Fatalf("probe %s: %v", strings.Join(args, " "), err)
	}
}

// destroy destroys the sandbox and checks that nothing of it is left on the
// host. It may be called more than once (Destroy is idempotent).
func (b *box) destroy(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), time.Minute)
	defer cancel()
	id := b.sb.ID()
	if err := b.sb.Destroy(ctx); err != nil {
		t.Errorf("Destroy(%s): %v", id, err)
	}
	if left := b.s.leftovers(ctx, id); len(left) > 0 {
		t.Errorf("after Destroy, sandbox %s left on the host: %s", id, strings.Join(left, "; "))
	}
}

func tail(b []byte) string { return probeexec.Tail(b) }

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// errno is how the probe reports an attempt: 0 is success, -1 means the
// attempt could not be made (see Note).
type errno struct {
	Errno int    `json:"errno"`
	Err   string `json:"err"`
	Note  string `json:"note"`
	// Signal is the signal that killed the attempt's child, for the
	// attempts made in one; 0 otherwise.
	Signal int `json:"signal"`
}

func (e errno) String() string {
	switch {
	case e.Signal != 0:
		return "killed by signal " + strconv.Itoa(e.Signal)
	case e.Errno == 0:
		return "success"
	case e.Errno < 0:
		return "not attempted (" + e.Note + ")"
	}
	return e.Err
}

func (e errno) is(want syscall.Errno) bool { return e.Errno == int(want) }
