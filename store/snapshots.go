package store

import (
	"context"
	"time"

	"github.com/stockade-sh/stockade/model"
)

// Snapshots are the records of sessions' snapshots (model.Snapshot). The
// files are the caller's: the store keeps their rows, which count in the
// workspace's checkpoint bytes (Sessions.CheckpointBytes).
type Snapshots interface {
	// CreateSnapshot records a snapshot with its events, in one
	// transaction. An unknown session of the workspace is ErrNotFound.
	CreateSnapshot(ctx context.Context, n NewSnapshot) (model.Snapshot, error)
	// GetSnapshot returns snapshot id of the workspace; another
	// workspace's is ErrNotFound.
	GetSnapshot(ctx context.Context, workspaceID, id string) (model.Snapshot, error)
	// ListSnapshots lists the workspace's snapshots of session sessionID,
	// newest first (at most MaxPageLimit).
	ListSnapshots(ctx context.Context, workspaceID, sessionID string) ([]model.Snapshot, error)
	// DeleteSnapshot deletes snapshot id of the workspace with its
	// events, in one transaction, and returns it; ErrNotFound when it is
	// not there.
	DeleteSnapshot(ctx context.Context, workspaceID, id string, audit []model.NewEvent) (model.Snapshot, error)
	// ListExpiredSnapshots returns the snapshots of every workspace whose
	// ExpiresAt is not after now, oldest first, at most MaxPageLimit.
	ListExpiredSnapshots(ctx context.Context, now time.Time) ([]model.Snapshot, error)
	// HasSnapshot reports whether snapshot id of any workspace is
	// recorded: what the daemon asks of a snapshot directory it finds.
	HasSnapshot(ctx context.Context, id string) (bool, error)
}

// NewSnapshot is a snapshot to record.
type NewSnapshot struct {
	ID, WorkspaceID, SessionID, KeyID string
	Name                              string
	Tool, Runtime, Driver             string
	Dir                               string
	Bytes                             int64
	// At is when it was taken; zero means the store's clock.
	At        time.Time
	ExpiresAt time.Time
	Audit     []model.NewEvent
}
