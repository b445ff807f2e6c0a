package docker

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/stockade-sh/stockade/internal/sandboxkit"
)

// cgroupOf finds the cgroup of the process pid, which must be the
// container cid's PID 1. When the engine is not on this host, or the pid is
// not the container's, it returns the zero cgroup, "not visible here": every
// number then reads as zero and OOM kills are known only from the
// container's state.
func cgroupOf(pid int, cid string) sandboxkit.Cgroup {
	if pid <= 0 || cid == "" {
		return sandboxkit.Cgroup{}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return sandboxkit.Cgroup{}
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
				cg := sandboxkit.Cgroup{Path: parts[2]}
				if _, err := os.Stat(cg.MemoryDir()); err == nil {
					return cg
				}
			}
		}
	}
	if unified != "" {
		cg := sandboxkit.Cgroup{V2: true, Path: unified}
		if _, err := os.Stat(filepath.Join(cg.MemoryDir(), "memory.events")); err == nil {
			return cg
		}
	}
	return sandboxkit.Cgroup{}
}
