package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/stockade-sh/stockade/client"
)

// Languages are the languages run_code takes.
var Languages = []string{"python", "node", "shell"}

// RunCodeInput is run_code's arguments.
type RunCodeInput struct {
	Code     string `json:"code" jsonschema:"the program's source code"`
	Language string `json:"language" jsonschema:"the language of the code: python, node or shell"`
	Timeout  int64  `json:"timeout,omitempty" jsonschema:"wall clock limit in seconds; the default and the ceiling are the workspace policy's"`
}

// WaitInput is wait_for_approval's arguments.
type WaitInput struct {
	ExecutionID string `json:"execution_id" jsonschema:"the execution_id of a run_code result whose approval is pending"`
}

// RunOutput is the structured result of run_code and wait_for_approval.
// The program's stdout and stderr are the result's text content.
type RunOutput struct {
	Status      client.ExecutionStatus `json:"status" jsonschema:"succeeded, failed (non-zero exit), timed_out, oom_killed, killed, or awaiting_approval"`
	ExecutionID string                 `json:"execution_id" jsonschema:"the execution's id in Stockade"`
	ExitCode    *int                   `json:"exit_code,omitempty" jsonschema:"the program's exit code, once it ran"`
	Signal      int                    `json:"signal,omitempty" jsonschema:"the signal that killed the program, if one did"`
	DurationMS  int64                  `json:"duration_ms,omitempty" jsonschema:"how long the program ran, in milliseconds"`
	// The output cap cut stdout or stderr.
	StdoutTruncated bool   `json:"stdout_truncated" jsonschema:"stdout was cut at the output cap"`
	StderrTruncated bool   `json:"stderr_truncated" jsonschema:"stderr was cut at the output cap"`
	Driver          string `json:"driver,omitempty" jsonschema:"the sandbox driver that ran the code"`
	// Set while approval is pending.
	ApprovalID        string     `json:"approval_id,omitempty" jsonschema:"the approval request an approver must decide"`
	ApprovalURL       string     `json:"approval_url,omitempty" jsonschema:"where an approver decides"`
	ApprovalExpiresAt *time.Time `json:"approval_expires_at,omitempty" jsonschema:"when the approval request expires undecided"`
}

func addRunCode(s *sdk.Server, t *tools) bool {
	in := inputWithLanguages[RunCodeInput]("run_code")
	in.Properties["timeout"].Minimum = jsonschema.Ptr(1.0)
	sdk.AddTool(s, &sdk.Tool{
		Name:  "run_code",
		Title: "Run code in a sandbox",
		Description: "Runs a program once in a fresh, hardened sandbox without network and returns its stdout and stderr " +
			"(text content) and its status and exit code (structured content). Nothing persists between calls. " +
			"A human may have to approve the call first; see wait_for_approval.",
		InputSchema: in,
		Annotations: closedWorld(),
	}, t.runCode)
	return true
}

func addWaitForApproval(s *sdk.Server, t *tools) bool {
	sdk.AddTool(s, &sdk.Tool{
		Name:  "wait_for_approval",
		Title: "Wait for an approval",
		Description: fmt.Sprintf("Waits (up to %s) for an approver's decision on a run_code call whose approval is pending, "+
			"then for the run, and returns what run_code would have. Call it again while approval is still pending.", t.opts.ApprovalWait),
		Annotations: readOnly(),
	}, t.waitForApproval)
	return true
}

// approvalInput names the elicitation of an approval in a multi round-trip
// tool call.
const approvalInput = "approval"

// approvalState is the request state of a run_code call that asked the
// client to show an approval page: the call resumes from it. A client
// echoes it back and could change it; it names only an execution, which
// the backend reads with the caller's own key (of one workspace).
type approvalState struct {
	ExecutionID string    `json:"execution_id"`
	ApprovalID  string    `json:"approval_id"`
	ExpiresAt   time.Time `json:"expires_at"`
	Mode        string    `json:"mode"`
}

