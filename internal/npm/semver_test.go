package npm

import (
	"strings"
	"testing"
)

// TestRange checks npm's range grammar against the versions each range
// must and must not admit, as node-semver reads them.
func TestRange(t *testing.T) {
	tests := []struct {
		rng     string
		in, out []string
	}{
		{"1.2.3", []string{"1.2.3"}, []string{"1.2.4", "1.2.3-beta"}},
		{"=1.2.3", []string{"1.2.3"}, []string{"1.2.2"}},
		{"v1.2.3", []string{"1.2.3"}, []string{"1.2.4"}},
		{"^1.2.3", []string{"1.2.3", "1.9.0"}, []string{"1.2.2", "2.0.0", "2.0.0-0", "1.3.0-beta"}},
		{"^1.2", []string{"1.2.0", "1.99.9"}, []string{"1.1.9", "2.0.0"}},
		{"^1.x", []string{"1.0.0", "1.5.0"}, []string{"2.0.0", "0.9.0"}},
		{"^0.2.3", []string{"0.2.3", "0.2.9"}, []string{"0.3.0", "0.2.2"}},
		{"^0.0.3", []string{"0.0.3"}, []string{"0.0.4", "0.0.2"}},
		{"^0.0", []string{"0.0.0", "0.0.9"}, []string{"0.1.0"}},
		{"^0.x", []string{"0.0.1", "0.9.0"}, []string{"1.0.0"}},
		{"^1.2.3-beta.2", []string{"1.2.3-beta.2", "1.2.3-beta.10", "1.2.3", "1.3.0"}, []string{"1.2.3-beta.1", "1.3.0-beta.1", "2.0.0"}},
		{"~1.2.3", []string{"1.2.3", "1.2.9"}, []string{"1.3.0", "1.2.2"}},
		{"~1.2", []string{"1.2.0", "1.2.9"}, []string{"1.3.0"}},
		{"~1", []string{"1.0.0", "1.9.9"}, []string{"2.0.0"}},
		{"~>1.2.3", []string{"1.2.5"}, []string{"1.3.0"}},
		{"1.x", []string{"1.0.0", "1.9.9"}, []string{"2.0.0", "0.9.0"}},
		{"1.2.X", []string{"1.2.0", "1.2.9"}, []string{"1.3.0"}},
		{"1", []string{"1.0.0", "1.5.0"}, []string{"2.0.0"}},
		{"1.2", []string{"1.2.0", "1.2.5"}, []string{"1.3.0"}},
		{"*", []string{"0.0.0", "9.9.9"}, []string{"1.0.0-rc.1"}},
		{"", []string{"0.0.0", "9.9.9"}, []string{"1.0.0-rc.1"}},
		{"x", []string{"3.0.0"}, nil},
		{">=1.2.3", []string{"1.2.3", "5.0.0"}, []string{"1.2.2"}},
		{">= 1.2.3 < 2", []string{"1.2.3", "1.9.9"}, []string{"2.0.0", "2.0.0-0"}},
		{">1.2.3", []string{"1.2.4"}, []string{"1.2.3"}},
		{">1.2", []string{"1.3.0"}, []string{"1.2.9"}},
		{">1", []string{"2.0.0"}, []string{"1.9.9"}},
		{"<1.2.3", []string{"1.2.2"}, []string{"1.2.3", "1.2.3-beta"}},
		{"<1.2", []string{"1.1.9"}, []string{"1.2.0"}},
		{"<=1.2", []string{"1.2.9"}, []string{"1.3.0"}},
		{"<=1.2.3", []string{"1.2.3"}, []string{"1.2.4"}},
		{">*", nil, []string{"0.0.0", "1.0.0"}},
		{"<*", nil, []string{"0.0.0", "1.0.0"}},
		{"1.2.3 - 2.3.4", []string{"1.2.3", "2.3.4"}, []string{"1.2.2", "2.3.5"}},
		{"1.2 - 2.3.4", []string{"1.2.0", "2.3.4"}, []string{"1.1.9", "2.3.5"}},
		{"1.2.3 - 2.3", []string{"2.3.9"}, []string{"2.4.0"}},
		{"1.2.3 - 2", []string{"2.9.9"}, []string{"3.0.0"}},
		{"1.2.7 || >=1.2.9 <2.0.0", []string{"1.2.7", "1.2.9", "1.4.6"}, []string{"1.2.8", "2.0.0"}},
		{"^1.0.0 || ^2.0.0", []string{"1.5.0", "2.5.0"}, []string{"3.0.0", "0.5.0"}},
		{"^2 <2.2 || > 2.3", []string{"2.1.0", "2.4.0", "3.0.0"}, []string{"2.2.0", "2.3.0"}},
	}
	for _, tt := range tests {
		t.Run(tt.rng, func(t *testing.T) {
			r, err := parseRange(tt.rng)
			if err != nil {
				t.Fatalf("parseRange(%q): %v", tt.rng, err)
			}
			for _, s := range tt.in {
				if !r.test(mustVersion(t, s)) {
					t.Errorf("%q does not admit %s, want it to", tt.rng, s)
				}
			}
			for _, s := range tt.out {
				if r.test(mustVersion(t, s)) {
					t.Errorf("%q admits %s, want it not to", tt.rng, s)
				}
			}
		})
	}
}

