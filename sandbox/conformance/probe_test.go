package conformance

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stockade-sh/stockade/sandbox"
)

// TestProbeOnHost runs the probe's harmless subcommands directly on the
// host. What it observes here is the host, so only the shape of its reports
// is checked; the subcommands that write, fill, fork or call refused system
// calls run only inside sandboxes.
func TestProbeOnHost(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the probe with the go command")
	}
	bin := BuildProbe(t)
	path := filepath.Join(t.TempDir(), "probe")
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if gz := probeGzip(t); len(gz) >= len(bin) {
		t.Errorf("compressed probe: got %d bytes, want fewer than the probe's %d", len(gz), len(bin))
	}
	t.Logf("probe: %d bytes, %d compressed (sandbox.MaxCodeSize %d)", len(bin), len(probeGz), sandbox.MaxCodeSize)

	for _, tc := range []struct {
		name  string
		args  []string
		stdin string
		exit  int
		keys  []string
	}{
		{"caps", []string{"caps"}, "", 0, []string{"status", "capget", "bounding", "no_new_privs", "uid"}},
		{"pids", []string{"pids"}, "", 0, []string{"self", "procs"}},
		{"env", []string{"env", hex.EncodeToString([]byte("not-in-any-environment"))}, "", 0, []string{"environ", "hits", "scanned"}},
		{"net", []string{"net", "127.0.0.1:1"}, "", 0, []string{"netlink", "proc_net_dev", "connect"}},
		{"stdin", []string{"stdin"}, "hello\x00", 0, []string{"stdin", "bytes"}},
		{"exit", []string{"exit", "3"}, "", 3, []string{"exit"}},
		{"readfile", []string{"readfile", "/nonexistent"}, "", 0, []string{"errno", "err", "content"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(path, tc.args...)
			cmd.Stdin = bytes.NewReader([]byte(tc.stdin))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.exit {
				t.Fatalf("got exit code %d, want %d; stderr: %s", code, tc.exit, stderr.String())
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(out, &m); err != nil {
				t.Fatalf("decoding %q: %v", out, err)
			}
			for _, k := range tc.keys {
				if _, ok := m[k]; !ok {
					t.Errorf("report %s has no %q", out, k)
				}
			}
		})
	}

	t.Run("flood", func(t *testing.T) {
		cmd := exec.Command(path, "flood", "100000", "both")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		if len(out) != 100000 || stderr.Len() != 100000 {
			t.Errorf("got %d bytes of stdout and %d of stderr, want 100000 each", len(out), stderr.Len())
		}
	})
}
