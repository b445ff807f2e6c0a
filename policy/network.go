package policy

import (
	"github.com/stockade-sh/stockade/errdefs"
)

// The words for network, the same in the API (an invocation's "network",
// a policy's and an approval card's), the CLI (policy set --network) and
// the audit trail: a request asks for network with NetworkAllow, and a
// workspace policy allows or denies it.
const (
	NetworkAllow = "allow"
	NetworkDeny  = "deny"
)

// ParseNetwork reads a network word: "allow", or "deny" (also ""). The
// older "allowed" and "denied" (the policy's flag before the words were
// one pair) are accepted as the same words.
func ParseNetwork(v string) (allow bool, err error) {
	switch v {
	case NetworkAllow, "allowed":
		return true, nil
	case "", NetworkDeny, "denied":
		return false, nil
	}
	return false, errdefs.Publicf(`network must be "allow" or "deny", got %q: %w`, v, errdefs.ErrInvalidArgument)
}

// NetworkWord is the word for allow: NetworkAllow or NetworkDeny.
func NetworkWord(allow bool) string {
	if allow {
		return NetworkAllow
	}
	return NetworkDeny
}
