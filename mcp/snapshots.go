package mcp

import (
	"context"
	"fmt"
	"strings"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/stockade-sh/stockade/client"
)

// SnapshotBackend is what the snapshot, fork, pause and resume tools need
// of Stockade besides SessionBackend, as *client.Client has it.
type SnapshotBackend interface {
	SnapshotSession(ctx context.Context, id string, req client.SnapshotRequest) (*client.Snapshot, error)
	ForkSession(ctx context.Context, id string, req client.ForkRequest) (*client.Fork, error)
	PauseSession(ctx context.Context, id string) (*client.Session, error)
	ResumeSession(ctx context.Context, id string) (*client.Session, error)
}

var _ SnapshotBackend = (*client.Client)(nil)

// SnapshotInput is snapshot_session's arguments.
type SnapshotInput struct {
	SessionID string `json:"session_id" jsonschema:"the session to snapshot"`
	Name      string `json:"name,omitempty" jsonschema:"a name for the snapshot"`
}

// SnapshotOutput is snapshot_session's structured result.
type SnapshotOutput struct {
	SnapshotID string `json:"snapshot_id" jsonschema:"the snapshot, from which create_session (its snapshot argument) starts a session; fork_session starts sessions from the current state"`
	SessionID  string `json:"session_id" jsonschema:"the session it was taken of, which runs on"`
	Bytes      int64  `json:"bytes" jsonschema:"the disk it takes"`
	StallMS    int64  `json:"stall_ms" jsonschema:"how long the session could not run a cell while it was saved"`
}

// ForkInput is fork_session's arguments.
type ForkInput struct {
	SessionID string `json:"session_id" jsonschema:"the session to fork"`
	Count     int    `json:"count,omitempty" jsonschema:"how many sessions to start (default 1); the ceiling is the server's"`
}

// ForkOutput is fork_session's structured result.
type ForkOutput struct {
	SourceID string          `json:"source_id" jsonschema:"the session forked, which runs on"`
	Sessions []SessionOutput `json:"sessions" jsonschema:"the new sessions, for run_cell and the file tools"`
	StallMS  int64           `json:"stall_ms" jsonschema:"how long the source could not run a cell while it was saved"`
}

func addSnapshotTools(s *sdk.Server, t *tools) bool {
	sb, ok := t.b.(SnapshotBackend)
	if !ok {
		return false
	}
	sdk.AddTool(s, &sdk.Tool{
		Name:  "fork_session",
		Title: "Fork a session",
		Description: "Starts count new sessions (default 1) from a session's current state: each has the source's variables, " +
			"imports and /workspace files, but is a session of its own: nothing one does reaches the source or the others, and each " +
			"draws its own random numbers. Use it to try several approaches from one state. All start, or none. Not on runc.",
		Annotations: closedWorld(),
	}, func(ctx context.Context, _ *sdk.CallToolRequest, in ForkInput) (*sdk.CallToolResult, ForkOutput, error) {
		if in.Count == 0 {
			in.Count = 1
		}
		f, err := sb.ForkSession(ctx, in.SessionID, client.ForkRequest{Count: in.Count})
		if err != nil {
			return nil, ForkOutput{}, failure(err)
		}
		out := ForkOutput{SourceID: f.SourceID, StallMS: f.StallMS, Sessions: []SessionOutput{}}
		var ids []string
		for i := range f.Sessions {
			out.Sessions = append(out.Sessions, sessionOutput(&f.Sessions[i]))
			ids = append(ids, f.Sessions[i].ID)
		}
		return textResult(fmt.Sprintf("Forked session %s into %d new session(s): %s.", f.SourceID, len(ids), strings.Join(ids, ", "))), out, nil
	})
	sdk.AddTool(s, &sdk.Tool{
		Name:  "snapshot_session",
		Title: "Snapshot a session",
		Description: "Saves a session's state (variables, imports, /workspace files), leaving it running; new sessions can start from " +
			"the snapshot later, even after the session ended. Not on runc.",
		Annotations: closedWorld(),
	}, func(ctx context.Context, _ *sdk.CallToolRequest, in SnapshotInput) (*sdk.CallToolResult, SnapshotOutput, error) {
		sn, err := sb.SnapshotSession(ctx, in.SessionID, client.SnapshotRequest{Name: in.Name})
		if err != nil {
			return nil, SnapshotOutput{}, failure(err)
		}
		return textResult(fmt.Sprintf("Snapshot %s of session %s (%d bytes); the session stalled %d ms.", sn.ID, sn.SessionID, sn.Bytes, sn.StallMS)),
			SnapshotOutput{SnapshotID: sn.ID, SessionID: sn.SessionID, Bytes: sn.Bytes, StallMS: sn.StallMS}, nil
	})
	for _, tr := range []struct {
		name, title, desc string
		do                func(context.Context, string) (*client.Session, error)
	}{
		{"pause_session", "Pause a session", "Saves an idle session's sandbox to disk and frees its memory; its next cell, file " +
			"operation or resume_session resumes it with its state. Not on runc.", sb.PauseSession},
		{"resume_session", "Resume a session", "Resumes a paused session from its checkpoint, with its state.", sb.ResumeSession},
	} {
		sdk.AddTool(s, &sdk.Tool{Name: tr.name, Title: tr.title, Description: tr.desc, Annotations: closedWorld()},
			func(ctx context.Context, _ *sdk.CallToolRequest, in SessionInput) (*sdk.CallToolResult, SessionOutput, error) {
				ss, err := tr.do(ctx, in.SessionID)
				if err != nil {
					return nil, SessionOutput{}, failure(err)
				}
				return textResult(fmt.Sprintf("Session %s is %s.", ss.ID, ss.State)), sessionOutput(ss), nil
			})
	}
	return true
}
