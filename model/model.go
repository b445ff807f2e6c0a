// Package model is Stockade's domain model: workspaces, their API keys and
// roles, the workspace policy, credits and the ledger that moves them,
// executions (a grant of one run, or a session's cell) with their statuses
// and the steps of their lifecycle, approval requests, sessions and audit
// events. It declares types, their states and their small invariants
// (which statuses are terminal, what a role is); it imports nothing of
// Stockade's.
//
// The store persists these types, the policy package decides over a
// Policy, the audit package encodes its events as NewEvents, and the
// capability layer moves an execution through its states (a Step is what
// one transition changes, which the store's Journal applies):
//
//	step := model.Step{From: model.StatusQueued, To: model.StatusRunning, Driver: "runc"}
//	ex, err := journal.Apply(ctx, ex.ID, step)
package model

import (
	"crypto/sha256"
	"encoding/hex"
	"time"
)

// Workspace is a tenant.
type Workspace struct {
	ID        string
	Name      string
	CreatedAt time.Time
}

// Role is what an API key may do.
type Role string

// The roles. An agent may invoke but never decide approvals; an approver may
// decide approvals but not invoke; an admin may do both.
const (
	RoleAgent    Role = "agent"
	RoleApprover Role = "approver"
	RoleAdmin    Role = "admin"
)

// Valid reports whether r is one of the roles.
func (r Role) Valid() bool { return r == RoleAgent || r == RoleApprover || r == RoleAdmin }

// KeyHash is the SHA-256 of an API key. Keys are random and long, so a fast
// hash is enough: there is nothing to brute-force.
type KeyHash [sha256.Size]byte

// HashKey returns the hash under which a key is stored and looked up.
func HashKey(key string) KeyHash { return sha256.Sum256([]byte(key)) }

// String returns the hash in lower-case hex, the form stored.
func (h KeyHash) String() string { return hex.EncodeToString(h[:]) }

// APIKey is a stored key. RevokedAt is zero while the key is active,
// LastUsedAt until a use of it is recorded (the store's RecordKeyUses).
type APIKey struct {
	ID          string
	WorkspaceID string
	Role        Role
	Hash        KeyHash
	Name        string
	CreatedAt   time.Time
	RevokedAt   time.Time
	LastUsedAt  time.Time
}
