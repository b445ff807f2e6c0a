package image

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// removeTree removes dir and everything under it. debootstrap mounts /proc,
// /sys and /dev inside its target and leaves them mounted when it is killed,
// so removeTree first detaches every mount below dir and refuses to delete
// anything while a mount remains: RemoveAll must never descend into the
// host's /proc, /sys or /dev.
func removeTree(dir string) error {
	if err := unmountUnder(dir); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return nil
}

// unmountUnder detaches every mount at or below dir, deepest first, and
// reports an error if any is left.
func unmountUnder(dir string) error {
	mounts, err := mountsUnder(dir)
	if err != nil || len(mounts) == 0 {
		return err
	}
	sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && err != syscall.EINVAL && err != syscall.ENOENT {
			return fmt.Errorf("unmounting %s: %w", m, err)
		}
	}
	left, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("%s is still mounted; unmount it by hand before removing %s", left[0], dir)
	}
	return nil
}

// mountsUnder lists the mount points of this mount namespace at or below dir.
func mountsUnder(dir string) ([]string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("resolving %s: %w", dir, err)
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading mount table: %w", err)
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		// Field 5 is the mount point, with space, tab, newline and
		// backslash escaped as octal.
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		mp := unescapeMountinfo(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out, sc.Err()
}

// unescapeMountinfo decodes the octal escapes of a mountinfo field.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
