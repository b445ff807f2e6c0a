package api

import (
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/policy"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
	"github.com/stockade-sh/stockade/wire"
)

// The API answers the store's records and the service's outcomes as the
// types of package wire; these functions are the one conversion of each.

// viewOf is execution e on the wire. Its result is the document the run
// left, answered as it was kept.
func viewOf(e model.Execution) wire.Execution {
	v := wire.Execution{ID: e.ID, Status: wire.ExecutionStatus(e.Status), Runtime: e.Runtime, Tool: e.Tool, SessionID: e.SessionID,
		ApprovalID: e.ApprovalID, Driver: e.Driver, CreatedAt: e.CreatedAt}
	// A document that does not read (none the server writes) is left out
	// rather than failing the answer.
	v.Result, _ = wire.ResultOf(e.Result)
	if !e.StartedAt.IsZero() {
		v.StartedAt = &e.StartedAt
	}
	if !e.FinishedAt.IsZero() {
		v.FinishedAt = &e.FinishedAt
	}
	return v
}

// approvalView is approval request a on the wire.
func approvalView(a model.Approval) wire.Approval {
	v := wire.Approval{ID: a.ID, ExecutionID: a.ExecutionID, Status: wire.ApprovalStatus(a.Status),
		RequestedAt: a.RequestedAt, ExpiresAt: a.ExpiresAt, DecidedBy: a.DecidedBy, Reason: a.Reason}
	if c := card(a); c != nil {
		v.Card = *c
	}
	if !a.DecidedAt.IsZero() {
		v.DecidedAt = &a.DecidedAt
	}
	return v
}

// card returns the approval card of a with its ids filled in; nil for a
// stored card that does not read (none the server writes).
func card(a model.Approval) *wire.ApprovalCard {
	c, err := capability.CardOf(a)
	if err != nil {
		return nil
	}
	return &c
}

// eventView is audit event e on the wire.
func eventView(e model.Event) wire.AuditEvent {
	return wire.AuditEvent{ID: e.ID, Seq: e.Seq, Type: e.Type, Code: e.Code, Actor: e.Actor, Reason: e.Reason,
		ExecutionID: e.ExecutionID, Data: e.Data, Time: e.Time, PrevHash: e.PrevHash, Hash: e.Hash}
}

// toolCallView is tool_calls row c on the wire.
func toolCallView(c model.ToolCall) wire.ToolCall {
	v := wire.ToolCall{ID: c.ID, ExecutionID: c.ExecutionID, Tool: c.Tool, Runtime: c.Runtime, InputSHA256: c.InputSHA256,
		Status: wire.ExecutionStatus(c.Status), ExitCode: c.ExitCode, StdoutPreview: string(c.StdoutPreview), StderrPreview: string(c.StderrPreview),
		StdoutTruncated: c.StdoutTruncated, StderrTruncated: c.StderrTruncated, Driver: c.Driver, CreditsCharged: c.CreditsCharged,
		CreatedAt: c.CreatedAt}
	if !c.StartedAt.IsZero() {
		v.StartedAt = &c.StartedAt
	}
	if !c.FinishedAt.IsZero() {
		v.FinishedAt = &c.FinishedAt
	}
	return v
}

// PolicyOf returns the wire form of a policy.
func PolicyOf(p model.Policy) wire.Policy {
	return wire.Policy{CodeExecution: p.CodeExecution, Approval: string(p.Approval), Network: policy.NetworkWord(p.NetworkAllowed),
		MaxSessions: p.MaxSessions, MaxTimeoutMS: p.MaxTimeout.Milliseconds(), Runtimes: p.Runtimes, ToolChanges: string(p.ToolChanges),
		ForkApproval: string(p.ForkApproval)}
}

// toolView is a tool and its record on the wire.
func toolView(ts capability.ToolStatus) wire.Tool {
	return wire.Tool{Name: ts.Tool.Name, Fingerprint: ts.Fingerprint, Record: tools.Canonical(ts.Tool), ReviewRequired: ts.ReviewRequired}
}

// fileEntry is an entry of a session directory's listing on the wire.
func fileEntry(e sandbox.FileInfo) wire.FileEntry {
	return wire.FileEntry{Name: e.Name, Type: string(e.Type), Size: e.Size, Mode: uint32(e.Mode.Perm()), MTime: e.ModTime.UTC()}
}
