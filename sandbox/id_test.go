package sandbox

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
)

func TestResolveID(t *testing.T) {
	tests := []struct {
		requested string
		want      string // "" with a nil error: a generated ID
		invalid   bool
	}{
		{requested: ""},
		{requested: "job-1.a_b", want: "job-1.a_b"},
		{requested: strings.Repeat("a", 64), want: strings.Repeat("a", 64)},
		{requested: strings.Repeat("a", 65), invalid: true},
		{requested: "-x", invalid: true},
		{requested: "a/b", invalid: true},
		{requested: "a b", invalid: true},
	}
	generated := regexp.MustCompile(`^sbx-[0-9a-f]{16}$`)
	for _, tt := range tests {
		t.Run(tt.requested, func(t *testing.T) {
			got, err := ResolveID(tt.requested)
			switch {
			case tt.invalid:
				if !errdefs.IsInvalidArgument(err) {
					t.Errorf("got %q, %v, want ErrInvalidArgument", got, err)
				}
			case err != nil:
				t.Errorf("got %v, want no error", err)
			case tt.want == "" && !generated.MatchString(got):
				t.Errorf("got %q, want sbx- and 16 hex digits", got)
			case tt.want != "" && got != tt.want:
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}
