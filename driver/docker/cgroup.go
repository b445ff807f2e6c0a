package docker

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

const cgroupRoot = "/sys/fs/cgroup"

// cgroup is the memory cgroup of one container as seen on this host, found
// from its PID 1 (see cgroupOf). The zero cgroup is "not visible here" (a
// remote engine): every number reads as zero and OOM kills are then known
// only from the container's state.
type cgroup struct {
	mem string // the memory controller's directory, "" when unknown
	v2  bool
	rel string // the path relative to each hierarchy's root
}

// cgroupOf finds the cgroup of the process pid, which must be the
// container cid's PID 1. When the engine is not on this host, or the pid is
// not the container's, it returns the zero cgroup.
func cgroupOf(pid int, cid string) cgroup {
	if pid <= 0 || cid == "" {
		return cgroup{}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return cgroup{}
	}
	var unified string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// hierarchy-ID:controller-list:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 || !strings.Contains(parts[2], cid) {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			unified = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				dir := filepath.Join(cgroupRoot, "memory", parts[2])
				if _, err := os.Stat(dir); err == nil {
					return cgroup{mem: dir, rel: parts[2]}
				}
			}
		}
	}
	if unified != "" {
		dir := filepath.Join(cgroupRoot, unified)
		if _, err := os.Stat(filepath.Join(dir, "memory.events")); err == nil {
			return cgroup{mem: dir, v2: true, rel: unified}
		}
	}
	return cgroup{}
}

// oomKills is the number of processes the kernel OOM-killed in the cgroup.
func (c cgroup) oomKills() int64 {
	if c.mem == "" {
		return 0
	}
	name := "memory.oom_control"
	if c.v2 {
		name = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(c.mem, name))
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// peak is the highest memory usage of the cgroup since the last resetPeak.
func (c cgroup) peak() int64 {
	if c.mem == "" {
		return 0
	}
	name := "memory.max_usage_in_bytes"
	if c.v2 {
		name = "memory.peak"
	}
	b, err := os.ReadFile(filepath.Join(c.mem, name))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// resetPeak starts a new peak measurement (cgroup v1 only; on v2 the peak
// covers the whole sandbox).
func (c cgroup) resetPeak() {
	if c.mem != "" && !c.v2 {
		_ = os.WriteFile(filepath.Join(c.mem, "memory.max_usage_in_bytes"), []byte("0"), 0)
	}
}

// dirs lists the cgroup's directories that exist on the host.
func (c cgroup) dirs() []string {
	if c.rel == "" {
		return nil
	}
	if c.v2 {
		if _, err := os.Stat(c.mem); err == nil {
			return []string{c.mem}
		}
		return nil
	}
	entries, err := os.ReadDir(cgroupRoot)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		d := filepath.Join(cgroupRoot, e.Name(), c.rel)
		if _, err := os.Stat(d); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// processesMentioning lists host processes whose command line contains s
// (the container's shim names the container's full ID).
func processesMentioning(s string) []string {
	if s == "" {
		return nil
	}
	entries, _ := os.ReadDir("/proc")
	var out []string
	self := strconv.Itoa(os.Getpid())
	for _, e := range entries {
		if e.Name() == self || e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(s)) {
			out = append(out, fmt.Sprintf("process %s: %s", e.Name(), strings.ReplaceAll(string(b), "\x00", " ")))
		}
	}
	return out
}
