// Package supervisor keeps a sandbox alive when the process that created it
// goes away. A shim (`stockade shim DIR`, one small detached process per
// sandbox, as containerd's shim) starts the OCI runtime with the guest's
// channel as its own pipes (the runtime's stdio, or descriptors 3 and 4 it
// passes on: Meta.ChannelFDs) and serves that channel on a unix socket in
// DIR, so that a daemon that restarts, or a gVisor sandbox that is
// restored, is reached again through the same socket.
//
// The shim relays whole frames of the guest protocol (package guest) both
// ways, one client at a time: a new connection replaces the old one. It
// keeps the guest's hello and replays it to each client, passes each
// client's Accept on (in the v2 header after the first), drains the
// guest's frames while no client is attached (so the guest never blocks),
// and records the highest request id any client used, which the next
// client reserves (guest.Client.ReserveIDs). A client that dies in the
// middle of a frame never desynchronises the guest: only whole frames are
// passed on. A few control frames are the shim's own and are never passed
// on (Controls). When the runtime exits, the shim records how (exit.json)
// and exits too.
//
// A sandbox does not outlive its purpose when its creator never comes
// back: the shim ends it by itself (see Serve) at its deadline
// (Meta.Deadline, moved by Conn.EndAt), and when no client is attached
// and none could attach any more, its directory or socket gone from its
// path (the state directory deleted or moved).
//
// A shim's directory, root-only (0700), holds:
//
//	meta.json  what the creator wrote before starting the shim (Meta), with a MAC
//	shim.sock  the guest channel (0600)
//	pid        the shim's pid
//	exit.json  how the runtime ended (Exit), once it has
//	shim.log   the runtime's stderr and the shim's own lines, bounded
//
// The directories of a driver's shims share a parent that holds the key
// of the MACs (LoadKey): a record the key's holder did not write is not
// its own. The parent, the key, each shim's directory and its record must
// be the user's of the process that reads them, closed to others and no
// symbolic links (CheckPrivate), or they are refused.
//
//	key, err := supervisor.LoadKey(root)
//	err = supervisor.WriteMeta(dir, key, supervisor.Meta{ID: id, Argv: runtimeArgv, ...})
//	err = supervisor.Launch(ctx, []string{exe, "shim"}, dir)
//	conn, err := supervisor.Dial(ctx, dir)
//	c, err := guest.Handshake(ctx, conn, conn)
//	c.ReserveIDs(conn.Status().LastID)
package supervisor

import (
	"crypto/hmac"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/sandbox"
)

// The names in a shim's directory, and of the key in their parent.
const (
	MetaFile   = "meta.json"
	SocketFile = "shim.sock"
	PIDFile    = "pid"
	ExitFile   = "exit.json"
	LogFile    = "shim.log"
	KeyFile    = "key"
)

