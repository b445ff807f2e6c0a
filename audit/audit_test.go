package audit_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
)

// Values with characters the JSON encoder escapes, to show that the
// structs escape them as the maps did.
const (
	sha    = "2ddfa05c2daa8aba3e9666ac6f8f041be42da5987823861f2aefae090d9ae93c"
	quirky = "a <b> & \"c\" \u2028 é"
)

// oldToolEvent is the data of the tool events as engine/drift.go declared
// it before the typed events.
type oldToolEvent struct {
	Tool                string          `json:"tool"`
	Fingerprint         string          `json:"fingerprint"`
	PreviousFingerprint string          `json:"previous_fingerprint,omitempty"`
	Record              json.RawMessage `json:"record,omitempty"`
	Diff                []string        `json:"diff,omitempty"`
	Growth              []string        `json:"growth,omitempty"`
	ReviewRequired      bool            `json:"review_required,omitempty"`
	Source              *struct {
		Seq  int64  `json:"seq"`
		Hash string `json:"hash"`
	} `json:"source,omitempty"`
}

// oldPolicyView is wire.Policy (before, api.PolicyView) as the CLI put it in policy.updated
// events before the typed events.
type oldPolicyView struct {
	CodeExecution bool     `json:"code_execution"`
	Approval      string   `json:"approval"`
	Network       string   `json:"network"`
	MaxTimeoutMS  int64    `json:"max_timeout_ms"`
	Runtimes      []string `json:"runtimes"`
	ToolChanges   string   `json:"tool_changes"`
}

