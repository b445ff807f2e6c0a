package capability

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/contract"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/telemetry"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
	"github.com/stockade-sh/stockade/wire"
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
	GetPolicy(ctx context.Context, workspaceID string) (model.Policy, error)
	ReplayExecution(ctx context.Context, e store.NewExecution) (store.Admission, error)
	Admit(ctx context.Context, e store.NewExecution, s model.Step) (store.Admission, error)
	GetExecution(ctx context.Context, workspaceID, executionID string) (model.Execution, error)
	GetApproval(ctx context.Context, workspaceID, approvalID string) (model.Approval, error)
}

// InvokeRequest is the body of POST /v1/executions, as the wire declares
// it: the service takes the API's request itself. Its Network is read by
// policy.ParseNetwork, which also takes the older "denied" and "allowed";
// its IdempotencyKey is not read (InvokeOptions carries it).
type InvokeRequest = wire.ExecutionRequest

// Invocation is the outcome of Invoke: the execution as admitted.
type Invocation struct {
	Execution model.Execution
	// Approval is set when the execution waits for a decision.
	Approval *model.Approval
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
func (s *gate) Invoke(ctx context.Context, p Principal, req InvokeRequest, o InvokeOptions) (_ *Invocation, err error) {
	ctx, sp := telemetry.Start(ctx, telemetry.Invoke, telemetry.Workspace(p.WorkspaceID), telemetry.Runtime(req.Runtime))
	defer sp.End(&err)
	network, err := policy.ParseNetwork(req.Network)
	if err != nil {
		return nil, err
	}
	if req.TimeoutMS < 0 || req.TimeoutMS > math.MaxInt64/int64(time.Millisecond) {
		return nil, errdefs.Publicf("timeout_ms %d is out of range: %w", req.TimeoutMS, errdefs.ErrInvalidArgument)
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	// The request is stored as it came, which a retry must match: the
	// timeout the policy gives one that names none is the approval card's
	// and the run's, and would make a retry under a changed policy look
	// like another request.
	rec := &runRecord{g: s, unit: "an invocation", recoverLost: true,
		ne: store.NewExecution{ID: o.ExecutionID, WorkspaceID: p.WorkspaceID, KeyID: p.KeyID, Runtime: req.Runtime,
			Request: mustJSON(req), InputSHA256: InputHash(req.Runtime, req.Code), IdempotencyKey: o.IdempotencyKey},
		failed: func(_ context.Context, err error) error { return fmt.Errorf("admitting execution: %w", err) }}
	c := &claim{by: p, grant: Grant{Kind: OneShot}, idempotencyKey: o.IdempotencyKey, egress: true, review: true, charged: true, record: rec,
		ask: policy.Request{Capability: contract.CodeExecute, Runtime: req.Runtime, Timeout: timeout, Network: network},
		asked: audit.Invocation{Capability: contract.CodeExecute.Name, Runtime: req.Runtime, TimeoutMS: req.TimeoutMS,
			Network: policy.NetworkWord(network), InputSHA256: rec.ne.InputSHA256, StdinSHA256: sha256Hex([]byte(req.Stdin))},
		card: func(in Admit) (bool, wire.ApprovalCard) {
			return in.Policy.ApprovalRequired || in.Network, wire.ApprovalCard{Code: req.Code, Stdin: req.Stdin}
		},
	}
	// Shape errors (unknown runtime, empty or oversized code) are the
	// caller's mistakes, not decisions, and are answered before the policy.
	// A tool's record refusing the runtime is a decision (recorded);
	// other validation errors (a timeout above the tool's limit too) are the
	// caller's mistakes.
	c.check = func() (tools.Tool, sandbox.Driver, error) {
		tool, drv, _, err := s.runner.Validate(engine.Request{Runtime: req.Runtime, Tool: req.Tool, Code: []byte(req.Code), Stdin: []byte(req.Stdin),
			Limits: sandbox.Limits{Timeout: timeout}})
		rec.ne.Tool = tool.Name // the execution names the tool it runs as
		return tool, drv, err
	}
	c.room = func(ctx context.Context, step Step, in Admit) (*ticket, error) {
		if step.To != Approved {
			// A request waiting for approval meets the driver, and takes
			// its place, when it is approved.
			return nil, nil
		}
		if err := s.healthy(ctx, c, in); err != nil {
			return nil, err
		}
		// Before the host runs out of memory, rather than let its OOM
		// killer choose. The memory is held from the admission to the
		// run's end, so that invocations admitted at once cannot all pass
		// a check that only some of them fit, to end launch_failed later;
		// nothing (nil) for a request a ready pool sandbox serves. The
		// reservation travels on the ticket (ticket.mem): the run hands it
		// to the engine, and every path that does not run releases it with
		// the ticket.
		mem, err := s.runner.Reserve(engine.Request{Runtime: req.Runtime, Tool: req.Tool, Network: network, Limits: sandbox.Limits{Timeout: c.timeout}})
		if err != nil {
			s.log.Warn("memory budget taken", "err", err)
			return nil, s.refuse(ctx, c, in, &Refusal{Code: "memory_exhausted",
				Reason: "the server's sandboxes hold all the memory it may give them (memory_budget); retry later", Class: errdefs.ErrResourceExhausted})
		}
		t := s.runs.slots.reserve()
		if t == nil {
			mem.Release()
			return nil, s.refuse(ctx, c, in, &Refusal{Code: "server_at_capacity",
				Reason: fmt.Sprintf("the server is at capacity (%d running, %d queued); retry later", s.opts.MaxConcurrent, s.opts.MaxQueue), Class: errdefs.ErrResourceExhausted})
		}
		t.mem = mem
		return t, nil
	}
	rec.dispatch = func(e model.Execution, t *ticket) { s.runs.dispatch(e, c.timeout, t) }
	err = s.admit(ctx, c)
	sp.Set(telemetry.Tool(rec.ne.Tool)...)
	if c.facts.drv != nil {
		sp.SetTier(string(c.facts.drv.Capabilities().Tier))
	}
	if err != nil {
		return nil, err
	}
	sp.Set(telemetry.Execution(rec.inv.Execution.ID))
	return rec.inv, nil
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
