package model

import "time"

// ApprovalMode says whether invocations wait for a human.
type ApprovalMode string

// The approval modes. The zero value is stored as ApprovalRequired.
const (
	ApprovalRequired ApprovalMode = "required"
	ApprovalNone     ApprovalMode = "none"
	// ApprovalPerSession asks for an approval of a session's first cell,
	// which then covers its later cells; a one-shot execution waits for
	// one as under ApprovalRequired.
	ApprovalPerSession ApprovalMode = "per_session"
)

// ToolChangeMode says what a change of a tool's isolation record does.
type ToolChangeMode string

// The tool change modes. The zero value is stored as ToolChangesFlag.
const (
	// ToolChangesFlag audits every change and flags growth of an allowlist
	// review_required; the tool stays enabled.
	ToolChangesFlag ToolChangeMode = "flag"
	// ToolChangesRequireReview also disables a changed tool until an
	// approver re-approves it.
	ToolChangesRequireReview ToolChangeMode = "require_review"
)

// ForkApprovalMode says whether a session started from a snapshot (a
// fork) is covered by its source's approval under ApprovalPerSession.
type ForkApprovalMode string

// The fork approval modes. The zero value is stored as ForkApprovalAnew.
const (
	// ForkApprovalAnew makes a fork's first cell wait for an approval of
	// its own: an approval covers the session it was given for.
	ForkApprovalAnew ForkApprovalMode = "anew"
	// ForkApprovalInherit makes a fork inherit the approval that covered
	// its source when the snapshot was taken, if one did; a fork of an
	// uncovered source is approved anew.
	ForkApprovalInherit ForkApprovalMode = "inherit"
)

// Policy is a workspace's policy record. Its zero value is the most
// restrictive policy: no code execution, approval required, no network, no
// runtime allowed.
type Policy struct {
	// CodeExecution allows code.execute at all; false refuses every
	// invocation.
	CodeExecution bool
	// Approval is ApprovalRequired (also the meaning of ""), ApprovalNone
	// or ApprovalPerSession.
	Approval ApprovalMode
	// NetworkAllowed makes "network: allow" permissible; false denies it.
	NetworkAllowed bool
	// MaxTimeout lowers the server's wall-clock ceiling for this workspace;
	// zero leaves the server's ceiling in force. It never raises it. It is
	// stored in whole milliseconds.
	MaxTimeout time.Duration
	// Runtimes lists the allowed runtimes ("python", "node", "shell"); empty
	// allows none.
	Runtimes []string
	// ToolChanges is ToolChangesFlag (also the meaning of "") or
	// ToolChangesRequireReview.
	ToolChanges ToolChangeMode
	// MaxSessions bounds the workspace's live sessions; zero leaves the
	// server's bound in force. It never raises it.
	MaxSessions int
	// ForkApproval is ForkApprovalAnew (also the meaning of "") or
	// ForkApprovalInherit; it matters under ApprovalPerSession only.
	ForkApproval ForkApprovalMode
	// UpdatedAt is set by the store.
	UpdatedAt time.Time
}

// RequiresApproval reports whether invocations must wait for a decision.
func (p Policy) RequiresApproval() bool { return p.Approval != ApprovalNone }

// DefaultPolicy is the policy of a new workspace: code execution enabled,
// approval required, no network, 30 s wall clock, every runtime, tool
// changes flagged, forks approved anew.
func DefaultPolicy() Policy {
	return Policy{
		CodeExecution: true,
		Approval:      ApprovalRequired,
		MaxTimeout:    30 * time.Second,
		Runtimes:      []string{"python", "node", "shell"},
		ToolChanges:   ToolChangesFlag,
		ForkApproval:  ForkApprovalAnew,
	}
}
