package store

import (
	"context"
	"time"
)

// E2BSandbox is what the E2B wire (package e2b) keeps of a session it
// opened beyond the session itself: the creating key, the template
// asked for, the metadata (a JSON object of strings) and the end E2B's
// timeout sets.
type E2BSandbox struct {
	SessionID   string
	WorkspaceID string
	KeyID       string
	Role        string
	Template    string
	Metadata    map[string]string
	// Envs is the environment every command and cell of it gets.
	Envs map[string]string
	// OnTimeout is what its end does: "kill" (end the session) or
	// "pause" (E2B's autoPause); empty is kill.
	OnTimeout string
	EndAt     time.Time
	CreatedAt time.Time
}

// E2BSandboxes stores E2BSandbox rows. GetE2BSandbox takes no workspace:
// the data plane resolves a sandbox id before it knows whose it is, and
// checks the workspace itself. Unknown ids are ErrNotFound.
type E2BSandboxes interface {
	PutE2BSandbox(ctx context.Context, sb E2BSandbox) error
	GetE2BSandbox(ctx context.Context, sessionID string) (E2BSandbox, error)
	SetE2BEndAt(ctx context.Context, workspaceID, sessionID string, end time.Time) error
	// ListE2BSandboxes lists a workspace's rows, newest first, at most
	// limit (<= 0: 1000).
	ListE2BSandboxes(ctx context.Context, workspaceID string, limit int) ([]E2BSandbox, error)
	// DueE2BSandboxes lists, of every workspace, the rows whose end is
	// at or before at and whose session is active, at most limit, the
	// soonest first (a far at lists the running ones).
	DueE2BSandboxes(ctx context.Context, at time.Time, limit int) ([]E2BSandbox, error)
}