func (t *tools) runCode(ctx context.Context, req *sdk.CallToolRequest, in RunCodeInput) (*sdk.CallToolResult, RunOutput, error) {
	if req.Params.RequestState != "" {
		return t.resume(ctx, req)
	}
	er := client.ExecutionRequest{Runtime: in.Language, Code: in.Code, TimeoutMS: in.Timeout * 1000}
	streamCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := t.b.StreamExecution(streamCtx, er)
	if err != nil {
		return nil, RunOutput{}, failure(err)
	}
	defer s.Close()
	p := newProgress(req)
	var (
		card     *client.ApprovalCard
		bound    *time.Timer
		waitOver atomic.Bool // the bound of the wait for approval has passed
		id       string
	)
	defer func() {
		if bound != nil {
			bound.Stop()
		}
	}()
	for {
		ev, err := s.Next()
		switch {
		case err != nil && waitOver.Load():
			return t.pending(ctx, id)
		case err != nil && ctx.Err() != nil:
			return nil, RunOutput{}, ctx.Err()
		case err != nil && id != "":
			// The stream was cut (a daemon restart, a proxy): the
			// execution goes on; wait for it as wait_for_approval would.
			return t.await(ctx, req, id, time.Now().Add(t.opts.ApprovalWait))
		case err != nil:
			return nil, RunOutput{}, failure(err)
		}
		switch e := ev.(type) {
		case *client.ApprovalRequired:
			card, id = &e.Card, e.Card.ExecutionID
			if t.becomeTask(ctx, taskCode, id, card.ApprovalID) {
				return textResult("Approval is pending; this call is task " + TaskID(taskCode, id) + "."), RunOutput{}, nil
			}
			if mode := t.elicitMode(req); mode != "" {
				return t.askApproval(card, mode)
			}
			p.note(ctx, fmt.Sprintf("waiting up to %s for an approver to decide on %s at %s", t.opts.ApprovalWait, card.ApprovalID, t.opts.approvalURL(card.ApprovalID)))
			bound = time.AfterFunc(t.opts.ApprovalWait, func() { waitOver.Store(true); cancel() })
		case *client.Started:
			// A decision that came as the bound passed loses to it: the
			// result says pending, and wait_for_approval finds it running.
			if bound != nil {
				bound.Stop()
			}
			id = e.ExecutionID
			p.note(ctx, "running on "+e.Driver)
		case *client.Output:
			p.output(ctx, e)
		case *client.Ended:
			return t.ended(&e.Execution)
		case *client.StreamError:
			return nil, RunOutput{}, fmt.Errorf("Stockade could not read the outcome of execution %s (%s); call wait_for_approval with it to read it again", id, e.Message)
		}
	}
}

// elicitMode is how the client can be asked to show an approval page:
// "url" (it opens the page), "form" (it shows the message), or "" when it
// supports no elicitation.
func (t *tools) elicitMode(req *sdk.CallToolRequest) string {
	caps := req.ClientCapabilities()
	if caps == nil || caps.Elicitation == nil {
		return ""
	}
	if caps.Elicitation.URL != nil && strings.Contains(t.opts.approvalURL("x"), "://") {
		return "url"
	}
	if caps.Elicitation.Form == nil && caps.Elicitation.URL != nil {
		return "" // URL mode only, and no absolute URL to give
	}
	return "form"
}

// askApproval asks the client to show the approval page of card (mode
// "url") or a message that says where it is ("form"). The call resumes in
// resume with the user's answer: the SDK retries it itself for clients of
// older protocol versions, the client does on newer ones.
func (t *tools) askApproval(card *client.ApprovalCard, mode string) (*sdk.CallToolResult, RunOutput, error) {
	state, _ := json.Marshal(approvalState{ExecutionID: card.ExecutionID, ApprovalID: card.ApprovalID, ExpiresAt: card.ExpiresAt, Mode: mode})
	page := t.opts.approvalURL(card.ApprovalID)
	what := fmt.Sprintf("Stockade needs a human to approve running this %s code (approval %s, expires %s).",
		card.Runtime, card.ApprovalID, card.ExpiresAt.Format(time.RFC3339))
	p := &sdk.ElicitParams{Mode: mode}
	if mode == "url" {
		p.Message = what + " Open the page to review the code and decide."
		p.URL, p.ElicitationID = page, card.ApprovalID
	} else {
		p.Message = fmt.Sprintf("%s An approver decides at %s (or with POST /v1/approvals/%s/approve and an approver key). "+
			"Accept to wait for the decision; decline to go on and check later.", what, page, card.ApprovalID)
		p.RequestedSchema = &jsonschema.Schema{Type: "object", Properties: map[string]*jsonschema.Schema{}}
	}
	return &sdk.CallToolResult{InputRequests: sdk.InputRequestMap{approvalInput: p}, RequestState: string(state)}, RunOutput{}, nil
}