// TestEventsEncodeAsBefore checks, for every event type, that the struct
// encodes to the bytes the code before the typed events wrote for the same
// inputs: the maps and structs (old) below are that code's, copied from
// engine/ and cmd/stockade/. The chain hashes the data byte for byte, so a
// difference would be a new shape, not a new spelling.
func TestEventsEncodeAsBefore(t *testing.T) {
	request := func(network string) map[string]any {
		return map[string]any{"capability": "code.execute", "runtime": "python", "timeout_ms": int64(1500), "network": network,
			"input_sha256": sha, "stdin_sha256": sha}
	}
	invocation := func(network string) audit.Invocation {
		return audit.Invocation{Capability: "code.execute", Runtime: "python", TimeoutMS: 1500, Network: network, InputSHA256: sha, StdinSHA256: sha}
	}
	raw := func(v any) json.RawMessage {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	record := json.RawMessage(`{"name":"fetch","egress":{"allow":["a.test"]},"note":"x \u003e y"}`)
	exit0, exit3 := 0, 3
	pol := audit.Policy{CodeExecution: true, Approval: "required", Network: "deny", MaxTimeoutMS: 30000, Runtimes: []string{"python", "shell"}, ToolChanges: "flag"}
	oldView := func(p audit.Policy) oldPolicyView {
		return oldPolicyView{CodeExecution: p.CodeExecution, Approval: p.Approval, Network: p.Network, MaxTimeoutMS: p.MaxTimeoutMS,
			Runtimes: p.Runtimes, ToolChanges: p.ToolChanges}
	}
	oldPol := oldView(pol)
	noRuntimes := pol
	noRuntimes.Runtimes = nil
	for _, tc := range []struct {
		name string
		ev   audit.Event
		old  any // nil: the event had no data
	}{
		{"invoke allowed", audit.InvokeAllowedEvent{ApprovalRequired: true, Request: invocation("allow")},
			map[string]any{"approval_required": true, "request": raw(request("allow"))}},
		{"invoke allowed without approval", audit.InvokeAllowedEvent{Request: invocation("deny")},
			map[string]any{"approval_required": false, "request": raw(request("deny"))}},
		{"invoke denied", audit.InvokeDeniedEvent{Decision: "runtime_not_allowed", Request: invocation("deny")},
			map[string]any{"decision": "runtime_not_allowed", "request": raw(request("deny"))}},
		{"approval requested", audit.ApprovalRequestedEvent{}, nil},
		{"approval approved", audit.ApprovalApprovedEvent{ApprovalID: "apr_1"}, map[string]string{"approval_id": "apr_1"}},
		{"approval denied", audit.ApprovalDeniedEvent{ApprovalID: "apr_1"}, map[string]string{"approval_id": "apr_1"}},
		{"approval expired", audit.ApprovalExpiredEvent{ApprovalID: "apr_1"}, map[string]string{"approval_id": "apr_1"}},
		{"execution finished with exit code", audit.ExecutionFinishedEvent{Status: model.StatusFailed, Driver: "runc", ResultSHA256: sha, Credits: 2, ExitCode: &exit3},
			map[string]any{"status": model.StatusFailed, "driver": "runc", "result_sha256": sha, "credits": int64(2), "exit_code": 3}},
		{"execution finished with exit code 0", audit.ExecutionFinishedEvent{Status: model.StatusSucceeded, Driver: "gvisor", ResultSHA256: sha, Credits: 2, ExitCode: &exit0},
			map[string]any{"status": model.StatusSucceeded, "driver": "gvisor", "result_sha256": sha, "credits": int64(2), "exit_code": 0}},
		{"execution finished without exit code", audit.ExecutionFinishedEvent{Status: model.StatusLaunchFailed, ResultSHA256: sha},
			map[string]any{"status": model.StatusLaunchFailed, "driver": "", "result_sha256": sha, "credits": int64(0)}},
		{"execution recovered", audit.ExecutionRecoveredEvent{}, nil},
		{"execution cancelled running", audit.ExecutionCancelledEvent{From: model.StatusRunning, To: model.StatusKilled, Credits: 2},
			struct {
				From       string `json:"from"`
				To         string `json:"to"`
				Credits    int64  `json:"credits"`
				ApprovalID string `json:"approval_id,omitempty"`
			}{From: "running", To: "killed", Credits: 2}},
		{"execution cancelled awaiting approval", audit.ExecutionCancelledEvent{From: model.StatusAwaitingApproval, To: model.StatusCancelled, ApprovalID: "apr_1"},
			struct {
				From       string `json:"from"`
				To         string `json:"to"`
				Credits    int64  `json:"credits"`
				ApprovalID string `json:"approval_id,omitempty"`
			}{From: "awaiting_approval", To: "cancelled", ApprovalID: "apr_1"}},
		{"tool registered", audit.ToolRegisteredEvent{Tool: "fetch", Fingerprint: "sha256:1", Record: record},
			oldToolEvent{Tool: "fetch", Fingerprint: "sha256:1", Record: record}},
		{"tool changed", audit.ToolChangedEvent{Tool: "fetch", Fingerprint: "sha256:2", PreviousFingerprint: "sha256:1", Record: record,
			Diff: []string{"egress.allow: [a] -> [a, b] (+b)"}, Growth: []string{"egress.allow +b"}, ReviewRequired: true},
			oldToolEvent{Tool: "fetch", Fingerprint: "sha256:2", PreviousFingerprint: "sha256:1", Record: record,
				Diff: []string{"egress.allow: [a] -> [a, b] (+b)"}, Growth: []string{"egress.allow +b"}, ReviewRequired: true}},
		{"tool changed, a workspace's copy", audit.ToolChangedEvent{Tool: "fetch", Fingerprint: "sha256:2", PreviousFingerprint: "sha256:1", Record: record,
			Diff: []string{"limits.timeout: 30s -> 10s"}, Source: &audit.EventRef{Seq: 7, Hash: sha}},
			oldToolEvent{Tool: "fetch", Fingerprint: "sha256:2", PreviousFingerprint: "sha256:1", Record: record,
				Diff: []string{"limits.timeout: 30s -> 10s"}, Source: &struct {
					Seq  int64  `json:"seq"`
					Hash string `json:"hash"`
				}{7, sha}}},
		{"tool removed", audit.ToolRemovedEvent{Tool: "retired", Fingerprint: "sha256:3"}, oldToolEvent{Tool: "retired", Fingerprint: "sha256:3"}},
		{"tool review approved", audit.ToolReviewApprovedEvent{Tool: "fetch", Fingerprint: "sha256:2"},
			struct {
				Tool        string `json:"tool"`
				Fingerprint string `json:"fingerprint"`
			}{"fetch", "sha256:2"}},
		{"egress denied with address", audit.EgressDeniedEvent{Sandbox: "sbx-1", Tool: "fetch", Protocol: "http", Name: "allowed.test", Port: 80, Detail: "127.0.0.1 is loopback", Addr: "127.0.0.1"},
			map[string]any{"sandbox": "sbx-1", "tool": "fetch", "protocol": "http", "name": "allowed.test", "port": 80, "detail": "127.0.0.1 is loopback", "addr": "127.0.0.1"}},
		{"egress denied by name", audit.EgressDeniedEvent{Sandbox: "sbx-1", Tool: "fetch", Protocol: "dns", Name: quirky, Port: 53, Detail: quirky},
			map[string]any{"sandbox": "sbx-1", "tool": "fetch", "protocol": "dns", "name": quirky, "port": 53, "detail": quirky}},
		{"refusals suppressed", audit.RefusalsSuppressedEvent{Suppressed: 203, Audited: 100}, map[string]any{"suppressed": 203, "audited": 100}},
		{"broker call", audit.BrokerCallEvent{Sandbox: "sbx-1", Tool: "brokered", Operation: "echo", ParamsSHA256: sha, Status: 200},
			map[string]any{"sandbox": "sbx-1", "tool": "brokered", "operation": "echo", "params_sha256": sha, "status": 200}},
		{"broker denied", audit.BrokerDeniedEvent{Sandbox: "sbx-1", Tool: "brokered", Operation: quirky},
			map[string]any{"sandbox": "sbx-1", "tool": "brokered", "operation": quirky, "params_sha256": "", "status": 0}},
		{"workspace created", audit.WorkspaceCreatedEvent{Name: "alpha"}, map[string]string{"name": "alpha"}},
		{"key created", audit.KeyCreatedEvent{KeyID: "key_1", Role: model.RoleAgent}, map[string]string{"key_id": "key_1", "role": "agent"}},
		{"key revoked", audit.KeyRevokedEvent{KeyID: "key_1", Role: model.RoleAdmin}, map[string]string{"key_id": "key_1", "role": "admin"}},
		{"credits granted", audit.CreditsGrantedEvent{Amount: 100}, map[string]int64{"amount": 100}},
		{"policy updated", audit.PolicyUpdatedEvent{Before: pol, After: noRuntimes},
			map[string]any{"before": oldPol, "after": oldView(noRuntimes)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := audit.NewEvent(tc.ev).Data
			var want json.RawMessage
			if tc.old != nil {
				want = raw(tc.old)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("data:\n got %s\nwant %s", got, want)
			}
		})
	}
}

// allEvents holds one event of every type, with data in every field.
var allEvents = []audit.Event{
	audit.SessionPausedEvent{CheckpointBytes: 1, SandboxID: "sb_1", SessionID: "ses_1"},
	audit.SessionResumedEvent{PausedMS: 1, SandboxID: "sb_2", SessionID: "ses_1"},
	audit.SessionSnapshottedEvent{Bytes: 1, ExpiresAt: "2026-12-08T00:00:00Z", Name: "n", SessionID: "ses_1", SnapshotID: "snp_1", StallMS: 1},
	audit.SessionForkedEvent{ApprovalID: "apr_1", SessionID: "ses_2", SnapshotID: "snp_1", SourceID: "ses_1"},
	audit.SnapshotDeletedEvent{SessionID: "ses_1", SnapshotID: "snp_1"},
	audit.InvokeAllowedEvent{ApprovalRequired: true, Request: audit.Invocation{Capability: "code.execute", Network: "allow", Runtime: "python", TimeoutMS: 1}},
	audit.InvokeDeniedEvent{Decision: "role_cannot_invoke", Request: audit.Invocation{Runtime: "node"}},
	audit.ApprovalRequestedEvent{},
	audit.ApprovalApprovedEvent{ApprovalID: "apr_1"},
	audit.ApprovalDeniedEvent{ApprovalID: "apr_2"},
	audit.ApprovalExpiredEvent{ApprovalID: "apr_3"},
	audit.ExecutionFinishedEvent{Credits: 2, Driver: "runc", ExitCode: new(1), ResultSHA256: sha, Status: model.StatusFailed},
	audit.ExecutionRecoveredEvent{},
	audit.ExecutionCancelledEvent{From: model.StatusQueued, To: model.StatusCancelled, ApprovalID: "apr_4"},
	audit.ToolRegisteredEvent{Tool: "t", Fingerprint: "f", Record: json.RawMessage(`{"name":"t"}`)},
	audit.ToolChangedEvent{Tool: "t", Fingerprint: "g", PreviousFingerprint: "f", Record: json.RawMessage(`{"name":"t"}`),
		Diff: []string{"d"}, Growth: []string{"g"}, ReviewRequired: true, Source: &audit.EventRef{Seq: 1, Hash: sha}},
	audit.ToolRemovedEvent{Tool: "t", Fingerprint: "g"},
	audit.ToolReviewApprovedEvent{Tool: "t", Fingerprint: "g"},
	audit.EgressDeniedEvent{Addr: "10.0.0.1", Detail: "private", Name: "n", Port: 443, Protocol: "tls", Sandbox: "s", Tool: "t"},
	audit.RefusalsSuppressedEvent{Audited: 100, Suppressed: 1},
	audit.BrokerCallEvent{Operation: "echo", ParamsSHA256: sha, Sandbox: "s", Status: 200, Tool: "t"},
	audit.BrokerDeniedEvent{Operation: "other", ParamsSHA256: sha, Sandbox: "s", Tool: "t"},
	audit.WorkspaceCreatedEvent{Name: "w"},
	audit.KeyCreatedEvent{KeyID: "key_1", Role: model.RoleApprover},
	audit.KeyRevokedEvent{KeyID: "key_1", Role: model.RoleApprover},
	audit.CreditsGrantedEvent{Amount: 5},
	audit.PolicyUpdatedEvent{After: audit.Policy{Network: "allow", Runtimes: []string{"python"}}, Before: audit.Policy{Network: "deny"}},
	audit.SessionCreatedEvent{Approval: model.ApprovalPerSession, Driver: "runc", ExpiresAt: "2026-12-01T11:00:00Z", IdleTimeoutMS: 600000,
		Network: "deny", Runtime: "python", SandboxID: "sb", SessionID: "ses_1", Tool: "code.execute", WorkspaceBytes: 1 << 28},
	audit.SessionEndedEvent{Cells: 3, EndReason: model.EndIdle, SessionID: "ses_1"},
	audit.SessionFileTransferredEvent{Direction: audit.TransferIn, Path: "/workspace/a.csv", SessionID: "ses_1", SHA256: sha, Size: 10},
	audit.TemplateBuiltEvent{Template: "analytics", Digest: "sha256:2", PreviousDigest: "sha256:1", Key: "sha256:k", Declaration: "sha256:d",
		CacheHit: true, Pull: true, SBOM: audit.TemplateSBOM{Debian: 3, Wheels: 1, NPM: 0, Files: 1}, Added: []string{"python3-yaml 6.0.2-1"},
		Removed: []string{"python3-bs4 4.13.4-2"}, Golden: "made", Job: "tb_1"},
	audit.TemplateBuildFailedEvent{Template: "analytics", Declaration: "sha256:d", Pull: true, Stage: "fetching", Error: "no such package",
		Cancelled: true, Job: "tb_2"},
}

// TestCodes checks that every event type has one code, that no two share
// a type or a code, and that the codes are the ones the chains hold:
// codes are stable, whatever the Go names.
func TestCodes(t *testing.T) {
	want := map[string]string{
		"capability.invoke_allowed": "CAP001I", "capability.invoke_denied": "CAP002W",
		"approval.requested": "APR001I", "approval.approved": "APR002I", "approval.denied": "APR003W", "approval.expired": "APR004W",
		"execution.finished": "EXE001I", "execution.recovered": "EXE002W", "execution.cancelled": "EXE003I",
		"tool.registered": "TOL001I", "tool.changed": "TOL002W", "tool.removed": "TOL003I", "tool.review_approved": "TOL004I",
		"egress.denied": "EGR001W", "egress.refusals_suppressed": "EGR002W", "broker.call": "BRK001I", "broker.denied": "BRK002W",
		"workspace.created": "ADM001I", "key.created": "ADM002I", "credits.granted": "ADM003I", "policy.updated": "ADM004I", "key.revoked": "ADM005I",
		"session.created": "SES001I", "session.ended": "SES002I", "session.file_transferred": "SES003I",
		"session.paused": "SES004I", "session.resumed": "SES005I",
		"session.snapshotted": "SES006I", "session.forked": "SES007I", "session.snapshot_deleted": "SES008I",
		"template.built": "TPL001I", "template.build_failed": "TPL002W",
	}
	got := map[string]string{}
	codes := map[string]string{}
	for _, e := range allEvents {
		if _, dup := got[e.Type()]; dup {
			t.Errorf("type %s: more than one event", e.Type())
		}
		if other, dup := codes[e.Code()]; dup {
			t.Errorf("code %s: both %s and %s", e.Code(), other, e.Type())
		}
		got[e.Type()], codes[e.Code()] = e.Code(), e.Type()
	}
	if !maps.Equal(got, want) {
		t.Errorf("codes:\n got %v\nwant %v", got, want)
	}
}

// TestDecode checks that Decode gives back every event as it was stored:
// its struct, its metadata from the columns, its data from the data.
func TestDecode(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, e := range allEvents {
		t.Run(e.Type(), func(t *testing.T) {
			meta := audit.Meta{WorkspaceID: "ws_1", Actor: "key_1", Reason: "because", ExecutionID: "ex_1", Time: at}
			e := withMeta(t, e, meta)
			ne := audit.NewEvent(e)
			if ne.Type != e.Type() || ne.Code != e.Code() || ne.WorkspaceID != meta.WorkspaceID || ne.Actor != meta.Actor ||
				ne.Reason != meta.Reason || ne.ExecutionID != meta.ExecutionID || !ne.Time.Equal(at) {
				t.Errorf("NewEvent: got %+v, want the event's type, code and metadata %+v", ne, meta)
			}
			stored := model.Event{ID: "ev_1", WorkspaceID: ne.WorkspaceID, Seq: 3, Type: ne.Type, Code: ne.Code, Actor: ne.Actor,
				Reason: ne.Reason, ExecutionID: ne.ExecutionID, Data: ne.Data, Time: ne.Time}
			got, err := audit.Decode(stored)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, e) {
				t.Errorf("Decode:\n got %#v\nwant %#v", got, e)
			}
		})
	}
	t.Run("unknown type", func(t *testing.T) {
		if _, err := audit.Decode(model.Event{ID: "ev_1", Type: "test.event"}); !errors.Is(err, audit.ErrUnknownType) || !errdefs.IsInvalidArgument(err) {
			t.Errorf("got %v, want ErrUnknownType, an invalid argument", err)
		}
	})
	t.Run("data of another shape", func(t *testing.T) {
		_, err := audit.Decode(model.Event{ID: "ev_1", Type: audit.InvokeDenied, Data: []byte(`{"decision":"x","request":{"network":false}}`)})
		if !errdefs.IsInvalidArgument(err) || errors.Is(err, audit.ErrUnknownType) {
			t.Errorf("got %v for a boolean network, want invalid argument", err)
		}
	})
}

// withMeta returns e with its Meta set to m.
func withMeta(t *testing.T, e audit.Event, m audit.Meta) audit.Event {
	t.Helper()
	v := reflect.New(reflect.TypeOf(e)).Elem()
	v.Set(reflect.ValueOf(e))
	f := v.FieldByName("Meta")
	if !f.IsValid() || f.Type() != reflect.TypeFor[audit.Meta]() {
		t.Fatalf("%T embeds no audit.Meta", e)
	}
	f.Set(reflect.ValueOf(m))
	return v.Interface().(audit.Event)
}

// TestMetaNotInData checks that no event's data holds its metadata: the
// columns do.
func TestMetaNotInData(t *testing.T) {
	for _, e := range allEvents {
		e := withMeta(t, e, audit.Meta{WorkspaceID: "ws_meta", Actor: "key_meta", Reason: "reason_meta", ExecutionID: "ex_meta", Time: time.Now()})
		data := audit.NewEvent(e).Data
		for _, s := range []string{"ws_meta", "key_meta", "reason_meta", "ex_meta", "Meta", "WorkspaceID"} {
			if bytes.Contains(data, []byte(s)) {
				t.Errorf("%s: data %s holds %q", e.Type(), data, s)
			}
		}
	}
}
