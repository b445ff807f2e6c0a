package wire

import "time"

// SnapshotRequest asks for a snapshot of a live session: the body of
// POST /v1/sessions/{id}/snapshots (which may be empty).
type SnapshotRequest struct {
	// Name is the caller's label for it, at most 128 bytes; empty is none.
	Name string `json:"name,omitempty"`
}

// Snapshot is a session's snapshot: its kernel's memory and /workspace,
// saved with the session left running, from which POST /v1/sessions
// {"snapshot": id} starts new sessions of the same workspace. It outlives
// its source session until it is deleted (DELETE /v1/snapshots/{id}) or
// expires.
type Snapshot struct {
	ID        string    `json:"id"`
	SessionID string    `json:"session_id"`
	Name      string    `json:"name,omitempty"`
	Runtime   string    `json:"runtime"`
	Tool      string    `json:"tool"`
	Bytes     int64     `json:"bytes"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
	// StallMS is how long the source could not run a cell while it was
	// saved; set in the answer of the snapshot's creation only.
	StallMS int64 `json:"stall_ms,omitempty"`
}

// SnapshotList is the answer of GET /v1/sessions/{id}/snapshots, newest
// first.
type SnapshotList struct {
	Items []Snapshot `json:"items"`
}

// ForkRequest asks for Count new sessions from a live session's state: the
// body of POST /v1/sessions/{id}/fork. Count is 1 to the server's ceiling
// (sessions.max_forks); every fork starts, or none does.
type ForkRequest struct {
	Count int `json:"count"`
	// IdleTimeoutMS and TTLMS are the forks' lifetimes, as a
	// SessionRequest's; zero takes the server's defaults.
	IdleTimeoutMS int64 `json:"idle_timeout_ms,omitempty"`
	TTLMS         int64 `json:"ttl_ms,omitempty"`
}

// Fork is the answer of POST /v1/sessions/{id}/fork: the new sessions
// (started at once; their order says nothing of when each started), and
// the snapshot they started from (deleted once they started).
type Fork struct {
	SourceID   string    `json:"source_id"`
	SnapshotID string    `json:"snapshot_id"`
	StallMS    int64     `json:"stall_ms"`
	Sessions   []Session `json:"sessions"`
}
