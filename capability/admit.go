package capability

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/contract"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
)

// gate admits requests: it decides each on the policy, records the
// decision and the admission, and hands what may run to runs.
type gate struct {
	*core
	st    gateStore
	runs  *runs
	tools *toolRecords
}

// gateStore is what gate needs of the store.
type gateStore interface {
	eventAppender
	GetPolicy(ctx context.Context, workspaceID string) (store.Policy, error)
	ReplayExecution(ctx context.Context, e store.NewExecution) (store.Admission, error)
	Admit(ctx context.Context, e store.NewExecution, s store.Step) (store.Admission, error)
	GetExecution(ctx context.Context, workspaceID, executionID string) (store.Execution, error)
	GetApproval(ctx context.Context, workspaceID, approvalID string) (store.Approval, error)
}

// InvokeRequest is the body of POST /v1/executions.
type InvokeRequest struct {
	Runtime   string `json:"runtime"`
	Code      string `json:"code"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
	// Network is "deny" (the default) or "allow" (policy.ParseNetwork,
	// which also takes the older "denied" and "allowed").
	Network string `json:"network,omitempty"`
	Stdin   string `json:"stdin,omitempty"`
	// Tool names the tool to run as; empty means the default tool.
	Tool string `json:"tool,omitempty"`
}

// Invocation is the outcome of Invoke: the execution as admitted.
type Invocation struct {
	Execution store.Execution
	// Approval is set when the execution waits for a decision.
	Approval *store.Approval
	// Replayed is set when an Idempotency-Key matched an earlier request.
	Replayed bool
}

// InvokeOptions are the parts of an invocation that are not its request body.
type InvokeOptions struct {
	// IdempotencyKey makes a retried request return the first execution;
	// empty means none.
	IdempotencyKey string
	// ExecutionID is the id to give the execution (see NewExecutionID), so
	// that the caller can Subscribe before the run starts; empty lets the
	// store choose one.
	ExecutionID string
}

// NewExecutionID returns a fresh execution id.
func NewExecutionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "ex_" + hex.EncodeToString(b[:])
}

// Invoke admits an invocation: the policy decision (recorded as exactly one
// capability.invoke_allowed or capability.invoke_denied event), the credit
// reservation and tool_calls row (one transaction), and then either the
// approval request or the run, which proceeds in the background. Use Wait
// or Subscribe for the outcome. A retry of an admitted request (the same
// IdempotencyKey and body) is the same request: it returns the first
// execution, Replayed, and is neither decided nor recorded again.
func (s *gate) Invoke(ctx context.Context, p Principal, req InvokeRequest, o InvokeOptions) (*Invocation, error) {
	network, err := policy.ParseNetwork(req.Network)
	if err != nil {
		return nil, err
	}
	if req.TimeoutMS < 0 || req.TimeoutMS > math.MaxInt64/int64(time.Millisecond) {
		return nil, errdefs.Publicf("timeout_ms %d is out of range: %w", req.TimeoutMS, errdefs.ErrInvalidArgument)
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	// Shape errors (unknown runtime, empty or oversized code) are the
	// caller's mistakes, not decisions, and are answered before the policy.
	// A tool's record refusing the runtime is a decision (recorded below);
	// other validation errors (a timeout above the tool's limit too) are the
	// caller's mistakes.
	tool, drv, _, verr := s.runner.Validate(engine.Request{Runtime: req.Runtime, Tool: req.Tool, Code: []byte(req.Code), Stdin: []byte(req.Stdin),
		Limits: sandbox.Limits{Timeout: timeout}})
	if verr != nil && !errdefs.IsPermissionDenied(verr) {
		return nil, verr
	}
	// The decision is computed here but acted on, and recorded, only once
	// the request is known not to be a retry.
	pol, err := s.st.GetPolicy(ctx, p.WorkspaceID)
	if err != nil {
		return nil, fmt.Errorf("loading workspace policy: %w", err)
	}
	d := policy.Decide(pol, policy.Request{Capability: contract.CodeExecute, Runtime: req.Runtime, Timeout: timeout, Network: network}, s.runner.Ceiling().Timeout)
	if timeout == 0 {
		timeout = min(s.runner.Limits(tool).Timeout, d.MaxTimeout)
	}
	// The request is stored as it came, which a retry must match: the
	// timeout the policy gives one that names none is the approval card's
	// and the run's, and would make a retry under a changed policy look
	// like another request.
	ne := store.NewExecution{
		ID: o.ExecutionID, WorkspaceID: p.WorkspaceID, KeyID: p.KeyID, Runtime: req.Runtime, Tool: tool.Name,
		Request: mustJSON(req), InputSHA256: InputHash(req.Runtime, req.Code), IdempotencyKey: o.IdempotencyKey,
	}
	if o.IdempotencyKey != "" && mayInvoke(p) {
		// A retry was decided with its first request: it must not be
		// refused now (for capacity, or a policy changed since) nor write
		// a second decision event. The same key on another body is a
		// conflict. Admit below still catches a retry that races with its
		// first request. Idempotency keys are the API key's own (the
		// store's scope), and a key whose role may not invoke is refused
		// below before any replay.
		adm, err := s.st.ReplayExecution(ctx, ne)
		if err == nil {
			return &Invocation{Execution: adm.Execution, Approval: adm.Approval, Replayed: true}, nil
		}
		if !errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("looking up the idempotency key: %w", err)
		}
	}

	in := Admit{By: p, Policy: d, Network: network, Tool: tool.Name, ToolEgress: !tool.Egress.None(),
		EgressAvailable: s.runner.EgressAvailable(), Price: s.price, At: s.opts.Now(),
		// The decision's event fingerprints what was asked to run: a row
		// changed later no longer matches its chain.
		Asked: audit.Invocation{Capability: contract.CodeExecute.Name, Runtime: req.Runtime, TimeoutMS: req.TimeoutMS,
			Network: policy.NetworkWord(network), InputSHA256: ne.InputSHA256, StdinSHA256: sha256Hex([]byte(req.Stdin))}}
	if verr != nil {
		in.ToolRefusal = strings.TrimSuffix(verr.Error(), ": "+errdefs.ErrPermissionDenied.Error())
	}
	if pol.ToolChanges == store.ToolChangesRequireReview {
		if in.ReviewPending, err = s.tools.reviewBlocks(ctx, p.WorkspaceID, tool.Name); err != nil {
			return nil, err
		}
	}
	if d.ApprovalRequired || network {
		card := ApprovalCard{
			Capability: contract.CodeExecute.Name, RiskLevel: string(contract.CodeExecute.Risk), Runtime: req.Runtime,
			Code: req.Code, Stdin: req.Stdin, Network: policy.NetworkWord(network), TimeoutMS: timeout.Milliseconds(), RequestedBy: p.KeyID,
			ExpiresAt: in.At.Add(s.opts.ApprovalTTL).UTC().Truncate(time.Microsecond), Tool: tool.Name,
			ToolFingerprint: tools.Fingerprint(tool),
		}
		if network {
			card.EgressAllow, card.EgressPorts = tool.Egress.Allow, tool.Egress.Ports
		}
		in.Card, in.ExpiresAt = mustJSON(card), card.ExpiresAt
	}
	step, err := Transition(Grant{Kind: OneShot}, in)
	if err != nil {
		return nil, err
	}
	if step.Write == nil {
		return s.deny(ctx, step)
	}
	var t *ticket
	if step.To == Approved {
		// A driver that cannot run sandboxes now is a refusal (recorded,
		// nothing reserved), not an execution that fails to launch. (A
		// request waiting for approval meets the driver when it is
		// approved.)
		if hc, ok := drv.(sandbox.HealthChecker); ok {
			if err := hc.Health(ctx); err != nil {
				s.log.Warn("driver unavailable", "driver", drv.Name(), "err", err)
				return s.refuse(ctx, in, "driver_unavailable", fmt.Sprintf("the %s sandbox driver is unavailable; retry later", drv.Name()), errdefs.ErrUnavailable)
			}
		}
		// Before the host runs out of memory, rather than let its OOM
		// killer choose.
		mem, err := s.reserveMemory(engine.Request{Runtime: req.Runtime, Tool: req.Tool, Network: network, Limits: sandbox.Limits{Timeout: timeout}})
		if err != nil {
			s.log.Warn("memory budget taken", "err", err)
			return s.refuse(ctx, in, "memory_exhausted", "the server's sandboxes hold all the memory it may give them (memory_budget); retry later", errdefs.ErrResourceExhausted)
		}
		if t = s.runs.slots.reserve(); t == nil {
			mem.Release()
			return s.refuse(ctx, in, "server_at_capacity", fmt.Sprintf("the server is at capacity (%d running, %d queued); retry later", s.opts.MaxConcurrent, s.opts.MaxQueue), errdefs.ErrResourceExhausted)
		}
		t.mem = mem
	}
	adm, err := s.st.Admit(ctx, ne, *step.Write)
	if err != nil && errdefs.IsUnavailable(err) && ne.ID != "" {
		adm, err = s.admittedAnyway(ctx, p.WorkspaceID, ne.ID, err)
	}
	if err != nil {
		t.release()
		if errdefs.IsResourceExhausted(err) {
			return s.refuse(ctx, in, "insufficient_credits", fmt.Sprintf("insufficient credits: an invocation costs %d", s.price), errdefs.ErrPaymentRequired)
		}
		return nil, fmt.Errorf("admitting execution: %w", err)
	}
	inv := &Invocation{Execution: adm.Execution, Approval: adm.Approval, Replayed: adm.Replayed}
	switch {
	case adm.Replayed:
		t.release()
	case step.Next.Dispatch:
		s.runs.dispatch(adm.Execution, timeout, t)
	default:
		s.runs.notify(step, adm.Execution)
	}
	return inv, nil
}

// refuse denies the request in, which the rules allowed, for a refusal
// the service met carrying its admission out.
func (s *gate) refuse(ctx context.Context, in Admit, code, reason string, class error) (*Invocation, error) {
	in.Refusal = &Refusal{Code: code, Reason: reason, Class: class}
	step, err := Transition(Grant{Kind: OneShot}, in)
	if err != nil {
		return nil, err
	}
	return s.deny(ctx, step)
}

// deny records the denial step and answers with its refusal.
func (s *gate) deny(ctx context.Context, step Step) (*Invocation, error) {
	for _, ev := range step.Events {
		if _, err := s.st.AppendEvent(ctx, audit.NewEvent(ev)); err != nil {
			return nil, fmt.Errorf("recording denial: %w", err)
		}
	}
	return nil, step.Refusal
}

// admittedAnyway looks up execution id after its admission failed with
// err, a store that was unavailable: a commit whose answer was lost (the
// connection cut after COMMIT) admitted it all the same, and it must run
// or wait for its approval, not stay queued with its credits reserved until
// the next start. It returns err when the execution is not there.
func (s *gate) admittedAnyway(ctx context.Context, ws, id string, err error) (store.Admission, error) {
	ex, gerr := s.st.GetExecution(ctx, ws, id)
	if gerr != nil {
		return store.Admission{}, err
	}
	s.log.Warn("admitting an execution failed, but it was admitted", "execution", id, "err", err)
	adm := store.Admission{Execution: ex}
	if ex.ApprovalID != "" {
		a, gerr := s.st.GetApproval(ctx, ws, ex.ApprovalID)
		if gerr != nil {
			return store.Admission{}, err
		}
		adm.Approval = &a
	}
	return adm, nil
}

// InputHash is the tool_calls input hash: SHA-256 over the runtime and the
// code, separated by a NUL byte.
func InputHash(runtime, code string) string {
	h := sha256.New()
	h.Write([]byte(runtime))
	h.Write([]byte{0})
	h.Write([]byte(code))
	return hex.EncodeToString(h.Sum(nil))
}