// resume continues a run_code call after the client showed the approval
// page: it waits for the decision until the request expires when the user
// accepted, and answers that approval is pending otherwise.
func (t *tools) resume(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, RunOutput, error) {
	var st approvalState
	if err := json.Unmarshal([]byte(req.Params.RequestState), &st); err != nil || st.ExecutionID == "" {
		return nil, RunOutput{}, errors.New("the request state of this call is not Stockade's; call run_code again without one")
	}
	answer, _ := req.Params.InputResponses[approvalInput].(*sdk.ElicitResult)
	if answer == nil || answer.Action != "accept" {
		return t.pending(ctx, st.ExecutionID)
	}
	// The daemon expires approvals once a second.
	res, out, err := t.await(ctx, req, st.ExecutionID, st.ExpiresAt.Add(2*time.Second))
	if st.Mode == "url" && out.Status != client.StatusAwaitingApproval {
		// The page's interaction is over; the client may close it.
		_ = req.Session.NotifyElicitationComplete(ctx, &sdk.ElicitationCompleteParams{ElicitationID: st.ApprovalID})
	}
	return res, out, err
}

func (t *tools) waitForApproval(ctx context.Context, req *sdk.CallToolRequest, in WaitInput) (*sdk.CallToolResult, RunOutput, error) {
	if in.ExecutionID == "" {
		return nil, RunOutput{}, errors.New("execution_id is required: the execution_id of a run_code result whose approval is pending")
	}
	return t.await(ctx, req, in.ExecutionID, time.Now().Add(t.opts.ApprovalWait))
}

// pollWait is the longest single wait for an execution: the call notes
// progress between waits.
const pollWait = 20 * time.Second

// await waits for execution id to end, answering that approval is pending
// if it still waits for one at deadline. A run, once approved, is waited
// for to its end (its own wall clock bounds it).
func (t *tools) await(ctx context.Context, req *sdk.CallToolRequest, id string, deadline time.Time) (*sdk.CallToolResult, RunOutput, error) {
	p := newProgress(req)
	wait := time.Duration(0)
	for {
		ex, err := t.b.GetExecution(ctx, id, wait)
		if err != nil {
			return nil, RunOutput{}, failure(err)
		}
		switch {
		case ex.Status.Final():
			return t.ended(ex)
		case ex.Status == client.StatusAwaitingApproval:
			left := time.Until(deadline)
			if left <= 0 {
				return t.pendingResult(ex)
			}
			wait = min(left, pollWait)
			p.note(ctx, fmt.Sprintf("waiting for an approver to decide on %s", ex.ApprovalID))
		default:
			wait = pollWait
			p.note(ctx, "running")
		}
	}
}

// pending answers that execution id waits for approval.
func (t *tools) pending(ctx context.Context, id string) (*sdk.CallToolResult, RunOutput, error) {
	ex, err := t.b.GetExecution(context.WithoutCancel(ctx), id, 0)
	if err != nil {
		return nil, RunOutput{}, failure(err)
	}
	if ex.Status.Final() {
		return t.ended(ex) // decided and run meanwhile
	}
	return t.pendingResult(ex)
}

func (t *tools) pendingResult(ex *client.Execution) (*sdk.CallToolResult, RunOutput, error) {
	out := RunOutput{Status: ex.Status, ExecutionID: ex.ID, ApprovalID: ex.ApprovalID}
	if ex.Status != client.StatusAwaitingApproval {
		// Approved, not ended yet.
		return textResult(fmt.Sprintf("Execution %s was approved and is %s; call wait_for_approval with execution_id %q for its result.",
			ex.ID, ex.Status, ex.ID)), out, nil
	}
	out.ApprovalURL = t.opts.approvalURL(ex.ApprovalID)
	msg := fmt.Sprintf("Approval is pending: an approver must approve request %s at %s before the code runs.", ex.ApprovalID, out.ApprovalURL)
	if ex.Approval != nil {
		exp := ex.Approval.ExpiresAt
		out.ApprovalExpiresAt = &exp
		msg += " It expires at " + exp.Format(time.RFC3339) + "."
	}
	msg += fmt.Sprintf(" Call wait_for_approval with execution_id %q to keep waiting for the decision and the result.", ex.ID)
	return textResult(msg), out, nil
}

