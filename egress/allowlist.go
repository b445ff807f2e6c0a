package egress

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/net/publicsuffix"
)

// Allowlist is a tool's egress line compiled for lookups: domain names,
// exact or "*." wildcards, and ports. The zero Allowlist allows nothing. It
// is immutable and safe for concurrent use.
type Allowlist struct {
	exact    map[string]bool
	suffixes []string // ".example.com" for "*.example.com"
	ports    []int
}

// NewAllowlist compiles names and ports. A name is a lower-case fully
// qualified domain name, or "*." followed by one that is not a public
// suffix (see IsPublicSuffix); "*.example.com" matches every name below
// example.com, not example.com itself. IP addresses, bare wildcards,
// wildcards over public suffixes and ports out of 1-65535 are refused:
// tools.Validate refuses them in records already, and this is the last
// line.
func NewAllowlist(names []string, ports []int) (*Allowlist, error) {
	a := &Allowlist{exact: map[string]bool{}}
	for _, n := range names {
		base, wild := strings.CutPrefix(n, "*.")
		c, ok := CanonicalName(base)
		if !ok || c != base || strings.Count(base, ".") < 1 {
			return nil, fmt.Errorf("allowlist entry %q is not a domain name or a \"*.\" wildcard over one", n)
		}
		if wild && IsPublicSuffix(base) {
			return nil, fmt.Errorf("allowlist entry %q is a wildcard over the public suffix %s", n, base)
		}
		if wild {
			a.suffixes = append(a.suffixes, "."+base)
		} else {
			a.exact[base] = true
		}
	}
	for _, p := range ports {
		if p < 1 || p > 65535 {
			return nil, fmt.Errorf("allowlist port %d is out of range 1-65535", p)
		}
		if !slices.Contains(a.ports, p) {
			a.ports = append(a.ports, p)
		}
	}
	return a, nil
}

// IsPublicSuffix reports whether name (canonical) is a public suffix of the
// Public Suffix List (golang.org/x/net/publicsuffix), in its ICANN section
// (com, co.uk, com.au) or its private one (github.io, s3.amazonaws.com):
// a name below which anyone can register names of their own, so that a
// wildcard over it would allow names of every registrant. A single label
// that the list does not know is a public suffix too (the list's "*"
// rule).
func IsPublicSuffix(name string) bool {
	suffix, _ := publicsuffix.PublicSuffix(name)
	return suffix == name
}

// AllowsName reports whether name (canonical, see CanonicalName) is listed.
func (a *Allowlist) AllowsName(name string) bool {
	if a == nil {
		return false
	}
	if a.exact[name] {
		return true
	}
	for _, s := range a.suffixes {
		if strings.HasSuffix(name, s) && len(name) > len(s) {
			return true
		}
	}
	return false
}

// AllowsPort reports whether port is listed.
func (a *Allowlist) AllowsPort(port int) bool {
	return a != nil && slices.Contains(a.ports, port)
}

// Ports returns the allowed ports.
func (a *Allowlist) Ports() []int {
	if a == nil {
		return nil
	}
	return slices.Clone(a.ports)
}

// Empty reports whether the allowlist allows no name at all.
func (a *Allowlist) Empty() bool {
	return a == nil || (len(a.exact) == 0 && len(a.suffixes) == 0)
}

// CanonicalName lower-cases s and drops one trailing dot, and reports
// whether the result is a syntactically valid DNS host name (letters,
// digits, hyphens and dots; labels of 1-63 characters; at most 253 in all)
// that is not an IP address. Names arriving in SNI, Host headers, CONNECT
// lines and DNS questions all go through it before any allowlist lookup, so
// that "Example.COM." and "example.com" are one name.
func CanonicalName(s string) (string, bool) {
	s = strings.ToLower(strings.TrimSuffix(s, "."))
	if s == "" || len(s) > 253 {
		return "", false
	}
	if _, err := netip.ParseAddr(s); err == nil {
		return s, false
	}
	for _, label := range strings.Split(s, ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return "", false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", false
			}
		}
	}
	// "127.1", "2130706433" and "0x7f.1" are IPv4 addresses to many
	// resolvers and libraries, never names.
	if isIPLiteral(s) {
		return "", false
	}
	return s, true
}

// isIPLiteral reports whether host is an IP address in any notation a
// client might send: dotted, bracketed IPv6, or a numeric IPv4 form such as
// "2130706433", "127.1" or "0x7f.1", whose last label is all digits or hex.
// An empty last label ("name..") is no number: such a host is an invalid
// name, not an IP literal.
func isIPLiteral(host string) bool {
	h := strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	if h == "" {
		return false
	}
	last := h[strings.LastIndexByte(h, '.')+1:]
	return last != "" && strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x")
}
