// Package conformance is the suite every sandbox.Driver must pass. It proves
// the security profile (sandbox/profile, whose facts it reads and does not
// restate) by attack: a probe program (./probe)
// is delivered into sandboxes like user code, tries what hostile code would
// try and reports what it could see and do, and the suite asserts on those
// reports from the host. A driver's test runs it:
//
//	func TestConformance(t *testing.T) {
//		d, err := runc.New(...)
//		...
//		conformance.Run(t, conformance.Harness{Driver: d, Image: img})
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
	"path"
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

	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/internal/probeexec"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

// Harness is what a driver's test gives the suite.
type Harness struct {
	Driver sandbox.Driver
	// Image is the `shell` runtime image (Debian minbase with busybox). The
	// probe is static, but it is unpacked with the image's /bin/busybox.
	Image sandbox.Image
	// Kernel reads the kernel of a running sandbox, for tiers whose
	// sandboxed processes are not host processes (gVisor's are tasks of
	// the Sentry): the suite needs it there to see them from the host
	// (see daemon). Nil on the shared-kernel tiers, whose processes the
	// suite finds on the host itself.
	Kernel func(ctx context.Context, id string) (SandboxKernel, error)
	// Restart returns a new driver value over the same state as Driver,
	// as a restarted daemon builds one: the suite re-attaches Driver's
	// detached sandboxes with it. Required when the driver declares
	// Reattach.
	Restart func() sandbox.Driver
}

// SandboxKernel is the kernel of a sandbox that has one of its own, as the
// host sees it.
type SandboxKernel struct {
	// HostPID is the host process that runs it (gVisor's Sentry): no task
	// of the sandbox outlives it.
	HostPID int
	// Tasks are the pids of its processes, as the sandbox numbers them.
	Tasks []int
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
// the driver's Leftovers (sandbox.Leftovers, which the suite needs) must
// report nothing for it.
func Run(t *testing.T, h Harness) {
	if h.Driver == nil {
		t.Fatal("conformance.Harness needs a Driver")
	}
	lo, ok := h.Driver.(sandbox.Leftovers)
	if !ok {
		t.Fatalf("driver %s does not implement sandbox.Leftovers, which the suite checks after every Destroy", h.Driver.Name())
	}
	s := &suite{h: h, caps: h.Driver.Capabilities(), p: profile.Default(), probe: probeGzip(t), leftovers: lo.Leftovers}
	t.Logf("driver %s, tier %s: %s", h.Driver.Name(), s.caps.Tier, s.caps.Boundary)
	for _, c := range []struct {
		name string
		fn   func(*suite, *testing.T)
	}{
		{"Abilities", (*suite).abilities},
		{"ExitCode", (*suite).exitCode},
		{"Stdin", (*suite).stdin},
		{"Environment", (*suite).environment},
		{"Sessions", (*suite).sessions},
		{"Execs", (*suite).execs},
		{"Kernels", (*suite).kernels},
		{"Files", (*suite).files},
		{"Reattach", (*suite).reattach},
		{"Deadline", (*suite).deadline},
		{"Bind", (*suite).bind},
		{"Snapshot", (*suite).snapshot},
		{"Credentials", (*suite).credentials},
		{"Filesystem", (*suite).filesystem},
		{"Network", (*suite).network},
		{"HostEnvironment", (*suite).hostEnvironment},
		{"HostPIDs", (*suite).hostPIDs},
		{"Descriptors", (*suite).descriptors},
		{"GuestSignals", (*suite).guestSignals},
		{"Syscalls", (*suite).syscalls},
		{"ForkBomb", (*suite).forkBomb},
		{"OOM", (*suite).oom},
		{"Timeout", (*suite).timeout},
		{"CPUCap", (*suite).cpuCap},
		{"Daemon", (*suite).daemon},
		{"OutputFlood", (*suite).outputFlood},
		{"ConcurrentIsolation", (*suite).concurrentIsolation},
		{"NoPersistence", (*suite).noPersistence},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(s, t) })
	}
}

type suite struct {
	h         Harness
	caps      sandbox.Capabilities
	leftovers func(id string) []string
	// p is the profile the suite asserts: Stockade's.
	p     profile.Profile
	probe []byte // gzip-compressed
}

// sharedKernel reports whether the driver declares that the sandboxed
// program talks to the host kernel directly. There the seccomp filter,
// read-only mounts and cgroups are the boundary, and the program's
// processes are host processes; otherwise (gVisor) the program talks to a
// kernel of the sandbox's own, whose processes the host sees through
// Harness.Kernel, and which presents a few facts of the profile otherwise
// (profile.Profile.Differences).
func (s *suite) sharedKernel() bool { return s.caps.SharedKernel }

// difference returns the profile's declared difference id of the suite's
// tier.
func (s *suite) difference(id string) (profile.Difference, bool) {
	return s.p.Difference(s.caps.Tier, id)
}

