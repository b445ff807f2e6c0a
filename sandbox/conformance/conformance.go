// Package conformance is the suite every sandbox.Driver must pass. It proves
// the security profile of DESIGN.md §3 by attack: a probe program (./probe)
// is delivered into sandboxes like user code, tries what hostile code would
// try and reports what it could see and do, and the suite asserts on those
// reports from the host. A driver's test runs it:
//
//	func TestConformance(t *testing.T) {
//		d, err := runc.New(...)
//		...
//		conformance.Run(t, conformance.Harness{Driver: d, Image: img, Leftovers: d.Leftovers})
//	}
//
// The suite needs the `go` command (it builds the probe) and an image with
// /bin/busybox (see probeGzip and internal/probeexec, which delivers it).
package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/probeexec"
	"github.com/stockade-sh/stockade/sandbox"
)

// Harness is what a driver's test gives the suite.
type Harness struct {
	Driver sandbox.Driver
	// Image is the `shell` runtime image (Debian minbase with busybox). The
	// probe is static, but it is unpacked with the image's /bin/busybox.
	Image sandbox.Image
	// Leftovers reports anything a destroyed sandbox left on the host
	// (processes, cgroups, runtime state, bundle directories) for the given
	// sandbox ID; empty means clean. Provided by the driver's test.
	Leftovers func(id string) []string
}

// Limits the checks use where the defaults would make them slow.
const (
	tmpSize   = 8 << 20
	pidsLimit = 64
	memLimit  = 256 << 20
	outputCap = 1 << 20
)

// Run runs every check against h.Driver, each as a subtest with sandboxes
// of its own. Every sandbox is destroyed (also when a check fails) and then
// h.Leftovers must report nothing for it.
func Run(t *testing.T, h Harness) {
	if h.Driver == nil || h.Leftovers == nil {
		t.Fatal("conformance.Harness needs a Driver and a Leftovers function")
	}
	s := &suite{h: h, caps: h.Driver.Capabilities(), probe: probeGzip(t)}
	t.Logf("driver %s, tier %s: %s", h.Driver.Name(), s.caps.Tier, s.caps.Tier.Boundary())
	for _, c := range []struct {
		name string
		fn   func(*suite, *testing.T)
	}{
		{"ExitCode", (*suite).exitCode},
		{"Stdin", (*suite).stdin},
		{"Environment", (*suite).environment},
		{"Sessions", (*suite).sessions},
		{"Credentials", (*suite).credentials},
		{"Filesystem", (*suite).filesystem},
		{"Network", (*suite).network},
		{"HostEnvironment", (*suite).hostEnvironment},
		{"HostPIDs", (*suite).hostPIDs},
		{"GuestSignals", (*suite).guestSignals},
		{"Syscalls", (*suite).syscalls},
		{"ForkBomb", (*suite).forkBomb},
		{"OOM", (*suite).oom},
		{"Timeout", (*suite).timeout},
		{"Daemon", (*suite).daemon},
		{"OutputFlood", (*suite).outputFlood},
		{"ConcurrentIsolation", (*suite).concurrentIsolation},
		{"NoPersistence", (*suite).noPersistence},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(s, t) })
	}
}

type suite struct {
	h     Harness
	caps  sandbox.Capabilities
	probe []byte // gzip-compressed
}

// sharedKernel reports whether the sandboxed program talks to the host
// kernel directly. There the seccomp filter, read-only mounts and cgroups
// are the boundary and are asserted as such; on gVisor the program talks to
// the Sentry, which presents some of these facts differently (see the
// checks), and on a microVM to a kernel of its own.
func (s *suite) sharedKernel() bool {
	return s.caps.Tier == sandbox.TierContainer || s.caps.Tier == sandbox.TierDocker
}

// ---------------------------------------------------------------------------
// Building and delivering the probe.

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
	return b.sb.Exec(ctx, b.request(req, args...))
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
	decode(t, b.run(t, sandbox.ExecRequest{}, args...), v, args...)
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
	if left := b.s.h.Leftovers(id); len(left) > 0 {
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
}

func (e errno) String() string {
	switch {
	case e.Errno == 0:
		return "success"
	case e.Errno < 0:
		return "not attempted (" + e.Note + ")"
	}
	return e.Err
}

func (e errno) is(want syscall.Errno) bool { return e.Errno == int(want) }

// ---------------------------------------------------------------------------
// Basic behaviour.

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

// ---------------------------------------------------------------------------
// Identity and privileges.

type valueReport struct {
	errno
	Value json.RawMessage `json:"value"`
}

type capsReport struct {
	Status map[string]string `json:"status"`
	Capget struct {
		errno
		Effective   string `json:"effective"`
		Permitted   string `json:"permitted"`
		Inheritable string `json:"inheritable"`
	} `json:"capget"`
	CapsChecked int         `json:"caps_checked"`
	Bounding    valueReport `json:"bounding"`
	Ambient     valueReport `json:"ambient"`
	NoNewPrivs  valueReport `json:"no_new_privs"`
	Seccomp     valueReport `json:"seccomp"`
	UID         int         `json:"uid"`
	EUID        int         `json:"euid"`
	GID         int         `json:"gid"`
	EGID        int         `json:"egid"`
	Groups      []int       `json:"groups"`
}