// Meta is what a shim's creator records in its directory before it starts
// it: what the shim runs, and what the creator needs to know the sandbox
// again later. Everything is covered by the MAC.
type Meta struct {
	// ID is the sandbox's ID, the directory's name.
	ID string `json:"id"`
	// Driver is the driver's name, Bundle the bundle directory.
	Driver string `json:"driver"`
	Bundle string `json:"bundle,omitempty"`
	// Labels are the sandbox's labels (sandbox.Spec.Labels, and a
	// binding's); Unbound is true until a Binder binds it.
	Labels  map[string]string `json:"labels,omitempty"`
	Unbound bool              `json:"unbound,omitempty"`
	Created time.Time         `json:"created"`
	// Data is the driver's own record of the sandbox (its limits, its
	// network), opaque here.
	Data json.RawMessage `json:"data,omitempty"`
	// Argv is the runtime's command (`runc run ...`, `runsc restore ...`)
	// and Env its whole environment.
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	// ChannelFDs passes the guest's channel to the runtime as its
	// descriptors 3 (to the guest) and 4 (from the guest), which Argv
	// passes on (runc run --preserve-fds 2), rather than as its stdin and
	// stdout; its stdout then goes to the log.
	ChannelFDs bool `json:"channel_fds,omitempty"`
	// Hello, when set, is the greeting of a guest that greeted before:
	// the sandbox is restored from a checkpoint, its guest is past its
	// handshake, the shim replays Hello and passes every Accept on in the
	// v2 header. LastID is then the highest id used before the checkpoint.
	Hello  *guest.Hello `json:"hello,omitempty"`
	LastID uint32       `json:"last_id,omitempty"`
	// Deadline, when not zero, is when the shim ends the sandbox by
	// itself, whether or not a client is attached: a sandbox whose
	// creator stopped for good does not run on. A client moves it while
	// the shim runs (Conn.EndAt). The zero Deadline never comes.
	Deadline time.Time `json:"deadline,omitzero"`
	// KillArgv, when set, is the runtime's command that kills every
	// process of the sandbox (`runc kill ID KILL`), and DeleteArgv the one
	// that removes the runtime's state of it (`runc delete --force ID`):
	// what the shim runs, with Env, when it ends the sandbox by itself and
	// the guest does not end at the close of its input, as the driver's
	// Destroy would. Nil runs nothing (the runtime's process is killed).
	KillArgv   []string `json:"kill_argv,omitempty"`
	DeleteArgv []string `json:"delete_argv,omitempty"`
	// CreateArgv, when set, makes the sandbox one created ahead, a ready
	// slot: the shim runs CreateArgv (`runsc create ...`) with the guest's
	// channel as it would run Argv, reports ready once it succeeded, and
	// waits for a client's FrameStart. It then reads its record again, as
	// the client has rewritten it with the command that starts the
	// created sandbox in Argv (`runsc restore ... ID`) and the Hello and
	// LastID of what it restores, and runs that Argv without the channel,
	// which the created sandbox holds since its create. Until then Argv
	// may be empty. A slot ended before its start (FrameCloseStdin,
	// FrameKill, its socket gone, SIGTERM) has DeleteArgv run, which
	// removes the created sandbox, and the shim exits.
	CreateArgv []string `json:"create_argv,omitempty"`
	// MAC authenticates the rest (see WriteMeta).
	MAC string `json:"mac"`
}

// Exit is how a shim's runtime ended.
type Exit struct {
	ExitCode int       `json:"exit_code"` // -1 when a signal ended it
	Signal   int       `json:"signal,omitempty"`
	At       time.Time `json:"at"`
	// Ended says why the shim ended the sandbox by itself (EndedDeadline,
	// EndedUnreachable); empty when the runtime ended otherwise.
	Ended string `json:"ended,omitempty"`
}

// Why a shim ended its sandbox by itself (Exit.Ended).
const (
	// EndedDeadline: its deadline passed (Meta.Deadline, Conn.EndAt).
	EndedDeadline = "deadline"
	// EndedUnreachable: no client was attached and none could attach, the
	// shim's socket gone from its directory's path.
	EndedUnreachable = "unreachable"
	// EndedUnused: a sandbox created ahead (Meta.CreateArgv) was ended
	// before it was started.
	EndedUnused = "unused"
)

// Status is what a shim says to each client before anything else, in a
// FrameStatus.
type Status struct {
	// ID is the sandbox's, PID the shim's.
	ID  string `json:"id"`
	PID int    `json:"pid"`
	// LastID is the highest request id a client has sent to the guest
	// (or the checkpoint's): the new client reserves it.
	LastID uint32 `json:"last_id"`
	// Greeted is true when the guest's hello follows at once; otherwise
	// it follows when the guest sends it.
	Greeted bool `json:"greeted"`
	// Restored is true for a sandbox restored from a checkpoint.
	Restored bool `json:"restored,omitempty"`
	// Clients counts the clients attached before this one.
	Clients int `json:"clients"`
	// Deadline is when the shim ends the sandbox by itself (Meta.Deadline,
	// or the last Conn.EndAt); zero for never.
	Deadline time.Time `json:"deadline,omitzero"`
	// Waiting is true for a sandbox created ahead (Meta.CreateArgv) that
	// waits for its FrameStart.
	Waiting bool `json:"waiting,omitempty"`
}

