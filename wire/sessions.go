package wire

import "time"

// SessionRequest asks for a session: the body of POST /v1/sessions.
type SessionRequest struct {
	// Runtime is python, node or shell: the session's kernel.
	Runtime string `json:"runtime"`
	// Tool names the tool to run as; empty is the default tool.
	Tool string `json:"tool,omitempty"`
	// IdleTimeoutMS and TTLMS ask for other lifetimes than the server's
	// defaults, within its ceilings; zero takes the defaults.
	IdleTimeoutMS int64 `json:"idle_timeout_ms,omitempty"`
	TTLMS         int64 `json:"ttl_ms,omitempty"`
	// Network is "deny" (the default, also when empty) or "allow": egress
	// to the tool's allowlist through the egress proxy, for the session's
	// life, approved with its first cell.
	Network string `json:"network,omitempty"`
	// Snapshot, when set, starts the session from that snapshot of the
	// workspace (a Snapshot's ID): its runtime and tool are the
	// snapshot's source's, and Runtime and Tool must be empty or the same.
	Snapshot string `json:"snapshot,omitempty"`
	// IdempotencyKey, if set, makes a retried request return the first
	// session instead of opening another. It travels as the
	// Idempotency-Key header, not in the body.
	IdempotencyKey string `json:"-"`
}

// Session is a session (the answer of /v1/sessions and its actions).
type Session struct {
	ID      string `json:"id"`
	Runtime string `json:"runtime"`
	Tool    string `json:"tool"`
	Tier    string `json:"tier"`
	Driver  string `json:"driver"`
	// State is active, paused or ended; EndedAt and EndReason (closed,
	// idle_timeout, ttl, interrupted, failed) are set once it ended, with
	// EndDetail when the reason alone does not say why (an interrupted
	// session whose daemon stopped or restarted: its driver cannot
	// re-attach a sandbox, or its sandbox was not found after a
	// restart), PausedAt and CheckpointBytes
	// while it is paused.
	State           string     `json:"state"`
	Network         string     `json:"network"`
	CreatedAt       time.Time  `json:"created_at"`
	ExpiresAt       time.Time  `json:"expires_at"`
	IdleExpiresAt   time.Time  `json:"idle_expires_at"`
	IdleTimeoutMS   int64      `json:"idle_timeout_ms"`
	EndedAt         *time.Time `json:"ended_at,omitempty"`
	EndReason       string     `json:"end_reason,omitempty"`
	EndDetail       string     `json:"end_detail,omitempty"`
	PausedAt        *time.Time `json:"paused_at,omitempty"`
	CheckpointBytes int64      `json:"checkpoint_bytes,omitempty"`
	Cells           int        `json:"cells"`
	// Approval is the approval mode its cells are admitted under, and
	// ApprovalID the approval that covers them (per_session).
	Approval       string `json:"approval"`
	ApprovalID     string `json:"approval_id,omitempty"`
	WorkspaceBytes int64  `json:"workspace_bytes"`
	Replayed       bool   `json:"replayed,omitempty"`
}

// CellRequest is a cell to run in a session: the body of POST
// /v1/sessions/{id}/exec.
type CellRequest struct {
	Code  string `json:"code"`
	Stdin string `json:"stdin,omitempty"`
	// TimeoutMS bounds the cell; zero is the tool's limit.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// IdempotencyKey, if set, makes a retried request return the first
	// cell instead of running it again. It travels as the Idempotency-Key
	// header, not in the body.
	IdempotencyKey string `json:"-"`
}

// Cell is a cell's outcome: the answer of POST /v1/sessions/{id}/exec
// once it ended, and the data of its stream's result event. Status is the
// cell's execution status: how it ended (succeeded, failed for a cell
// that raised, timed_out, oom_killed, killed, denied, approval_expired),
// or awaiting_approval (then ApprovalID is set) where a client made it
// of an execution that waits (CellOf).
type Cell struct {
	ExecutionID string          `json:"execution_id"`
	SessionID   string          `json:"session_id"`
	Cell        int             `json:"cell"`
	Status      ExecutionStatus `json:"status"`
	CellEnd
	// Credits is what the cell was charged; a Cell made of an execution
	// (CellOf) does not know it (0).
	Credits int64 `json:"credits"`
	// ApprovalID is the approval request of a cell that needed one.
	ApprovalID string `json:"approval_id,omitempty"`
	Replayed   bool   `json:"replayed,omitempty"`
}

