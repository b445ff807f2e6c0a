package npm

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
)

// version is a semantic version (semver.org 2.0.0) as npm's registry
// publishes them; build metadata is kept for printing but not compared.
type version struct {
	Major, Minor, Patch uint64
	Pre                 []string
	Build               string
}

var versionRE = regexp.MustCompile(`^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$`)

// parseVersion parses an exact version; a leading "v" or "=" is allowed,
// as npm allows it.
func parseVersion(s string) (version, error) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "=")
	m := versionRE.FindStringSubmatch(s)
	if m == nil || len(s) > 256 {
		return version{}, errors.New("not a version")
	}
	var v version
	var err error
	if v.Major, err = strconv.ParseUint(m[1], 10, 64); err != nil {
		return version{}, errors.New("not a version")
	}
	if v.Minor, err = strconv.ParseUint(m[2], 10, 64); err != nil {
		return version{}, errors.New("not a version")
	}
	if v.Patch, err = strconv.ParseUint(m[3], 10, 64); err != nil {
		return version{}, errors.New("not a version")
	}
	if m[4] != "" {
		v.Pre = strings.Split(m[4], ".")
	}
	v.Build = m[5]
	return v, nil
}

func (v version) String() string {
	s := strconv.FormatUint(v.Major, 10) + "." + strconv.FormatUint(v.Minor, 10) + "." + strconv.FormatUint(v.Patch, 10)
	if len(v.Pre) > 0 {
		s += "-" + strings.Join(v.Pre, ".")
	}
	return s
}

// compare orders versions by semver precedence.
func compare(a, b version) int {
	for _, d := range [][2]uint64{{a.Major, b.Major}, {a.Minor, b.Minor}, {a.Patch, b.Patch}} {
		if d[0] != d[1] {
			if d[0] < d[1] {
				return -1
			}
			return 1
		}
	}
	switch {
	case len(a.Pre) == 0 && len(b.Pre) == 0:
		return 0
	case len(a.Pre) == 0:
		return 1
	case len(b.Pre) == 0:
		return -1
	}
	for i := 0; i < len(a.Pre) && i < len(b.Pre); i++ {
		if c := compareIdent(a.Pre[i], b.Pre[i]); c != 0 {
			return c
		}
	}
	switch {
	case len(a.Pre) < len(b.Pre):
		return -1
	case len(a.Pre) > len(b.Pre):
		return 1
	}
	return 0
}

// compareIdent orders prerelease identifiers: numeric ones numerically
// and below alphanumeric ones, which compare as ASCII.
func compareIdent(a, b string) int {
	na, ea := strconv.ParseUint(a, 10, 64)
	nb, eb := strconv.ParseUint(b, 10, 64)
	switch {
	case ea == nil && eb == nil:
		if na < nb {
			return -1
		} else if na > nb {
			return 1
		}
		return 0
	case ea == nil:
		return -1
	case eb == nil:
		return 1
	}
	return strings.Compare(a, b)
}

// comparator is one bound of a range: an operator ("<", "<=", ">", ">=",
// "=") and a version.
type comparator struct {
	op string
	v  version
}

func (c comparator) test(v version) bool {
	d := compare(v, c.v)
	switch c.op {
	case "<":
		return d < 0
	case "<=":
		return d <= 0
	case ">":
		return d > 0
	case ">=":
		return d >= 0
	}
	return d == 0
}

// semverRange is a range of npm's grammar: comparator sets joined by
// "||", each set's comparators all holding.
type semverRange [][]comparator

// test reports whether v is in the range. As npm's, a prerelease version
// is only in a set with a comparator of the same major.minor.patch that
// has a prerelease: "^1.2.3-beta.1" admits 1.2.3-beta.2, never 1.3.0-rc.
func (r semverRange) test(v version) bool {
	for _, set := range r {
		if testSet(set, v) {
			return true
		}
	}
	return false
}

func testSet(set []comparator, v version) bool {
	for _, c := range set {
		if !c.test(v) {
			return false
		}
	}
	if len(v.Pre) == 0 {
		return true
	}
	for _, c := range set {
		if len(c.v.Pre) > 0 && c.v.Major == v.Major && c.v.Minor == v.Minor && c.v.Patch == v.Patch {
			return true
		}
	}
	return false
}

// partial is a version that may leave parts out or write them as "x",
// "X" or "*": nil parts are wildcards.
type partial struct {
	major, minor, patch *uint64
	pre                 []string
}

var (
	partialRE  = regexp.MustCompile(`^v?(?:([xX*]|0|[1-9]\d*)(?:\.([xX*]|0|[1-9]\d*)(?:\.([xX*]|0|[1-9]\d*)(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?)?)?)$`)
	opSpace    = regexp.MustCompile(`(<=|>=|<|>|=|~>|~|\^)\s+`)
	hyphenRE   = regexp.MustCompile(`^(\S+)\s+-\s+(\S+)$`)
	comparerRE = regexp.MustCompile(`^(<=|>=|<|>|=|~>|~|\^)?(.*)$`)
)

func parsePartial(s string) (partial, error) {
	m := partialRE.FindStringSubmatch(s)
	if m == nil {
		return partial{}, errors.New("not a version")
	}
	var p partial
	parts := []**uint64{&p.major, &p.minor, &p.patch}
	wild := false
	for i, s := range m[1:4] {
		if s == "" || s == "x" || s == "X" || s == "*" {
			wild = true
			continue
		}
		if wild {
			return partial{}, errors.New("a number after a wildcard")
		}
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || n > 1<<53 {
			return partial{}, errors.New("a number too large")
		}
		*parts[i] = &n
	}
	if m[4] != "" {
		p.pre = strings.Split(m[4], ".")
	}
	return p, nil
}

