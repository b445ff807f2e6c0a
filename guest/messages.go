package guest

import (
	"fmt"
	"slices"
	"strings"

	"github.com/stockade-sh/stockade/errdefs"
)

// Hello is the guest's greeting. A v1 guest sends Version only.
type Hello struct {
	Version  int      `json:"version"`
	Min      int      `json:"min,omitempty"`
	Max      int      `json:"max,omitempty"`
	Features []string `json:"features,omitempty"`
}

// FeatureExitNotice is the feature a guest announces when it honours
// ExecRequest.ExitNotice.
const FeatureExitNotice = "exit-notice"

// Has says whether the guest announced feature.
func (h *Hello) Has(feature string) bool { return slices.Contains(h.Features, feature) }

// Accept is the host's answer to Hello.
type Accept struct {
	Version int `json:"version"`
}

// ExecRequest asks the guest to write File, if any, and run Argv. Only one
// exec runs at a time in a guest; another is refused with ErrorBusy.
type ExecRequest struct {
	// File is written (atomically, by rename) before the program starts;
	// nil means none.
	File *FileSpec `json:"file,omitempty"`
	// Argv[0] is an absolute path; "{file}" in any element is replaced by
	// File's path.
	Argv []string `json:"argv"`
	// Env is the whole environment; nil is empty.
	Env []string `json:"env"`
	// Cwd is the program's working directory; empty means File's
	// directory, or / without a file.
	Cwd string `json:"cwd,omitempty"`
	// Stdin is fed, then closed, unless StdinStream is set: then the host
	// sends FrameStdin and FrameStdinClose frames.
	Stdin       []byte `json:"stdin,omitempty"`
	StdinStream bool   `json:"stdin_stream,omitempty"`
	// OutputCap is the bytes forwarded per stream; the rest is drained and
	// dropped. The host asks for one byte more than it keeps, so that
	// output of exactly its cap is told apart from truncated output.
	OutputCap int64 `json:"output_cap"`
	// ExitNotice gives the program, as its descriptor 3, the write end of
	// a pipe on which it may give notice of its end: its exit status
	// (0-255) as one decimal line, written once its output is flushed and
	// its work done. The guest then stops every process of the sandbox
	// (SIGSTOP), and once /proc shows each of them stopped or gone it
	// reports that status, with the output written until then, before they
	// are killed and reaped: the report does not wait for the kernel to
	// tear a large process down (about 9 ms for python with numpy and
	// pandas imported). No process of the exec runs after the report
	// either way. Where the guest cannot stop them all at once (it is not
	// PID 1, or a kernel runs), or they do not stop in time, they are
	// killed and reaped first, and the report still gives the notice's
	// status. Meant for an exec after which the sandbox is destroyed (a
	// warm pool's one-shot); a guest without FeatureExitNotice is never
	// asked (Client.Exec clears it), and its program has no descriptor 3.
	ExitNotice bool `json:"exit_notice,omitempty"`
}

// FileSpec is a file an ExecRequest delivers.
type FileSpec struct {
	Path string `json:"path"` // see ValidatePath
	Data []byte `json:"data"`
	Mode uint32 `json:"mode"` // permission bits; zero means 0644
}

// Started says that an exec's program or a kernel runs.
type Started struct {
	PID int `json:"pid"`
}

// maxPID is the kernel's highest possible pid (PID_MAX_LIMIT).
const maxPID = 1 << 22

// Validate checks a Started read from an untrusted guest.
func (s *Started) Validate() error {
	if s.PID < 1 || s.PID > maxPID {
		return fmt.Errorf("pid %d out of range: %w", s.PID, ErrProtocol)
	}
	return nil
}

// ExitReport is the guest's account of how a program ended. Only the
// fields the guest can know are here; timeouts and OOM kills are decided by
// the host.
type ExitReport struct {
	ExitCode    int   `json:"exit_code"` // -1 if killed by a signal
	Signal      int   `json:"signal"`
	CPUUserUs   int64 `json:"cpu_user_us"`
	CPUSysUs    int64 `json:"cpu_sys_us"`
	MaxRSSBytes int64 `json:"max_rss_bytes"`
	// Cancelled is true when the guest killed the program on the host's
	// FrameCancel.
	Cancelled bool `json:"cancelled,omitempty"`
}

