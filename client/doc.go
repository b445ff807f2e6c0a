// Package client is a typed Go client of Stockade's HTTP API: executions
// (with their event stream), approvals, the audit trail, tool calls, the
// workspace, tools, the daemon's health, and sessions (cells that keep
// their kernel's state, streamed or not, and the files of /workspace). Every method takes a context
// first and answers an error that wraps one of errdefs' classes, so that
// callers test it with errdefs.IsPermissionDenied and the like; an
// [*Error] also carries the API's stable code and, on 429 and 503, the
// Retry-After the daemon asked for.
//
//	c, err := client.New("http://127.0.0.1:8700", os.Getenv("STOCKADE_KEY"))
//	ex, err := c.CreateExecution(ctx, client.ExecutionRequest{Runtime: "python", Code: "print(6*7)"})
//	if ex.Status == client.StatusAwaitingApproval {
//		ex, err = c.GetExecution(ctx, ex.ID, 30*time.Second) // an approver decides meanwhile
//	}
//
//	s, err := c.CreateSession(ctx, client.SessionRequest{Runtime: "python"})
//	_, err = c.ExecCell(ctx, s.ID, client.CellRequest{Code: "x = 6*7"})
//	cell, err := c.ExecCell(ctx, s.ID, client.CellRequest{Code: "x"}) // cell.Outputs[0].Data == "42"
//
// The client bounds what it reads of each answer (see MaxAnswer), so that a
// misbehaving server cannot make it hold unbounded memory. A Client is safe
// for concurrent use.
package client
