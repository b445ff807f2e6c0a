// Package policy decides whether a workspace's policy allows an invocation.
// It is pure: the caller loads the policy and records the decision.
//
//	d := policy.Decide(pol, policy.Request{Capability: contract.CodeExecute, Runtime: "python", Timeout: 10 * time.Second}, ceiling)
//	if !d.Allowed { ... record capability.invoke_denied with d.Reason ... }
package policy

import (
	"fmt"
	"slices"
	"time"

	"github.com/stockade-sh/stockade/contract"
	"github.com/stockade-sh/stockade/model"
)

// Request is what the decision looks at.
type Request struct {
	Capability contract.Capability
	Runtime    string
	// Timeout is the wall clock asked for; zero means the default.
	Timeout time.Duration
	// Network is true when the invocation asks for network access.
	Network bool
}

// Denial reasons, stable for clients and audit queries.
const (
	DenyCodeExecutionDisabled = "code_execution_disabled"
	DenyRuntimeNotAllowed     = "runtime_not_allowed"
	DenyNetworkNotPermitted   = "network_not_permitted"
	DenyTimeoutAboveMax       = "timeout_above_max"
)

// Decision is the outcome of Decide.
type Decision struct {
	Allowed bool
	// Code is one of the Deny* constants when denied.
	Code string
	// Reason is a sentence for people.
	Reason string
	// ApprovalRequired says a human must approve before it runs.
	ApprovalRequired bool
	// MaxTimeout is the effective wall-clock ceiling: the workspace's,
	// never above the server's.
	MaxTimeout time.Duration
}

// Decide applies p to r. serverCeiling is the server's wall-clock ceiling;
// the workspace's MaxTimeout may only lower it.
func Decide(p model.Policy, r Request, serverCeiling time.Duration) Decision {
	maxTimeout := serverCeiling
	if p.MaxTimeout > 0 && (maxTimeout == 0 || p.MaxTimeout < maxTimeout) {
		maxTimeout = p.MaxTimeout
	}
	deny := func(code, format string, a ...any) Decision {
		return Decision{Code: code, Reason: fmt.Sprintf(format, a...), MaxTimeout: maxTimeout}
	}
	switch {
	case r.Capability == contract.CodeExecute && !p.CodeExecution:
		return deny(DenyCodeExecutionDisabled, "code execution is disabled by the workspace policy")
	case !slices.Contains(p.Runtimes, r.Runtime):
		return deny(DenyRuntimeNotAllowed, "runtime %q is not allowed by the workspace policy (allowed: %v)", r.Runtime, p.Runtimes)
	case r.Network && !p.NetworkAllowed:
		return deny(DenyNetworkNotPermitted, "network access is not permitted by the workspace policy")
	case maxTimeout > 0 && r.Timeout > maxTimeout:
		return deny(DenyTimeoutAboveMax, "timeout %s is above the workspace maximum of %s", r.Timeout, maxTimeout)
	}
	return Decision{
		Allowed: true,
		// A network request always goes to a human, whatever the default.
		ApprovalRequired: (r.Capability.Risk == contract.RiskHigh && p.RequiresApproval()) || r.Network,
		MaxTimeout:       maxTimeout,
	}
}
