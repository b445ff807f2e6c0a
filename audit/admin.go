package audit

import (
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/policy"
)

// Changes made with the admin commands (actor "cli"), each written in the
// transaction of the change.
const (
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

// WorkspaceCreatedEvent starts a workspace's chain.
type WorkspaceCreatedEvent struct {
	Meta `json:"-"`
	Name string `json:"name"`
}

func (WorkspaceCreatedEvent) Type() string { return WorkspaceCreated }
func (WorkspaceCreatedEvent) Code() string { return WorkspaceCreatedCode }

// KeyCreatedEvent is an API key created (its id, never the key).
type KeyCreatedEvent struct {
	Meta  `json:"-"`
	KeyID string     `json:"key_id"`
	Role  model.Role `json:"role"`
}

func (KeyCreatedEvent) Type() string { return KeyCreated }
func (KeyCreatedEvent) Code() string { return KeyCreatedCode }

// KeyRevokedEvent is an API key revoked.
type KeyRevokedEvent struct {
	Meta  `json:"-"`
	KeyID string     `json:"key_id"`
	Role  model.Role `json:"role"`
}

func (KeyRevokedEvent) Type() string { return KeyRevoked }
func (KeyRevokedEvent) Code() string { return KeyRevokedCode }

// CreditsGrantedEvent is credits added to a workspace's balance.
type CreditsGrantedEvent struct {
	Meta   `json:"-"`
	Amount int64 `json:"amount"`
}

func (CreditsGrantedEvent) Type() string { return CreditsGranted }
func (CreditsGrantedEvent) Code() string { return CreditsGrantedCode }

// PolicyUpdatedEvent is a change of a workspace's policy: the policy
// before and after it.
type PolicyUpdatedEvent struct {
	Meta   `json:"-"`
	After  Policy `json:"after"`
	Before Policy `json:"before"`
}

func (PolicyUpdatedEvent) Type() string { return PolicyUpdated }
func (PolicyUpdatedEvent) Code() string { return PolicyUpdatedCode }

// Policy is a workspace policy as the chain records it. It has the API's
// words (wire.Policy) but is a type of its own: the API's view may
// change, an event written never does. (Events written before the policy
// named network with the request's words hold "network_allowed": a
// boolean.)
type Policy struct {
	CodeExecution bool   `json:"code_execution"`
	Approval      string `json:"approval"`
	// Network is "allow" or "deny": whether invocations may ask for it.
	Network string `json:"network"`
	// MaxSessions is the bound of live sessions; 0 (omitted) is the
	// server's.
	MaxSessions  int      `json:"max_sessions,omitempty"`
	MaxTimeoutMS int64    `json:"max_timeout_ms"`
	Runtimes     []string `json:"runtimes"`
	ToolChanges  string   `json:"tool_changes"`
	// ForkApproval is anew or inherit (docs/design.md §10); events written
	// before the policy had it omit it, which means anew.
	ForkApproval string `json:"fork_approval,omitempty"`
}

// PolicyOf returns p as the chain records it.
func PolicyOf(p model.Policy) Policy {
	return Policy{CodeExecution: p.CodeExecution, Approval: string(p.Approval), Network: policy.NetworkWord(p.NetworkAllowed),
		MaxSessions: p.MaxSessions, MaxTimeoutMS: p.MaxTimeout.Milliseconds(), Runtimes: p.Runtimes, ToolChanges: string(p.ToolChanges),
		ForkApproval: string(p.ForkApproval)}
}
