package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunAboveRecordLimits checks that `stockade run` refuses limits above
// the tool's record as bad input: exit 2, one line naming the tool and the
// record's limit, nothing run.
func TestRunAboveRecordLimits(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tools.yaml")
	if err := os.WriteFile(file, []byte(`
tools:
  - name: report
    input_trust: trusted
    tier: container
    limits: {timeout: 10s, memory: 256MiB}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"timeout", []string{"--timeout", "20s"}, "timeout 20s is above the ceiling of 10s"},
		{"memory", []string{"--memory", "1GiB"}, "memory 1GiB is above the ceiling of 256MiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "state")
			args := append([]string{"run", "--tools", file, "--tool", "report", "--runtime", "python", "-c", "print(1)"}, tt.args...)
			code, stdout, stderr := stockade(t, state, nil, args...)
			if code != 2 {
				t.Errorf("exit status: got %d, want 2 (stderr %q)", code, stderr)
			}
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			if stdout != "" || len(lines) != 1 || !strings.Contains(lines[0], `tool "report"`) || !strings.Contains(lines[0], tt.want) {
				t.Errorf("got stdout %q stderr %q, want one line naming tool \"report\" and %q", stdout, stderr, tt.want)
			}
			if left := listTree(t, state); len(left) > 0 {
				t.Errorf("left behind in the state directory: %v", left)
			}
		})
	}
}