// ended is the result of an execution that has ended: the program's
// output when it ran, a tool error when it did not (denied, expired,
// unable to launch).
func (t *tools) ended(ex *client.Execution) (*sdk.CallToolResult, RunOutput, error) {
	r := ex.Result
	switch {
	case ex.Status == client.StatusDenied:
		return nil, RunOutput{}, fmt.Errorf("an approver denied approval request %s: the code did not run and was not charged; "+
			"change what the code does before asking again", ex.ApprovalID)
	case ex.Status == client.StatusApprovalExpired:
		return nil, RunOutput{}, fmt.Errorf("approval request %s expired before an approver decided: the code did not run; "+
			"call run_code again to ask anew", ex.ApprovalID)
	case r == nil || ex.Status == client.StatusLaunchFailed:
		why := "no result"
		if r != nil && r.Error != "" {
			why = r.Error
		}
		return nil, RunOutput{}, fmt.Errorf("Stockade could not run the code (%s); nothing was charged; retry later, or tell the operator if it persists", why)
	}
	out := RunOutput{Status: ex.Status, ExecutionID: ex.ID, Signal: r.Signal, DurationMS: r.DurationMS,
		StdoutTruncated: r.StdoutTruncated, StderrTruncated: r.StderrTruncated, Driver: r.Driver, ApprovalID: ex.ApprovalID}
	if r.ExitCode >= 0 {
		code := r.ExitCode
		out.ExitCode = &code
	}
	var content []sdk.Content
	if r.Stdout != "" {
		content = append(content, &sdk.TextContent{Text: r.Stdout})
	}
	if r.Stderr != "" {
		content = append(content, &sdk.TextContent{Text: "stderr:\n" + r.Stderr})
	}
	content = append(content, &sdk.TextContent{Text: summary(ex.Status, r)})
	return &sdk.CallToolResult{Content: content}, out, nil
}

// summary says in a line how the program ended.
func summary(st client.ExecutionStatus, r *client.Result) string {
	var s string
	switch st {
	case client.StatusSucceeded, client.StatusFailed:
		s = fmt.Sprintf("exit code %d (%s) in %d ms", r.ExitCode, st, r.DurationMS)
	case client.StatusTimedOut:
		s = fmt.Sprintf("timed out: the sandbox was killed at the wall clock limit after %d ms", r.DurationMS)
	case client.StatusOOMKilled:
		s = "killed: out of memory"
	default:
		s = fmt.Sprintf("%s by signal %d", st, r.Signal)
	}
	if r.Error != "" {
		s += " (" + r.Error + ")"
	}
	for _, c := range []struct {
		cut  bool
		name string
	}{{r.StdoutTruncated, "stdout"}, {r.StderrTruncated, "stderr"}} {
		if c.cut {
			s += "; " + c.name + " was truncated at the output cap"
		}
	}
	return s
}

// progress sends a call's progress notifications, when the client asked
// for them with a progress token: notes of what the call waits for, and
// the program's output as it comes. Progress counts the notifications.
type progress struct {
	req   *sdk.CallToolRequest
	token any
	n     float64
}

func newProgress(req *sdk.CallToolRequest) *progress {
	return &progress{req: req, token: req.Params.GetProgressToken()}
}

func (p *progress) note(ctx context.Context, msg string) {
	if p.token == nil {
		return
	}
	p.n++
	// A notification that does not arrive loses only progress.
	_ = p.req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{ProgressToken: p.token, Progress: p.n, Message: msg})
}

func (p *progress) output(ctx context.Context, o *client.Output) {
	p.note(ctx, o.Stream+": "+o.Data)
}
