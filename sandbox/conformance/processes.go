package conformance

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/sandbox"
)

// The checks of what the program can see of the host (its environment
// and processes) and of what it leaves behind: the guest it cannot
// signal, daemons that must end with their Exec, descriptors it must not
// hold.

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