const zeroCaps = "0000000000000000"

func (s *suite) credentials(t *testing.T) {
	b := s.start(t, sandbox.Limits{})
	var r capsReport
	b.report(t, &r, "caps")
	t.Logf("caps report: status %v, seccomp %s, no_new_privs %s", r.Status, r.Seccomp.Value, r.NoNewPrivs.Value)

	t.Run("Capabilities", func(t *testing.T) {
		for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
			v, ok := r.Status[k]
			switch {
			case ok && v != zeroCaps:
				t.Errorf("/proc/self/status %s: got %s, want %s", k, v, zeroCaps)
			case !ok && s.sharedKernel():
				t.Errorf("/proc/self/status has no %s line", k)
			}
			// gVisor's status has no CapAmb line; the prctl reading
			// below covers the ambient set there.
		}
		c := r.Capget
		if c.Errno != 0 {
			t.Errorf("capget: got %s, want success", c.errno)
		}
		for name, v := range map[string]string{"effective": c.Effective, "permitted": c.Permitted, "inheritable": c.Inheritable} {
			if v != zeroCaps {
				t.Errorf("capget %s: got %s, want %s", name, v, zeroCaps)
			}
		}
		for name, v := range map[string]valueReport{"bounding (PR_CAPBSET_READ)": r.Bounding, "ambient (PR_CAP_AMBIENT_IS_SET)": r.Ambient} {
			if strings.HasPrefix(name, "ambient") && s.caps.Tier == sandbox.TierGVisor && v.is(syscall.EINVAL) {
				// The Sentry implements no ambient capability set
				// (Linux 4.3+), so it rejects PR_CAP_AMBIENT: the set
				// is empty by construction.
				continue
			}
			if v.Errno != 0 {
				t.Errorf("%s: got %s, want success", name, v.errno)
			} else if string(v.Value) != `"`+zeroCaps+`"` {
				t.Errorf("%s: got %s, want %s", name, v.Value, zeroCaps)
			}
		}
		if r.CapsChecked < 32 {
			t.Errorf("the bounding set was read for %d capabilities, want at least 32", r.CapsChecked)
		}
	})

	t.Run("NoNewPrivs", func(t *testing.T) {
		if r.NoNewPrivs.Errno != 0 || string(r.NoNewPrivs.Value) != "1" {
			t.Errorf("PR_GET_NO_NEW_PRIVS: got %s (%s), want 1", r.NoNewPrivs.Value, r.NoNewPrivs.errno)
		}
		// gVisor's status has no NoNewPrivs line.
		if v, ok := r.Status["NoNewPrivs"]; (ok || s.sharedKernel()) && v != "1" {
			t.Errorf("/proc/self/status NoNewPrivs: got %q, want 1", v)
		}
	})

	t.Run("Seccomp", func(t *testing.T) {
		if !s.sharedKernel() {
			// gVisor applies the OCI profile inside the Sentry (with
			// --oci-seccomp); what its status reports for the mode is
			// its own business. The refusals themselves are asserted by
			// the Syscalls check on every tier.
			t.Logf("tier %s presents seccomp mode %q in status and %s from PR_GET_SECCOMP", s.caps.Tier, r.Status["Seccomp"], r.Seccomp.Value)
			return
		}
		if v := r.Status["Seccomp"]; v != "2" {
			t.Errorf("/proc/self/status Seccomp: got %q, want 2 (filter)", v)
		}
		if r.Seccomp.Errno != 0 || string(r.Seccomp.Value) != "2" {
			t.Errorf("PR_GET_SECCOMP: got %s (%s), want 2", r.Seccomp.Value, r.Seccomp.errno)
		}
	})

	t.Run("User", func(t *testing.T) {
		for name, v := range map[string]int{"uid": r.UID, "euid": r.EUID, "gid": r.GID, "egid": r.EGID} {
			if v != 65534 {
				t.Errorf("%s: got %d, want 65534", name, v)
			}
		}
		for _, g := range r.Groups {
			if g != 65534 {
				t.Errorf("supplementary groups: got %v, want none but 65534", r.Groups)
				break
			}
		}
	})
}

// ---------------------------------------------------------------------------
// Filesystem.

type fsReport struct {
	Writes []struct {
		errno
		Path string `json:"path"`
		Op   string `json:"op"`
	} `json:"writes"`
	Statfs []struct {
		errno
		Path   string `json:"path"`
		RO     bool   `json:"ro"`
		NoSUID bool   `json:"nosuid"`
		NoDev  bool   `json:"nodev"`
		Size   int64  `json:"size"`
		Flags  int64  `json:"flags"`
	} `json:"statfs"`
	TmpFill struct {
		errno
		Written int64 `json:"written"`
	} `json:"tmp_fill"`
	Dev []struct {
		errno
		Name  string `json:"name"`
		Type  string `json:"type"`
		Major int    `json:"major"`
		Minor int    `json:"minor"`
	} `json:"dev"`
	Mounts []struct {
		MountPoint string `json:"mount_point"`
		FSType     string `json:"fstype"`
		Source     string `json:"source"`
		Options    string `json:"options"`
	} `json:"mounts"`
}