// The frame types of the shim itself, in the v2 header with id 0. None is a
// guest frame type (a guest frame of one of them is dropped, never passed
// on).
const (
	// FrameStatus (shim -> client) carries a Status, first on every
	// connection.
	FrameStatus guest.FrameType = 's'
	// FrameCloseStdin (client -> shim) closes the guest's input (its stdin,
	// or descriptor 3 under Meta.ChannelFDs): the guest
	// then kills every process of the sandbox and exits, and the runtime
	// with it.
	FrameCloseStdin guest.FrameType = 'c'
	// FrameKill (client -> shim) kills the runtime's process; the shim
	// then records the exit and exits.
	FrameKill guest.FrameType = 'k'
	// FrameDeadline (client -> shim) moves the sandbox's deadline
	// (Meta.Deadline): its payload is a Deadline.
	FrameDeadline guest.FrameType = 'd'
	// FrameStart (client -> shim) starts a sandbox created ahead
	// (Meta.CreateArgv) with the Argv of the shim's record as rewritten;
	// the guest's hello (the record's Hello) follows on the connection.
	FrameStart guest.FrameType = 'g'
)

// Controls are the frame types the shim answers itself.
var Controls = map[guest.FrameType]string{
	FrameStatus:     "status",
	FrameCloseStdin: "close the guest's input",
	FrameKill:       "kill the runtime",
	FrameDeadline:   "move the deadline",
	FrameStart:      "start the sandbox created ahead",
}

// Deadline is a FrameDeadline's payload.
type Deadline struct {
	// At is the new deadline; zero for never.
	At time.Time `json:"at,omitzero"`
}

// maxMeta bounds a meta.json; maxStatus a FrameStatus.
const (
	maxMeta   = 1 << 20
	maxStatus = 4 << 10
)

// LoadKey returns the key of the MACs of the shims under root, creating
// root (0700) and the key (0600, random) when they do not exist. Root and
// the key must be this process's user's, closed to others and not
// symbolic links (CheckPrivate): whoever made either first could forge
// the records whose commands the shims run.
func LoadKey(root string) ([]byte, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("creating the shims' directory: %w", err)
	}
	p := filepath.Join(root, KeyFile)
	key, err := readKey(root)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return key, err
	}
	key = make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	// The key is written whole to a file of its own, then linked into
	// place, which fails when a key is there: of two callers making the
	// key at once, one wins and the other reads its key, never a key half
	// written.
	f, err := os.CreateTemp(root, ".key-*")
	if err != nil {
		return nil, fmt.Errorf("creating the shims' key: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(key); err != nil {
		f.Close()
		return nil, fmt.Errorf("writing the shims' key: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("writing the shims' key: %w", err)
	}
	if err := os.Link(f.Name(), p); errors.Is(err, os.ErrExist) {
		return readKey(root)
	} else if err != nil {
		return nil, fmt.Errorf("creating the shims' key: %w", err)
	}
	return key, nil
}

// readKey reads the key of the shims under root, which must exist: root
// and the key are checked as LoadKey says.
func readKey(root string) ([]byte, error) {
	if _, err := CheckPrivate(root, true); err != nil {
		return nil, fmt.Errorf("checking the shims' directory: %w", err)
	}
	p := filepath.Join(root, KeyFile)
	key, err := ReadPrivate(p, 64)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("reading the shims' key: %w", err)
	case len(key) != 32:
		return nil, fmt.Errorf("the shims' key %s is %d bytes, not 32; remove it to make a new one (the shims it signed are then destroyed as not ours): %w", p, len(key), errdefs.ErrFailedPrecondition)
	}
	return key, nil
}