// floor is the lowest version the partial covers (wildcards are 0).
func (p partial) floor() version {
	v := version{Pre: p.pre}
	if p.major != nil {
		v.Major = *p.major
	}
	if p.minor != nil {
		v.Minor = *p.minor
	}
	if p.patch != nil {
		v.Patch = *p.patch
	}
	return v
}

// ceiling is the first version above what the partial covers, as the
// lowest prerelease ("-0") so that no prerelease of it is covered; ok is
// false when the partial covers every version.
func (p partial) ceiling() (version, bool) {
	switch {
	case p.major == nil:
		return version{}, false
	case p.minor == nil:
		return version{Major: *p.major + 1, Pre: []string{"0"}}, true
	case p.patch == nil:
		return version{Major: *p.major, Minor: *p.minor + 1, Pre: []string{"0"}}, true
	}
	return version{Major: *p.major, Minor: *p.minor, Patch: *p.patch + 1, Pre: []string{"0"}}, true
}

func (p partial) exact() bool { return p.patch != nil }

// none is a set no version is in (">*", "<*"), as npm reads them.
var none = []comparator{{"<", version{Pre: []string{"0"}}}}

// parseRange parses npm's range grammar: "||"-joined sets of space-joined
// comparators (<, <=, >, >=, =), x-ranges ("1.x", "1.2.*", "*", ""),
// tilde ("~1.2.3"), caret ("^1.2.3") and hyphen ranges ("1.2 - 2.3.4").
func parseRange(s string) (semverRange, error) {
	if len(s) > 1024 {
		return nil, errors.New("too long")
	}
	var r semverRange
	for _, part := range strings.Split(s, "||") {
		set, err := parseSet(strings.TrimSpace(part))
		if err != nil {
			return nil, err
		}
		r = append(r, set)
	}
	return r, nil
}

func parseSet(s string) ([]comparator, error) {
	s = opSpace.ReplaceAllString(s, "$1")
	if m := hyphenRE.FindStringSubmatch(s); m != nil {
		lo, err := parsePartial(m[1])
		if err != nil {
			return nil, err
		}
		hi, err := parsePartial(m[2])
		if err != nil {
			return nil, err
		}
		set := []comparator{{">=", lo.floor()}}
		if hi.exact() {
			return append(set, comparator{"<=", hi.floor()}), nil
		}
		if c, ok := hi.ceiling(); ok {
			set = append(set, comparator{"<", c})
		}
		return set, nil
	}
	if s == "" {
		return []comparator{{">=", version{}}}, nil
	}
	var set []comparator
	for _, tok := range strings.Fields(s) {
		m := comparerRE.FindStringSubmatch(tok)
		p, err := parsePartial(m[2])
		if err != nil {
			return nil, err
		}
		cs, err := desugar(m[1], p)
		if err != nil {
			return nil, err
		}
		set = append(set, cs...)
		if len(set) > 64 {
			return nil, errors.New("too many comparators")
		}
	}
	return set, nil
}

// desugar turns one operator and partial version into comparators.
func desugar(op string, p partial) ([]comparator, error) {
	lo := p.floor()
	hi, bounded := p.ceiling()
	switch op {
	case "", "=":
		if p.exact() {
			return []comparator{{"=", lo}}, nil
		}
		if !bounded {
			return []comparator{{">=", version{}}}, nil
		}
		return []comparator{{">=", lo}, {"<", hi}}, nil
	case "~", "~>":
		if p.minor == nil {
			if !bounded {
				return []comparator{{">=", version{}}}, nil
			}
			return []comparator{{">=", lo}, {"<", hi}}, nil
		}
		return []comparator{{">=", lo}, {"<", version{Major: lo.Major, Minor: lo.Minor + 1, Pre: []string{"0"}}}}, nil
	case "^":
		switch {
		case p.major == nil:
			return []comparator{{">=", version{}}}, nil
		case lo.Major > 0 || p.minor == nil:
			return []comparator{{">=", lo}, {"<", version{Major: lo.Major + 1, Pre: []string{"0"}}}}, nil
		case lo.Minor > 0 || p.patch == nil:
			return []comparator{{">=", lo}, {"<", version{Major: 0, Minor: lo.Minor + 1, Pre: []string{"0"}}}}, nil
		}
		return []comparator{{">=", lo}, {"<", version{Patch: lo.Patch + 1, Pre: []string{"0"}}}}, nil
	case ">":
		if p.exact() {
			return []comparator{{">", lo}}, nil
		}
		if !bounded {
			return none, nil
		}
		return []comparator{{">=", hi.release()}}, nil
	case ">=":
		return []comparator{{">=", lo}}, nil
	case "<":
		if !bounded {
			return none, nil
		}
		if p.exact() {
			return []comparator{{"<", lo}}, nil
		}
		return []comparator{{"<", version{Major: lo.Major, Minor: lo.Minor, Patch: lo.Patch, Pre: []string{"0"}}}}, nil
	case "<=":
		if p.exact() {
			return []comparator{{"<=", lo}}, nil
		}
		if !bounded {
			return []comparator{{">=", version{}}}, nil
		}
		return []comparator{{"<", hi}}, nil
	}
	return nil, errors.New("unknown operator")
}

// release is v without its prerelease.
func (v version) release() version { return version{Major: v.Major, Minor: v.Minor, Patch: v.Patch} }
