package ocidriver

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/internal/sandboxkit"
)

// cgroupV2 reports whether the host uses the unified hierarchy. A hybrid
// layout (v1 controllers with an empty cgroup2 mount under
// /sys/fs/cgroup/unified) counts as v1: that is where runc puts the limits.
func cgroupV2() bool {
	var st unix.Statfs_t
	if err := unix.Statfs(sandboxkit.CgroupRoot, &st); err != nil {
		return false
	}
	return st.Type == unix.CGROUP2_SUPER_MAGIC
}

// cgroup is one sandbox's cgroup, which this driver creates before the
// runtime starts and removes after it ends.
type cgroup struct {
	sandboxkit.Cgroup
}

// prepare creates the sandbox's memory cgroup and sets its memory limit
// (swap included, so no swap) before the runtime starts. runsc removes at exit
// only the cgroup directories it created, and leaves the resources of a
// directory it did not create alone; so a directory made here both enforces
// the limit on gVisor and outlives a sandbox that the kernel OOM-killed
// whole (gVisor's Sentry is the process that dies), whose oom_kill counter
// can then still be read. runc applies the same limit again.
func (c cgroup) prepare(memory int64) error {
	dir := c.MemoryDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating cgroup %s: %w", dir, err)
	}
	v := []byte(strconv.FormatInt(memory, 10))
	files := []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"}
	if c.V2 {
		v, files = []byte(strconv.FormatInt(memory, 10)), []string{"memory.max"}
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f), v, 0); err != nil && !(f == "memory.memsw.limit_in_bytes" && errors.Is(err, os.ErrNotExist)) {
			return fmt.Errorf("setting %s: %w", f, err)
		}
	}
	if c.V2 {
		if err := os.WriteFile(filepath.Join(dir, "memory.swap.max"), []byte("0"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("setting memory.swap.max: %w", err)
		}
		return nil
	}
	// On v1 the CPU time is counted in a hierarchy of its own, which runsc
	// would remove with a Sentry the kernel OOM-killed, before the run's
	// CPU time is read: made here, it outlives the sandbox too. Only a
	// cpuacct hierarchy without the cpu controller: a cpu directory made
	// here would keep runsc from setting the sandbox's CPU quota.
	if cpu := c.CPUDir(); accountingOnly(filepath.Join(cmp.Or(c.Root, sandboxkit.CgroupRoot), "cpuacct")) {
		if err := os.MkdirAll(cpu, 0o755); err != nil {
			return fmt.Errorf("creating cgroup %s: %w", cpu, err)
		}
	}
	return nil
}

// remove deletes the cgroup's directories that the runtime left behind.
// Only an empty cgroup can be removed: the runtime has ended every process
// of the sandbox by now, but the kernel may still be tearing the last ones
// down, so a busy cgroup is tried again for a moment before it is reported.
func (c cgroup) remove() error {
	var errs []error
	for _, d := range c.Dirs() {
		err := unix.Rmdir(d)
		for try := 0; err == unix.EBUSY && try < 50; try++ {
			time.Sleep(10 * time.Millisecond)
			err = unix.Rmdir(d)
		}
		if err != nil && err != unix.ENOENT {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// accountingOnly reports whether the v1 hierarchy at dir (the cpuacct
// mount) is a directory of its own that does not carry the cpu
// controller (not "cpu,cpuacct", which hosts often mount together).
func accountingOnly(dir string) bool {
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return false
	}
	_, err = os.Stat(filepath.Join(dir, "cpu.cfs_quota_us"))
	return errors.Is(err, os.ErrNotExist)
}
