package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/daemontest"
	"github.com/stockade-sh/stockade/model"
)

// ctx bounds one test's requests, so that a hung daemon fails the test.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

func newClient(t *testing.T, d *daemontest.Daemon, key string) *client.Client {
	t.Helper()
	c, err := client.New(d.URL, key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// drain reads a stream to its end and returns its events.
func drain(t *testing.T, s *client.Stream) []client.Event {
	t.Helper()
	var evs []client.Event
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			return evs
		}
		if err != nil {
			t.Fatalf("after %d events: %v", len(evs), err)
		}
		evs = append(evs, ev)
	}
}

func stdoutOf(evs []client.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		if o, ok := ev.(*client.Output); ok && o.Stream == "stdout" {
			b.WriteString(o.Data)
		}
	}
	return b.String()
}

func TestExecutions(t *testing.T) {
	d := daemontest.Start(t, daemontest.Options{})
	ws := d.Workspace(t, daemontest.NoApproval, 100)
	c := newClient(t, d, ws.Agent)

	t.Run("create", func(t *testing.T) {
		ex, err := c.CreateExecution(ctx(t), client.ExecutionRequest{Runtime: "python", Code: "print(6*7)", IdempotencyKey: "k1"})
		if err != nil {
			t.Fatal(err)
		}
		if ex.Status != client.StatusSucceeded || ex.Result == nil || ex.Result.Stdout != "42\n" || ex.Result.ExitCode != 0 {
			t.Fatalf("got %+v (result %+v), want succeeded with 42", ex, ex.Result)
		}
		again, err := c.CreateExecution(ctx(t), client.ExecutionRequest{Runtime: "python", Code: "print(6*7)", IdempotencyKey: "k1"})
		if err != nil {
			t.Fatal(err)
		}
		if again.ID != ex.ID || !again.Replayed {
			t.Errorf("retry with the same Idempotency-Key: got %s replayed=%v, want %s replayed", again.ID, again.Replayed, ex.ID)
		}
		got, err := c.GetExecution(ctx(t), ex.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got.ID != ex.ID || got.Result.Stdout != "42\n" || got.StartedAt == nil || got.FinishedAt == nil {
			t.Errorf("GetExecution: got %+v, want the ended execution %s", got, ex.ID)
		}
	})
	t.Run("stream", func(t *testing.T) {
		s, err := c.StreamExecution(ctx(t), client.ExecutionRequest{Runtime: "shell", Code: "echo 42; echo oops >&2; exit 3"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		evs := drain(t, s)
		if _, ok := evs[0].(*client.Started); !ok {
			t.Errorf("first event: got %T, want *client.Started", evs[0])
		}
		if got := stdoutOf(evs); got != "42\n" {
			t.Errorf("stdout events: got %q, want %q", got, "42\n")
		}
		end, ok := evs[len(evs)-1].(*client.Ended)
		if !ok {
			t.Fatalf("last event: got %T, want *client.Ended", evs[len(evs)-1])
		}
		if r := end.Execution.Result; end.Execution.Status != client.StatusFailed || r.ExitCode != 3 || r.Stderr != "oops\n" {
			t.Errorf("result: got %s %+v, want failed with exit code 3 and stderr oops", end.Execution.Status, r)
		}
	})
	t.Run("workspace, audit, tool calls, tools, health", func(t *testing.T) {
		w, err := c.Workspace(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if w.ID != ws.ID || w.Policy.Approval != "none" || w.Credits.Available >= 100 {
			t.Errorf("workspace: got %+v, want %s, approval none, credits spent", w, ws.ID)
		}
		calls, err := c.ListToolCalls(ctx(t), client.ToolCallFilter{Statuses: []client.ExecutionStatus{client.StatusFailed}})
		if err != nil {
			t.Fatal(err)
		}
		if len(calls.Items) != 1 || calls.Items[0].ExitCode == nil || *calls.Items[0].ExitCode != 3 {
			t.Fatalf("failed tool calls: got %+v, want the one that exited 3", calls.Items)
		}
		evs, err := c.ListAuditEvents(ctx(t), client.EventFilter{ExecutionID: calls.Items[0].ExecutionID})
		if err != nil {
			t.Fatal(err)
		}
		var types []string
		for _, e := range evs.Items {
			types = append(types, e.Type)
		}
		if !slices.Contains(types, "capability.invoke_allowed") || !slices.Contains(types, "execution.finished") {
			t.Errorf("audit events of the execution: got %v, want invoke_allowed and execution.finished", types)
		}
		page, err := c.ListAuditEvents(ctx(t), client.EventFilter{Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Items) != 1 || page.Next == "" {
			t.Errorf("a page of one: got %d items, next %q; want 1 and a cursor", len(page.Items), page.Next)
		}
		tools, err := c.Tools(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(tools) != 1 || tools[0].Name != "code.execute" || len(tools[0].Record) == 0 {
			t.Errorf("tools: got %+v, want code.execute with its record", tools)
		}
		h, err := c.Health(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if h.Status != "ok" || h.DefaultDriver != "runc" || h.Drivers["runc"] != "ok" {
			t.Errorf("health: got %+v, want ok on runc", h)
		}
	})
}

func TestApprovals(t *testing.T) {
	d := daemontest.Start(t, daemontest.Options{})
	ws := d.Workspace(t, nil, 100)
	agent, approver := newClient(t, d, ws.Agent), newClient(t, d, ws.Approver)

	t.Run("approved while streaming", func(t *testing.T) {
		s, err := agent.StreamExecution(ctx(t), client.ExecutionRequest{Runtime: "node", Code: "console.log(6*7)"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ev, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		ar, ok := ev.(*client.ApprovalRequired)
		if !ok || ar.Card.ApprovalID == "" || ar.Card.Code != "console.log(6*7)" || ar.Card.Runtime != "node" {
			t.Fatalf("first event: got %#v, want the approval card", ev)
		}
		pending, err := approver.ListApprovals(ctx(t), client.ApprovalFilter{Status: client.ApprovalPending})
		if err != nil {
			t.Fatal(err)
		}
		if len(pending.Items) != 1 || pending.Items[0].ID != ar.Card.ApprovalID {
			t.Fatalf("pending approvals: got %+v, want %s", pending.Items, ar.Card.ApprovalID)
		}
		dec, err := approver.Approve(ctx(t), ar.Card.ApprovalID, "looks fine")
		if err != nil {
			t.Fatal(err)
		}
		if dec.Approval.Status != client.ApprovalApproved || dec.Approval.Reason != "looks fine" || dec.Execution.ID != ar.Card.ExecutionID {
			t.Errorf("decision: got %+v, want approved with the reason", dec)
		}
		evs := drain(t, s)
		if got := stdoutOf(evs); got != "42\n" {
			t.Errorf("stdout after the approval: got %q, want 42", got)
		}
	})
	t.Run("denied", func(t *testing.T) {
		ex, err := agent.CreateExecution(ctx(t), client.ExecutionRequest{Runtime: "python", Code: "print(1)"})
		if err != nil {
			t.Fatal(err)
		}
		if ex.Status != client.StatusAwaitingApproval || ex.Approval == nil || ex.Approval.ApprovalID != ex.ApprovalID {
			t.Fatalf("got %+v, want awaiting approval with its card", ex)
		}
		if _, err := agent.Deny(ctx(t), ex.ApprovalID, ""); !errdefs.IsPermissionDenied(err) {
			t.Errorf("the agent denying: got %v, want permission denied", err)
		}
		if _, err := approver.Deny(ctx(t), ex.ApprovalID, "no"); err != nil {
			t.Fatal(err)
		}
		got, err := agent.GetExecution(ctx(t), ex.ID, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != client.StatusDenied {
			t.Errorf("status: got %s, want denied", got.Status)
		}
		if _, err := approver.Approve(ctx(t), ex.ApprovalID, ""); !errdefs.IsConflict(err) {
			t.Errorf("approving a denied request: got %v, want a conflict", err)
		}
	})
}

// The API's error answers arrive as errors of the right class, with the
// API's message and Retry-After. The last case holds the daemon's only
// slot.
func TestErrors(t *testing.T) {
	d := daemontest.Start(t, daemontest.Options{Service: capability.ServiceOptions{MaxConcurrent: 1, MaxQueue: -1}})
	ws := d.Workspace(t, daemontest.NoApproval, 100)
	broke := d.Workspace(t, daemontest.NoApproval, 0)
	pythonOnly := d.Workspace(t, func(p *model.Policy) { p.Approval = model.ApprovalNone; p.Runtimes = []string{"python"} }, 100)

	for _, tc := range []struct {
		name  string
		key   string
		call  func(c *client.Client) error
		class func(error) bool
		code  string
		msg   string
	}{
		{"a bad key", "sk_nope", func(c *client.Client) error { _, err := c.Workspace(ctx(t)); return err }, errdefs.IsUnauthenticated, "unauthenticated", "invalid or revoked API key"},
		{"an unknown execution", ws.Agent, func(c *client.Client) error { _, err := c.GetExecution(ctx(t), "ex_nope", 0); return err }, errdefs.IsNotFound, "not_found", `execution "ex_nope" not found`},
		{"an unknown runtime", ws.Agent, func(c *client.Client) error {
			_, err := c.CreateExecution(ctx(t), client.ExecutionRequest{Runtime: "ruby", Code: "puts 1"})
			return err
		}, errdefs.IsInvalidArgument, "invalid_argument", "ruby"},
		{"a runtime the policy refuses", pythonOnly.Agent, func(c *client.Client) error {
			_, err := c.StreamExecution(ctx(t), client.ExecutionRequest{Runtime: "node", Code: "1"})
			return err
		}, errdefs.IsPermissionDenied, "permission_denied", "node"},
		{"no credits", broke.Agent, func(c *client.Client) error {
			_, err := c.CreateExecution(ctx(t), client.ExecutionRequest{Runtime: "python", Code: "1"})
			return err
		}, errdefs.IsPaymentRequired, "insufficient_credits", "insufficient credits"},
		{"an agent approving", ws.Agent, func(c *client.Client) error { _, err := c.Approve(ctx(t), "apr_nope", ""); return err }, errdefs.IsPermissionDenied, "permission_denied", "approver or admin"},
		{"at capacity", ws.Agent, func(c *client.Client) error {
			// One run holds the only slot (and the queue has none).
			s, err := c.StreamExecution(ctx(t), client.ExecutionRequest{Runtime: "shell", Code: "sleep 20"})
			if err != nil {
				return err
			}
			defer s.Close()
			if ev, err := s.Next(); err != nil {
				return err
			} else if _, ok := ev.(*client.Started); !ok {
				return fmt.Errorf("got %T, want the long run started", ev)
			}
			_, err = c.CreateExecution(ctx(t), client.ExecutionRequest{Runtime: "python", Code: "1"})
			return err
		}, errdefs.IsResourceExhausted, "resource_exhausted", "at capacity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(newClient(t, d, tc.key))
			if !tc.class(err) {
				t.Fatalf("got %v, want another class", err)
			}
			e, ok := client.AsError(err)
			if !ok {
				t.Fatalf("got %T, want a *client.Error in the chain", err)
			}
			if e.Code != tc.code || !strings.Contains(e.Message, tc.msg) {
				t.Errorf("got %s %q, want %s containing %q", e.Code, e.Message, tc.code, tc.msg)
			}
			if tc.code == "resource_exhausted" && e.RetryAfter != time.Second {
				t.Errorf("RetryAfter: got %s, want 1s", e.RetryAfter)
			}
		})
	}
}

// TestExample runs the package's example against a real daemon, once
// without approval and once with an approver who approves meanwhile, and
// checks what it prints.
func TestExample(t *testing.T) {
	d := daemontest.Start(t, daemontest.Options{})
	for _, tc := range []struct {
		name   string
		policy func(*model.Policy)
		want   string
	}{
		{"no approval", daemontest.NoApproval, "succeeded: 42\n"},
		{"approval", nil, "waiting for an approver to decide on apr_"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := d.Workspace(t, tc.policy, 10)
			t.Setenv("STOCKADE_URL", d.URL)
			t.Setenv("STOCKADE_KEY", ws.Agent)
			if tc.policy == nil {
				go approveNext(t, newClient(t, d, ws.Approver))
			}
			out := captureStdout(t, Example)
			if !strings.HasPrefix(out, tc.want) || !strings.HasSuffix(out, "succeeded: 42\n") {
				t.Errorf("the example printed %q, want it to start with %q and end with the result", out, tc.want)
			}
		})
	}
}

// approveNext approves the first approval request that appears.
func approveNext(t *testing.T, approver *client.Client) {
	for range 600 {
		p, err := approver.ListApprovals(t.Context(), client.ApprovalFilter{Status: client.ApprovalPending})
		if err == nil && len(p.Items) > 0 {
			if _, err := approver.Approve(t.Context(), p.Items[0].ID, ""); err != nil {
				t.Errorf("approving: %v", err)
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Error("no approval request appeared")
}

// captureStdout runs fn with os.Stdout going to a pipe and returns what
// it wrote.
func captureStdout(t *testing.T, fn func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	got := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		got <- string(b)
	}()
	func() {
		defer func() { os.Stdout = old; w.Close() }()
		fn()
	}()
	return <-got
}