// Validate checks a report read from an untrusted guest.
func (r *ExitReport) Validate() error {
	if err := validateStatus(r.ExitCode, r.Signal); err != nil {
		return err
	}
	if r.CPUUserUs < 0 || r.CPUSysUs < 0 || r.MaxRSSBytes < 0 {
		return fmt.Errorf("negative resource usage: %w", ErrProtocol)
	}
	return nil
}

func validateStatus(code, sig int) error {
	switch {
	case code < -1 || code > 255:
		return fmt.Errorf("exit code %d out of range: %w", code, ErrProtocol)
	case sig < 0 || sig > 64:
		return fmt.Errorf("signal %d out of range: %w", sig, ErrProtocol)
	case code == -1 && sig == 0:
		return fmt.Errorf("no exit code and no signal: %w", ErrProtocol)
	case code != -1 && sig != 0:
		return fmt.Errorf("both exit code %d and signal %d: %w", code, sig, ErrProtocol)
	}
	return nil
}

// SignalRequest sends Signal to an exec's process group or a kernel.
type SignalRequest struct {
	Signal int `json:"signal"`
}

// WriteRequest starts writing a file at Path; parent directories are
// created as needed. The file appears (by rename) only at FrameEnd.
type WriteRequest struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode"` // permission bits; zero means 0644
}

// WriteResult is the answer to a complete write.
type WriteResult struct {
	Size int64 `json:"size"`
}

// ReadRequest reads at most Max bytes of the regular file at Path.
type ReadRequest struct {
	Path string `json:"path"`
	Max  int64  `json:"max"`
}

// ReadResult ends a read: the file's size and mode, and whether it had more
// than Max bytes.
type ReadResult struct {
	Size      int64  `json:"size"`
	Mode      uint32 `json:"mode"`
	Truncated bool   `json:"truncated,omitempty"`
}

// Validate checks a ReadResult read from an untrusted guest.
func (r *ReadResult) Validate() error {
	if r.Size < 0 || r.Mode > 0o7777 {
		return fmt.Errorf("read result size %d mode %#o out of range: %w", r.Size, r.Mode, ErrProtocol)
	}
	return nil
}

// PathRequest names one path (list, stat, remove).
type PathRequest struct {
	Path string `json:"path"`
}

// MkdirRequest creates a directory and its missing parents; an existing
// directory is success.
type MkdirRequest struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode"` // permission bits; zero means 0755
}

// The types of an Entry.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
	TypeOther   = "other"
)

// Entry describes one file, as stat or list see it: a symlink is reported
// as such, never followed.
type Entry struct {
	Name  string `json:"name"`
	Type  string `json:"type"`
	Size  int64  `json:"size"`
	Mode  uint32 `json:"mode"`  // permission bits
	MTime int64  `json:"mtime"` // nanoseconds since the Unix epoch
}

// Validate checks an Entry read from an untrusted guest.
func (e *Entry) Validate() error {
	switch {
	case !validName(e.Name):
		return fmt.Errorf("entry name %q is not a plain name: %w", e.Name, ErrProtocol)
	case e.Type != TypeFile && e.Type != TypeDir && e.Type != TypeSymlink && e.Type != TypeOther:
		return fmt.Errorf("entry type %q unknown: %w", e.Type, ErrProtocol)
	case e.Size < 0 || e.Mode > 0o7777:
		return fmt.Errorf("entry size %d mode %#o out of range: %w", e.Size, e.Mode, ErrProtocol)
	}
	return nil
}

func validName(n string) bool {
	return n != "" && n != "." && n != ".." && len(n) <= MaxName && !strings.ContainsAny(n, "/\x00")
}

// ListResult lists a directory, at most MaxListEntries entries.
type ListResult struct {
	Entries   []Entry `json:"entries"`
	Truncated bool    `json:"truncated,omitempty"`
}

// Validate checks a ListResult read from an untrusted guest.
func (r *ListResult) Validate() error {
	if len(r.Entries) > MaxListEntries {
		return fmt.Errorf("list of %d entries exceeds %d: %w", len(r.Entries), MaxListEntries, ErrProtocol)
	}
	for i := range r.Entries {
		if err := r.Entries[i].Validate(); err != nil {
			return err
		}
	}
	return nil
}

