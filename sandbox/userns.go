package sandbox

// Sandboxes with a user namespace of their own (see
// Capabilities.UserNamespace) take their host ids from
// [FirstHostID, FirstHostID + 2*HostIDSlots): two per sandbox, a slot's
// base for root inside and base+1 for the sandbox user (the same for
// gids). No account lives there; distinct ids keep sandboxes apart in the
// kernel's per-user accounting (pipe buffers, inotify instances, pending
// signals, process counts), which all sandboxes would otherwise share as
// the host's nobody. internal/hostids hands the slots out so that no two
// live sandboxes share one.
const (
	FirstHostID = 1 << 30
	HostIDSlots = 1 << 20
)
