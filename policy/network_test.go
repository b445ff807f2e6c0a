package policy

import (
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
)

// TestParseNetwork checks the words and the older ones still accepted.
func TestParseNetwork(t *testing.T) {
	for in, want := range map[string]bool{"allow": true, "deny": false, "": false, "allowed": true, "denied": false} {
		if got, err := ParseNetwork(in); err != nil || got != want {
			t.Errorf("ParseNetwork(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"yes", "Allow", "true", "open"} {
		if _, err := ParseNetwork(in); !errdefs.IsInvalidArgument(err) {
			t.Errorf("ParseNetwork(%q): got %v, want an ErrInvalidArgument", in, err)
		}
	}
	if NetworkWord(true) != "allow" || NetworkWord(false) != "deny" {
		t.Errorf("got %q and %q, want allow and deny", NetworkWord(true), NetworkWord(false))
	}
}
