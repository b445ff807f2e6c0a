package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/errdefs"
)

// TasksExtension is the identifier of MCP's Tasks extension (SEP-2663,
// protocol 2026-07-28): a tools/call may answer with a task handle
// (resultType "task") that the client polls with tasks/get and cancels
// with tasks/cancel. Stockade makes one of an approval-gated run_code or
// run_cell call when the call's client capabilities name the extension:
// the call returns at once, and the task is working while the approver
// decides and the code runs, then completed with what the tool would
// have answered. The Go SDK has no Tasks support (v1.8.0): the methods
// are custom methods, and the handle replaces the tool's result in a
// receiving middleware (see docs/design.md, section 6, "MCP").
const TasksExtension = "io.modelcontextprotocol/tasks"

// StatelessProtocol is the first version of MCP without sessions
// (SEP-2575), which the Tasks extension goes with.
const StatelessProtocol = "2026-07-28"

// taskPollInterval is the polling interval a task suggests.
const taskPollInterval = 2 * time.Second

// CancelBackend is what tasks/cancel needs of Stockade: cancelling an
// execution, as POST /v1/executions/{id}/cancel.
type CancelBackend interface {
	CancelExecution(ctx context.Context, id, reason string) (*client.Execution, error)
}

var _ CancelBackend = (*client.Client)(nil)

// Task kinds, the tool a task runs, as a task id names them.
const (
	taskCode = "code" // run_code
	taskCell = "cell" // run_cell
)

// maxTaskID bounds a task id a client sends.
const maxTaskID = 160

// TaskID is the task id of execution id run by the tool of kind (taskCode
// or taskCell). The id is the handle itself: tasks are Stockade's
// executions, kept in its store, so that any daemon (or stockade mcp
// process) answers for a task, as the stateless protocol wants.
func TaskID(kind, executionID string) string { return kind + ":" + executionID }

// ParseTaskID decodes a task id a client sent: its kind and execution id.
func ParseTaskID(s string) (kind, executionID string, err error) {
	if len(s) > maxTaskID {
		return "", "", errdefs.Publicf("the task id is %d bytes, more than %d: %w", len(s), maxTaskID, errdefs.ErrInvalidArgument)
	}
	kind, id, ok := strings.Cut(s, ":")
	if !ok || (kind != taskCode && kind != taskCell) || id == "" {
		return "", "", errdefs.Publicf("%q is not a task id of this server: %w", s, errdefs.ErrNotFound)
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return "", "", errdefs.Publicf("%q is not a task id of this server: %w", s, errdefs.ErrNotFound)
		}
	}
	return kind, id, nil
}

// Task is the Tasks extension's task, with its status's payload: the
// tool's result once completed.
type Task struct {
	sdk.ResultBase
	// ResultType is "task" on a tools/call's answer, "complete" on
	// tasks/get's.
	ResultType     string          `json:"resultType"`
	TaskID         string          `json:"taskId"`
	Status         string          `json:"status"`
	StatusMessage  string          `json:"statusMessage,omitempty"`
	CreatedAt      string          `json:"createdAt"`
	LastUpdatedAt  string          `json:"lastUpdatedAt"`
	TTLMs          *int64          `json:"ttlMs"`
	PollIntervalMs int64           `json:"pollIntervalMs,omitempty"`
	Result         json.RawMessage `json:"result,omitempty"`
}

// TaskParams is the params of tasks/get, tasks/update and tasks/cancel;
// tasks/update's inputResponses are read by no one (Stockade's tasks ask
// the client nothing).
type TaskParams struct {
	sdk.ParamsBase
	TaskID string `json:"taskId"`
}

// ackResult is the empty answer of tasks/update and tasks/cancel.
type ackResult struct {
	sdk.ResultBase
	ResultType string `json:"resultType"`
}

// taskSlot carries, from the tools/call middleware to the tool's handler,
// whether the call may become a task and, back, the task it became.
type taskSlot struct{ task *Task }

type taskSlotKey struct{}

// taskMiddleware gives a tools/call whose client supports tasks a slot in
// its context, and answers the call with the task the handler left in it
// instead of the handler's result.
func taskMiddleware(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
		ctr, ok := req.(*sdk.CallToolRequest)
		if method != "tools/call" || !ok || !clientTasks(ctr) {
			return next(ctx, method, req)
		}
		slot := &taskSlot{}
		res, err := next(context.WithValue(ctx, taskSlotKey{}, slot), method, req)
		if err != nil || slot.task == nil {
			return res, err
		}
		return slot.task, nil
	}
}

// clientTasks reports whether the call's client declared the Tasks
// extension.
func clientTasks(req *sdk.CallToolRequest) bool {
	caps := req.ClientCapabilities()
	if caps == nil {
		return false
	}
	_, ok := caps.Extensions[TasksExtension]
	return ok
}

