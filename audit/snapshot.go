package audit

// The events of sessions' snapshots and forks (docs/design.md §10).
const (
	SessionSnapshotted     = "session.snapshotted"
	SessionSnapshottedCode = "SES006I"
	SessionForked          = "session.forked"
	SessionForkedCode      = "SES007I"
	SnapshotDeleted        = "session.snapshot_deleted"
	SnapshotDeletedCode    = "SES008I"
)

// SessionSnapshottedEvent is a snapshot of a live session taken with its
// sandbox left running (or of a paused session, from its checkpoint),
// written with the snapshot's record. StallMS is how long the source
// could not run a cell (0 for a paused one). Snapshots are not charged.
type SessionSnapshottedEvent struct {
	Meta       `json:"-"`
	Bytes      int64  `json:"bytes"`
	ExpiresAt  string `json:"expires_at"`
	Name       string `json:"name,omitempty"`
	SessionID  string `json:"session_id"`
	SnapshotID string `json:"snapshot_id"`
	StallMS    int64  `json:"stall_ms"`
}

func (SessionSnapshottedEvent) Type() string { return SessionSnapshotted }
func (SessionSnapshottedEvent) Code() string { return SessionSnapshottedCode }

// SessionForkedEvent is a session started from a snapshot: a fork of
// SourceID (POST /v1/sessions/{id}/fork, whose snapshot is deleted once
// its forks started) or a start from a named snapshot (POST /v1/sessions
// with snapshot). It follows the new session's session.created. Under
// approval per_session its first cell is approved anew, unless the
// workspace's policy has fork_approval inherit and an approval covered
// the source when the snapshot was taken: ApprovalID is then that
// approval, which covers the new session's cells from the start, and
// Reason says it was inherited from SourceID (docs/design.md §10).
type SessionForkedEvent struct {
	Meta       `json:"-"`
	ApprovalID string `json:"approval_id,omitempty"`
	SessionID  string `json:"session_id"`
	SnapshotID string `json:"snapshot_id"`
	SourceID   string `json:"source_id"`
}

func (SessionForkedEvent) Type() string { return SessionForked }
func (SessionForkedEvent) Code() string { return SessionForkedCode }

// SnapshotDeletedEvent is a snapshot deleted, by its workspace's key or at
// its expiry (Actor "system"), with its files.
type SnapshotDeletedEvent struct {
	Meta       `json:"-"`
	SessionID  string `json:"session_id"`
	SnapshotID string `json:"snapshot_id"`
}

func (SnapshotDeletedEvent) Type() string { return SnapshotDeleted }
func (SnapshotDeletedEvent) Code() string { return SnapshotDeletedCode }
