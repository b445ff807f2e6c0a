// Package audit names Stockade's audit events. Every event has a type (what
// happened) and a stable code (for queries and alerts that must survive a
// rename), as in Teleport's lib/events/codes.go. Events are stored in the
// workspace's tamper-evident chain (store.Audit).
package audit

// Event types and their codes.
const (
	InvokeAllowed     = "capability.invoke_allowed"
	InvokeAllowedCode = "CAP001I"
	InvokeDenied      = "capability.invoke_denied"
	InvokeDeniedCode  = "CAP002W"

	ApprovalRequested     = "approval.requested"
	ApprovalRequestedCode = "APR001I"
	ApprovalApproved      = "approval.approved"
	ApprovalApprovedCode  = "APR002I"
	ApprovalDenied        = "approval.denied"
	ApprovalDeniedCode    = "APR003W"
	ApprovalExpired       = "approval.expired"
	ApprovalExpiredCode   = "APR004W"

	ExecutionFinished      = "execution.finished"
	ExecutionFinishedCode  = "EXE001I"
	ExecutionRecovered     = "execution.recovered"
	ExecutionRecoveredCode = "EXE002W"
	// ExecutionCancelled is an execution cancelled by the key that
	// invoked it or an admin key; its data is ExecutionCancelledData.
	ExecutionCancelled     = "execution.cancelled"
	ExecutionCancelledCode = "EXE003I"

	ToolRegistered         = "tool.registered"
	ToolRegisteredCode     = "TOL001I"
	ToolChanged            = "tool.changed"
	ToolChangedCode        = "TOL002W"
	ToolRemoved            = "tool.removed"
	ToolRemovedCode        = "TOL003I"
	ToolReviewApproved     = "tool.review_approved"
	ToolReviewApprovedCode = "TOL004I"

	// EgressDenied is a connection or DNS question of a sandbox that the
	// egress proxy refused; Reason is the proxy's stable reason.
	EgressDenied     = "egress.denied"
	EgressDeniedCode = "EGR001W"
	// RefusalsSuppressed counts the refusals of an execution (egress
	// proxy and broker) past the ones audited one by one.
	RefusalsSuppressed     = "egress.refusals_suppressed"
	RefusalsSuppressedCode = "EGR002W"
	BrokerCall             = "broker.call"
	BrokerCallCode         = "BRK001I"
	BrokerDenied           = "broker.denied"
	BrokerDeniedCode       = "BRK002W"

	WorkspaceCreated     = "workspace.created"
	WorkspaceCreatedCode = "ADM001I"
	KeyCreated           = "key.created"
	KeyCreatedCode       = "ADM002I"
	CreditsGranted       = "credits.granted"
	CreditsGrantedCode   = "ADM003I"
	PolicyUpdated        = "policy.updated"
	PolicyUpdatedCode    = "ADM004I"
	KeyRevoked           = "key.revoked"
	KeyRevokedCode       = "ADM005I"
)

// ExecutionCancelledData is the data of an ExecutionCancelled event, in
// the chain with the cancel it records (one transaction).
type ExecutionCancelledData struct {
	// From is the status the execution was cancelled in:
	// awaiting_approval, queued or running.
	From string `json:"from"`
	// To is the status it ended in: cancelled, or killed for a running
	// one, whose sandbox was destroyed.
	To string `json:"to"`
	// Credits is what the execution was charged: 0, or the price of an
	// invocation for a running one (it launched).
	Credits int64 `json:"credits"`
	// ApprovalID is the approval request the cancel closed, if any.
	ApprovalID string `json:"approval_id,omitempty"`
}
