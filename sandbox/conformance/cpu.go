package conformance

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/sandbox"
)

// cpuCap checks that a sandbox's processes together stay within the
// tier's CPU limit (Capabilities.DefaultCPU) as the host measures it, and
// that the Exec's reported CPU time is the host's: four processes busy
// for busyFor, the sandbox's cgroup read from the host over a window
// inside the busy time and over the whole Exec. The bound is an upper one:
// a host busy with other work gives the sandbox less, never more.
func (s *suite) cpuCap(t *testing.T) {
	const (
		procs   = 4
		busyFor = 8 * time.Second
		settle  = time.Second     // after "started", before the window
		window  = 5 * time.Second // within busyFor
		// slack is the most the host may count over the limit: CFS
		// hands out the quota in slices, and the window's reads are not
		// at period boundaries.
		slack = 1.05
		// agree is how far the reported CPU time may be from the
		// cgroup's over the Exec: the guest, which the cgroup counts
		// too, reads the program's output, and on a shared kernel the
		// host's count starts with the busy processes, after the
		// probe's start.
		agree      = 0.10
		agreeFloor = 250 * time.Millisecond
	)
	limit := s.caps.DefaultCPU
	if limit <= 0 {
		t.Fatalf("tier %s declares no CPU limit (Capabilities.DefaultCPU %v)", s.caps.Tier, limit)
	}
	b := s.start(t, sandbox.Limits{})
	marker := "stockade-busy-" + randHex(8)

	// The host's count starts before the Exec where the sandbox's cgroup
	// can be found then (through its kernel's host process); on a shared
	// kernel it is found through the busy processes, once they run, and
	// starts then.
	var usage func() time.Duration
	var begun time.Duration
	if !s.sharedKernel() {
		usage = s.sandboxCPU(t, b, "")
		begun = usage()
	}
	_, done := b.startBackground(t, busyFor+time.Minute, "the busy processes", "busy", strconv.Itoa(procs), strconv.Itoa(int(busyFor/time.Second)), marker)
	if usage == nil {
		usage = s.sandboxCPU(t, b, marker)
		begun = usage()
	}
	time.Sleep(settle)
	u0, t0 := usage(), time.Now()
	time.Sleep(window)
	u1, t1 := usage(), time.Now()
	host := float64(u1-u0) / float64(t1.Sub(t0))
	t.Logf("the host counted %.3f CPUs for %d busy processes over %s (limit %v)", host, procs, t1.Sub(t0).Round(time.Millisecond), limit)
	if host > slack*limit {
		t.Errorf("%d busy processes: the host counted %.3f CPUs over %s, want at most %.2f (%.2fx the tier's limit of %v)",
			procs, host, t1.Sub(t0).Round(time.Millisecond), slack*limit, slack, limit)
	}

	var o execOutcome
	select {
	case o = <-done:
	case <-time.After(busyFor + 2*time.Minute):
		t.Fatal("the busy Exec did not end")
	}
	if o.err != nil || o.res.Status != sandbox.StatusSucceeded {
		t.Fatalf("the busy Exec: got %+v, %v; want it to succeed", o.res, o.err)
	}
	var r struct {
		Processes int   `json:"processes"`
		WallMS    int64 `json:"wall_ms"`
		CPUMS     int64 `json:"cpu_ms"`
	}
	decode(t, o.res, &r, "busy")
	res := o.res
	t.Logf("Exec: duration %s, CPU time %s; the sandbox's kernel counted %d ms of CPU over %d ms for its %d processes",
		res.Duration.Round(time.Millisecond), res.CPUTime.Round(time.Millisecond), r.CPUMS, r.WallMS, r.Processes)
	if got, most := res.CPUTime, time.Duration(slack*limit*float64(res.Duration)); got > most {
		t.Errorf("the Exec's CPU time: got %s over %s (%.3f CPUs), want at most %s (%.2fx the tier's limit of %v)",
			got.Round(time.Millisecond), res.Duration.Round(time.Millisecond), float64(got)/float64(res.Duration), most.Round(time.Millisecond), slack, limit)
	}
	if !s.caps.Sessions {
		// The cgroup is gone with the sandbox: the Exec's count is not
		// the host's to read any more.
		return
	}
	whole := usage() - begun
	t.Logf("the host counted %s for the sandbox over the Exec", whole.Round(time.Millisecond))
	if diff := (res.CPUTime - whole).Abs(); diff > max(time.Duration(agree*float64(whole)), agreeFloor) {
		t.Errorf("the Exec's CPU time: got %s, want the %s the host counted for the sandbox over the Exec (within %.0f%% or %s)",
			res.CPUTime.Round(time.Millisecond), whole.Round(time.Millisecond), agree*100, agreeFloor)
	}
}

