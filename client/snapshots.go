package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/stockade-sh/stockade/wire"
)

// The wire types of snapshots and forks.
type (
	// SnapshotRequest is the body of SnapshotSession.
	SnapshotRequest = wire.SnapshotRequest
	// Snapshot is a session's snapshot.
	Snapshot = wire.Snapshot
	// ForkRequest is the body of ForkSession.
	ForkRequest = wire.ForkRequest
	// Fork is ForkSession's answer.
	Fork = wire.Fork
)

// SnapshotSession takes a snapshot of session id (its kernel's state and
// /workspace) and leaves it running; StallMS says how long it could not
// run a cell. A session that runs a cell answers an error of class
// ErrConflict (409 session_busy); one whose driver cannot save a sandbox
// (runc) 409 with the reason. CreateSession with SessionRequest.Snapshot
// starts sessions from it.
func (c *Client) SnapshotSession(ctx context.Context, id string, req SnapshotRequest) (*Snapshot, error) {
	var s Snapshot
	if _, err := c.do(ctx, http.MethodPost, sessionPath(id, "snapshots"), nil, req, &s); err != nil {
		return nil, fmt.Errorf("snapshotting session %s: %w", id, err)
	}
	return &s, nil
}

// ListSnapshots lists the live snapshots of session id, newest first.
func (c *Client) ListSnapshots(ctx context.Context, id string) ([]Snapshot, error) {
	var l wire.SnapshotList
	if _, err := c.do(ctx, http.MethodGet, sessionPath(id, "snapshots"), nil, nil, &l); err != nil {
		return nil, fmt.Errorf("listing the snapshots of session %s: %w", id, err)
	}
	return l.Items, nil
}

// DeleteSnapshot deletes snapshot id and its files.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	if _, err := c.do(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(id), nil, nil, nil); err != nil {
		return fmt.Errorf("deleting snapshot %s: %w", id, err)
	}
	return nil
}

// ForkSession starts req.Count new sessions from a snapshot of session
// id, all of them or none: a count out of the server's range answers an
// error of class ErrInvalidArgument, too many sessions for the
// workspace's bound or the memory budget ErrResourceExhausted (429).
func (c *Client) ForkSession(ctx context.Context, id string, req ForkRequest) (*Fork, error) {
	var f Fork
	if _, err := c.do(ctx, http.MethodPost, sessionPath(id, "fork"), nil, req, &f); err != nil {
		return nil, fmt.Errorf("forking session %s: %w", id, err)
	}
	return &f, nil
}