// mac is the MAC of m without its MAC field.
func (m Meta) mac(key []byte) (string, error) {
	m.MAC = ""
	b, err := json.Marshal(m)
	if err != nil {
		return "", err
	}
	return MAC(key, b), nil
}

// WriteMeta writes m, with its MAC under key, to dir's meta.json (0600),
// creating dir (0700) if needed; it replaces an earlier record whole.
func WriteMeta(dir string, key []byte, m Meta) error {
	if err := sandbox.CheckID(m.ID); err != nil {
		return err
	}
	if filepath.Base(dir) != m.ID {
		return fmt.Errorf("shim directory %s is not named after sandbox %s: %w", dir, m.ID, errdefs.ErrInvalidArgument)
	}
	mac, err := m.mac(key)
	if err != nil {
		return err
	}
	m.MAC = mac
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating the shim's directory: %w", err)
	}
	if _, err := CheckPrivate(dir, true); err != nil {
		return fmt.Errorf("checking the shim's directory: %w", err)
	}
	tmp := filepath.Join(dir, MetaFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing the shim's record: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, MetaFile)); err != nil {
		return fmt.Errorf("writing the shim's record: %w", err)
	}
	return nil
}

// ErrNotOurs is wrapped by ReadMeta's error for a record that the key's
// holder did not write, or that does not belong to its directory.
var ErrNotOurs = errors.New("the shim's record was not written by this key's holder")

// ReadMeta reads dir's meta.json and checks its MAC under key and that it
// names the directory's sandbox; a record that fails either is ErrNotOurs,
// as is one in a directory, or a record file, that is not this process's
// user's alone (CheckPrivate).
func ReadMeta(dir string, key []byte) (Meta, error) {
	if _, err := CheckPrivate(dir, true); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Meta{}, fmt.Errorf("reading the shim's record: %w", err)
		}
		return Meta{}, fmt.Errorf("shim %s: %w: %w", dir, err, ErrNotOurs)
	}
	b, err := ReadPrivate(filepath.Join(dir, MetaFile), maxMeta)
	if errdefs.IsFailedPrecondition(err) {
		return Meta{}, fmt.Errorf("shim %s: %w: %w", dir, err, ErrNotOurs)
	}
	if err != nil {
		return Meta{}, fmt.Errorf("reading the shim's record: %w", err)
	}
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return Meta{}, fmt.Errorf("decoding the shim's record %s: %v: %w", dir, err, ErrNotOurs)
	}
	want, err := m.mac(key)
	if err != nil {
		return Meta{}, err
	}
	if !hmac.Equal([]byte(m.MAC), []byte(want)) {
		return Meta{}, fmt.Errorf("shim %s: %w", dir, ErrNotOurs)
	}
	if m.ID != filepath.Base(dir) || sandbox.CheckID(m.ID) != nil {
		return Meta{}, fmt.Errorf("shim %s names sandbox %q: %w", dir, m.ID, ErrNotOurs)
	}
	return m, nil
}

// ReadExit reads how dir's runtime ended; ok is false while it has not.
func ReadExit(dir string) (x Exit, ok bool) {
	b, err := readBounded(filepath.Join(dir, ExitFile), maxStatus)
	if err != nil || json.Unmarshal(b, &x) != nil {
		return Exit{}, false
	}
	return x, true
}

// Log returns the end of dir's shim.log: what the runtime said before it
// failed.
func Log(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, LogFile))
	if err != nil {
		return ""
	}
	if len(b) > 4<<10 {
		b = b[len(b)-4<<10:]
	}
	return string(b)
}

// List returns the names of the shim directories under root (every entry
// that is a directory); a root that does not exist has none.
func List(root string) ([]string, error) {
	entries, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing shims: %w", err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

func readBounded(p string, max int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readAtMost(f, max)
}

// readAtMost reads f whole, if it holds at most max bytes.
func readAtMost(f *os.File, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is longer than %d bytes: %w", f.Name(), max, errdefs.ErrTooLarge)
	}
	return b, nil
}
