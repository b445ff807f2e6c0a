package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/internal/netns"
	"github.com/stockade-sh/stockade/internal/testenv"
)

// TestClaimHost checks that a second daemon on the host cannot take the
// first one's state directory or, with egress, its sandbox network prefix,
// and that the error names what is shared.
func TestClaimHost(t *testing.T) {
	testenv.RequiresRoot(t) // the prefix's lock is under /run/stockade
	first := config.Default()
	first.StateDir, first.Egress, first.EgressPrefix = t.TempDir(), true, "stkcl"
	t.Cleanup(func() { os.Remove(filepath.Join(filepath.Dir(netns.UserRunDir), "egress-stkcl.lock")) })
	release, err := claimHost(first)
	if err != nil {
		t.Fatalf("first claim: %v", err)
	}
	sameState := first
	sameState.Egress = false
	samePrefix := first
	samePrefix.StateDir = t.TempDir()
	for name, c := range map[string]struct {
		cfg  config.Config
		want string
	}{
		"state directory": {sameState, "uses the state directory " + first.StateDir},
		"egress prefix":   {samePrefix, `uses the sandbox network prefix "stkcl"`},
	} {
		if r, err := claimHost(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			if r != nil {
				r()
			}
			t.Errorf("same %s: got %v, want an error containing %q", name, err, c.want)
		}
	}
	release()
	again, err := claimHost(samePrefix)
	if err != nil {
		t.Fatalf("a claim after the release: %v", err)
	}
	again()
}
