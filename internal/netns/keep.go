package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
)

// A kept network (Options.Kept) is a session's: its sandbox outlives the
// daemon, which re-attaches it at its next start and serves its network
// again. Its names carry a "k" after the prefix's separator
// ("<prefix>-k<n>", "<prefix>hk<n>", "<prefix>_k<n>"), which CleanupStale's
// patterns do not match and Leftovers's prefixes do.

// keptNames are the names of the kept network of slot.
func (m *Manager) keptNames(slot int) (ns, hostIf, table string) {
	n := strconv.Itoa(slot)
	return m.cfg.Prefix + "-k" + n, m.cfg.Prefix + "hk" + n, m.cfg.Prefix + "_k" + n
}

// keptSlot is the slot of kept network namespace name, false for any
// other name.
func (m *Manager) keptSlot(name string) (int, bool) {
	digits, ok := strings.CutPrefix(name, m.cfg.Prefix+"-k")
	if !ok || digits == "" || strings.Trim(digits, "0123456789") != "" {
		return 0, false
	}
	slot, err := strconv.Atoi(digits)
	if err != nil || slot < 0 || slot >= m.slots {
		return 0, false
	}
	return slot, true
}

// markKept holds the slots of the kept networks whose host interfaces are
// among links, so that Create gives no other network their addresses.
func (m *Manager) markKept(links []netlink.Link) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, l := range links {
		name := l.Attrs().Name
		if slot, ok := m.keptSlot(m.cfg.Prefix + "-" + trimPrefix(name, m.cfg.Prefix+"h")); ok {
			m.used[slot] = true
		}
	}
}

func trimPrefix(s, p string) string {
	if len(s) < len(p) || s[:len(p)] != p {
		return ""
	}
	return s[len(p):]
}

// Adopt returns the kept network named name (Net.Name of a network made
// with Options.Kept, which a re-attached sandbox's record names), as
// Create made it, and holds its slot. It does not check the rules: those
// CleanupStale left are the ones Create wrote. Removing it (Remove) frees
// the slot; the host ids of its user namespace are freed by the removal
// of its bind mount, their holder.
func (m *Manager) Adopt(name string) (*Net, error) {
	slot, ok := m.keptSlot(name)
	if !ok {
		return nil, fmt.Errorf("netns: %q is not a kept network of prefix %s", name, m.cfg.Prefix)
	}
	ns, hostIf, table := m.keptNames(slot)
	link, hostAddr, sbxAddr := m.linkOf(slot)
	n := &Net{Name: ns, Path: filepath.Join(RunDir, ns), HostIf: hostIf, HostAddr: hostAddr, SandboxAddr: sbxAddr, Link: link, Table: table, m: m, slot: slot}
	if _, err := os.Stat(n.Path); err != nil {
		return nil, fmt.Errorf("netns: kept network %s: %w", name, err)
	}
	if _, err := linkByName(hostIf); err != nil {
		return nil, fmt.Errorf("netns: kept network %s has no host interface %s: %w", name, hostIf, err)
	}
	if p := filepath.Join(UserRunDir, ns); exists(p) {
		n.UserNSPath = p
	}
	m.mu.Lock()
	m.used[slot] = true
	m.mu.Unlock()
	return n, nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// RemoveKept removes every kept network whose name keep does not hold:
// those of sandboxes that are gone, or that no daemon serves any more. It
// returns what it removed.
func (m *Manager) RemoveKept(keep map[string]bool) ([]string, error) {
	seen := map[int]bool{}
	var slots []int
	add := func(name string) {
		if slot, ok := m.keptSlot(name); ok && !keep[name] && !seen[slot] {
			seen[slot] = true
			slots = append(slots, slot)
		}
	}
	for _, d := range pinDirs {
		entries, _ := os.ReadDir(d.dir)
		for _, e := range entries {
			add(e.Name())
		}
	}
	if links, err := netlink.LinkList(); err == nil {
		for _, l := range links {
			if rest := trimPrefix(l.Attrs().Name, m.cfg.Prefix+"h"); rest != "" {
				add(m.cfg.Prefix + "-" + rest)
			}
		}
	}
	if tables, err := listTables(); err == nil {
		for _, t := range tables {
			if rest := trimPrefix(t, m.cfg.Prefix+"_"); rest != "" {
				add(m.cfg.Prefix + "-" + rest)
			}
		}
	}
	var (
		removed []string
		errs    []error
	)
	for _, slot := range slots {
		ns, hostIf, table := m.keptNames(slot)
		n := &Net{Name: ns, Path: filepath.Join(RunDir, ns), HostIf: hostIf, Table: table, m: m, slot: slot}
		if err := n.Remove(); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, "kept network "+ns)
	}
	return removed, errors.Join(errs...)
}
