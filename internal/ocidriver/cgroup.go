package ocidriver

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

const cgroupRoot = "/sys/fs/cgroup"

// cgroupV2 reports whether the host uses the unified hierarchy. A hybrid
// layout (v1 controllers with an empty cgroup2 mount under
// /sys/fs/cgroup/unified) counts as v1: that is where runc puts the limits.
func cgroupV2() bool {
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupRoot, &st); err != nil {
		return false
	}
	return st.Type == unix.CGROUP2_SUPER_MAGIC
}

// cgroup reads the memory accounting of one sandbox's cgroup. Missing files
// read as zero: the numbers are best effort and never fail an Exec.
type cgroup struct {
	v2   bool
	path string // relative to the hierarchy root, e.g. "/stockade/sbx-..."
}

func (c cgroup) memDir() string {
	if c.v2 {
		return filepath.Join(cgroupRoot, c.path)
	}
	return filepath.Join(cgroupRoot, "memory", c.path)
}

// oomKills is the number of processes the kernel OOM-killed in the cgroup.
func (c cgroup) oomKills() int64 {
	name := "memory.oom_control"
	if c.v2 {
		name = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(c.memDir(), name))
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
	name := "memory.max_usage_in_bytes"
	if c.v2 {
		name = "memory.peak"
	}
	b, err := os.ReadFile(filepath.Join(c.memDir(), name))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// resetPeak starts a new peak measurement. On v2 memory.peak is reset only
// for the writer's open file, so the peak there covers the whole sandbox.
func (c cgroup) resetPeak() {
	if !c.v2 {
		_ = os.WriteFile(filepath.Join(c.memDir(), "memory.max_usage_in_bytes"), []byte("0"), 0)
	}
}

// dirs lists every directory the cgroup may have on the host.
func (c cgroup) dirs() []string {
	if c.v2 {
		return []string{filepath.Join(cgroupRoot, c.path)}
	}
	entries, err := os.ReadDir(cgroupRoot)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		d := filepath.Join(cgroupRoot, e.Name(), c.path)
		if _, err := os.Stat(d); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// prepare creates the sandbox's memory cgroup and sets its memory limit
// (swap included, so no swap) before the runtime starts. runsc removes at exit
// only the cgroup directories it created, and leaves the resources of a
// directory it did not create alone; so a directory made here both enforces
// the limit on gVisor and outlives a sandbox that the kernel OOM-killed
// whole (gVisor's Sentry is the process that dies), whose oom_kill counter
// can then still be read. runc applies the same limit again.
func (c cgroup) prepare(memory int64) error {
	dir := c.memDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating cgroup %s: %w", dir, err)
	}
	v := []byte(strconv.FormatInt(memory, 10))
	files := []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"}
	if c.v2 {
		v, files = []byte(strconv.FormatInt(memory, 10)), []string{"memory.max"}
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f), v, 0); err != nil && !(f == "memory.memsw.limit_in_bytes" && errors.Is(err, os.ErrNotExist)) {
			return fmt.Errorf("setting %s: %w", f, err)
		}
	}
	if c.v2 {
		if err := os.WriteFile(filepath.Join(dir, "memory.swap.max"), []byte("0"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("setting memory.swap.max: %w", err)
		}
	}
	return nil
}

// remove deletes the cgroup's directories that the runtime left behind.
// Only empty cgroups can be removed; a cgroup with live processes stays and
// is reported by Leftovers.
func (c cgroup) remove() {
	for _, d := range c.dirs() {
		_ = unix.Rmdir(d)
	}
}
