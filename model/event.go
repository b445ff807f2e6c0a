package model

import (
	"encoding/json"
	"time"
)

// NewEvent is the input of the store's AppendEvent. Outside the store's
// own tests it comes from audit.NewEvent, which encodes an event's struct
// as its Data.
type NewEvent struct {
	// WorkspaceID names the chain; empty is the unattributed chain.
	WorkspaceID string
	// Type is the event's name, e.g. "capability.invoke_denied"; required.
	Type string
	// Code is the event's stable code, e.g. "CAP002W".
	Code string
	// Actor is who caused the event: an API key id, "system" or "cli".
	Actor       string
	Reason      string
	ExecutionID string
	// Data is the event's typed payload (JSON); it may be nil. Its bytes are
	// stored and hashed exactly as given.
	Data json.RawMessage
	// Time defaults to the store's clock.
	Time time.Time
}

// Event is a stored audit event, a link of its workspace's hash chain.
type Event struct {
	ID          string
	WorkspaceID string
	// Seq numbers the chain from 1 without gaps.
	Seq         int64
	Type        string
	Code        string
	Actor       string
	Reason      string
	ExecutionID string
	Data        json.RawMessage
	Time        time.Time
	// PrevHash is the Hash of event Seq-1, empty for Seq 1.
	PrevHash string
	// Hash is store.ChainHash of this event, lower-case hex.
	Hash string
}

// ChainHead is the last link of a chain.
type ChainHead struct {
	WorkspaceID string
	Seq         int64
	Hash        string
}

// BrokenLink locates the first place where a chain does not verify.
type BrokenLink struct {
	WorkspaceID string
	// Seq is the sequence number where the chain breaks: the first row that
	// does not verify, or the first missing one.
	Seq int64
	// EventID is the row found at Seq, empty when the row is missing.
	EventID string
	// Reason says what does not match, e.g. "hash mismatch".
	Reason string
}
