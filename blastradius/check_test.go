package blastradius

import (
	"encoding/json"
	"testing"

	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// TestCoveredMount checks that only the last mount of a mount point is
// judged: it is the one the sandbox sees.
func TestCoveredMount(t *testing.T) {
	for _, tc := range []struct {
		name      string
		options   []string // of the mounts at /sys/fs/cgroup, in mount order
		deviation bool
	}{
		{"read-write covered by read-only", []string{"rw,nosuid", "ro,nosuid"}, false},
		{"read-only covered by read-write", []string{"ro,nosuid", "rw,nosuid"}, true},
		{"read-write alone", []string{"rw,nosuid"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mounts []map[string]string
			for _, o := range tc.options {
				mounts = append(mounts, map[string]string{"mount_point": "/sys/fs/cgroup", "fstype": "tmpfs", "source": "tmpfs", "options": o})
			}
			var r rawReach
			if err := json.Unmarshal(mustMarshal(t, map[string]any{"mounts": mounts}), &r); err != nil {
				t.Fatal(err)
			}
			e := &evaluator{t: tools.Tool{Tier: sandbox.TierDocker}, r: &r}
			var devs []Check
			for _, c := range e.mounts().Checks {
				if c.Deviation {
					devs = append(devs, c)
				}
			}
			if got := len(devs) > 0; got != tc.deviation {
				t.Errorf("deviation %v, want %v: %+v", got, tc.deviation, devs)
			}
		})
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
