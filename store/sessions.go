package store

import (
	"context"
	"time"

	"github.com/stockade-sh/stockade/model"
)

// Sessions are the records of stateful sessions: a session is a grant of
// many runs in one sandbox, and each of its cells is an execution (with
// model.Execution.SessionID and Cell set) that the Journal admits and
// applies as any other. The journal keeps a session's integrity: a cell is
// admitted only into an active session, one cell at a time, numbered in
// order; a session ends once.
type Sessions interface {
	// OpenSession records a session that starts active, with the events
	// s.Audit, in one transaction. A workspace that already has s.MaxLive
	// active sessions (when MaxLive > 0) is ErrResourceExhausted and
	// nothing is written. When s.IdempotencyKey names a session of the
	// workspace, nothing is written and that session comes back with
	// replayed set; if its RequestSHA256 differs, it is ErrConflict.
	OpenSession(ctx context.Context, s NewSession) (sess model.Session, replayed bool, err error)
	// EndSession ends active or paused session id for the reason e says,
	// with its events, in one transaction. A session that has ended
	// already is ErrConflict and nothing is written; an unknown one
	// ErrNotFound.
	EndSession(ctx context.Context, id string, e SessionEnd) (model.Session, error)
	// PauseSession records that active session id is paused: its sandbox
	// was saved to a checkpoint of p.CheckpointBytes and is gone. A
	// session that is not active, or has a cell that has not ended
	// (awaiting approval, queued or running), is ErrConflict and nothing
	// is written; an unknown one ErrNotFound.
	PauseSession(ctx context.Context, id string, p SessionPause) (model.Session, error)
	// ResumeSession records that paused session id is active again, in
	// sandbox r.SandboxID, its idle timeout counted from r.At and its
	// checkpoint gone (CheckpointBytes 0). A session that is not paused
	// is ErrConflict and nothing is written; an unknown one ErrNotFound.
	ResumeSession(ctx context.Context, id string, r SessionResume) (model.Session, error)
	// GetSession returns session id of the workspace.
	GetSession(ctx context.Context, workspaceID, id string) (model.Session, error)
	// ReplaySession returns the session that API key keyID created with
	// idempotency key key: ErrNotFound when there is none. Idempotency
	// keys are the API key's own: another key's sessions are never found.
	ReplaySession(ctx context.Context, keyID, key string) (model.Session, error)
	// ListSessions lists the workspace's sessions, newest first.
	ListSessions(ctx context.Context, workspaceID string, f SessionFilter) (Page[model.Session], error)
	// ListActiveSessions returns every active session of every
	// workspace, oldest first: what a restarted daemon re-adopts and the
	// lifetime sweep reads.
	ListActiveSessions(ctx context.Context) ([]model.Session, error)
	// PendingCell returns the id of the session's cell that has not ended
	// (awaiting approval, queued or running), or "" when it has none.
	PendingCell(ctx context.Context, sessionID string) (string, error)
	// ListPausedSessions returns every paused session of every
	// workspace, oldest first: what the lifetime sweep ends at their TTL,
	// and whose checkpoints a restarted daemon keeps.
	ListPausedSessions(ctx context.Context) ([]model.Session, error)
	// CountActiveSessions is the number of live sessions of the
	// workspace: active or paused (a paused session holds its place, so
	// that it can always resume).
	CountActiveSessions(ctx context.Context, workspaceID string) (int, error)
	// CheckpointBytes is the disk the workspace's paused sessions'
	// checkpoints and its snapshots (Snapshots) take, in bytes, and how
	// many paused sessions it has.
	CheckpointBytes(ctx context.Context, workspaceID string) (bytes int64, paused int, err error)
}

// NewSession is the record OpenSession creates.
type NewSession struct {
	// ID is the session's id (the capability layer chooses it, so that the
	// sandbox's labels can name it); required.
	ID          string
	WorkspaceID string
	// KeyID is the key that opened it; it must belong to the workspace.
	KeyID     string
	Tool      string
	Runtime   string
	Driver    string
	SandboxID string
	Network   bool
	// Approval is the workspace's approval mode when it opened, which its
	// cells are admitted under.
	Approval model.ApprovalMode
	// ApprovalID, when set, is an approved approval of the workspace that
	// covers its cells from the start: a fork's that inherits its source's
	// under ApprovalPerSession (docs/design.md §10). Approval must then be
	// ApprovalPerSession; the session's ApprovedBy is the approval's
	// decider. Any other approval is ErrInvalidArgument.
	ApprovalID string
	// IdleTimeout ends it when no cell ran for so long (> 0).
	IdleTimeout time.Duration
	// ExpiresAt ends it whatever it does; after At.
	ExpiresAt time.Time
	// WorkspaceBytes is the size of its /workspace.
	WorkspaceBytes int64
	// IdempotencyKey makes a retried creation return the first session;
	// RequestSHA256 fingerprints the request it was made for.
	IdempotencyKey string
	RequestSHA256  string
	// MaxLive bounds the workspace's active sessions, this one counted;
	// zero does not bound them.
	MaxLive int
	// At is its creation time; zero means the store's clock.
	At time.Time
	// Audit events are appended with it (its session.created).
	Audit []model.NewEvent
}

// SessionEnd is how EndSession ends a session.
type SessionEnd struct {
	Reason model.SessionEndReason
	// Detail says in words why it ended, where Reason alone does not
	// (model.Session.EndDetail); empty means nothing more.
	Detail string
	// At is when; zero means the store's clock.
	At    time.Time
	Audit []model.NewEvent
}

// SessionPause is how PauseSession pauses a session.
type SessionPause struct {
	// CheckpointBytes is the size of its checkpoint on disk (>= 0).
	CheckpointBytes int64
	// At is when; zero means the store's clock.
	At    time.Time
	Audit []model.NewEvent
}

// SessionResume is how ResumeSession resumes a session.
type SessionResume struct {
	// SandboxID is the restored sandbox's (required).
	SandboxID string
	// At is when; zero means the store's clock.
	At    time.Time
	Audit []model.NewEvent
}

// SessionFilter selects sessions. Zero fields do not filter.
type SessionFilter struct {
	PageRequest
	States []model.SessionState
}
