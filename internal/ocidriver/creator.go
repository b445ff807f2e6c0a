package ocidriver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/stockade-sh/stockade/sandbox"
)

// creatorFile, in the bundle of a sandbox that no shim supervises, names
// the process that created it: "PID STARTTIME PIDNS", its pid, its start
// time in clock ticks after boot (/proc/PID/stat) and its pid namespace
// (/proc/self/ns/pid). Such a sandbox lives only as long as that process:
// its guest's channel is the process's, and nothing else could re-attach
// to it.
const creatorFile = "creator"

// creator identifies a process across pid reuse.
type creator struct {
	pid   int
	start uint64
	pidNS string
}

func (c creator) String() string { return fmt.Sprintf("%d %d %s\n", c.pid, c.start, c.pidNS) }

var (
	selfOnce sync.Once
	selfRec  creator
	selfErr  error
)

// self is this process as a creator.
func self() (creator, error) {
	selfOnce.Do(func() {
		pid := os.Getpid()
		start, err := startTime(pid)
		if err != nil {
			selfErr = err
			return
		}
		ns, err := os.Readlink("/proc/self/ns/pid")
		if err != nil {
			selfErr = fmt.Errorf("reading this process's pid namespace: %w", err)
			return
		}
		selfRec = creator{pid: pid, start: start, pidNS: ns}
	})
	return selfRec, selfErr
}

// startTime is process pid's start time in clock ticks after boot, field
// 22 of /proc/PID/stat; os.ErrNotExist when there is no such process.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold anything.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("reading /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("reading /proc/%d/stat: %d fields after the command name, want at least 20", pid, len(f))
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// writeCreator records this process as the creator of the sandbox of
// bundle. The record appears whole or not at all. A process that cannot
// tell who it is (no /proc) records nothing: its sandboxes are left to
// Reap, as before there were records.
func writeCreator(bundle string) error {
	me, err := self()
	if err != nil {
		return nil
	}
	tmp := filepath.Join(bundle, creatorFile+".tmp")
	if err := os.WriteFile(tmp, []byte(me.String()), 0o600); err != nil {
		return fmt.Errorf("recording the sandbox's creator: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(bundle, creatorFile)); err != nil {
		return fmt.Errorf("recording the sandbox's creator: %w", err)
	}
	return nil
}

// readCreator reads the creator record of bundle; false when there is
// none that reads.
func readCreator(bundle string) (creator, bool) {
	b, err := os.ReadFile(filepath.Join(bundle, creatorFile))
	if err != nil {
		return creator{}, false
	}
	var c creator
	if n, err := fmt.Sscanf(string(b), "%d %d %s\n", &c.pid, &c.start, &c.pidNS); err != nil || n != 3 || c.pid <= 0 {
		return creator{}, false
	}
	return c, true
}

// gone reports whether creator c has certainly ended: it ran in this
// process's pid namespace, and no process of its pid and start time is
// there. A creator of another pid namespace is never taken for gone: its
// pid means nothing here.
func (c creator) gone() bool {
	me, err := self()
	if err != nil || c.pidNS != me.pidNS {
		return false
	}
	start, err := startTime(c.pid)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return true
	case err != nil:
		return false
	}
	return start != c.start
}

// reapOrphans destroys the sandboxes of the state directory whose creator
// is gone and that no shim supervises: the leftovers of a process killed
// (SIGKILL) before it could destroy its sandboxes, such as a local
// `stockade run`, which no daemon's Reap would match. A bundle without a
// creator record is left alone (it may be another process's create under
// way, or a detached sandbox; Reap handles those), and so are this
// driver's own. It returns the IDs of the sandboxes it destroyed. Several
// processes sharing a state directory may run it at once: Destroy is
// idempotent.
func (d *Driver) reapOrphans(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(d.cfg.StateDir, "bundles"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing bundles: %w", err)
	}
	var reaped []string
	var errs []error
	for _, e := range entries {
		id := e.Name()
		if d.isSpared(id) {
			continue
		}
		if _, err := os.Stat(d.shimDir(id)); err == nil {
			continue
		}
		c, ok := readCreator(d.bundleDir(id))
		if !ok || !c.gone() {
			continue
		}
		d.adoptOnce.Do(d.adoptBundles)
		if err := d.newSbx(id, sandbox.Limits{}).Destroy(ctx); err != nil {
			errs = append(errs, fmt.Errorf("destroying sandbox %s of gone process %d: %w", id, c.pid, err))
			continue
		}
		reaped = append(reaped, id)
	}
	return reaped, errors.Join(errs...)
}