// KernelRequest starts a kernel: a long-lived interpreter owned by the
// guest that runs cells (see the kernel wire in cmd/stockade-guest). Its
// processes stay until it is stopped.
type KernelRequest struct {
	Argv []string `json:"argv"` // Argv[0] is an absolute path
	Env  []string `json:"env"`  // the whole environment; nil is empty
	Cwd  string   `json:"cwd,omitempty"`
}

// CellRequest runs Code in the kernel that the request with id Kernel
// started. One cell runs at a time per kernel; another is refused with
// ErrorBusy.
type CellRequest struct {
	Kernel uint32 `json:"kernel"`
	Code   string `json:"code"`
	Stdin  string `json:"stdin,omitempty"`
	// OutputCap is the bytes forwarded per stream, as ExecRequest's.
	OutputCap int64 `json:"output_cap"`
}

// Display is a rich output of a cell (an image, HTML, ...), or its value.
type Display struct {
	MimeType string `json:"mime_type"`
	Data     []byte `json:"data"`
}

// Validate checks a Display read from an untrusted guest.
func (d *Display) Validate() error {
	if !validMimeType(d.MimeType) || len(d.Data) > MaxDisplay {
		return fmt.Errorf("display of type %.64q and %d bytes: %w", d.MimeType, len(d.Data), ErrProtocol)
	}
	return nil
}

