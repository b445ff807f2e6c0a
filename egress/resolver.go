package egress

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"testing"
)

// Resolver resolves a name to addresses. *net.Resolver implements it. The
// proxy calls it only for names the allowlist allows, and checks every
// address it returns before dialing, so a Resolver needs no trust: a
// hostile or re-bound answer can at worst make a connection fail.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

var _ Resolver = (*net.Resolver)(nil)

// TestOverride maps test names to addresses the proxy would otherwise
// refuse (loopback upstreams started by a test). It exists only inside test
// binaries: NewTestOverride needs the testing.TB of a running test, which
// no other package can fake, and Config.Validate refuses an override
// whenever testing.Testing() is false. Nothing in a configuration file can
// produce one.
type TestOverride struct {
	names map[string][]netip.Addr
}

// NewTestOverride returns an override that resolves each name of names
// (canonical, see CanonicalName) to its addresses and lets the proxy dial
// them although they are loopback or private. Only for tests.
func NewTestOverride(tb testing.TB, names map[string][]netip.Addr) *TestOverride {
	tb.Helper()
	for n := range names {
		if c, ok := CanonicalName(n); !ok || c != n {
			tb.Fatalf("egress.NewTestOverride: %q is not a canonical name", n)
		}
	}
	return &TestOverride{names: maps.Clone(names)}
}

func (o *TestOverride) lookup(name string) ([]netip.Addr, bool) {
	if o == nil {
		return nil, false
	}
	as, ok := o.names[name]
	return as, ok
}

// checkTestOverride refuses an override outside a test binary.
func checkTestOverride(o *TestOverride) error {
	if o != nil && !testing.Testing() {
		return fmt.Errorf("egress: a test resolver override is set outside a test binary; it would let sandboxes reach private addresses")
	}
	return nil
}
