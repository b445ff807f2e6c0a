// Code generated for the move to package model; DO NOT EDIT.

package store

import "github.com/stockade-sh/stockade/model"

// The domain types moved to package model, kept here under their old names
// until every reference names model (the next commit rewrites them and
// removes this file).
type (
	Workspace         = model.Workspace
	Role              = model.Role
	KeyHash           = model.KeyHash
	APIKey            = model.APIKey
	ApprovalMode      = model.ApprovalMode
	ToolChangeMode    = model.ToolChangeMode
	Policy            = model.Policy
	Credits           = model.Credits
	ReservationStatus = model.ReservationStatus
	Reservation       = model.Reservation
	LedgerKind        = model.LedgerKind
	LedgerEntry       = model.LedgerEntry
	ExecutionStatus   = model.ExecutionStatus
	Execution         = model.Execution
	Step              = model.Step
	CreditMove        = model.CreditMove
	ApprovalChange    = model.ApprovalChange
	Output            = model.Output
	ToolCall          = model.ToolCall
	ToolInvocation    = model.ToolInvocation
	ApprovalStatus    = model.ApprovalStatus
	Approval          = model.Approval
	NewEvent          = model.NewEvent
	Event             = model.Event
	ChainHead         = model.ChainHead
	BrokenLink        = model.BrokenLink
	SessionState      = model.SessionState
	SessionEndReason  = model.SessionEndReason
	Session           = model.Session
)

// The moved constants.
const (
	RoleAgent                = model.RoleAgent
	RoleApprover             = model.RoleApprover
	RoleAdmin                = model.RoleAdmin
	ApprovalRequired         = model.ApprovalRequired
	ApprovalNone             = model.ApprovalNone
	ApprovalPerSession       = model.ApprovalPerSession
	ToolChangesFlag          = model.ToolChangesFlag
	ToolChangesRequireReview = model.ToolChangesRequireReview
	ReservationOpen          = model.ReservationOpen
	ReservationCommitted     = model.ReservationCommitted
	ReservationReleased      = model.ReservationReleased
	LedgerGrant              = model.LedgerGrant
	LedgerReserve            = model.LedgerReserve
	LedgerCommit             = model.LedgerCommit
	LedgerRelease            = model.LedgerRelease
	StatusQueued             = model.StatusQueued
	StatusAwaitingApproval   = model.StatusAwaitingApproval
	StatusRunning            = model.StatusRunning
	StatusSucceeded          = model.StatusSucceeded
	StatusFailed             = model.StatusFailed
	StatusTimedOut           = model.StatusTimedOut
	StatusOOMKilled          = model.StatusOOMKilled
	StatusKilled             = model.StatusKilled
	StatusDenied             = model.StatusDenied
	StatusApprovalExpired    = model.StatusApprovalExpired
	StatusLaunchFailed       = model.StatusLaunchFailed
	StatusCancelled          = model.StatusCancelled
	PreviewLimit             = model.PreviewLimit
	ApprovalPending          = model.ApprovalPending
	ApprovalApproved         = model.ApprovalApproved
	ApprovalDenied           = model.ApprovalDenied
	ApprovalExpired          = model.ApprovalExpired
	ApprovalCancelled        = model.ApprovalCancelled
	SessionActive            = model.SessionActive
	SessionPaused            = model.SessionPaused
	SessionEnded             = model.SessionEnded
	EndClosed                = model.EndClosed
	EndIdle                  = model.EndIdle
	EndTTL                   = model.EndTTL
	EndInterrupted           = model.EndInterrupted
	EndFailed                = model.EndFailed
)

// The moved variables and functions.
var (
	ExecutionStatuses = model.ExecutionStatuses
	HashKey           = model.HashKey
	DefaultPolicy     = model.DefaultPolicy
)
