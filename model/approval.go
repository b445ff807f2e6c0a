package model

import (
	"encoding/json"
	"time"
)

// ApprovalStatus is the state of an approval request.
type ApprovalStatus string

// The approval states. Pending moves to one of the others exactly once.
const (
	ApprovalPending  ApprovalStatus = "pending"
	ApprovalApproved ApprovalStatus = "approved"
	ApprovalDenied   ApprovalStatus = "denied"
	ApprovalExpired  ApprovalStatus = "expired"
	// ApprovalCancelled: its execution was cancelled before anyone
	// decided; Reason is the cancel's.
	ApprovalCancelled ApprovalStatus = "cancelled"
)

// Valid reports whether s is one of the approval states.
func (s ApprovalStatus) Valid() bool {
	switch s {
	case ApprovalPending, ApprovalApproved, ApprovalDenied, ApprovalExpired, ApprovalCancelled:
		return true
	}
	return false
}

// Approval is one approval request. DecidedBy and DecidedAt are empty while
// pending and for expired and cancelled requests.
type Approval struct {
	ID          string
	ExecutionID string
	WorkspaceID string
	Status      ApprovalStatus
	Card        json.RawMessage
	RequestedAt time.Time
	ExpiresAt   time.Time
	DecidedBy   string
	DecidedAt   time.Time
	Reason      string
}