func (s *suite) filesystem(t *testing.T) {
	b := s.start(t, sandbox.Limits{TmpSize: tmpSize})
	var r fsReport
	b.report(t, &r, "fs")
	write := func(t *testing.T, path string) errno {
		t.Helper()
		for _, w := range r.Writes {
			if w.Path == path {
				return w.errno
			}
		}
		t.Fatalf("the probe did not report a write to %s", path)
		return errno{}
	}
	statfs := func(t *testing.T, path string) (ro, nosuid, nodev bool, size int64) {
		t.Helper()
		for _, st := range r.Statfs {
			if st.Path == path {
				if st.Errno != 0 {
					t.Fatalf("statfs %s: %s", path, st.errno)
				}
				return st.RO, st.NoSUID, st.NoDev, st.Size
			}
		}
		t.Fatalf("the probe did not report statfs of %s", path)
		return
	}

	t.Run("RootReadOnly", func(t *testing.T) {
		for _, p := range []string{
			"/.stockade-probe", "/etc/.stockade-probe", "/usr/bin/.stockade-probe", "/.stockade/.stockade-probe",
			"/var/tmp/.stockade-probe", "/.stockade-probe-dir", "/usr/.stockade-probe-dir",
		} {
			e := write(t, p)
			switch {
			case e.Errno == 0:
				t.Errorf("creating %s: got success, want EROFS", p)
			case s.sharedKernel() && !e.is(syscall.EROFS):
				// A read-only mount answers EROFS before file
				// permissions are checked; anything else means only
				// the image's file modes stand in the way.
				t.Errorf("creating %s: got %s, want EROFS", p, e)
			case !s.sharedKernel() && !e.is(syscall.EROFS) && !e.is(syscall.EACCES):
				t.Errorf("creating %s: got %s, want EROFS or EACCES", p, e)
			}
		}
		for _, p := range []string{"/.stockade/guest", "/etc/passwd", "/bin/busybox"} {
			if e := write(t, p); e.Errno == 0 {
				t.Errorf("opening %s for writing: got success, want refused", p)
			}
		}
		for _, p := range []string{"/", "/etc", "/usr/bin", "/.stockade/guest"} {
			if ro, _, _, _ := statfs(t, p); !ro {
				t.Errorf("statfs %s: got read-write, want read-only", p)
			}
		}
	})

	t.Run("Tmp", func(t *testing.T) {
		if e := write(t, "/tmp/.stockade-probe"); e.Errno != 0 {
			t.Errorf("creating a file in /tmp: got %s, want success", e)
		}
		f := r.TmpFill
		t.Logf("filling /tmp (cap %d bytes) wrote %d bytes, then %s", tmpSize, f.Written, f.errno)
		if !f.is(syscall.ENOSPC) {
			t.Errorf("filling /tmp: got %s, want ENOSPC", f.errno)
		}
		if f.Written > tmpSize || f.Written < tmpSize/2 {
			t.Errorf("filling /tmp: wrote %d bytes, want between %d and %d (the cap)", f.Written, tmpSize/2, tmpSize)
		}
		_, nosuid, nodev, size := statfs(t, "/tmp")
		if !nosuid {
			t.Errorf("statfs /tmp: got nosuid=false, want nosuid")
		}
		switch {
		case s.caps.Tier == sandbox.TierGVisor:
			// runsc drops the nodev mount option (it knows ro,
			// noexec, nosuid and noatime only). A device node there
			// would be the Sentry's own, and creating one needs
			// CAP_MKNOD, which no set holds (see Credentials).
			t.Logf("tier %s: /tmp nodev=%t", s.caps.Tier, nodev)
		case !nodev:
			t.Errorf("statfs /tmp: got nodev=false, want nodev")
		}
		if size > tmpSize {
			t.Errorf("statfs /tmp: got size %d, want at most %d", size, tmpSize)
		}
	})

	t.Run("ProcAndSysReadOnly", func(t *testing.T) {
		for _, p := range []string{
			"/proc/sys/kernel/hostname", "/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches",
			"/proc/sysrq-trigger", "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/uevent_helper",
		} {
			if e := write(t, p); e.Errno == 0 {
				t.Errorf("opening %s for writing: got success, want refused", p)
			}
		}
		if ro, _, _, _ := statfs(t, "/sys"); !ro {
			t.Errorf("statfs /sys: got read-write, want read-only")
		}
		ro, _, _, _ := statfs(t, "/proc/sys")
		switch {
		case s.sharedKernel() && !ro:
			t.Errorf("statfs /proc/sys: got read-write, want read-only (runc's readonlyPaths)")
		case !s.sharedKernel():
			// runsc ignores the OCI readonlyPaths; /proc/sys is the
			// Sentry's own emulation, and the writes above are refused.
			t.Logf("tier %s: /proc/sys mounted read-only: %t", s.caps.Tier, ro)
		}
	})

	t.Run("DevMinimal", func(t *testing.T) {
		allowed := map[string]bool{
			"null": true, "zero": true, "full": true, "random": true, "urandom": true, "tty": true,
			"console": true, "ptmx": true, "pts": true, "shm": true, "mqueue": true, "fd": true,
			"stdin": true, "stdout": true, "stderr": true, "core": true,
		}
		devices := map[[2]int]bool{{1, 3}: true, {1, 5}: true, {1, 7}: true, {1, 8}: true, {1, 9}: true, {5, 0}: true, {5, 1}: true, {5, 2}: true}
		if s.caps.Tier == sandbox.TierGVisor {
			// The Sentry registers FUSE and TUN devices of its own in
			// every sandbox; they are emulated, not the host's.
			allowed["fuse"], allowed["net"] = true, true
			devices[[2]int{10, 229}], devices[[2]int{10, 200}] = true, true
		}
		var names []string
		for _, d := range r.Dev {
			names = append(names, d.Name)
			top, _, _ := strings.Cut(d.Name, "/")
			if !allowed[top] {
				t.Errorf("/dev/%s (%s) exists, want a minimal /dev", d.Name, d.Type)
			}
			switch {
			case d.Type == "block":
				t.Errorf("/dev/%s is a block device (%d:%d)", d.Name, d.Major, d.Minor)
			case d.Type == "char" && !devices[[2]int{d.Major, d.Minor}] && d.Major != 136: // 136: pty slaves
				t.Errorf("/dev/%s is character device %d:%d, not one of the minimal set", d.Name, d.Major, d.Minor)
			}
		}
		t.Logf("/dev: %s", strings.Join(names, " "))
	})

	t.Run("NoHostMounts", func(t *testing.T) {
		under := func(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
		for _, m := range r.Mounts {
			p := m.MountPoint
			if p == "/" || p == "/tmp" || p == "/workspace" || p == "/.stockade/guest" ||
				under(p, "/proc") || under(p, "/dev") || under(p, "/sys") {
				continue
			}
			if s.caps.Tier == sandbox.TierDocker && dockerEtcFiles[p] != "" && hasOption(m.Options, "ro") {
				// dockerd always bind-mounts these three files, even with
				// --network=none; the driver writes fixed contents into
				// them, checked below, and they are read-only.
				continue
			}
			t.Errorf("unexpected mount at %s (%s from %s, %s): only the image, the guest and the profile's mounts may be mounted", p, m.FSType, m.Source, m.Options)
		}
	})

	if s.caps.Tier == sandbox.TierDocker {
		t.Run("DockerEtcFiles", func(t *testing.T) {
			b := s.start(t, sandbox.Limits{})
			for p, want := range dockerEtcFiles {
				var rd struct {
					errno
					Content string `json:"content"`
				}
				decode(t, b.run(t, sandbox.ExecRequest{}, "readfile", p), &rd, "readfile")
				if !strings.Contains(rd.Content, want) || strings.Contains(rd.Content, "search") {
					t.Errorf("%s: got %q, want the driver's fixed contents (containing %q) and nothing of the host's", p, rd.Content, want)
				}
			}
		})
	}
}

// dockerEtcFiles are the files dockerd mounts into every container, with a
// line of the contents the docker driver gives them.
var dockerEtcFiles = map[string]string{
	"/etc/resolv.conf": "nameserver 127.0.0.1",
	"/etc/hostname":    "sandbox",
	"/etc/hosts":       "127.0.0.1",
}

func hasOption(opts, o string) bool {
	for _, v := range strings.Split(opts, ",") {
		if v == o {
			return true
		}
	}
	return false
}

// ---------------------------------------------------------------------------
// Network, environment, processes.

func (s *suite) network(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()

	b := s.start(t, sandbox.Limits{})
	var r struct {
		Netlink struct {
			errno
			Names []string `json:"names"`
		} `json:"netlink"`
		ProcNetDev  []string `json:"proc_net_dev"`
		SysClassNet []string `json:"sys_class_net"`
		Addresses   struct {
			errno
			Addrs []string `json:"addrs"`
		} `json:"addresses"`
		Connect []struct {
			Addr   string `json:"addr"`
			Result string `json:"result"`
			Errno  int    `json:"errno"`
		} `json:"connect"`
		PingSocket errno `json:"ping_socket"`
		LowPort    errno `json:"low_port"`
	}
	addr := ln.Addr().String()
	b.report(t, &r, "net", addr)
	// Give a connection that did get through time to be accepted.
	time.Sleep(100 * time.Millisecond)

	seen := map[string]bool{}
	for _, n := range slices.Concat(r.Netlink.Names, r.ProcNetDev, r.SysClassNet) {
		seen[n] = true
	}
	if len(r.Netlink.Names) == 0 && len(r.ProcNetDev) == 0 {
		t.Errorf("the probe found no interface at all (netlink: %s); want lo", r.Netlink.errno)
	}
	for n := range seen {
		if n != "lo" {
			t.Errorf("interface %s is visible (netlink %v, /proc/net/dev %v, /sys/class/net %v), want only lo", n, r.Netlink.Names, r.ProcNetDev, r.SysClassNet)
		}
	}
	for _, a := range r.Addresses.Addrs {
		if !strings.HasPrefix(a, "127.") && !strings.HasPrefix(a, "::1/") {
			t.Errorf("address %s is configured, want loopback addresses only", a)
		}
	}
	if len(r.Connect) != 1 {
		t.Fatalf("got %d connect results, want 1", len(r.Connect))
	}
	t.Logf("connect to the host's %s from the sandbox: %s", addr, r.Connect[0].Result)
	if r.Connect[0].Result == "connected" {
		t.Errorf("connect to the host's %s: got connected, want it to fail", addr)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host listener on %s accepted %d connections during the run, want 0", addr, n)
	}
	// The host kernel's defaults, which Docker changes for its
	// containers: ping sockets for no group (the kernel's ICMP socket code
	// stays out of reach), ports below 1024 for privileged processes only.
	// gVisor allows both, in its own network stack: nothing of the host
	// kernel is behind them there.
	if s.caps.Tier == sandbox.TierGVisor {
		t.Logf("gVisor's network stack: ICMP socket %s, bind to port 80 %s", r.PingSocket, r.LowPort)
		return
	}
	if !r.PingSocket.is(syscall.EACCES) {
		t.Errorf("socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP): got %s, want EACCES (net.ipv4.ping_group_range \"1 0\")", r.PingSocket)
	}
	if !r.LowPort.is(syscall.EACCES) {
		t.Errorf("bind to 127.0.0.1:80: got %s, want EACCES (net.ipv4.ip_unprivileged_port_start 1024)", r.LowPort)
	}
}

func (s *suite) hostEnvironment(t *testing.T) {
	canary := "stockade-canary-" + randHex(16)
	t.Setenv("STOCKADE_CONFORMANCE_CANARY", canary)
	b := s.start(t, sandbox.Limits{})
	var r struct {
		Environ    []string `json:"environ"`
		Hits       []string `json:"hits"`
		Scanned    int      `json:"scanned"`
		Unreadable []string `json:"unreadable"`
	}
	// The probe gets the canary hex-encoded so that its own command line
	// does not contain it.
	b.report(t, &r, "env", hex.EncodeToString([]byte(canary)))
	t.Logf("scanned the environment and %d /proc files; unreadable: %v", r.Scanned, r.Unreadable)
	if len(r.Hits) > 0 {
		t.Errorf("the host's canary variable is visible in the sandbox at %v, want nowhere", r.Hits)
	}
	if r.Scanned == 0 {
		t.Errorf("the probe could read no /proc/*/environ or cmdline, want at least its own")
	}
}

type procInfo struct {
	PID     int    `json:"pid"`
	PPID    int    `json:"ppid"`
	UID     int    `json:"uid"`
	Comm    string `json:"comm"`
	Cmdline string `json:"cmdline"`
}

func (s *suite) hostPIDs(t *testing.T) {
	b := s.start(t, sandbox.Limits{})
	var r struct {
		Self  int        `json:"self"`
		Procs []procInfo `json:"procs"`
	}
	b.report(t, &r, "pids")
	t.Logf("visible processes: %+v", r.Procs)
	byPID := map[int]procInfo{}
	for _, p := range r.Procs {
		byPID[p.PID] = p
	}
	if _, ok := byPID[r.Self]; !ok {
		t.Fatalf("the probe (pid %d) does not see itself in /proc", r.Self)
	}
	// Only the probe and its ancestors (the guest) may be visible.
	lineage := map[int]bool{}
	for pid := r.Self; pid > 0 && !lineage[pid]; pid = byPID[pid].PPID {
		lineage[pid] = true
	}
	hostComm, _ := os.ReadFile("/proc/self/comm")
	for _, p := range r.Procs {
		if p.PID >= 50 {
			t.Errorf("pid %d (%s) is visible; want only the small pids of a new pid namespace", p.PID, p.Comm)
		}
		if !lineage[p.PID] {
			t.Errorf("process %d (%s: %s) is visible; want only the probe and its ancestors", p.PID, p.Comm, p.Cmdline)
		}
		if p.PID == os.Getpid() && p.Comm == strings.TrimSpace(string(hostComm)) {
			t.Errorf("the test process itself (pid %d, %s) is visible in the sandbox", p.PID, p.Comm)
		}
	}
}

// guestSignals checks that the program, which runs with the guest's uid,
// can neither end nor stop the guest with a signal (but the synchronous
// faults, which crash it on purpose: a denial of service of the attacker's
// own box). Linux drops such signals to PID 1 unless it has a handler;
// gVisor delivers them, and the guest's own dispositions are the defence.
func (s *suite) guestSignals(t *testing.T) {
	b := s.start(t, sandbox.Limits{})
	var r struct {
		Parent  int     `json:"parent"`
		Sent    []int   `json:"sent"`
		Refused []errno `json:"refused"`
	}
	// A guest that died of a signal fails the Exec; one that stopped
	// never answers, and the Exec times out.
	res := b.run(t, sandbox.ExecRequest{Timeout: 20 * time.Second}, "killparent")
	decode(t, res, &r, "killparent")
	if r.Parent != 1 {
		t.Errorf("the probe's parent is pid %d, want the guest as pid 1", r.Parent)
	}
	// SIGKILL, SIGSTOP and 7 synchronous faults are not sent.
	if len(r.Sent) != 64-9 || len(r.Refused) > 0 {
		t.Errorf("sent %d signals to the guest (%v), refused %v; want all 55", len(r.Sent), r.Sent, r.Refused)
	}
	if s.caps.Sessions {
		if res := b.run(t, sandbox.ExecRequest{}, "exit", "0"); res.Status != sandbox.StatusSucceeded {
			t.Errorf("after the signals, the next exec: got status %s, want %s", res.Status, sandbox.StatusSucceeded)
		}
	}
}

// ---------------------------------------------------------------------------
// System calls.

// refusedSyscalls are the probe's attempts that the profile must refuse.
// Without the profile, each succeeds for an unprivileged process on a
// typical kernel (except those also gated by capabilities: mount, setns,
// fsopen, unshare(CLONE_NEWNS|CLONE_NEWNET), socket(AF_PACKET), bpf).
var refusedSyscalls = []string{
	"io_uring_setup", "userfaultfd", "bpf", "perf_event_open",
	"keyctl", "add_key", "request_key",
	"ptrace_traceme", "ptrace_seize_pid1", "ptrace_seize_child", "process_vm_readv",
	"unshare_newuser", "unshare_newns", "unshare_newnet", "clone_newuser", "setns", "clone3", "clone3_newuser",
	"mount", "fsopen",
	"socket_af_alg", "socket_af_packet", "socket_af_vsock",
	"ioctl_tiocsti", "ioctl_tiocsti_high_bits",
}

func (s *suite) syscalls(t *testing.T) {
	b := s.start(t, sandbox.Limits{})
	var r struct {
		Results []struct {
			errno
			Name string `json:"name"`
		} `json:"results"`
	}
	b.report(t, &r, "syscalls")
	got := map[string]errno{}
	var summary []string
	for _, x := range r.Results {
		got[x.Name] = x.errno
		summary = append(summary, x.Name+"="+x.errno.String())
	}
	t.Logf("tier %s: %s", s.caps.Tier, strings.Join(summary, " "))
	for _, name := range refusedSyscalls {
		t.Run(name, func(t *testing.T) {
			e, ok := got[name]
			switch {
			case !ok:
				t.Fatalf("the probe did not report %s", name)
			case e.Errno < 0:
				t.Fatalf("%s: %s", name, e)
			case strings.HasPrefix(name, "clone3"):
				// On every tier clone3 must be ENOSYS: glibc creates
				// threads with clone3 and falls back to clone only on
				// ENOSYS (EPERM breaks pthread_create), and clone's flags
				// are what the profile can check. On the host kernel an
				// errno rule says so; under gVisor, which answers EPERM
				// for every errno rule of the OCI profile, a trace rule
				// with no tracer does — otherwise the Sentry's clone3
				// would create namespaces.
				if !e.is(syscall.ENOSYS) {
					t.Errorf("%s: got %s, want ENOSYS", name, e)
				}
				return
			case e.Errno == 0:
				t.Fatalf("%s: got success, want refused", name)
			}
			if !s.sharedKernel() {
				// gVisor refuses with the profile's EPERM or with its
				// own answer (ENOSYS for what the Sentry does not
				// implement, EAFNOSUPPORT for unknown socket families):
				// either way the host kernel never sees the call.
				return
			}
			// On the shared kernel the seccomp filter must be what
			// refuses: EPERM. Any other errno means the call reached
			// the kernel.
			if !e.is(syscall.EPERM) {
				t.Errorf("%s: got %s, want EPERM from the seccomp filter", name, e)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// Resource limits.

func (s *suite) forkBomb(t *testing.T) {
	b := s.start(t, sandbox.Limits{Pids: pidsLimit})

	// While the bomb runs, measure how late a 10 ms timer fires on the host.
	stop := make(chan struct{})
	var stopOnce sync.Once
	halt := func() { stopOnce.Do(func() { close(stop) }) }
	t.Cleanup(halt)
	worst := make(chan time.Duration, 1)
	go func() {
		var w time.Duration
		for {
			select {
			case <-stop:
				worst <- w
				return
			default:
			}
			t0 := time.Now()
			time.Sleep(10 * time.Millisecond)
			_ = os.Getpid()
			w = max(w, time.Since(t0))
		}
	}()
	res := b.run(t, sandbox.ExecRequest{Timeout: time.Minute}, "forkbomb", "1000", "3000")
	halt()
	w := <-worst
	t.Logf("host: a 10ms sleep took at most %v while the fork bomb ran", w)
	if w > 5*time.Second {
		t.Errorf("host: a 10ms sleep took %v during the fork bomb, want under 5s", w)
	}
	var r struct {
		errno
		Forked         int   `json:"forked"`
		LimitReachedMs int64 `json:"limit_reached_ms"`
	}
	decode(t, res, &r, "forkbomb")
	t.Logf("fork bomb: %d children, then %s after %d ms", r.Forked, r.errno, r.LimitReachedMs)
	if r.Forked >= pidsLimit {
		t.Errorf("fork bomb: got %d children, want fewer than the pids limit %d", r.Forked, pidsLimit)
	}
	if !r.is(syscall.EAGAIN) {
		t.Errorf("fork bomb: fork failed with %s, want EAGAIN (the pids limit)", r.errno)
	}
}

func (s *suite) oom(t *testing.T) {
	b := s.start(t, sandbox.Limits{Memory: memLimit})
	res := b.run(t, sandbox.ExecRequest{Timeout: time.Minute}, "alloc", "1024")
	if res.Status != sandbox.StatusOOMKilled {
		t.Errorf("allocating 1 GiB under a %d MiB limit: got status %s (exit code %d, signal %d), want %s; stderr: %q",
			memLimit>>20, res.Status, res.ExitCode, res.Signal, sandbox.StatusOOMKilled, tail(res.Stderr))
	}
	t.Logf("peak memory %d MiB", res.PeakMemory>>20)
}

func (s *suite) timeout(t *testing.T) {
	for _, args := range [][]string{{"spin"}, {"sleep", "60"}} {
		t.Run(args[0], func(t *testing.T) {
			const limit = 2 * time.Second
			b := s.start(t, sandbox.Limits{})
			start := time.Now()
			res := b.run(t, sandbox.ExecRequest{Timeout: limit}, args...)
			elapsed := time.Since(start)
			if res.Status != sandbox.StatusTimedOut {
				t.Errorf("got status %s (exit code %d), want %s", res.Status, res.ExitCode, sandbox.StatusTimedOut)
			}
			if !bytes.Contains(res.Stdout, []byte("started\n")) {
				t.Errorf("got stdout %q, want the output printed before the timeout (started)", tail(res.Stdout))
			}
			if res.Duration < limit {
				t.Errorf("got Duration %v, want at least the timeout %v", res.Duration, limit)
			}
			if elapsed > limit+10*time.Second {
				t.Errorf("Exec returned after %v, want soon after the timeout %v", elapsed, limit)
			}
			if s.caps.Sessions {
				// The sandbox was killed: it cannot run anything more.
				_, err := b.exec(t.Context(), sandbox.ExecRequest{}, "exit", "0")
				if !errdefs.IsFailedPrecondition(err) {
					t.Errorf("Exec after a timeout: got error %v, want ErrFailedPrecondition", err)
				}
			}
		})
	}
}

// hostProcesses lists host processes (other than this one) whose command
// line contains s.
func hostProcesses(s string) []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(s)) {
			out = append(out, e.Name()+": "+strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " ")))
		}
	}
	return out
}

func (s *suite) daemon(t *testing.T) {
	type daemonReport struct {
		PID     int    `json:"pid"`
		Alive   bool   `json:"alive"`
		Cmdline string `json:"cmdline"`
	}
	check := func(t *testing.T, r daemonReport, marker string) {
		t.Helper()
		if r.PID <= 0 || !r.Alive || !strings.Contains(r.Cmdline, marker) {
			t.Fatalf("the probe could not start its daemon: got pid %d alive %t cmdline %q", r.PID, r.Alive, r.Cmdline)
		}
	}

	// The daemon outlives the program that started it; the sandbox is
	// destroyed after the Exec.
	t.Run("AfterExec", func(t *testing.T) {
		marker := "stockade-daemon-" + randHex(8)
		b := s.start(t, sandbox.Limits{})
		var r daemonReport
		b.report(t, &r, "daemon", marker)
		check(t, r, marker)
		t.Logf("daemon pid %d in the sandbox; host processes with its marker after the Exec: %v", r.PID, hostProcesses(marker))
		b.destroy(t)
		if left := hostProcesses(marker); len(left) > 0 {
			t.Errorf("after Destroy the daemon still runs on the host: %v", left)
		}
	})

	// The sandbox is destroyed while the program that started the daemon
	// still runs, so the daemon is certainly alive when Destroy is called.
	t.Run("DestroyWhileRunning", func(t *testing.T) {
		marker := "stockade-daemon-" + randHex(8)
		b := s.start(t, sandbox.Limits{})
		var mu sync.Mutex
		var out []byte
		started := make(chan struct{})
		var once sync.Once
		type outcome struct {
			res *sandbox.Result
			err error
		}
		done := make(chan outcome, 1)
		go func() {
			res, err := b.exec(t.Context(), sandbox.ExecRequest{
				Timeout: 2 * time.Minute,
				OnOutput: func(st sandbox.Stream, p []byte) {
					mu.Lock()
					defer mu.Unlock()
					if st == sandbox.Stdout {
						out = append(out, p...)
						if bytes.Contains(out, []byte("started\n")) {
							once.Do(func() { close(started) })
						}
					}
				},
			}, "daemon", marker, "120")
			done <- outcome{res, err}
		}()
		select {
		case <-started:
		case o := <-done:
			t.Fatalf("the probe ended before starting its daemon: %+v, %v", o.res, o.err)
		case <-time.After(time.Minute):
			t.Fatal("the probe did not start its daemon within a minute")
		}
		mu.Lock()
		var r daemonReport
		line, _, _ := bytes.Cut(out, []byte("\n"))
		err := json.Unmarshal(line, &r)
		mu.Unlock()
		if err != nil {
			t.Fatalf("decoding the daemon report %q: %v", line, err)
		}
		check(t, r, marker)
		if s.sharedKernel() {
			// Here the daemon is a host process: the check below
			// proves something only if it is visible now.
			if seen := hostProcesses(marker); len(seen) == 0 {
				t.Errorf("the running daemon is not visible on the host, want it found by its marker %s", marker)
			}
		}
		b.destroy(t)
		select {
		case o := <-done:
			if o.err == nil {
				t.Logf("the Exec interrupted by Destroy ended with status %s", o.res.Status)
			} else {
				t.Logf("the Exec interrupted by Destroy returned %v", o.err)
			}
		case <-time.After(time.Minute):
			t.Errorf("Exec did not return within a minute of Destroy")
		}
		if left := hostProcesses(marker); len(left) > 0 {
			t.Errorf("after Destroy the daemon still runs on the host: %v", left)
		}
	})
}

func (s *suite) outputFlood(t *testing.T) {
	b := s.start(t, sandbox.Limits{OutputCap: outputCap})
	res := b.run(t, sandbox.ExecRequest{}, "flood", strconv.Itoa(3*outputCap), "both")
	if res.Status != sandbox.StatusSucceeded {
		t.Errorf("got status %s (exit code %d), want %s: the output beyond the cap is dropped, not fatal", res.Status, res.ExitCode, sandbox.StatusSucceeded)
	}
	for _, o := range []struct {
		name      string
		out       []byte
		truncated bool
	}{{"stdout", res.Stdout, res.StdoutTruncated}, {"stderr", res.Stderr, res.StderrTruncated}} {
		if len(o.out) != outputCap || !o.truncated {
			t.Errorf("%s: got %d bytes, truncated %t; want %d bytes, truncated", o.name, len(o.out), o.truncated, outputCap)
		}
		if len(bytes.Trim(o.out, "x")) != 0 {
			t.Errorf("%s: got bytes other than the probe's output", o.name)
		}
	}
}

// ---------------------------------------------------------------------------
// Isolation between sandboxes.

func (s *suite) concurrentIsolation(t *testing.T) {
	marker := "markerA-" + randHex(4)
	a := s.start(t, sandbox.Limits{})
	b := s.start(t, sandbox.Limits{})

	// A writes /tmp/<marker> and sleeps; B looks while A runs.
	var mu sync.Mutex
	var outA []byte
	started := make(chan struct{})
	var once sync.Once
	type outcome struct {
		res *sandbox.Result
		err error
	}
	doneA := make(chan outcome, 1)
	go func() {
		res, err := a.exec(t.Context(), sandbox.ExecRequest{
			Timeout: time.Minute,
			OnOutput: func(st sandbox.Stream, p []byte) {
				mu.Lock()
				defer mu.Unlock()
				if st == sandbox.Stdout {
					outA = append(outA, p...)
					if bytes.Contains(outA, []byte("started\n")) {
						once.Do(func() { close(started) })
					}
				}
			},
		}, "mark", "/tmp/"+marker, "5")
		doneA <- outcome{res, err}
	}()
	select {
	case <-started:
	case o := <-doneA:
		t.Fatalf("sandbox A ended before it started: %+v, %v", o.res, o.err)
	case <-time.After(time.Minute):
		t.Fatal("sandbox A did not start within a minute")
	}

	var r struct {
		Tmp   []string   `json:"tmp"`
		Procs []procInfo `json:"procs"`
	}
	b.report(t, &r, "seeothers")
	t.Logf("sandbox B sees /tmp %v and processes %+v", r.Tmp, r.Procs)
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
	var rd errno
	decode(t, a.run(t, sandbox.ExecRequest{}, "readfile", "/tmp/markerB"), &rd, "readfile")
	if !rd.is(syscall.ENOENT) {
		t.Errorf("sandbox A reading B's /tmp/markerB: got %s, want ENOENT", rd)
	}
}

func (s *suite) noPersistence(t *testing.T) {
	content := "persist-" + randHex(8)
	paths := []string{"/tmp/persist", "/dev/shm/persist"}
	first := s.start(t, sandbox.Limits{})
	for _, p := range paths {
		var w errno
		decode(t, first.run(t, sandbox.ExecRequest{}, "writefile", p, content), &w, "writefile")
		if w.Errno != 0 {
			t.Errorf("first sandbox writing %s: got %s, want success", p, w)
		}
	}
	first.destroy(t)

	second := s.start(t, sandbox.Limits{})
	for _, p := range paths {
		var r struct {
			errno
			Content string `json:"content"`
		}
		decode(t, second.run(t, sandbox.ExecRequest{}, "readfile", p), &r, "readfile")
		if !r.is(syscall.ENOENT) {
			t.Errorf("second sandbox reading %s: got %s %q, want ENOENT", p, r.errno, r.Content)
		}
	}
}