// TestRangeRefused checks that what is not a range is refused.
func TestRangeRefused(t *testing.T) {
	for _, s := range []string{"1.2.3.4", "^^1", "a.b.c", "1.x.3", ">=1 <", "01.2.3", "1.2.3 -", strings.Repeat("1", 2000)} {
		if r, err := parseRange(s); err == nil {
			t.Errorf("parseRange(%q) = %v, want an error", s, r)
		}
	}
}

// TestParseDepSpec checks which dependency specs are ranges, tags, or
// refused.
func TestParseDepSpec(t *testing.T) {
	for _, tt := range []struct{ spec, tag, err string }{
		{"^1.0.0", "", ""},
		{"latest", "latest", ""},
		{"next", "next", ""},
		{"npm:other@^1", "", "aliases (npm:) are not supported"},
		{"git+https://github.com/a/b.git", "", "URLs or git repositories"},
		{"github:a/b", "", "URLs or git repositories"},
		{"a/b", "", "git repositories (user/repo)"},
		{"file:../x", "", "local packages (file:)"},
		{"workspace:*", "", "local packages (workspace:)"},
		{"https://example.com/x.tgz", "", "URLs or git repositories"},
		{"1.2.3.4", "", "is not a version range"},
	} {
		_, tag, err := parseDepSpec(tt.spec)
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("parseDepSpec(%q): %v, want an error containing %q", tt.spec, err, tt.err)
		case tt.err == "" && (err != nil || tag != tt.tag):
			t.Errorf("parseDepSpec(%q) = tag %q, %v; want tag %q", tt.spec, tag, err, tt.tag)
		}
	}
}

// TestCompare checks semver precedence, prereleases included.
func TestCompare(t *testing.T) {
	order := []string{"1.0.0-0", "1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2", "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1", "1.1.0", "2.0.0"}
	for i := 1; i < len(order); i++ {
		a, b := mustVersion(t, order[i-1]), mustVersion(t, order[i])
		if compare(a, b) >= 0 || compare(b, a) <= 0 {
			t.Errorf("compare(%s, %s) does not order them", order[i-1], order[i])
		}
	}
	if compare(mustVersion(t, "1.0.0+build.1"), mustVersion(t, "1.0.0")) != 0 {
		t.Errorf("build metadata takes part in precedence")
	}
}

func mustVersion(t *testing.T, s string) version {
	t.Helper()
	v, err := parseVersion(s)
	if err != nil {
		t.Fatalf("parseVersion(%q): %v", s, err)
	}
	return v
}
