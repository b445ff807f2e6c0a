package model

import "time"

// SessionState is where a session is.
type SessionState string

// The session states.
const (
	SessionActive SessionState = "active"
	// SessionPaused: its sandbox is saved to a checkpoint and gone until
	// it resumes.
	SessionPaused SessionState = "paused"
	SessionEnded  SessionState = "ended"
)

// SessionEndReason says why a session ended.
type SessionEndReason string

// The reasons a session ends.
const (
	// EndClosed: its key (or an admin) closed it.
	EndClosed SessionEndReason = "closed"
	// EndIdle: no cell ran for its idle timeout.
	EndIdle SessionEndReason = "idle_timeout"
	// EndTTL: its hard lifetime ran out.
	EndTTL SessionEndReason = "ttl"
	// EndInterrupted: its daemon did not keep it: a restarted daemon found
	// no live sandbox for it, or a daemon stopped for good ended it.
	EndInterrupted SessionEndReason = "interrupted"
	// EndFailed: its sandbox or kernel was lost and could not be started
	// again.
	EndFailed SessionEndReason = "failed"
)

// Valid reports whether r is one of the reasons.
func (r SessionEndReason) Valid() bool {
	switch r {
	case EndClosed, EndIdle, EndTTL, EndInterrupted, EndFailed:
		return true
	}
	return false
}

// Session is a session's record. Times not reached yet are zero.
type Session struct {
	ID          string
	WorkspaceID string
	KeyID       string
	Tool        string
	Runtime     string
	Driver      string
	SandboxID   string
	Network     bool
	State       SessionState
	// EndReason and EndedAt are set once it ended; EndDetail, when not
	// empty, says in words a user reads why, where EndReason alone does
	// not: an interrupted session whose daemon stopped or restarted, and
	// whose driver cannot re-attach a sandbox, or whose sandbox the
	// restarted daemon did not find.
	EndReason SessionEndReason
	EndDetail string
	EndedAt   time.Time
	// Approval is the approval mode its cells are admitted under.
	Approval ApprovalMode
	// ApprovalID is the approval that covers its cells under
	// ApprovalPerSession, and ApprovedBy the key that decided it; empty
	// until its first cell is approved.
	ApprovalID     string
	ApprovedBy     string
	IdleTimeout    time.Duration
	CreatedAt      time.Time
	ExpiresAt      time.Time
	LastActiveAt   time.Time
	Cells          int
	WorkspaceBytes int64
	IdempotencyKey string
	RequestSHA256  string
	// PausedAt is when it was paused and CheckpointBytes the size of its
	// checkpoint; zero unless it is paused.
	PausedAt        time.Time
	CheckpointBytes int64
}

// IdleExpiresAt is when the session ends unless a cell runs before.
func (s Session) IdleExpiresAt() time.Time { return s.LastActiveAt.Add(s.IdleTimeout) }
