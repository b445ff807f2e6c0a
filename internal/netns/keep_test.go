package netns

import (
	"slices"
	"strings"
	"testing"
)

// TestKeptNetwork makes a kept network (a session's), then plays a
// daemon's restart: a new manager's CleanupStale keeps it and holds its
// slot, Adopt gives it back as it was made, RemoveKept spares the ones it
// is told to keep and removes the others.
func TestKeptNetwork(t *testing.T) {
	for _, userNS := range []bool{false, true} {
		t.Run(map[bool]string{false: "host user namespace", true: "own user namespace"}[userNS], func(t *testing.T) {
			m := newTestManager(t)
			n := createWith(t, m, Options{ProxyPorts: []uint16{80}, UserNamespace: userNS, Kept: true})
			if !strings.HasPrefix(n.Name, testPrefix+"-k") || !strings.HasPrefix(n.HostIf, testPrefix+"hk") || !strings.HasPrefix(n.Table, testPrefix+"_k") {
				t.Fatalf("a kept network's names: got %s, %s, %s", n.Name, n.HostIf, n.Table)
			}
			m2, err := NewManager(Config{Prefix: testPrefix, Range: testRange})
			if err != nil {
				t.Fatal(err)
			}
			removed, err := m2.CleanupStale()
			if err != nil {
				t.Fatal(err)
			}
			if slices.ContainsFunc(removed, func(s string) bool { return strings.Contains(s, n.Name) || strings.Contains(s, n.HostIf) }) {
				t.Fatalf("CleanupStale removed %v, want the kept network %s left", removed, n.Name)
			}
			left := m2.Leftovers()
			for _, want := range []string{"netns " + n.Name, "link " + n.HostIf, "nftables table inet " + n.Table} {
				if !slices.Contains(left, want) {
					t.Fatalf("after CleanupStale: got %v, want %q kept", left, want)
				}
			}
			other := createWith(t, m2, Options{ProxyPorts: []uint16{80}})
			if other.Link == n.Link {
				t.Fatalf("a new network got the kept network's link %s", n.Link)
			}
			a, err := m2.Adopt(n.Name)
			if err != nil {
				t.Fatal(err)
			}
			if a.Path != n.Path || a.HostIf != n.HostIf || a.HostAddr != n.HostAddr || a.SandboxAddr != n.SandboxAddr || a.Table != n.Table || a.UserNSPath != n.UserNSPath {
				t.Fatalf("Adopt: got %+v, want %+v", a, n)
			}
			if _, err := m2.Adopt(other.Name); err == nil {
				t.Fatalf("Adopt(%s): a network that is not kept was adopted", other.Name)
			}
			if removed, err := m2.RemoveKept(map[string]bool{n.Name: true}); err != nil || len(removed) != 0 {
				t.Fatalf("RemoveKept keeping it: removed %v, %v; want nothing", removed, err)
			}
			if removed, err := m2.RemoveKept(nil); err != nil || len(removed) != 1 {
				t.Fatalf("RemoveKept: removed %v, %v; want the kept network", removed, err)
			}
			if err := other.Remove(); err != nil {
				t.Fatal(err)
			}
			if left := m2.Leftovers(); len(left) > 0 {
				t.Fatalf("after RemoveKept: got %v, want nothing", left)
			}
		})
	}
}
