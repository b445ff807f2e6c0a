package sandbox

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"time"
)

// The optional abilities of a driver, each a small interface found by type
// assertion, and each backed by exactly one flag of Capabilities: the flag
// is true exactly when the driver value (or, for Files and Kernels, every
// sandbox it creates) implements the interface. The conformance suite
// checks both ways, and for each flag that is false that the driver says
// why (Capabilities.Lacks).

// HealthChecker is implemented by drivers that can tell whether their
// backend is usable right now (Capabilities.Health).
type HealthChecker interface {
	Health(ctx context.Context) error
}

// Reaper is implemented by drivers that can find and destroy sandboxes left
// behind by a crashed process, labelled by Spec.Labels
// (Capabilities.Reap).
type Reaper interface {
	// Reap destroys every sandbox of this driver whose labels contain all of
	// match, except those a Reattach of this driver value returned and
	// that are not destroyed yet, and returns their IDs.
	Reap(ctx context.Context, match map[string]string) ([]string, error)
}

// Leftovers is implemented by drivers that can tell what a sandbox left on
// the host (Capabilities.Leftovers): the conformance suite asks after
// every Destroy, the tests of the layers above after theirs.
type Leftovers interface {
	// Leftovers lists anything of sandbox id that is still there
	// (processes, cgroups, runtime state, directories, containers), one
	// line each; empty means clean. ctx bounds its time (a driver may
	// bound it further).
	Leftovers(ctx context.Context, id string) []string
}

// Files is implemented by sandboxes that move files in and out through
// their guest (Capabilities.Files). Paths are absolute, clean, below /tmp
// or /workspace, without NUL, at most 4096 bytes with components of at
// most 255; anything else is ErrInvalidArgument before anything is sent.
// No operation follows a symlink anywhere on its path, nor goes above its
// root, even when code in the sandbox swaps a component while it runs; the
// host never opens a host path named by the sandbox.
type Files interface {
	// WriteFile writes what r yields, at most max bytes, to path with the
	// permission bits of mode (0 means 0644), creating missing parents.
	// The file appears whole or not at all: more than max bytes
	// (ErrTooLarge), a cancelled ctx or a lost guest leave no file. It
	// returns the bytes written.
	WriteFile(ctx context.Context, path string, mode fs.FileMode, r io.Reader, max int64) (int64, error)
	// ReadFile reads at most max bytes of the regular file at path; the
	// FileInfo says its size, so a file longer than max is told by
	// info.Size > len(data).
	ReadFile(ctx context.Context, path string, max int64) ([]byte, FileInfo, error)
	// ListDir lists the directory at path (a root itself too), at most
	// MaxListEntries entries; truncated says there were more.
	ListDir(ctx context.Context, path string) (entries []FileInfo, truncated bool, err error)
	// Stat describes the file at path, a symlink as itself.
	Stat(ctx context.Context, path string) (FileInfo, error)
	// Remove removes the file, symlink or empty directory at path.
	Remove(ctx context.Context, path string) error
	// Mkdir creates the directory at path and its missing parents with the
	// permission bits of mode (0 means 0755); an existing directory is
	// success.
	Mkdir(ctx context.Context, path string, mode fs.FileMode) error
}

// MaxListEntries bounds a ListDir.
const MaxListEntries = 4096

// FileType is what a FileInfo describes.
type FileType string

const (
	TypeFile    FileType = "file"
	TypeDir     FileType = "dir"
	TypeSymlink FileType = "symlink"
	TypeOther   FileType = "other"
)

// FileInfo describes one file in a sandbox, as the sandbox reported it
// (validated: a plain name, a known type, sizes and bits in range).
type FileInfo struct {
	Name    string
	Type    FileType
	Size    int64
	Mode    fs.FileMode // permission bits only
	ModTime time.Time
}

// Kernels is implemented by sandboxes that run kernels: long-lived
// interpreter processes that keep their state between cells, and whose
// processes stay between Execs until they are stopped (Capabilities.Kernels).
type Kernels interface {
	// StartKernel starts a kernel and returns once it is ready for cells.
	StartKernel(ctx context.Context, spec KernelSpec) (Kernel, error)
	// ListKernels returns the live kernels of the sandbox, also those a
	// re-attached sandbox had before (see Reattacher).
	ListKernels(ctx context.Context) ([]Kernel, error)
}

