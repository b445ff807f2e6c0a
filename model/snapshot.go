package model

import "time"

// Snapshot is a live session's saved state (its kernel's memory and
// /workspace), taken with the session left running, from which new
// sessions of the same workspace start. It outlives its source session:
// it goes when it is deleted or at ExpiresAt.
type Snapshot struct {
	ID          string
	WorkspaceID string
	// SessionID is the session it was taken of; KeyID the key that took
	// it.
	SessionID string
	KeyID     string
	// Name is the caller's, "" when none was given.
	Name string
	// Tool, Runtime and Driver are its source session's, which the
	// sessions started from it run as.
	Tool, Runtime, Driver string
	// Dir is where it is kept on the host (never answered to a client).
	Dir string
	// Bytes is the disk it takes.
	Bytes     int64
	CreatedAt time.Time
	ExpiresAt time.Time
}
