package sandboxkit

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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

// UntilDone runs a clean-up until it has succeeded once, as a sandbox's
// Destroy must: calls are serialised, a call after a failed one tries again
// (the failure may have been passing: a busy runtime, a slow kernel), and a
// call after a successful one returns nil at once. The zero value is ready.
type UntilDone struct {
	mu   sync.Mutex
	done bool
}

// Do runs f unless an earlier call succeeded, and returns f's error.
func (u *UntilDone) Do(f func() error) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.done {
		return nil
	}
	err := f()
	u.done = err == nil
	return err
}