// KernelSpec describes a kernel's process.
type KernelSpec struct {
	// Argv is the kernel program and its arguments; Argv[0] is an absolute
	// path inside the sandbox. It speaks the kernel wire (see
	// cmd/stockade-guest).
	Argv []string
	// Env is the kernel's whole environment; nil means empty.
	Env []string
	// Cwd is its working directory; empty means /.
	Cwd string
}

// Kernel is one kernel of a sandbox. Its methods are safe for concurrent
// use; one cell runs at a time (another Run meanwhile is ErrConflict).
type Kernel interface {
	// ID names the kernel within its sandbox, also after a re-attach.
	ID() string
	// Run runs one cell and returns its result. A cell that raises is a
	// CellResult with CellError, not an error; a kernel that dies during
	// the cell is ErrFailedPrecondition (Done then closes). When ctx ends
	// first, the cell is interrupted and Run returns ctx's error.
	Run(ctx context.Context, cell Cell) (*CellResult, error)
	// Interrupt interrupts the running cell (SIGINT to the kernel).
	Interrupt() error
	// Stop ends the kernel and every process it started, and waits until
	// it is gone.
	Stop(ctx context.Context) error
	// Done is closed when the kernel has ended.
	Done() <-chan struct{}
}

// Cell is code a kernel runs.
type Cell struct {
	Code string
	// Stdin is the cell's input.
	Stdin string
	// OnOutput and OnDisplay, if set, receive the cell's output and
	// displays as they come, within the caps; they are called one at a
	// time and must not retain what they are given.
	OnOutput  func(s Stream, p []byte)
	OnDisplay func(d Display)
}

// MaxDisplays bounds the displays a CellResult keeps.
const MaxDisplays = 16

// Display is a rich output of a cell (an image, HTML, ...) or its value.
type Display struct {
	MimeType string
	Data     []byte
}

// CellStatus is how a cell ended.
type CellStatus string

const (
	CellOK     CellStatus = "ok"
	CellRaised CellStatus = "error" // the cell raised: see CellResult.Error
)

// CellResult is what a cell produced, bounded: each stream to the
// sandbox's output cap, at most MaxDisplays displays.
type CellResult struct {
	Status CellStatus
	// Error is the exception of a cell that raised.
	Error *CellError
	// Value is the value of the cell's last expression, if it had one.
	Value           *Display
	Displays        []Display
	DisplaysDropped int
	Stdout, Stderr  []byte
	StdoutTruncated bool
	StderrTruncated bool
	Duration        time.Duration
}

// CellError is the exception a cell raised.
type CellError struct {
	Name, Value, Traceback string
}

// Binder is implemented by drivers that create sandboxes before they know
// whom they serve, for warm pools (Capabilities.Bind): CreateUnbound
// starts a sandbox from a Spec whose Labels name the pool, and Bind hands
// it, exactly once, to the workspace and execution it will serve.
type Binder interface {
	// CreateUnbound is Create for a sandbox that Bind will bind. The
	// caller must Destroy it.
	CreateUnbound(ctx context.Context, spec Spec) (Sandbox, error)
	// Bind binds sb, which CreateUnbound returned, once: a second Bind, or
	// one of a sandbox Create made, is ErrFailedPrecondition. Its labels
	// are added to the sandbox's (a key it has already is
	// ErrInvalidArgument) and its limits may only tighten (a field above
	// the sandbox's is ErrInvalidArgument; with
	// Capabilities.BindFixedLimits, memory or CPU other than the
	// sandbox's too). Nothing changes on error.
	Bind(ctx context.Context, sb Sandbox, b Binding) error
}

// Binding is what Bind gives a sandbox.
type Binding struct {
	// Labels are added to the sandbox's, as Spec.Labels (Reap and
	// Reattach find them).
	Labels map[string]string
	// Limits tighten the sandbox's; zero fields keep them.
	Limits Limits
	// Network and Egress give the sandbox its egress network, where the
	// driver can do that at bind time (Capabilities.BindEgress);
	// otherwise a Binding with a network is ErrInvalidArgument and the
	// network must be given to CreateUnbound.
	Network NetworkMode
	Egress  *EgressNet
}

// Reattacher is implemented by drivers whose detached sandboxes
// (Spec.Detached) outlive the process that created them, so that a
// restarted daemon can serve them again (Capabilities.Reattach).
type Reattacher interface {
	// Reattach finds every detached sandbox of this driver on the host. It
	// returns those that are alive and that it can prove are its own
	// (records it wrote, whose labels contain all of match, and whose
	// supervisor answers for the sandbox they name), connected again with
	// their kernels. It destroys those it proves are not its own or are
	// dead; one whose supervisor lives but does not answer, or that it
	// had not reached when ctx ended, it keeps and names in the error. The
	// caller must Destroy what it returns.
	Reattach(ctx context.Context, match map[string]string) ([]Sandbox, error)
}