// sandboxCPU returns a reader of the CPU time that b's cgroup has used,
// as the host counts it (cpuacct.usage on a v1 or hybrid host, cpu.stat's
// usage_usec on v2). The cgroup is found from a host process of the
// sandbox: on a shared kernel one whose argv has marker, otherwise the
// process that runs the sandbox's kernel (Harness.Kernel), which marker
// need not name.
func (s *suite) sandboxCPU(t *testing.T, b *box, marker string) func() time.Duration {
	t.Helper()
	var pid int
	switch {
	case !s.sharedKernel():
		if s.h.Kernel == nil {
			t.Fatalf("tier %s runs the sandbox's processes in a kernel of its own: the harness must give Kernel for the host to see them", s.caps.Tier)
		}
		k, err := s.h.Kernel(t.Context(), b.sb.ID())
		if err != nil {
			t.Fatalf("reading the sandbox's kernel: %v", err)
		}
		pid = k.HostPID
	default:
		pids := hostProcs(marker)
		if len(pids) == 0 {
			t.Fatalf("no host process has %s in its argv: the busy processes are not visible on the host", marker)
		}
		pid = pids[0]
	}
	file, read, err := cpuUsageFile(pid)
	if err != nil {
		t.Fatalf("finding the cgroup of the sandbox's host process %d: %v", pid, err)
	}
	t.Logf("the sandbox's CPU time, from the host: %s", file)
	return func() time.Duration {
		n, err := read()
		if err != nil {
			t.Fatalf("reading %s: %v", file, err)
		}
		return n
	}
}

// hostProcs lists the host processes with marker as an argument.
func hostProcs(marker string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && slices.Contains(strings.Split(string(b), "\x00"), marker) {
			out = append(out, pid)
		}
	}
	return out
}

// cpuUsageFile finds the file that counts the CPU time of pid's cgroup and
// returns it with its reader: the cpuacct hierarchy's cpuacct.usage where
// the host has one (v1, or a hybrid layout), else the unified hierarchy's
// cpu.stat.
func cpuUsageFile(pid int) (string, func() (time.Duration, error), error) {
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", nil, err
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", nil, err
	}
	var v1Path, v2Path string
	sc := bufio.NewScanner(bytes.NewReader(cg))
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2Path = parts[2]
		case slices.Contains(strings.Split(parts[1], ","), "cpuacct"):
			v1Path = parts[2]
		}
	}
	var v1Mount, v2Mount string
	sc = bufio.NewScanner(bytes.NewReader(mounts))
	for sc.Scan() {
		// ID parent major:minor root mount-point options ... - type source super-options
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		switch {
		case g[0] == "cgroup" && slices.Contains(strings.Split(g[2], ","), "cpuacct") && v1Mount == "":
			v1Mount = f[4]
		case g[0] == "cgroup2" && v2Mount == "":
			v2Mount = f[4]
		}
	}
	switch {
	case v1Path != "" && v1Mount != "":
		file := filepath.Join(v1Mount, v1Path, "cpuacct.usage")
		return file, func() (time.Duration, error) {
			b, err := os.ReadFile(file)
			if err != nil {
				return 0, err
			}
			n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			return time.Duration(n), err
		}, nil
	case v2Path != "" && v2Mount != "":
		file := filepath.Join(v2Mount, v2Path, "cpu.stat")
		return file, func() (time.Duration, error) {
			b, err := os.ReadFile(file)
			if err != nil {
				return 0, err
			}
			sc := bufio.NewScanner(bytes.NewReader(b))
			for sc.Scan() {
				if v, ok := strings.CutPrefix(sc.Text(), "usage_usec "); ok {
					n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					return time.Duration(n) * time.Microsecond, err
				}
			}
			return 0, fmt.Errorf("no usage_usec in %s", file)
		}, nil
	}
	return "", nil, fmt.Errorf("no cpuacct or unified cgroup of pid %d in\n%s", pid, cg)
}
