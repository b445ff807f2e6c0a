package mcp_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/internal/daemontest"
	"github.com/stockade-sh/stockade/mcp"
)

// TestSnapshotToolsOnRunc calls fork_session, snapshot_session,
// pause_session and resume_session on a runc session through every
// transport: runc cannot save a sandbox, so the first three are tool
// errors with the reason, and resuming the active session answers it
// active. (Forks that start are tested on gVisor through the API:
// api/snapshots_test.go.)
func TestSnapshotToolsOnRunc(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			d := tr.daemon(t, capability.ServiceOptions{Sessions: capability.SessionOptions{CheckpointDir: t.TempDir()}}, mcp.Options{ApprovalWait: time.Second})
			ws := d.Workspace(t, daemontest.NoApproval, 100)
			cs := tr.connect(t, d, ws.Agent, mcp.Options{ApprovalWait: time.Second}, nil)
			res := call(t, cs, "create_session", map[string]any{"language": "python"}, nil)
			var ss mcp.SessionOutput
			b, _ := json.Marshal(res.StructuredContent)
			if err := json.Unmarshal(b, &ss); err != nil || ss.SessionID == "" {
				t.Fatalf("create_session: got %s (%v)", b, err)
			}
			id := map[string]any{"session_id": ss.SessionID}
			wantError(t, call(t, cs, "fork_session", map[string]any{"session_id": ss.SessionID, "count": 2}, nil), "cannot be snapshotted or forked", "CRIU")
			wantError(t, call(t, cs, "snapshot_session", id, nil), "cannot be snapshotted")
			wantError(t, call(t, cs, "pause_session", id, nil), "cannot pause")
			res = call(t, cs, "resume_session", id, nil)
			if b, _ := json.Marshal(res.StructuredContent); res.IsError || !json.Valid(b) {
				t.Fatalf("resume_session of an active session: got %q, error %v", text(res), res.IsError)
			}
			var out mcp.SessionOutput
			b, _ = json.Marshal(res.StructuredContent)
			if err := json.Unmarshal(b, &out); err != nil || out.State != "active" {
				t.Errorf("resume_session: got %s, want the session active", b)
			}
			call(t, cs, "close_session", id, nil)
		})
	}
}