// Deadliner is implemented by the detached sandboxes of a Reattacher:
// each ends itself at its deadline (Spec.Deadline), as Destroy would end
// it, when no process has destroyed it before.
type Deadliner interface {
	// SetDeadline moves the sandbox's deadline to t; the zero t never
	// comes. It holds across a restart of the sandbox's creator and a
	// Reattach. A sandbox that is not detached is ErrFailedPrecondition.
	SetDeadline(ctx context.Context, t time.Time) error
}

// Snapshotter is implemented by drivers that can save a running sandbox
// and start it again from what they saved (Capabilities.Snapshots).
type Snapshotter interface {
	// Checkpoint saves sb, with its processes, memory and kernels, into
	// dir (created, readable by root only; it must not exist), and ends
	// sb as Destroy does. sb must be idle: an Exec, a cell or a file
	// operation in flight is ErrFailedPrecondition, except, for an
	// ExecRestorer, a pool's interpreter waiting for its program.
	Checkpoint(ctx context.Context, sb Sandbox, dir string) error
	// Restore starts a detached sandbox, with a new ID, from what
	// Checkpoint saved in dir, carrying the saved sandbox's labels and
	// then those of labels. Its kernels are there (Kernels.ListKernels).
	// It refuses a dir it cannot prove holds what this driver saved (see
	// the driver's doc), and starts nothing then. The saved labels bind
	// the checkpoint: a label of labels that the saved sandbox had with
	// another value (a checkpoint of one session restored as another's)
	// is ErrForeignCheckpoint, of class ErrFailedPrecondition, and starts
	// nothing either. The caller must Destroy it; dir stays until the
	// caller removes it.
	Restore(ctx context.Context, dir string, labels map[string]string) (Sandbox, error)
}

// LiveSnapshotter is implemented by Snapshotters that can also save a
// sandbox and leave it running (gVisor's checkpoint -leave-running): the
// save behind a session's snapshots and forks. It is an interface of its
// own, found by type assertion on a Snapshotter, so that a Snapshotter
// need not have it.
type LiveSnapshotter interface {
	Snapshotter
	// Snapshot saves sb into dir as Checkpoint does, but sb stays: it
	// stalls while it is saved and then serves on, its kernels with it.
	// The caller keeps sb idle (no cell or Exec in flight; the driver does
	// not check: the engine refuses a busy session with ErrConflict). It
	// returns how long sb was frozen.
	Snapshot(ctx context.Context, sb Sandbox, dir string, o SnapshotOptions) (time.Duration, error)
}

// ExecRestorer is implemented by Snapshotters whose Checkpoint also
// saves a sandbox in which a warm pool's interpreter waits for its
// program (an Exec with ExitNotice and StdinStream that nothing was
// written to yet), and whose restored sandbox goes on with it. It is an
// interface of its own, found by type assertion on a Snapshotter.
type ExecRestorer interface {
	Snapshotter
	// RestoreExec restores the sandbox saved in dir as Restore does and
	// returns, beside it, the interpreter it holds as an Exec of req (the
	// request the interpreter was started with: its OnOutput receives the
	// output from now on; its timeout starts now). A checkpoint without
	// such an interpreter fails (ErrFailedPrecondition) and leaves
	// nothing running.
	RestoreExec(ctx context.Context, dir string, labels map[string]string, req ExecRequest) (Sandbox, Exec, error)
}

// SnapshotOptions are a LiveSnapshotter's Snapshot's.
type SnapshotOptions struct {
	// Unbind names the labels left out of what binds the snapshot, so
	// that Restore may give them other values (a snapshot of one session
	// restored as another session); every other label binds it as a
	// checkpoint's do.
	Unbind []string
	// Thawed, when set, is called once sb serves again, while the
	// snapshot is still being finished (its image digested and sealed):
	// the caller may let work on sb go on from then. It is called on
	// failure too, once sb serves again.
	Thawed func()
}

// ErrForeignCheckpoint is a checkpoint restored for another sandbox than
// the one it was saved for (Snapshotter.Restore).
var ErrForeignCheckpoint = errors.New("the checkpoint belongs to another sandbox")