// becomeTask makes the call of ctx the task of execution id, run by the
// tool of kind, when its client supports tasks: it reports false, and
// does nothing, otherwise. The handle's times are the execution's, as
// tasks/get answers them while it awaits approval.
func (t *tools) becomeTask(ctx context.Context, kind, id, approvalID string) bool {
	slot, ok := ctx.Value(taskSlotKey{}).(*taskSlot)
	if !ok {
		return false
	}
	created := time.Now() // should the execution not be read: near enough
	if ex, err := t.b.GetExecution(ctx, id, 0); err == nil {
		created = ex.CreatedAt
	}
	at := created.UTC().Format(time.RFC3339Nano)
	slot.task = &Task{ResultType: "task", TaskID: TaskID(kind, id), Status: "working", CreatedAt: at,
		LastUpdatedAt: at, PollIntervalMs: taskPollInterval.Milliseconds(), StatusMessage: t.awaitingMessage(approvalID)}
	return true
}

func (t *tools) awaitingMessage(approvalID string) string {
	return fmt.Sprintf("awaiting approval: an approver must approve request %s at %s before the code runs", approvalID, t.opts.approvalURL(approvalID))
}

// addTasks registers the Tasks extension's methods.
func addTasks(s *sdk.Server, t *tools) {
	s.AddReceivingMiddleware(taskMiddleware)
	must(sdk.AddReceivingCustomMethod(s, "tasks/get", func(ctx context.Context, _ *sdk.ServerSession, p *TaskParams) (*Task, error) {
		return t.getTask(ctx, p.TaskID)
	}))
	must(sdk.AddReceivingCustomMethod(s, "tasks/update", func(ctx context.Context, _ *sdk.ServerSession, p *TaskParams) (*ackResult, error) {
		// No task of Stockade's asks for input: the responses, if any,
		// answer nothing outstanding and are ignored, as SEP-2663 says.
		if _, err := t.getTask(ctx, p.TaskID); err != nil {
			return nil, err
		}
		return &ackResult{ResultType: "complete"}, nil
	}))
	must(sdk.AddReceivingCustomMethod(s, "tasks/cancel", func(ctx context.Context, _ *sdk.ServerSession, p *TaskParams) (*ackResult, error) {
		_, id, err := ParseTaskID(p.TaskID)
		if err != nil {
			return nil, err
		}
		cb, ok := t.b.(CancelBackend)
		if !ok {
			return nil, errors.New("this server cannot cancel executions")
		}
		if _, err := cb.CancelExecution(ctx, id, "cancelled by the MCP client (tasks/cancel)"); err != nil {
			return nil, failure(err)
		}
		return &ackResult{ResultType: "complete"}, nil
	}))
}

func must(err error) {
	if err != nil {
		panic("mcp: " + err.Error())
	}
}

// getTask reads task id's execution, with the caller's key, and answers
// its state: working until it ends, then completed with the tool's
// result (a tool error included), or cancelled.
func (t *tools) getTask(ctx context.Context, taskID string) (*Task, error) {
	kind, id, err := ParseTaskID(taskID)
	if err != nil {
		return nil, err
	}
	ex, err := t.b.GetExecution(ctx, id, 0)
	if err != nil {
		return nil, failure(err)
	}
	task := &Task{ResultType: "complete", TaskID: taskID, Status: "working", CreatedAt: ex.CreatedAt.UTC().Format(time.RFC3339Nano),
		LastUpdatedAt: ex.CreatedAt.UTC().Format(time.RFC3339Nano), PollIntervalMs: taskPollInterval.Milliseconds()}
	for _, at := range []*time.Time{ex.StartedAt, ex.FinishedAt} {
		if at != nil {
			task.LastUpdatedAt = at.UTC().Format(time.RFC3339Nano)
		}
	}
	switch {
	case ex.Status == client.StatusAwaitingApproval:
		task.StatusMessage = t.awaitingMessage(ex.ApprovalID)
		return task, nil
	case ex.Status == client.StatusCancelled:
		task.Status, task.StatusMessage = "cancelled", "the execution was cancelled before it ended"
		return task, nil
	case !ex.Status.Final():
		task.StatusMessage = string(ex.Status)
		return task, nil
	}
	var (
		res *sdk.CallToolResult
		out any
	)
	if kind == taskCell {
		sb, ok := sessionsOf(t)
		if !ok {
			return nil, errors.New("this server has no sessions: a cell's task cannot be read")
		}
		c, err := sb.WaitCell(ctx, id, 0)
		if err != nil {
			return nil, failure(err)
		}
		res, out, err = t.cellEnded(c)
	} else {
		res, out, err = t.ended(ex)
	}
	if err != nil {
		// The tool's error: the task completed with a tool error, as the
		// call would have.
		res = &sdk.CallToolResult{}
		res.SetError(err)
	} else {
		res.StructuredContent = out
	}
	b, err := completeResult(res)
	if err != nil {
		return nil, fmt.Errorf("encoding the result of task %s: %w", taskID, err)
	}
	task.Status, task.StatusMessage, task.Result = "completed", string(ex.Status), b
	return task, nil
}

// completeResult is res as a completed task carries it: with resultType
// "complete", which the SDK sets only on a result it sends itself.
func completeResult(res *sdk.CallToolResult) (json.RawMessage, error) {
	b, err := json.Marshal(res)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	m["resultType"] = json.RawMessage(`"complete"`)
	return json.Marshal(m)
}
