package sandbox

import (
	"crypto/rand"
	"encoding/binary"
)

// Sandboxes with a user namespace of their own (see
// Capabilities.UserNamespace) take their host ids from
// [FirstHostID, FirstHostID + 2*HostIDSlots): two per sandbox at a random
// slot, the base for root inside and base+1 for the sandbox user (the same
// for gids). No account lives there; distinct ids keep sandboxes apart in
// the kernel's per-user accounting (pipe buffers, inotify instances,
// pending signals, process counts), which all sandboxes would otherwise
// share as the host's nobody. Two sandboxes meet on a slot once in about a
// million.
const (
	FirstHostID = 1 << 30
	HostIDSlots = 1 << 20
)

// RandomHostIDBase returns the base of a random slot.
func RandomHostIDBase() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return FirstHostID + 2*(binary.LittleEndian.Uint32(b[:])%HostIDSlots)
}
