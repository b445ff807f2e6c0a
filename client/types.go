package client

import "github.com/stockade-sh/stockade/wire"

// The API's types are declared once, in package wire, which the server
// encodes and the client decodes; these names are the client's for them.

// ExecutionStatus is where an execution is in its life.
type ExecutionStatus = wire.ExecutionStatus

// The execution statuses. Every status but the first three is final.
const (
	StatusQueued           = wire.StatusQueued
	StatusAwaitingApproval = wire.StatusAwaitingApproval
	StatusRunning          = wire.StatusRunning
	StatusSucceeded        = wire.StatusSucceeded
	StatusFailed           = wire.StatusFailed
	StatusTimedOut         = wire.StatusTimedOut
	StatusOOMKilled        = wire.StatusOOMKilled
	StatusKilled           = wire.StatusKilled
	StatusDenied           = wire.StatusDenied
	StatusApprovalExpired  = wire.StatusApprovalExpired
	StatusLaunchFailed     = wire.StatusLaunchFailed
	StatusCancelled        = wire.StatusCancelled
)

// The approval statuses.
const (
	ApprovalPending   = wire.ApprovalPending
	ApprovalApproved  = wire.ApprovalApproved
	ApprovalDenied    = wire.ApprovalDenied
	ApprovalExpired   = wire.ApprovalExpired
	ApprovalCancelled = wire.ApprovalCancelled
)

type (
	// ExecutionRequest is what to run (POST /v1/executions).
	ExecutionRequest = wire.ExecutionRequest
	// Execution is an execution as the API shows it.
	Execution = wire.Execution
	// Result is how a run ended.
	Result = wire.Result
	// ApprovalCard is what an approver is shown of a request.
	ApprovalCard = wire.ApprovalCard
	// ApprovalStatus is where an approval request is.
	ApprovalStatus = wire.ApprovalStatus
	// Approval is an approval request.
	Approval = wire.Approval
	// Decision is the answer of Approve and Deny.
	Decision = wire.Decision
	// AuditEvent is one event of the workspace's audit trail.
	AuditEvent = wire.AuditEvent
	// ToolCall is a tool_calls row.
	ToolCall = wire.ToolCall
	// Workspace is the key's workspace: its policy and credit balance.
	Workspace = wire.Workspace
	// Policy is a workspace's policy.
	Policy = wire.Policy
	// Tool is a tool and its isolation record.
	Tool = wire.Tool
	// Health is the daemon's health.
	Health = wire.Health
	// SessionRequest asks for a session (POST /v1/sessions).
	SessionRequest = wire.SessionRequest
	// Session is a session as the API shows it.
	Session = wire.Session
	// CellRequest is a cell to run in a session.
	CellRequest = wire.CellRequest
	// Cell is a cell's outcome.
	Cell = wire.Cell
	// CellOutput is one rich output of a cell.
	CellOutput = wire.CellOutput
	// CellError is an exception a cell raised.
	CellError = wire.CellError
	// FileEntry is one entry of a session directory's listing.
	FileEntry = wire.FileEntry
	// FileInfo is a file moved into a session.
	FileInfo = wire.FileInfo
)

// Page is one page of a list; Next is the cursor of the next page, empty
// on the last.
type Page[T any] = wire.Page[T]