// validMimeType accepts type/subtype of printable ASCII without spaces, at
// most 127 bytes.
func validMimeType(s string) bool {
	t, sub, ok := strings.Cut(s, "/")
	if !ok || t == "" || sub == "" || len(s) > 127 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// The statuses of a CellResult.
const (
	CellOK    = "ok"
	CellError = "error"
)

// CellResult ends a cell.
type CellResult struct {
	Status string       `json:"status"`
	Error  *CellFailure `json:"error,omitempty"`
	Value  *Display     `json:"value,omitempty"`
	// ExitCode is the exit status of the cell's last command, for kernels
	// whose cells have one (the shell's); nil for the others.
	ExitCode *int `json:"exit_code,omitempty"`
}

// CellFailure is the exception a cell raised.
type CellFailure struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// maxFailureText bounds each text of a CellFailure.
const maxFailureText = 64 << 10

// Validate checks a CellResult read from an untrusted guest.
func (r *CellResult) Validate() error {
	switch r.Status {
	case CellOK:
	case CellError:
		if r.Error == nil {
			return fmt.Errorf("cell error without its exception: %w", ErrProtocol)
		}
	default:
		return fmt.Errorf("cell status %.32q unknown: %w", r.Status, ErrProtocol)
	}
	if r.ExitCode != nil && (*r.ExitCode < 0 || *r.ExitCode > 255) {
		return fmt.Errorf("cell exit code %d out of range: %w", *r.ExitCode, ErrProtocol)
	}
	if e := r.Error; e != nil && (len(e.Name) > maxFailureText || len(e.Value) > maxFailureText || len(e.Traceback) > maxFailureText) {
		return fmt.Errorf("cell exception longer than %d bytes: %w", maxFailureText, ErrProtocol)
	}
	if r.Value != nil {
		return r.Value.Validate()
	}
	return nil
}

// KernelExit says that a kernel's process ended.
type KernelExit struct {
	ExitCode int `json:"exit_code"` // -1 if killed by a signal
	Signal   int `json:"signal"`
}

// Validate checks a KernelExit read from an untrusted guest.
func (k *KernelExit) Validate() error { return validateStatus(k.ExitCode, k.Signal) }

// Pong answers a ping: the guest's version, its live kernels, the id of
// the exec that runs (0 if none) and the ids of the cells that run (a
// client reached again cancels those an earlier client left, which
// FrameCancel of the cell's id interrupts).
type Pong struct {
	Version int      `json:"version"`
	Kernels []uint32 `json:"kernels"`
	Exec    uint32   `json:"exec"`
	Cells   []uint32 `json:"cells,omitempty"`
}

// Validate checks a Pong read from an untrusted guest.
func (p *Pong) Validate() error {
	if len(p.Kernels) > MaxKernels {
		return fmt.Errorf("pong with %d kernels exceeds %d: %w", len(p.Kernels), MaxKernels, ErrProtocol)
	}
	for _, id := range p.Kernels {
		if id == 0 {
			return fmt.Errorf("pong with kernel id 0: %w", ErrProtocol)
		}
	}
	if len(p.Cells) > len(p.Kernels) {
		return fmt.Errorf("pong with %d cells for %d kernels: %w", len(p.Cells), len(p.Kernels), ErrProtocol)
	}
	for _, id := range p.Cells {
		if id == 0 {
			return fmt.Errorf("pong with cell id 0: %w", ErrProtocol)
		}
	}
	return nil
}

// The codes of an ErrorReply.
const (
	ErrorUnsupported = "unsupported" // a request type this guest does not serve
	ErrorInvalid     = "invalid"     // a malformed or refused request
	ErrorBusy        = "busy"        // an exec (or a kernel's cell) already runs
	ErrorNotFound    = "not_found"
	ErrorExists      = "exists"
	ErrorNotDir      = "not_dir" // a component on the way is not a directory
	ErrorSymlink     = "symlink" // a component is a symlink, which is never followed
	ErrorNotRegular  = "not_regular"
	ErrorIsDir       = "is_dir"
	ErrorNotEmpty    = "not_empty"
	ErrorTooLarge    = "too_large"
	ErrorDenied      = "denied"      // permission denied
	ErrorStart       = "start"       // the program or kernel could not be started
	ErrorKernelGone  = "kernel_gone" // the kernel ended during the cell, or before it
	ErrorCancelled   = "cancelled"
	ErrorIO          = "io"
	ErrorProtocol    = "protocol" // id 0: the guest exits
)

// ErrorReply says why the guest could not serve a request.
type ErrorReply struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Sanitize bounds a reply read from an untrusted guest: the message is cut
// to MaxMessage bytes of valid UTF-8, and a code that is not a short
// lower-case word becomes ErrorIO.
func (e *ErrorReply) Sanitize() {
	if len(e.Message) > MaxMessage {
		e.Message = e.Message[:MaxMessage]
	}
	e.Message = strings.ToValidUTF8(e.Message, "?")
	ok := e.Code != "" && len(e.Code) <= 32
	for i := 0; ok && i < len(e.Code); i++ {
		ok = e.Code[i] == '_' || (e.Code[i] >= 'a' && e.Code[i] <= 'z')
	}
	if !ok {
		e.Code = ErrorIO
	}
}

// Error is a guest's ErrorReply as a Go error, wrapping the errdefs class
// of its code.
type Error struct {
	Op string // the request, e.g. "stat /tmp/x"
	ErrorReply
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (%s)", e.Op, e.Message, e.Code)
}

// Public says that the message of a refused file operation is fit for the
// client: it is about the client's own sandbox (a path below /workspace
// not found, a directory not empty), in the guest's words.
func (e *Error) Public() bool {
	switch e.Code {
	case ErrorNotFound, ErrorInvalid, ErrorNotDir, ErrorSymlink, ErrorNotRegular, ErrorIsDir,
		ErrorExists, ErrorNotEmpty, ErrorTooLarge, ErrorDenied:
		return true
	}
	return false
}

// Unwrap returns the errdefs class of the code.
func (e *Error) Unwrap() error {
	switch e.Code {
	case ErrorNotFound:
		return errdefs.ErrNotFound
	case ErrorInvalid, ErrorNotDir, ErrorSymlink, ErrorNotRegular, ErrorIsDir:
		return errdefs.ErrInvalidArgument
	case ErrorExists, ErrorBusy, ErrorNotEmpty:
		return errdefs.ErrConflict
	case ErrorTooLarge:
		return errdefs.ErrTooLarge
	case ErrorDenied:
		return errdefs.ErrPermissionDenied
	case ErrorStart, ErrorKernelGone, ErrorCancelled, ErrorUnsupported:
		return errdefs.ErrFailedPrecondition
	}
	return errdefs.ErrUnavailable
}
