package ocidriver

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/internal/sandboxkit"
)

// TestCgroupFiles lays out a v1 and a v2 tree of its own and checks the
// files each layout is driven through: the limits prepare writes and the
// numbers a run reads back. This host runs cgroup v1 only, so the v2 names
// are checked here against the kernel's documentation
// (Documentation/admin-guide/cgroup-v2.rst), not against a kernel.
func TestCgroupFiles(t *testing.T) {
	const path = "/stockade/sbx-test"
	const limit = 512 << 20
	read := func(t *testing.T, name string) string {
		t.Helper()
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	write := func(t *testing.T, name, content string) {
		t.Helper()
		if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		v2   bool
		// limits are the files prepare must write, with their contents;
		// peak is the file a run's peak memory comes from, events the
		// file that counts OOM kills (two, in eventsText).
		limits       map[string]string
		peak, events string
		eventsText   string
	}{
		{
			name:       "v1",
			limits:     map[string]string{"memory.limit_in_bytes": "536870912", "memory.memsw.limit_in_bytes": "536870912"},
			peak:       "memory.max_usage_in_bytes",
			events:     "memory.oom_control",
			eventsText: "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
		},
		{
			name:       "v2",
			v2:         true,
			limits:     map[string]string{"memory.max": "536870912", "memory.swap.max": "0"},
			peak:       "memory.peak",
			events:     "memory.events",
			eventsText: "low 0\nhigh 0\nmax 7\noom 3\noom_kill 2\noom_group_kill 0\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			c := cgroup{sandboxkit.Cgroup{V2: tc.v2, Path: path, Root: root}}
			dir := c.MemoryDir()
			if tc.v2 {
				if dir != filepath.Join(root, path) {
					t.Fatalf("memory dir %s, want the unified hierarchy's", dir)
				}
			} else if dir != filepath.Join(root, "memory", path) {
				t.Fatalf("memory dir %s, want the memory hierarchy's", dir)
			}
			if err := c.prepare(limit); err != nil {
				t.Fatal(err)
			}
			for f, want := range tc.limits {
				if got := read(t, filepath.Join(dir, f)); got != want {
					t.Errorf("%s: %q, want %q", f, got, want)
				}
			}
			write(t, filepath.Join(dir, tc.peak), "12345678\n")
			write(t, filepath.Join(dir, tc.events), tc.eventsText)
			if got := c.Peak(); got != 12345678 {
				t.Errorf("Peak: %d, want 12345678 (from %s)", got, tc.peak)
			}
			if got := c.OOMKills(); got != 2 {
				t.Errorf("OOMKills: %d, want 2 (from %s)", got, tc.events)
			}
			if got := c.Dirs(); !slices.Equal(got, []string{dir}) {
				t.Errorf("Dirs: %v, want [%s]", got, dir)
			}
		})
	}
}
