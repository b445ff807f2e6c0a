package sandboxkit

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// CgroupRoot is where the host's cgroup hierarchies are mounted.
const CgroupRoot = "/sys/fs/cgroup"

// Cgroup is one sandbox's cgroup on this host. Its numbers are best effort:
// a file that is missing or unreadable reads as zero, and never fails an
// Exec. The zero Cgroup is "not visible here" (the sandbox runs on another
// host): every number reads as zero and it has no directories.
type Cgroup struct {
	// V2 says the host uses the unified hierarchy; otherwise (v1, or a
	// hybrid layout) every controller has its own hierarchy.
	V2 bool
	// Path is the cgroup's path below each hierarchy's root, e.g.
	// "/stockade/sbx-..."; empty means not visible here.
	Path string
	// Root is where the hierarchies are mounted; empty means CgroupRoot.
	// Tests set it to lay out a v1 or v2 tree of their own.
	Root string
}

func (c Cgroup) root() string {
	if c.Root != "" {
		return c.Root
	}
	return CgroupRoot
}

// MemoryDir is the directory of the cgroup's memory controller, or "" for
// the zero Cgroup.
func (c Cgroup) MemoryDir() string {
	switch {
	case c.Path == "":
		return ""
	case c.V2:
		return filepath.Join(c.root(), c.Path)
	}
	return filepath.Join(c.root(), "memory", c.Path)
}

// OOMKills is the number of processes the kernel OOM-killed in the cgroup.
func (c Cgroup) OOMKills() int64 {
	sc := bufio.NewScanner(bytes.NewReader(c.readMemory("memory.oom_control", "memory.events")))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// Peak is the highest memory usage of the cgroup since the last ResetPeak.
func (c Cgroup) Peak() int64 {
	n, _ := strconv.ParseInt(strings.TrimSpace(string(c.readMemory("memory.max_usage_in_bytes", "memory.peak"))), 10, 64)
	return n
}

// CPUDir is the directory of the cgroup's CPU accounting (the cpuacct
// controller on v1, the unified directory on v2), or "" for the zero
// Cgroup.
func (c Cgroup) CPUDir() string {
	switch {
	case c.Path == "":
		return ""
	case c.V2:
		return c.MemoryDir()
	}
	return filepath.Join(c.root(), "cpuacct", c.Path)
}

// CPUUsage is the CPU time the cgroup's processes have used since it was
// created: cpuacct.usage on v1, cpu.stat's usage_usec on v2.
func (c Cgroup) CPUUsage() time.Duration {
	if c.Path == "" {
		return 0
	}
	if !c.V2 {
		b, _ := os.ReadFile(filepath.Join(c.CPUDir(), "cpuacct.usage"))
		n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return time.Duration(n)
	}
	b, _ := os.ReadFile(filepath.Join(c.MemoryDir(), "cpu.stat"))
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "usage_usec "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return time.Duration(n) * time.Microsecond
		}
	}
	return 0
}

// ResetPeak starts a new peak measurement on v1. On v2 memory.peak is reset
// only for the writer's open file, so the peak there covers the whole
// sandbox.
func (c Cgroup) ResetPeak() {
	if c.Path != "" && !c.V2 {
		_ = os.WriteFile(filepath.Join(c.MemoryDir(), "memory.max_usage_in_bytes"), []byte("0"), 0)
	}
}

// readMemory reads the memory controller's file named v1 or v2, after the
// hierarchy; nil when there is none.
func (c Cgroup) readMemory(v1, v2 string) []byte {
	if c.Path == "" {
		return nil
	}
	name := v1
	if c.V2 {
		name = v2
	}
	b, _ := os.ReadFile(filepath.Join(c.MemoryDir(), name))
	return b
}

// Dirs lists the cgroup's directories that exist on the host, in every
// hierarchy.
func (c Cgroup) Dirs() []string {
	if c.Path == "" {
		return nil
	}
	if c.V2 {
		if _, err := os.Stat(c.MemoryDir()); err == nil {
			return []string{c.MemoryDir()}
		}
		return nil
	}
	entries, err := os.ReadDir(c.root())
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		d := filepath.Join(c.root(), e.Name(), c.Path)
		if _, err := os.Stat(d); err == nil {
			out = append(out, d)
		}
	}
	return out
}