// CellEnd is how a cell ended, as a Cell shows it and as the engine's
// result document of a cell (engine.CellResult) holds it.
type CellEnd struct {
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	// Outputs are the cell's rich outputs: text/plain for the value of its
	// last expression, image/png (Data base64) for a figure.
	Outputs        []CellOutput `json:"outputs"`
	OutputsDropped int          `json:"outputs_dropped,omitempty"`
	// Error is the exception the cell raised, or why it could not run
	// (named StockadeError).
	Error *CellError `json:"error,omitempty"`
	// KernelRestarted says the kernel was restarted (after a timeout that
	// an interrupt did not end, or an OOM kill): its state is gone.
	KernelRestarted bool  `json:"kernel_restarted"`
	DurationMS      int64 `json:"duration_ms"`
	// EndedBy is set when Stockade ended the cell before its code did
	// (status killed): cancel, session_ended or daemon_shutdown.
	EndedBy string `json:"ended_by,omitempty"`
}

// CellOutput is one rich output of a cell, and the data of a cell
// stream's output event.
type CellOutput struct {
	MimeType string `json:"mime_type"`
	// Data is the text of a text/* output, base64 for any other.
	Data string `json:"data"`
}

// CellError is an exception a cell raised.
type CellError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// StockadeError is the name of a CellError that says why Stockade could
// not run a cell, rather than an exception the cell raised.
const StockadeError = "StockadeError"

// CellOf is the cell of execution ex, a session's cell: its status, and,
// once it ran, its outcome from the execution's result document. Credits
// are not part of an execution (0).
func CellOf(ex Execution) Cell {
	c := Cell{ExecutionID: ex.ID, SessionID: ex.SessionID, Status: ex.Status, ApprovalID: ex.ApprovalID, Replayed: ex.Replayed,
		CellEnd: CellEnd{Outputs: []CellOutput{}}}
	r := ex.Result
	if r == nil {
		return c
	}
	c.Cell, c.Stdout, c.Stderr, c.StdoutTruncated, c.StderrTruncated = r.Cell, r.Stdout, r.Stderr, r.StdoutTruncated, r.StderrTruncated
	c.OutputsDropped, c.KernelRestarted, c.DurationMS, c.EndedBy = r.OutputsDropped, r.KernelRestarted, r.DurationMS, r.EndedBy
	c.Outputs = append(c.Outputs, r.Outputs...)
	switch {
	case r.Raised != nil:
		raised := *r.Raised
		c.Error = &raised
	case r.Error != "":
		c.Error = &CellError{Name: StockadeError, Value: r.Error}
	}
	return c
}

// FileInfo is a file written into a session (the answer of PUT
// /v1/sessions/{id}/files).
type FileInfo struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// FileEntry is one entry of a session directory's listing.
type FileEntry struct {
	Name string `json:"name"`
	// Type is file, dir, symlink or other.
	Type string `json:"type"`
	Size int64  `json:"size"`
	// Mode is the permission bits.
	Mode  uint32    `json:"mode"`
	MTime time.Time `json:"mtime"`
}

// FileList is a listing of a session's directory (GET
// /v1/sessions/{id}/files?dir=); Truncated says there were more entries
// than the server lists at once.
type FileList struct {
	Entries   []FileEntry `json:"entries"`
	Truncated bool        `json:"truncated"`
}

// Interrupted is the answer of POST /v1/sessions/{id}/interrupt: whether
// a cell ran.
type Interrupted struct {
	Interrupted bool `json:"interrupted"`
}
