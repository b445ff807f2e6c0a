package audit

import "github.com/stockade-sh/stockade/model"

// The events of a session's life; its cells are executions, audited as
// any execution is.
const (
	SessionCreated             = "session.created"
	SessionCreatedCode         = "SES001I"
	SessionEnded               = "session.ended"
	SessionEndedCode           = "SES002I"
	SessionFileTransferred     = "session.file_transferred"
	SessionFileTransferredCode = "SES003I"
	SessionPaused              = "session.paused"
	SessionPausedCode          = "SES004I"
	SessionResumed             = "session.resumed"
	SessionResumedCode         = "SES005I"
)

// SessionCreatedEvent is a session opened, written with its record.
type SessionCreatedEvent struct {
	Meta `json:"-"`
	// Approval is the approval mode its cells are admitted under.
	Approval      model.ApprovalMode `json:"approval"`
	Driver        string             `json:"driver"`
	ExpiresAt     string             `json:"expires_at"`
	IdleTimeoutMS int64              `json:"idle_timeout_ms"`
	Network       string             `json:"network"`
	Runtime       string             `json:"runtime"`
	SandboxID     string             `json:"sandbox_id"`
	SessionID     string             `json:"session_id"`
	Tool          string             `json:"tool"`
	// WorkspaceBytes is the size of its /workspace.
	WorkspaceBytes int64 `json:"workspace_bytes"`
}

func (SessionCreatedEvent) Type() string { return SessionCreated }
func (SessionCreatedEvent) Code() string { return SessionCreatedCode }

// SessionEndedEvent is a session's end, written with it; its sandbox is
// destroyed.
type SessionEndedEvent struct {
	Meta      `json:"-"`
	Cells     int                    `json:"cells"`
	EndReason model.SessionEndReason `json:"end_reason"`
	SessionID string                 `json:"session_id"`
}

func (SessionEndedEvent) Type() string { return SessionEnded }
func (SessionEndedEvent) Code() string { return SessionEndedCode }

// The directions of a file transfer.
const (
	TransferIn  = "in"
	TransferOut = "out"
	// TransferRemoved is a file removed from the session's /workspace.
	TransferRemoved = "removed"
)

// SessionFileTransferredEvent is a file moved into or out of a session's
// /workspace (or removed from it) through the files API. Transfers are not
// charged.
type SessionFileTransferredEvent struct {
	Meta      `json:"-"`
	Direction string `json:"direction"`
	Path      string `json:"path"`
	SessionID string `json:"session_id"`
	// SHA256 is the hex SHA-256 of the bytes moved; empty for a removal.
	SHA256 string `json:"sha256,omitempty"`
	Size   int64  `json:"size"`
}

func (SessionFileTransferredEvent) Type() string { return SessionFileTransferred }
func (SessionFileTransferredEvent) Code() string { return SessionFileTransferredCode }

// SessionPausedEvent is a session paused, written with its state: its
// sandbox was saved to a checkpoint of CheckpointBytes on disk and ended.
// Actor is the key that paused it, or "system" for pause_after_idle.
type SessionPausedEvent struct {
	Meta            `json:"-"`
	CheckpointBytes int64  `json:"checkpoint_bytes"`
	SandboxID       string `json:"sandbox_id"`
	SessionID       string `json:"session_id"`
}

func (SessionPausedEvent) Type() string { return SessionPaused }
func (SessionPausedEvent) Code() string { return SessionPausedCode }

// SessionResumedEvent is a paused session served again, from its
// checkpoint, in a new sandbox (SandboxID); its checkpoint is deleted.
// PausedMS is how long it was paused.
type SessionResumedEvent struct {
	Meta      `json:"-"`
	PausedMS  int64  `json:"paused_ms"`
	SandboxID string `json:"sandbox_id"`
	SessionID string `json:"session_id"`
}

func (SessionResumedEvent) Type() string { return SessionResumed }
func (SessionResumedEvent) Code() string { return SessionResumedCode }
