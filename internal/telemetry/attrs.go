package telemetry

import (
	"context"
	"errors"
	"strings"

	"go.opentelemetry.io/otel/attribute"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/clip"
)

// The attributes a span may carry: each built here, so that what leaves
// the daemon in a trace is declared in one place. None takes code,
// output, stdin, a broker call's parameters or a credential.
//
// Where the OpenTelemetry semantic conventions name the attribute it is
// theirs. The GenAI ones (gen_ai.*) are of development status in
// semantic conventions v1.37 and may be renamed; error.type is stable.
// The stockade.* ones are Stockade's own.
const (
	// GenAI semantic conventions (development status).
	keyOperation = "gen_ai.operation.name" // "execute_tool"
	keyToolName  = "gen_ai.tool.name"
	keyToolCall  = "gen_ai.tool.call.id" // the execution id
	// Stable.
	keyErrorType = "error.type"
	// Stockade's own.
	keyTier      = "stockade.tier"
	keyWorkspace = "stockade.workspace.id"
	keyRuntime   = "stockade.runtime"
	keyOutcome   = "stockade.outcome"
	keyOp        = "stockade.store.operation"
	keyDriver    = "stockade.driver"
	keyProtocol  = "stockade.egress.protocol"
	keyDest      = "stockade.egress.destination"
	keyPort      = "stockade.egress.port"
	keyReason    = "stockade.reason"
	keyBrokerOp  = "stockade.broker.operation"
	keyStatus    = "stockade.broker.status"
	keyRestored  = "stockade.sandbox.restored"
)

// Restored marks a sandbox made from a checkpoint (a template's golden
// one) rather than started cold.
func Restored() attribute.KeyValue { return attribute.Bool(keyRestored, true) }

// Tool is an invocation of the tool name: gen_ai.operation.name
// execute_tool and gen_ai.tool.name.
func Tool(name string) []attribute.KeyValue {
	return []attribute.KeyValue{attribute.String(keyOperation, "execute_tool"), attribute.String(keyToolName, name)}
}

// Execution is the execution id, as gen_ai.tool.call.id.
func Execution(id string) attribute.KeyValue { return attribute.String(keyToolCall, id) }

// Workspace is the workspace id.
func Workspace(id string) attribute.KeyValue { return attribute.String(keyWorkspace, id) }

// Runtime is the runtime's name (python, node, shell).
func Runtime(name string) attribute.KeyValue { return attribute.String(keyRuntime, name) }

// Tier is the isolation tier (container, gvisor, docker).
func Tier(tier string) attribute.KeyValue { return attribute.String(keyTier, tier) }

// Driver is the driver that runs the sandbox.
func Driver(name string) attribute.KeyValue { return attribute.String(keyDriver, name) }

// Outcome is how a phase ended: ok, error, or the phase's own word
// (approved, denied, expired, hit, miss, allowed, refused).
func Outcome(o string) attribute.KeyValue { return attribute.String(keyOutcome, o) }

// StoreOp names a store write (admit, apply).
func StoreOp(op string) attribute.KeyValue { return attribute.String(keyOp, op) }

// Egress describes an egress proxy decision: protocol, the destination
// name the sandbox asked for, its port, and the reason of a refusal.
func Egress(protocol, dest string, port int, reason string) []attribute.KeyValue {
	return []attribute.KeyValue{attribute.String(keyProtocol, protocol), attribute.String(keyDest, clip.String(dest, clip.Name)),
		attribute.Int(keyPort, port), attribute.String(keyReason, clip.String(reason, clip.Name))}
}

// Broker describes a broker call: its operation and the upstream's
// status, never its parameters.
func Broker(op string, status int) []attribute.KeyValue {
	return []attribute.KeyValue{attribute.String(keyBrokerOp, clip.String(op, clip.Name)), attribute.Int(keyStatus, status)}
}

// ErrorType is err's error class (error.type), e.g. "unavailable", or
// "internal" for an error of no class.
func ErrorType(err error) attribute.KeyValue { return attribute.String(keyErrorType, classOf(err)) }

// classOf names err's class, and only that: a message may quote what a
// sandbox or a client sent.
func classOf(err error) string {
	switch {
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	}
	for _, c := range []error{errdefs.ErrGone, errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrPermissionDenied,
		errdefs.ErrFailedPrecondition, errdefs.ErrResourceExhausted, errdefs.ErrUnavailable, errdefs.ErrUnauthenticated,
		errdefs.ErrConflict, errdefs.ErrTooLarge, errdefs.ErrPaymentRequired} {
		if errors.Is(err, c) {
			return strings.ReplaceAll(c.Error(), " ", "_")
		}
	}
	return "internal"
}
