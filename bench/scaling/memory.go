package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/stockade-sh/stockade/internal/ocidriver"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
)

// cgroupV2 reports whether the host uses the unified hierarchy, as the
// OCI drivers decide it: a hybrid layout (v1 controllers, an empty
// cgroup2 mount) is v1, where the drivers put the sandboxes' memory
// cgroups.
func cgroupV2() bool {
	var st unix.Statfs_t
	return unix.Statfs(sandboxkit.CgroupRoot, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// usageFiles names, for the hierarchy in use, the file of a memory
// cgroup's usage and the memory.stat key of its anonymous memory.
func usageFiles(v2 bool) (usage, anon string) {
	if v2 {
		return "memory.current", "anon"
	}
	return "memory.usage_in_bytes", "total_rss"
}

// cgroupMemory is one sandbox's memory cgroup: its usage (what its limit
// is enforced against: anonymous memory, page cache such as its tmpfs
// files, kernel memory) and the anonymous part of it.
type cgroupMemory struct {
	id          string
	usage, anon int64
}

// sandboxMemory reads the memory cgroup of every sandbox whose bundle is
// in the driver's state directory dir: each sandbox of the benchmark's
// daemon on that driver. Under gVisor a sandbox's cgroup holds its
// Sentry and its memory file (the sandbox's processes' memory).
func sandboxMemory(dir string, v2 bool) ([]cgroupMemory, error) {
	bundles, err := os.ReadDir(filepath.Join(dir, "bundles"))
	if err != nil {
		return nil, fmt.Errorf("listing the sandboxes: %w", err)
	}
	usageFile, anonKey := usageFiles(v2)
	var out []cgroupMemory
	for _, b := range bundles {
		cg := sandboxkit.Cgroup{V2: v2, Path: ocidriver.CgroupParent + "/" + b.Name()}
		usage, err := readInt(filepath.Join(cg.MemoryDir(), usageFile))
		if err != nil {
			return nil, fmt.Errorf("reading the memory cgroup of sandbox %s: %w", b.Name(), err)
		}
		stat, err := os.ReadFile(filepath.Join(cg.MemoryDir(), "memory.stat"))
		if err != nil {
			return nil, fmt.Errorf("reading the memory cgroup of sandbox %s: %w", b.Name(), err)
		}
		out = append(out, cgroupMemory{id: b.Name(), usage: usage, anon: field(stat, anonKey+" ", 1)})
	}
	return out, nil
}

// hostMemory is what the sessions hold on the host outside their
// sandboxes' cgroups: the supervisors (`stockade shim`, the processes
// running bin, the benchmark's own build of stockade), one a sandbox,
// and the runtime's processes that stay beside a running sandbox outside
// its cgroup (such as `runsc run`, which the shim starts and waits for):
// those whose command line names state, the benchmark's state
// directory. Each process counts its proportional set size
// (smaps_rollup's Pss: a page shared by k processes counts 1/k in each).
type hostMemory struct {
	pss             int64
	shims, runtimes int
}

func readHostMemory(bin, state string) (hostMemory, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return hostMemory{}, err
	}
	var m hostMemory
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		dir := filepath.Join("/proc", p.Name())
		exe, _ := os.Readlink(filepath.Join(dir, "exe"))
		shim := exe == bin
		if !shim {
			cmdline, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
			cgroups, _ := os.ReadFile(filepath.Join(dir, "cgroup"))
			if !bytes.Contains(cmdline, []byte(state+"/")) || inSandboxCgroup(cgroups) {
				continue
			}
		}
		b, err := os.ReadFile(filepath.Join(dir, "smaps_rollup"))
		if err != nil {
			continue // it ended meanwhile
		}
		m.pss += field(b, "Pss:", 1024)
		if shim {
			m.shims++
		} else {
			m.runtimes++
		}
	}
	return m, nil
}

// inSandboxCgroup says whether a process's /proc/PID/cgroup puts it in a
// sandbox's cgroup, whose memory the cgroup readings count already.
func inSandboxCgroup(cgroups []byte) bool {
	for l := range strings.SplitSeq(string(cgroups), "\n") {
		// "4:memory:/stockade/sbx-..." on v1, "0::/stockade/sbx-..." on v2.
		if f := strings.SplitN(l, ":", 3); len(f) == 3 && (f[1] == "memory" || f[1] == "") && strings.HasPrefix(f[2], ocidriver.CgroupParent+"/") {
			return true
		}
	}
	return false
}

// selfRSS is this process's resident set (VmRSS): the daemon's (engine,
// capability layer, SQLite store, HTTP API) and the benchmark's clients'.
func selfRSS() int64 {
	b, _ := os.ReadFile("/proc/self/status")
	return field(b, "VmRSS:", 1024)
}

// field is the number after the first line of b that starts with key,
// times unit (a trailing "kB" is dropped); zero if there is none.
func field(b []byte, key string, unit int64) int64 {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n * unit
		}
	}
	return 0
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func gib(b int64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }
