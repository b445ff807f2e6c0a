package sandboxkit

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ProcessesMentioning lists the host processes, other than this one, whose
// command line contains s, one "process PID: command line" each. Leftovers
// uses it to find a sandbox's runtime or shim still running; an empty s
// matches nothing.
func ProcessesMentioning(s string) []string {
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
