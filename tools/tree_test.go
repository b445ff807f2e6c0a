package tools

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/sandbox"
)

// salesTree makes a data root holding sales/ with dirs directories of
// files files each, and returns the root and a tool mounting sales/.
func salesTree(t testing.TB, dirs, files int) (string, Tool) {
	t.Helper()
	root := t.TempDir()
	for d := range dirs {
		dir := filepath.Join(root, "sales", fmt.Sprintf("region-%d", d/10), fmt.Sprintf("month-%d", d))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for f := range files {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("day-%d.csv", f)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root, Tool{Name: "sales-report", InputTrust: Trusted, Tier: sandbox.TierGVisor, Source: "tools.yaml:1",
		Filesystem: Filesystem{Mounts: []sandbox.Mount{{Source: filepath.Join(root, "sales"), Target: "/data/sales"}}}}
}

// TestMountTreeTooLarge checks that a tree past the walk's bound is
// refused, naming the bound, where the walk used to stop quietly and let
// the mount pass unchecked.
func TestMountTreeTooLarge(t *testing.T) {
	saved := maxTreeEntries
	defer func() { maxTreeEntries = saved }()
	// 2 region directories, 11 month directories, 5 files in each: 68.
	root, tool := salesTree(t, 11, 5)
	for _, tt := range []struct {
		max  int
		want bool
	}{{68, false}, {67, true}} {
		t.Run(fmt.Sprint(tt.max), func(t *testing.T) {
			maxTreeEntries = tt.max
			ps := Validate([]Tool{tool}, Options{DataRoot: root})
			if got := hasRule(ps, RuleMountTooLarge); got != tt.want {
				t.Fatalf("Validate with a bound of %d: got %v, want rule %s %v", tt.max, ps, RuleMountTooLarge, tt.want)
			}
			if tt.want && !strings.Contains(ps.Error(), fmt.Sprintf("more than %d entries", tt.max)) {
				t.Errorf("got %v, want the bound named", ps)
			}
			_, err := ResolveMounts(tool, Options{DataRoot: root})
			if (err != nil) != tt.want {
				t.Errorf("ResolveMounts with a bound of %d: got %v", tt.max, err)
			}
		})
	}
}

// laterChecker returns a checker whose clock runs 2 s ahead, so that the
// directories a test has just made count as old enough to be remembered,
// as a real data directory's are.
func laterChecker(root string) *MountChecker {
	c := NewMountChecker(Options{DataRoot: root})
	c.now = func() time.Time { return time.Now().Add(2 * trustAfter) }
	return c
}

// TestMountCheckerSeesLaterAdditions checks that a socket or a credentials
// directory put below a mount after a check that passed is refused at the
// next one, also where the checker remembers the directories above it.
func TestMountCheckerSeesLaterAdditions(t *testing.T) {
	tests := []struct {
		name string
		add  func(t *testing.T, dir string)
		rule string
	}{
		{"socket", func(t *testing.T, dir string) {
			l, err := net.Listen("unix", filepath.Join(dir, "agent.sock"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
		}, RuleMountSocket},
		{"credentials directory", func(t *testing.T, dir string) {
			if err := os.MkdirAll(filepath.Join(dir, ".aws"), 0o700); err != nil {
				t.Fatal(err)
			}
		}, RuleMountCredentials},
		{"one of two levels", func(t *testing.T, dir string) {
			if err := os.MkdirAll(filepath.Join(dir, ".config", "gcloud"), 0o700); err != nil {
				t.Fatal(err)
			}
		}, RuleMountCredentials},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root, tool := salesTree(t, 3, 2)
			c := laterChecker(root)
			if _, err := c.Resolve(tool); err != nil {
				t.Fatal(err)
			}
			// Past the file system's clock tick, so that the change is
			// stamped apart from the tree's making.
			time.Sleep(50 * time.Millisecond)
			tt.add(t, filepath.Join(root, "sales", "region-0", "month-1"))
			_, err := c.Resolve(tool)
			if err == nil || !strings.Contains(err.Error(), "rule "+tt.rule) || !strings.Contains(err.Error(), "month-1") {
				t.Errorf("Resolve after the change: got %v, want rule %s naming the path", err, tt.rule)
			}
		})
	}
}

// TestMountCheckerRemembers checks that a check again reads only the
// directories that changed, and every directory of a tree changed in the
// last trustAfter.
func TestMountCheckerRemembers(t *testing.T) {
	root, tool := salesTree(t, 20, 3)
	const dirs = 1 + 2 + 20 // sales, its regions, their months
	reads := func(c *MountChecker) int { return c.tree(filepath.Join(root, "sales")).reads }

	fresh := NewMountChecker(Options{DataRoot: root})
	for range 2 {
		if _, err := fresh.Resolve(tool); err != nil {
			t.Fatal(err)
		}
	}
	if got := reads(fresh); got != 2*dirs {
		t.Errorf("directories read by two checks of a tree just made: got %d, want %d (none is old enough to be remembered)", got, 2*dirs)
	}

	c := laterChecker(root)
	for range 2 {
		if _, err := c.Resolve(tool); err != nil {
			t.Fatal(err)
		}
	}
	if got := reads(c); got != dirs {
		t.Errorf("directories read by two checks: got %d, want %d (the second reads none)", got, dirs)
	}
	time.Sleep(50 * time.Millisecond)
	if err := os.WriteFile(filepath.Join(root, "sales", "region-1", "month-12", "new.csv"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resolve(tool); err != nil {
		t.Fatal(err)
	}
	if got := reads(c); got != dirs+1 {
		t.Errorf("directories read after a file was added: got %d, want %d (only its directory again)", got, dirs+1)
	}
}

// BenchmarkMountCheck times the check of a mount of 10,000 files in 100
// directories before a run: walked whole (ResolveMounts, what every run
// would cost without the checker's memory) and checked again by a
// MountChecker that remembers the tree.
func BenchmarkMountCheck(b *testing.B) {
	root, tool := salesTree(b, 100, 100)
	b.Run("walk", func(b *testing.B) {
		for b.Loop() {
			if _, err := ResolveMounts(tool, Options{DataRoot: root}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("remembered", func(b *testing.B) {
		c := laterChecker(root)
		for b.Loop() {
			if _, err := c.Resolve(tool); err != nil {
				b.Fatal(err)
			}
		}
	})
}
