package client_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/daemontest"
)

// TestSessions drives a session through every session method of the
// client against a real daemon: cells that keep state, a streamed cell, a
// busy session, an interrupt, files in and out, another workspace refused,
// and an ended session's error with when and why.
func TestSessions(t *testing.T) {
	d := daemontest.Start(t, daemontest.Options{})
	ws := d.Workspace(t, daemontest.NoApproval, 100)
	other := d.Workspace(t, daemontest.NoApproval, 100)
	c, stranger := newClient(t, d, ws.Agent), newClient(t, d, other.Agent)

	ss, err := c.CreateSession(ctx(t), client.SessionRequest{Runtime: "python", IdempotencyKey: "open-1"})
	if err != nil {
		t.Fatalf("CreateSession: %v", err)
	}
	if ss.State != "active" || ss.Runtime != "python" || ss.Tier == "" || !ss.ExpiresAt.After(time.Now()) {
		t.Errorf("CreateSession: got %+v, want an active python session with a tier and a future TTL", ss)
	}
	if again, err := c.CreateSession(ctx(t), client.SessionRequest{Runtime: "python", IdempotencyKey: "open-1"}); err != nil || again.ID != ss.ID || !again.Replayed {
		t.Errorf("CreateSession with the same Idempotency-Key: got %+v, %v; want session %s replayed", again, err, ss.ID)
	}

	if cell, err := c.ExecCell(ctx(t), ss.ID, client.CellRequest{Code: "x = 6*7"}); err != nil || cell.Status != client.StatusSucceeded || cell.Cell != 1 {
		t.Fatalf("first cell: got %+v, %v; want cell 1 succeeded", cell, err)
	}
	cell, err := c.ExecCell(ctx(t), ss.ID, client.CellRequest{Code: "x"})
	if err != nil || len(cell.Outputs) != 1 || cell.Outputs[0].MimeType != "text/plain" || cell.Outputs[0].Data != "42" {
		t.Errorf("second cell: got %+v, %v; want the value 42 of x as text/plain", cell, err)
	}
	cell, err = c.ExecCell(ctx(t), ss.ID, client.CellRequest{Code: "1/0"})
	if err != nil || cell.Status != client.StatusFailed || cell.Error == nil || cell.Error.Name != "ZeroDivisionError" {
		t.Errorf("a cell that raises: got %+v, %v; want failed with ZeroDivisionError", cell, err)
	}

	t.Run("stream", func(t *testing.T) {
		s, err := c.StreamCell(ctx(t), ss.ID, client.CellRequest{Code: "print('a'); print('b')\nx + 1"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		evs := drain(t, s)
		end, ok := evs[len(evs)-1].(*client.CellEnded)
		if !ok {
			t.Fatalf("last event: got %T, want *client.CellEnded", evs[len(evs)-1])
		}
		if got := stdoutOf(evs); got != "a\nb\n" {
			t.Errorf("streamed stdout: got %q, want a and b", got)
		}
		if end.Cell.Stdout != "a\nb\n" || len(end.Cell.Outputs) != 1 || end.Cell.Outputs[0].Data != "43" {
			t.Errorf("the cell: got %+v, want its stdout and the value 43", end.Cell)
		}
	})

	t.Run("busy and interrupt", func(t *testing.T) {
		s, err := c.StreamCell(ctx(t), ss.ID, client.CellRequest{Code: "import time\nprint('sleeping', flush=True)\ntime.sleep(60)"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for {
			ev, err := s.Next()
			if err != nil {
				t.Fatalf("waiting for the cell's output: %v", err)
			}
			if _, ok := ev.(*client.Output); ok {
				break
			}
		}
		if _, err := c.ExecCell(ctx(t), ss.ID, client.CellRequest{Code: "1"}); !errdefs.IsConflict(err) {
			t.Errorf("a cell while another runs: got %v, want a conflict (session_busy)", err)
		}
		if ok, err := c.InterruptCell(ctx(t), ss.ID); err != nil || !ok {
			t.Errorf("InterruptCell: got %v, %v; want true", ok, err)
		}
		evs := drain(t, s)
		end, ok := evs[len(evs)-1].(*client.CellEnded)
		if !ok || end.Cell.Error == nil || end.Cell.Error.Name != "KeyboardInterrupt" {
			t.Errorf("the interrupted cell: got %+v, want a KeyboardInterrupt", evs[len(evs)-1])
		}
		if cell, err := c.ExecCell(ctx(t), ss.ID, client.CellRequest{Code: "x"}); err != nil || len(cell.Outputs) != 1 || cell.Outputs[0].Data != "42" {
			t.Errorf("a cell after the interrupt: got %+v, %v; want x still 42", cell, err)
		}
	})

	t.Run("files", func(t *testing.T) {
		data := "a,b\n1,2\n3,4\n"
		fi, err := c.PutFile(ctx(t), ss.ID, "data.csv", strings.NewReader(data), int64(len(data)))
		if err != nil || fi.Size != int64(len(data)) || len(fi.SHA256) != 64 {
			t.Fatalf("PutFile: got %+v, %v; want %d bytes and a sha256", fi, err, len(data))
		}
		if cell, err := c.ExecCell(ctx(t), ss.ID, client.CellRequest{Code: "open('/workspace/data.csv').read().upper()"}); err != nil || len(cell.Outputs) != 1 || !strings.Contains(cell.Outputs[0].Data, "A,B") {
			t.Errorf("a cell reading the file: got %+v, %v", cell, err)
		}
		entries, truncated, err := c.ListFiles(ctx(t), ss.ID, "/workspace")
		if err != nil || truncated || len(entries) != 1 || entries[0].Name != "data.csv" || entries[0].Type != "file" || entries[0].Size != int64(len(data)) {
			t.Errorf("ListFiles: got %+v, %v, %v; want data.csv alone", entries, truncated, err)
		}
		var b bytes.Buffer
		got, err := c.GetFile(ctx(t), ss.ID, "/workspace/data.csv", &b, 1<<20)
		if err != nil || b.String() != data || got.SHA256 != fi.SHA256 {
			t.Errorf("GetFile: got %q, %+v, %v; want the file back with its sha256", b.String(), got, err)
		}
		if _, err := c.GetFile(ctx(t), ss.ID, "data.csv", &b, 3); !errdefs.IsTooLarge(err) {
			t.Errorf("GetFile over max: got %v, want ErrTooLarge", err)
		}
		for _, p := range []string{"../etc/passwd", "/etc/passwd", "a\x00b"} {
			if _, err := c.GetFile(ctx(t), ss.ID, p, &b, 1<<20); !errdefs.IsInvalidArgument(err) {
				t.Errorf("GetFile %q: got %v, want invalid_path", p, err)
			}
		}
		if err := c.RemoveFile(ctx(t), ss.ID, "data.csv"); err != nil {
			t.Errorf("RemoveFile: %v", err)
		}
		if _, err := c.GetFile(ctx(t), ss.ID, "data.csv", &b, 1<<20); !errdefs.IsNotFound(err) {
			t.Errorf("GetFile of a removed file: got %v, want not found", err)
		}
	})

	t.Run("another workspace", func(t *testing.T) {
		if _, err := stranger.GetSession(ctx(t), ss.ID); !errdefs.IsNotFound(err) {
			t.Errorf("GetSession: got %v, want not found", err)
		}
		if _, err := stranger.ExecCell(ctx(t), ss.ID, client.CellRequest{Code: "x"}); !errdefs.IsNotFound(err) {
			t.Errorf("ExecCell: got %v, want not found", err)
		}
	})

	p, err := c.ListSessions(ctx(t), client.SessionFilter{State: "active"})
	if err != nil || len(p.Items) != 1 || p.Items[0].ID != ss.ID {
		t.Errorf("ListSessions active: got %+v, %v; want session %s alone", p, err, ss.ID)
	}
	ended, err := c.CloseSession(ctx(t), ss.ID)
	if err != nil || ended.State != "ended" || ended.EndReason != "closed" || ended.EndedAt == nil {
		t.Fatalf("CloseSession: got %+v, %v; want it ended, closed", ended, err)
	}
	_, err = c.ExecCell(ctx(t), ss.ID, client.CellRequest{Code: "x"})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != "session_expired" || ce.EndReason != "closed" || ce.EndedAt == nil || !errdefs.IsFailedPrecondition(err) {
		t.Errorf("a cell of an ended session: got %v (%+v), want session_expired saying when and why", err, ce)
	}
	if got, err := c.GetSession(ctx(t), ss.ID); err != nil || got.State != "ended" {
		t.Errorf("GetSession of an ended session: got %+v, %v; want it, ended", got, err)
	}
}