// expect asserts that the profile's fact holds (holds true), unless the tier
// declares difference id: then it asserts the declared fact instead (holds
// false), so that a difference that no longer holds is noticed. A check
// consults the declared differences and nothing else: none skips or
// relaxes an assertion for a tier on its own.
func (s *suite) expect(t *testing.T, id string, holds bool, format string, args ...any) {
	t.Helper()
	d, declared := s.difference(id)
	switch {
	case !declared && !holds:
		t.Errorf(format, args...)
	case declared && holds:
		t.Errorf("tier %s: the declared difference %q (%s) no longer holds: remove it from the profile's Differences (sandbox/profile)", d.Tier, d.ID, d.Fact)
	}
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
	if left := b.s.leftovers(id); len(left) > 0 {
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

func (s *suite) credentials(t *testing.T) {
	b := s.start(t, sandbox.Limits{})
	var r capsReport
	b.report(t, &r, "caps")
	t.Logf("caps report: status %v, seccomp %s, no_new_privs %s", r.Status, r.Seccomp.Value, r.NoNewPrivs.Value)
	// wantCaps is every capability set of the profile; Stockade's are
	// empty.
	wantCaps, err := s.p.CapabilityMask()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("Capabilities", func(t *testing.T) {
		for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
			v, ok := r.Status[k]
			if k == "CapAmb" {
				s.expect(t, "status-ambient", ok, "/proc/self/status has no %s line", k)
			} else if !ok {
				t.Errorf("/proc/self/status has no %s line", k)
			}
			if ok && v != wantCaps {
				t.Errorf("/proc/self/status %s: got %s, want %s", k, v, wantCaps)
			}
		}
		c := r.Capget
		if c.Errno != 0 {
			t.Errorf("capget: got %s, want success", c.errno)
		}
		for name, v := range map[string]string{"effective": c.Effective, "permitted": c.Permitted, "inheritable": c.Inheritable} {
			if v != wantCaps {
				t.Errorf("capget %s: got %s, want %s", name, v, wantCaps)
			}
		}
		for name, v := range map[string]valueReport{"bounding (PR_CAPBSET_READ)": r.Bounding, "ambient (PR_CAP_AMBIENT_IS_SET)": r.Ambient} {
			if strings.HasPrefix(name, "ambient") {
				s.expect(t, "status-ambient", !v.is(syscall.EINVAL), "%s: got EINVAL, want success", name)
				if _, declared := s.difference("status-ambient"); declared {
					continue
				}
			}
			if v.Errno != 0 {
				t.Errorf("%s: got %s, want success", name, v.errno)
			} else if string(v.Value) != `"`+wantCaps+`"` {
				t.Errorf("%s: got %s, want %s", name, v.Value, wantCaps)
			}
		}
		if r.CapsChecked < 32 {
			t.Errorf("the bounding set was read for %d capabilities, want at least 32", r.CapsChecked)
		}
	})

	t.Run("NoNewPrivs", func(t *testing.T) {
		want := map[bool]string{true: "1", false: "0"}[s.p.NoNewPrivs]
		if r.NoNewPrivs.Errno != 0 || string(r.NoNewPrivs.Value) != want {
			t.Errorf("PR_GET_NO_NEW_PRIVS: got %s (%s), want %s", r.NoNewPrivs.Value, r.NoNewPrivs.errno, want)
		}
		v, ok := r.Status["NoNewPrivs"]
		s.expect(t, "status-nonewprivs", ok, "/proc/self/status has no NoNewPrivs line")
		if ok && v != want {
			t.Errorf("/proc/self/status NoNewPrivs: got %q, want %s", v, want)
		}
	})

	// The mode only; what the filter refuses is asserted by Syscalls. On
	// gVisor the Sentry applies the OCI profile (--oci-seccomp) and presents
	// the mode as Linux does.
	t.Run("Seccomp", func(t *testing.T) {
		if v := r.Status["Seccomp"]; v != "2" {
			t.Errorf("/proc/self/status Seccomp: got %q, want 2 (filter)", v)
		}
		if r.Seccomp.Errno != 0 || string(r.Seccomp.Value) != "2" {
			t.Errorf("PR_GET_SECCOMP: got %s (%s), want 2", r.Seccomp.Value, r.Seccomp.errno)
		}
	})

	t.Run("User", func(t *testing.T) {
		uid, gid := int(s.p.User.UID), int(s.p.User.GID)
		for name, v := range map[string][2]int{"uid": {r.UID, uid}, "euid": {r.EUID, uid}, "gid": {r.GID, gid}, "egid": {r.EGID, gid}} {
			if v[0] != v[1] {
				t.Errorf("%s: got %d, want %d", name, v[0], v[1])
			}
		}
		for _, g := range r.Groups {
			if g != gid {
				t.Errorf("supplementary groups: got %v, want none but %d", r.Groups, gid)
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
	ProcSys struct {
		Tried    int            `json:"tried"`
		Writable []string       `json:"writable"`
		Errnos   map[string]int `json:"errnos"`
	} `json:"proc_sys"`
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
		_, permissionsFirst := s.difference("root-eacces")
		eacces := 0
		for _, p := range []string{
			"/.stockade-probe", "/etc/.stockade-probe", "/usr/bin/.stockade-probe", "/.stockade/.stockade-probe",
			"/var/tmp/.stockade-probe", "/.stockade-probe-dir", "/usr/.stockade-probe-dir",
		} {
			// A read-only mount answers EROFS before file permissions
			// are checked; anything else means only the image's file
			// modes stand in the way.
			e := write(t, p)
			if e.is(syscall.EACCES) && permissionsFirst && p != "/var/tmp/.stockade-probe" {
				eacces++
				continue
			}
			if !e.is(syscall.EROFS) {
				t.Errorf("creating %s: got %s, want EROFS", p, e)
			}
		}
		s.expect(t, "root-eacces", eacces == 0, "creating files in root's directories of the image: got EACCES %d times, want EROFS", eacces)
		for _, p := range []string{s.p.Guest.Path, "/etc/passwd", "/bin/busybox"} {
			if e := write(t, p); e.Errno == 0 {
				t.Errorf("opening %s for writing: got success, want refused", p)
			}
		}
		for p, want := range map[string]bool{"/": s.p.ReadOnlyRoot, "/etc": s.p.ReadOnlyRoot, "/usr/bin": s.p.ReadOnlyRoot, s.p.Guest.Path: slices.Contains(s.p.Guest.Options, "ro")} {
			if ro, _, _, _ := statfs(t, p); ro != want {
				t.Errorf("statfs %s: got read-only %t, want %t", p, ro, want)
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
		tmp, _ := s.p.ScratchAt("/tmp")
		_, nosuid, nodev, size := statfs(t, "/tmp")
		if want := slices.Contains(tmp.Options, "nosuid"); nosuid != want {
			t.Errorf("statfs /tmp: got nosuid=%t, want %t", nosuid, want)
		}
		if slices.Contains(tmp.Options, "nodev") {
			s.expect(t, "tmp-nodev", nodev, "statfs /tmp: got nodev=false, want nodev")
		}
		// What nodev guards against, on every tier: a device node made
		// there. A FIFO, which needs no privilege, shows that mknod
		// reaches /tmp at all.
		if e := write(t, "/tmp/.stockade-probe-fifo"); e.Errno != 0 {
			t.Errorf("mknod of a FIFO in /tmp: got %s, want success", e)
		}
		if e := write(t, "/tmp/.stockade-probe-dev"); !e.is(syscall.EPERM) {
			t.Errorf("mknod of character device 1:3 in /tmp: got %s, want EPERM (no CAP_MKNOD)", e)
		}
		if size > tmpSize {
			t.Errorf("statfs /tmp: got size %d, want at most %d", size, tmpSize)
		}
	})

	t.Run("ProcAndSysReadOnly", func(t *testing.T) {
		if e := write(t, "/proc/self/comm"); e.Errno != 0 {
			t.Errorf("opening /proc/self/comm (the process's own) for writing: got %s, want success", e)
		}
		for _, p := range []string{"/proc/sysrq-trigger", "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/uevent_helper"} {
			if e := write(t, p); e.Errno == 0 {
				t.Errorf("opening %s for writing: got success, want refused", p)
			}
		}
		ps := r.ProcSys
		t.Logf("opened %d files below /proc/sys for writing: refused %v", ps.Tried, ps.Errnos)
		if ps.Tried < 20 {
			t.Errorf("the probe tried %d files below /proc/sys, want the whole tree (at least 20)", ps.Tried)
		}
		for _, p := range ps.Writable {
			t.Errorf("opening %s for writing: got success, want refused", p)
		}
		for _, m := range s.p.Mounts {
			if m.Path == "/sys" {
				if ro, _, _, _ := statfs(t, "/sys"); ro != slices.Contains(m.Options, "ro") {
					t.Errorf("statfs /sys: got read-only %t, want the profile's options %v", ro, m.Options)
				}
			}
		}
		if slices.Contains(s.p.ReadOnlyPaths, "/proc/sys") {
			ro, _, _, _ := statfs(t, "/proc/sys")
			s.expect(t, "proc-sys-rw", ro, "statfs /proc/sys: got read-write, want read-only (readonlyPaths)")
		}
	})

	t.Run("DevMinimal", func(t *testing.T) {
		dev := s.p.DevOn(s.caps.Tier)
		present := map[string]bool{}
		for _, d := range r.Dev {
			present[d.Name] = true
		}
		if !present["null"] || !present["zero"] {
			t.Fatalf("the probe's listing of /dev has no null or zero: %+v", r.Dev)
		}
		// The devices a tier declares it adds are absent elsewhere.
		var added []string
		for _, d := range s.p.Differences {
			if d.ID == "dev-fuse-tun" {
				for _, dev := range d.Devices {
					added = append(added, dev.Name)
				}
			}
		}
		s.expect(t, "dev-fuse-tun", !slices.ContainsFunc(added, func(n string) bool { return present[n] }), "/dev has %s", strings.Join(added, " or "))
		var names []string
		for _, d := range r.Dev {
			names = append(names, d.Name)
			top, _, _ := strings.Cut(d.Name, "/")
			if !slices.Contains(dev.Names, top) {
				t.Errorf("/dev/%s (%s) exists, want a minimal /dev", d.Name, d.Type)
			}
			switch {
			case d.Type == "block":
				t.Errorf("/dev/%s is a block device (%d:%d)", d.Name, d.Major, d.Minor)
			case d.Type == "char" && !dev.Allows(d.Major, d.Minor):
				t.Errorf("/dev/%s is character device %d:%d, not one of the minimal set", d.Name, d.Major, d.Minor)
			}
		}
		t.Logf("/dev: %s", strings.Join(names, " "))
	})

	t.Run("NoHostMounts", func(t *testing.T) {
		points := map[string]bool{}
		for _, m := range r.Mounts {
			points[m.MountPoint] = true
		}
		if !points["/"] || !points["/tmp"] {
			t.Fatalf("the probe's mount table has no / or /tmp: %+v", r.Mounts)
		}
		for _, m := range r.Mounts {
			if !allowedMount(s.p, s.caps.Tier, m.MountPoint, m.Options) {
				t.Errorf("unexpected mount at %s (%s from %s, %s): only the image, the guest and the profile's mounts may be mounted", m.MountPoint, m.FSType, m.Source, m.Options)
			}
		}
	})

	if d, ok := s.difference("docker-etc-files"); ok {
		t.Run("DockerEtcFiles", func(t *testing.T) {
			b := s.start(t, sandbox.Limits{})
			for _, f := range d.Files {
				var rd struct {
					errno
					Content string `json:"content"`
				}
				decode(t, b.run(t, sandbox.ExecRequest{}, "readfile", f.Path), &rd, "readfile")
				if !strings.Contains(rd.Content, f.Line) || strings.Contains(rd.Content, "search") {
					t.Errorf("%s: got %q, want the driver's fixed contents (containing %q) and nothing of the host's", f.Path, rd.Content, f.Line)
				}
			}
		})
	}
}

// allowedMount reports whether profile p accounts for a mount at point,
// mounted with options, on tier: the image's root, a scratch, the guest
// agent, the kernel file systems and what is below them, and the files the
// tier declares it mounts read-only. The suite's sandboxes have no data
// mounts and no egress.
func allowedMount(p profile.Profile, tier sandbox.Tier, point, options string) bool {
	if _, ok := p.ScratchAt(point); ok || point == "/" || point == p.Guest.Path {
		return true
	}
	for _, m := range p.Mounts {
		if under(point, m.Path) {
			return true
		}
	}
	d, _ := p.Difference(tier, "docker-etc-files")
	return hasOption(options, "ro") && slices.ContainsFunc(d.Files, func(f profile.File) bool { return f.Path == point })
}

// under reports whether p is dir or below it.
func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

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
		Connect         []connectResult `json:"connect"`
		LoopbackConnect connectResult   `json:"loopback_connect"`
		UDPSocket       errno           `json:"udp_socket"`
		PingSocket      errno           `json:"ping_socket"`
		Ping6Socket     errno           `json:"ping6_socket"`
		PingHighBits    errno           `json:"ping_socket_high_bits"`
		HighPort        errno           `json:"high_port"`
		LowPort         errno           `json:"low_port"`
	}
	addr := ln.Addr().String()
	b.report(t, &r, "net", addr)
	// Give a connection that did get through time to be accepted.
	time.Sleep(100 * time.Millisecond)

	seen := map[string]bool{}
	for _, n := range slices.Concat(r.Netlink.Names, r.ProcNetDev, r.SysClassNet) {
		seen[n] = true
	}
	if !slices.Contains(r.Netlink.Names, "lo") || !slices.Contains(r.ProcNetDev, "lo") {
		t.Errorf("the probe did not find lo (netlink %v: %s, /proc/net/dev %v); want it found both ways", r.Netlink.Names, r.Netlink.errno, r.ProcNetDev)
	}
	for n := range seen {
		if !slices.Contains(s.p.Network.Interfaces, n) {
			t.Errorf("interface %s is visible (netlink %v, /proc/net/dev %v, /sys/class/net %v), want only %s", n, r.Netlink.Names, r.ProcNetDev, r.SysClassNet, strings.Join(s.p.Network.Interfaces, ", "))
		}
	}
	if !slices.ContainsFunc(r.Addresses.Addrs, func(a string) bool { return strings.HasPrefix(a, "127.0.0.1/") }) {
		t.Errorf("the probe found addresses %v (%s), want 127.0.0.1 among them", r.Addresses.Addrs, r.Addresses.errno)
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
	// The control: the same connect to a listener of the sandbox's own.
	if r.LoopbackConnect.Result != "connected" {
		t.Errorf("connect to a listener on the sandbox's own loopback (%s): got %s, want connected", r.LoopbackConnect.Addr, r.LoopbackConnect.Result)
	}
	if r.Connect[0].Result == "connected" {
		t.Errorf("connect to the host's %s: got connected, want it to fail", addr)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host listener on %s accepted %d connections during the run, want 0", addr, n)
	}
	// The controls: a datagram socket and a bind to a free port work.
	if r.UDPSocket.Errno != 0 || r.HighPort.Errno != 0 {
		t.Errorf("socket(AF_INET, SOCK_DGRAM, 0): got %s; bind to 127.0.0.1:0: got %s; want success for both", r.UDPSocket, r.HighPort)
	}
	// ICMP sockets stay out of reach: on the host kernel the profile's
	// net.ipv4.ping_group_range, a range without the sandbox's group
	// (which Docker changes for its containers, and the docker driver
	// sets back), refuses them with EACCES; gVisor's netstack implements
	// no such setting, and the profile's filter refuses them there
	// (oci.UserSpaceKernel).
	pingRange, _ := s.p.Network.Sysctl("net.ipv4.ping_group_range")
	if !groupOutside(pingRange, s.p.User.GID) {
		t.Fatalf("the profile's net.ipv4.ping_group_range %q admits the sandbox's group %d; the suite asserts refused ICMP sockets only", pingRange, s.p.User.GID)
	}
	wantPing, why := syscall.EACCES, "net.ipv4.ping_group_range "+strconv.Quote(pingRange)
	if !s.sharedKernel() {
		wantPing, why = syscall.EPERM, "the profile's filter"
	}
	for name, e := range map[string]errno{
		"socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP)":                r.PingSocket,
		"socket(AF_INET6, SOCK_DGRAM, IPPROTO_ICMPV6)":             r.Ping6Socket,
		"socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP with high bits)": r.PingHighBits,
	} {
		if !e.is(wantPing) {
			t.Errorf("%s: got %s, want %s (%s)", name, e, unix.ErrnoName(wantPing), why)
		}
	}
	// Ports below the profile's net.ipv4.ip_unprivileged_port_start for
	// privileged processes only; the probe binds port 80.
	start, _ := s.p.Network.Sysctl("net.ipv4.ip_unprivileged_port_start")
	if n, err := strconv.Atoi(start); err != nil || n <= 80 {
		t.Fatalf("the profile's net.ipv4.ip_unprivileged_port_start %q does not keep port 80 privileged; the suite asserts a refused bind only", start)
	}
	why = "net.ipv4.ip_unprivileged_port_start " + start
	s.expect(t, "low-ports", r.LowPort.Errno != 0, "bind to 127.0.0.1:80: got success, want EACCES (%s)", why)
	if r.LowPort.Errno != 0 && !r.LowPort.is(syscall.EACCES) {
		t.Errorf("bind to 127.0.0.1:80: got %s, want EACCES (%s)", r.LowPort, why)
	}
}

// groupOutside reports whether gid lies outside a net.ipv4.ping_group_range
// value ("low high"; low above high is the empty range).
func groupOutside(rng string, gid uint32) bool {
	var lo, hi int64
	if _, err := fmt.Sscanf(rng, "%d %d", &lo, &hi); err != nil {
		return false
	}
	return int64(gid) < lo || int64(gid) > hi
}

// connectResult is the probe's report of one TCP connect.
type connectResult struct {
	Addr   string `json:"addr"`
	Result string `json:"result"`
	Errno  int    `json:"errno"`
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
	// The control: the same scan finds a canary that is in the
	// program's environment, in its environ and in its /proc file.
	b = s.start(t, sandbox.Limits{})
	var c struct {
		Hits []string `json:"hits"`
	}
	b.reportWith(t, sandbox.ExecRequest{Env: []string{"STOCKADE_CONTROL=" + canary}}, &c, "env", hex.EncodeToString([]byte(canary)))
	if !slices.Contains(c.Hits, "environ") || !slices.ContainsFunc(c.Hits, func(h string) bool { return strings.HasSuffix(h, "/environ") }) {
		t.Errorf("with the canary in the program's environment, the probe found it at %v; want its environ and its /proc/PID/environ", c.Hits)
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

// refusal is how the profile refuses a system call: an errno, or a kill by
// signal.
type refusal struct {
	errno  syscall.Errno
	signal syscall.Signal
}

func (r refusal) String() string {
	if r.signal != 0 {
		return "killed by signal " + strconv.Itoa(int(r.signal))
	}
	return unix.ErrnoName(r.errno)
}

func (r refusal) matches(e errno) bool {
	return e.Errno >= 0 && e.Signal == int(r.signal) && (r.signal != 0 || e.is(r.errno))
}

// policyEntry is what of the profile's seccomp policy a probe attempt
// tries; one field is set.
type policyEntry struct {
	syscall string // a system call the policy denies, or answers ENOSYS
	family  string // a socket family, refused unless the policy allows it
	ioctl   string // an ioctl request the policy may refuse
	base    bool   // what the base profile refuses (clone's namespace flags)
	foreign bool   // a system call of another architecture (amd64's x32)
}

// syscallAttempts are the probe's attempts at what the seccomp policy
// refuses, each with the entry of the policy it tries. Without the
// profile, each succeeds for an unprivileged process on a typical kernel
// (except those also gated by capabilities: mount, setns, fsopen,
// unshare(CLONE_NEWNS|CLONE_NEWNET), socket(AF_PACKET), bpf; there the
// filter's verdict is what shows the filter refuses them).
var syscallAttempts = map[string]policyEntry{
	"io_uring_setup": {syscall: "io_uring_setup"}, "userfaultfd": {syscall: "userfaultfd"},
	"bpf": {syscall: "bpf"}, "perf_event_open": {syscall: "perf_event_open"},
	"keyctl": {syscall: "keyctl"}, "add_key": {syscall: "add_key"}, "request_key": {syscall: "request_key"},
	"ptrace_traceme": {syscall: "ptrace"}, "ptrace_seize_pid1": {syscall: "ptrace"}, "ptrace_seize_child": {syscall: "ptrace"},
	"process_vm_readv": {syscall: "process_vm_readv"},
	"unshare_newuser":  {syscall: "unshare"}, "unshare_newns": {syscall: "unshare"}, "unshare_newnet": {syscall: "unshare"},
	"setns": {syscall: "setns"}, "mount": {syscall: "mount"}, "fsopen": {syscall: "fsopen"},
	"clone3": {syscall: "clone3"}, "clone3_newuser": {syscall: "clone3"},
	"clone_newuser": {base: true},
	"socket_af_alg": {family: "AF_ALG"}, "socket_af_packet": {family: "AF_PACKET"}, "socket_af_vsock": {family: "AF_VSOCK"},
	"ioctl_tiocsti": {ioctl: "TIOCSTI"}, "ioctl_tiocsti_high_bits": {ioctl: "TIOCSTI"},
	"x32_getpid": {foreign: true},
}

// refusedSyscalls returns the probe's attempts that policy refuses, with
// how it refuses them on every tier.
//
// Every errno rule answers EPERM, the profile's default action: under
// gVisor too, which turns every errno rule into EPERM. An ENOSYS entry
// (clone3) must answer ENOSYS: glibc creates threads with clone3 and falls
// back to clone only on ENOSYS (EPERM breaks pthread_create), and clone's
// flags are what the profile can check. On the host kernel an errno rule
// says so; under gVisor a trace rule with no tracer does (see
// oci.UserSpaceKernel). The x32 ABI (amd64 only) is an architecture a
// native-only policy leaves out, and its filter kills the caller.
func refusedSyscalls(policy profile.Seccomp, goarch string) map[string]refusal {
	eperm, enosys := refusal{errno: syscall.EPERM}, refusal{errno: syscall.ENOSYS}
	m := map[string]refusal{}
	for name, a := range syscallAttempts {
		switch {
		case a.syscall != "" && slices.ContainsFunc(policy.ENOSYS, func(r profile.Reasoned) bool { return r.Name == a.syscall }):
			m[name] = enosys
		case a.syscall != "" && slices.Contains(policy.Denied, a.syscall):
			m[name] = eperm
		case a.family != "" && !slices.ContainsFunc(policy.SocketFamilies, func(f profile.SocketFamily) bool { return f.Name == a.family }):
			m[name] = eperm
		case a.ioctl != "" && policy.RefusedIoctl.Name == a.ioctl, a.base:
			m[name] = eperm
		case a.foreign && policy.NativeOnly && goarch == "amd64":
			m[name] = refusal{signal: syscall.SIGSYS}
		}
	}
	return m
}

// syscalls asserts, for each system call the profile must refuse, both the
// answer to the probe's real attempt and the sandbox filter's verdict on
// the same call, read by the probe without executing it (a filter of its
// own stacked on the sandbox's answers the call with TRACE, which an errno
// or kill rule outranks). The verdict tells the filter's refusal from the
// kernel's own (EPERM for want of a capability), on every tier. The
// probe's controls show that the means work on the tier: a raw child's
// allowed call succeeds, the overlay turns an allowed call into ENOSYS,
// and the raw fork and an allowed socket family succeed.
func (s *suite) syscalls(t *testing.T) {
	b := s.start(t, sandbox.Limits{})
	type attempt struct {
		errno
		Name    string `json:"name"`
		Verdict errno  `json:"verdict"`
	}
	var r struct {
		Results  []attempt `json:"results"`
		Controls []attempt `json:"controls"`
	}
	b.report(t, &r, "syscalls")
	got := map[string]attempt{}
	var summary []string
	for _, x := range r.Results {
		got[x.Name] = x
		summary = append(summary, x.Name+"="+x.errno.String()+"/"+x.Verdict.String())
	}
	t.Logf("tier %s (attempt/verdict): %s", s.caps.Tier, strings.Join(summary, " "))

	t.Run("Controls", func(t *testing.T) {
		want := map[string]refusal{
			"raw_child_getpid": {}, "verdict_getpid": {errno: syscall.ENOSYS},
			"raw_clone": {}, "socket_af_inet": {},
		}
		seen := 0
		for _, c := range r.Controls {
			w, ok := want[c.Name]
			if !ok {
				continue
			}
			seen++
			if !w.matches(c.errno) {
				t.Errorf("control %s: got %s, want %s", c.Name, c.errno, w)
			}
		}
		if seen != len(want) {
			t.Errorf("the probe reported %d of the %d controls %v", seen, len(want), r.Controls)
		}
	})
	for name, want := range refusedSyscalls(s.p.Seccomp, runtime.GOARCH) {
		if d, ok := s.difference("x32-abi"); ok && name == "x32_getpid" {
			// See the declared difference.
			want = refusal{errno: syscall.EPERM}
			t.Logf("tier %s: %s", d.Tier, d.Fact)
		}
		t.Run(name, func(t *testing.T) {
			a, ok := got[name]
			if !ok {
				t.Fatalf("the probe did not report %s", name)
			}
			if !want.matches(a.errno) {
				t.Errorf("%s: got %s, want %s", name, a.errno, want)
			}
			if !want.matches(a.Verdict) {
				t.Errorf("%s: the filter's verdict: got %s, want %s", name, a.Verdict, want)
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
				// The timeout ended the exec, not the sandbox: the next
				// one runs.
				res, err := b.exec(t.Context(), sandbox.ExecRequest{}, "exit", "0")
				if err != nil || res.Status != sandbox.StatusSucceeded {
					t.Errorf("Exec after a timeout: got %+v, %v; want it to run and succeed", res, err)
				}
			}
		})
	}
}

// hostDaemons lists the host processes whose command line is the probe's
// daemon with marker ("probe sleep 300 MARKER").
func hostDaemons(marker string) []string {
	want := []byte("sleep\x00300\x00" + marker + "\x00")
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, want) {
			out = append(out, e.Name()+": "+strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " ")))
		}
	}
	return out
}

// daemonReport is the probe's report of the daemon it started.
type daemonReport struct {
	PID     int    `json:"pid"`
	Alive   bool   `json:"alive"`
	Cmdline string `json:"cmdline"`
	// Seen are the pids the probe's own scan of /proc finds with the
	// marker: the control for findproc.
	Seen []int `json:"seen"`
}

// heldDaemon is a daemon the probe started in an Exec that still runs.
type heldDaemon struct {
	marker string
	report daemonReport
	done   <-chan execOutcome // the Exec's outcome, once
	// kernel is the tier's kernel of the sandbox, on tiers with a
	// Harness.Kernel, read while the daemon runs.
	kernel SandboxKernel
}

// holdDaemon starts the probe's daemon in b with an Exec that stays
// running for hold, and proves that the daemon is visible where the checks
// after it look: to the probe's own scan of /proc in the sandbox, and on
// the host (as a host process on a shared kernel, as a task of the
// sandbox's kernel otherwise).
func (s *suite) holdDaemon(t *testing.T, b *box, hold time.Duration) *heldDaemon {
	t.Helper()
	d := &heldDaemon{marker: "stockade-daemon-" + randHex(8)}
	var out []byte
	out, d.done = b.startBackground(t, hold+time.Minute, "the daemon", "daemon", d.marker, strconv.Itoa(int(hold/time.Second)))
	line, _, _ := bytes.Cut(out, []byte("\n"))
	err := json.Unmarshal(line, &d.report)
	if err != nil {
		t.Fatalf("decoding the daemon report %q: %v", line, err)
	}
	r := d.report
	if r.PID <= 0 || !r.Alive || !strings.Contains(r.Cmdline, d.marker) {
		t.Fatalf("the probe could not start its daemon: got pid %d alive %t cmdline %q", r.PID, r.Alive, r.Cmdline)
	}
	if !slices.Equal(r.Seen, []int{r.PID}) {
		t.Fatalf("the probe's scan of /proc found %v with the marker, want the running daemon %d", r.Seen, r.PID)
	}
	if s.sharedKernel() {
		if seen := hostDaemons(d.marker); len(seen) == 0 {
			t.Fatalf("the running daemon is not visible on the host, want it found by its marker %s", d.marker)
		}
		return d
	}
	if s.h.Kernel == nil {
		t.Fatalf("tier %s runs the sandbox's processes in a kernel of its own: the harness must give Kernel for the host to see them", s.caps.Tier)
	}
	k, err := s.h.Kernel(t.Context(), b.sb.ID())
	if err != nil {
		t.Fatalf("reading the sandbox's kernel: %v", err)
	}
	if !slices.Contains(k.Tasks, r.PID) {
		t.Fatalf("the sandbox's kernel (host pid %d) lists tasks %v, want the running daemon %d among them", k.HostPID, k.Tasks, r.PID)
	}
	d.kernel = k
	return d
}

// wait waits for the Exec that started the daemon to end.
func (d *heldDaemon) wait(t *testing.T) execOutcome {
	t.Helper()
	select {
	case o := <-d.done:
		return o
	case <-time.After(2 * time.Minute):
		t.Fatal("the Exec holding the daemon did not end within 2 minutes")
		return execOutcome{}
	}
}

// daemonGone checks, after Destroy, that nothing of the daemon is left on the
// host: no host process with its marker on a shared kernel; otherwise the
// host process of the sandbox's kernel, which ran it, has exited. pidfd
// must have been opened on that process before Destroy.
func (s *suite) daemonGone(t *testing.T, d *heldDaemon, pidfd int) {
	t.Helper()
	if s.sharedKernel() {
		if left := hostDaemons(d.marker); len(left) > 0 {
			t.Errorf("after Destroy the daemon still runs on the host: %v", left)
		}
		return
	}
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	if err != nil {
		t.Fatalf("polling the pidfd of the sandbox's kernel: %v", err)
	}
	if n == 0 {
		t.Errorf("after Destroy the sandbox's kernel (host pid %d), which ran the daemon %d, still runs", d.kernel.HostPID, d.report.PID)
	}
}

// openKernel opens a pidfd on the host process of the sandbox's kernel, on
// tiers that have one, so that its exit can be told from a new process
// with its pid; -1 on a shared kernel.
func (s *suite) openKernel(t *testing.T, d *heldDaemon) int {
	t.Helper()
	if s.sharedKernel() {
		return -1
	}
	fd, err := unix.PidfdOpen(d.kernel.HostPID, 0)
	if err != nil {
		t.Fatalf("opening a pidfd on the sandbox's kernel (host pid %d): %v", d.kernel.HostPID, err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// daemon checks that a daemon, a process that leaves the program's process
// group and session, outlives neither the Exec that started it nor the
// sandbox. Each looks for the daemon only where the daemon was first seen
// alive (see holdDaemon).
func (s *suite) daemon(t *testing.T) {
	// The guest kills what the program left behind when it ends.
	t.Run("AfterExec", func(t *testing.T) {
		b := s.start(t, sandbox.Limits{})
		d := s.holdDaemon(t, b, 2*time.Second)
		if o := d.wait(t); o.err != nil || o.res.Status != sandbox.StatusSucceeded {
			t.Fatalf("the Exec holding the daemon: got %+v, %v; want it to succeed", o.res, o.err)
		}
		if s.caps.Sessions {
			var r struct {
				PIDs []int `json:"pids"`
			}
			b.report(t, &r, "findproc", d.marker)
			if len(r.PIDs) > 0 {
				t.Errorf("after the Exec that started it, the next Exec sees the daemon at %v (it was %d)", r.PIDs, d.report.PID)
			}
		}
		switch {
		case s.sharedKernel():
			if left := hostDaemons(d.marker); len(left) > 0 {
				t.Errorf("after the Exec that started it, the daemon still runs on the host: %v", left)
			}
		default:
			k, err := s.h.Kernel(t.Context(), b.sb.ID())
			if err != nil {
				t.Fatalf("reading the sandbox's kernel: %v", err)
			}
			if slices.Contains(k.Tasks, d.report.PID) {
				t.Errorf("after the Exec that started it, the sandbox's kernel still runs the daemon %d (tasks %v)", d.report.PID, k.Tasks)
			}
		}
		pidfd := s.openKernel(t, d)
		b.destroy(t)
		s.daemonGone(t, d, pidfd)
	})

	// The sandbox is destroyed while the program that started the daemon
	// still runs, so the daemon is certainly alive when Destroy is called.
	t.Run("DestroyWhileRunning", func(t *testing.T) {
		b := s.start(t, sandbox.Limits{})
		d := s.holdDaemon(t, b, 120*time.Second)
		pidfd := s.openKernel(t, d)
		b.destroy(t)
		o := d.wait(t)
		if o.err == nil && o.res.Status == sandbox.StatusSucceeded {
			t.Errorf("the Exec interrupted by Destroy: got status %s, want it cut short", o.res.Status)
		}
		s.daemonGone(t, d, pidfd)
	})
}

// descriptors checks that a program holds its stdin, stdout and stderr and
// no other descriptor of the host's: none of the guest's channel (which
// runc's sandboxes pass to the guest as 3 and 4, see guest.ChannelEnv), of
// the runtime or of the daemon. The only others allowed are the cgroup
// files Go's runtime opens for itself (the probe is a Go program). The
// control: an Exec with an exit notice gives the program a descriptor 3,
// and the listing must show it.
func (s *suite) descriptors(t *testing.T) {
	b := s.start(t, sandbox.Limits{})
	list := func(req sandbox.ExecRequest) map[int]string {
		var r struct {
			FDs []struct {
				FD     int    `json:"fd"`
				Target string `json:"target"`
			} `json:"fds"`
		}
		b.reportWith(t, req, &r, "fds")
		got := map[int]string{}
		for _, f := range r.FDs {
			got[f.FD] = f.Target
		}
		return got
	}
	if ctl := list(sandbox.ExecRequest{ExitNotice: true}); !strings.HasPrefix(ctl[3], "pipe:") {
		t.Fatalf("with an exit notice the probe lists %v, want its descriptor 3 as a pipe: the listing cannot see a descriptor beyond stdio", ctl)
	}
	got := list(sandbox.ExecRequest{})
	for fd := range 3 {
		if _, ok := got[fd]; !ok {
			t.Errorf("the program has no descriptor %d (it has %v)", fd, got)
		}
	}
	goRuntime := []string{"cpu.max", "cpu.cfs_quota_us", "cpu.cfs_period_us"}
	for fd, target := range got {
		if fd > 2 && !(strings.HasPrefix(target, "/sys/fs/cgroup/") && slices.Contains(goRuntime, path.Base(target))) {
			t.Errorf("the program holds descriptor %d (%s); want its stdio only", fd, target)
		}
	}
	t.Logf("descriptors: %v", got)
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
