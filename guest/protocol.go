// Package guest is the framed protocol spoken between the host and
// stockade-guest, the agent that runs as PID 1 inside every sandbox, over the
// sandbox's stdin (host to guest) and stdout (guest to host).
//
// A frame is a 1-byte type, a 4-byte big-endian payload length and the
// payload. The guest sends FrameReady once at start. For each FrameExec the
// host sends, the guest answers with any number of FrameStdout and
// FrameStderr frames, then exactly one FrameExit or FrameError. Closing the
// guest's stdin asks it to exit.
//
// The guest is inside the attacker's box: everything the host reads is
// bounded by MaxPayload and validated (ReadFrame, ExitReport.Validate).
package guest

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
)

// Version is sent in FrameReady; the host refuses a guest of another version.
const Version = 1

// FrameType identifies a frame's payload.
type FrameType byte

const (
	FrameReady  FrameType = 'H' // guest->host, JSON Ready
	FrameExec   FrameType = 'X' // host->guest, JSON ExecRequest
	FrameStdout FrameType = 'O' // guest->host, raw bytes
	FrameStderr FrameType = 'E' // guest->host, raw bytes
	FrameExit   FrameType = 'Z' // guest->host, JSON ExitReport
	FrameError  FrameType = '!' // guest->host, JSON ErrorReport: the program could not be started
)

// MaxPayload bounds one frame. An ExecRequest carries at most 1 MiB of code
// and 1 MiB of stdin, base64-encoded.
const MaxPayload = 3 << 20

// MaxChunk is the largest stdout/stderr payload the guest sends in one frame.
const MaxChunk = 32 << 10

// ErrProtocol is wrapped by every error caused by a malformed frame.
var ErrProtocol = errors.New("guest protocol violation")

// Ready is the guest's greeting.
type Ready struct {
	Version int `json:"version"`
}

// ExecRequest asks the guest to write File and run Argv in File's directory.
type ExecRequest struct {
	File  FileSpec `json:"file"`
	Argv  []string `json:"argv"`  // "{file}" is replaced by the file's path
	Env   []string `json:"env"`   // the whole environment; nil is empty
	Stdin []byte   `json:"stdin"` // fed then closed
	// OutputCap is the bytes forwarded per stream; the rest is drained and
	// dropped. The host asks for one byte more than it keeps, so that
	// output of exactly its cap is told apart from truncated output.
	OutputCap int64 `json:"output_cap"`
}

// FileSpec is the delivered code file.
type FileSpec struct {
	Path string `json:"path"` // absolute, under /tmp or /workspace
	Data []byte `json:"data"`
	Mode uint32 `json:"mode"`
}

// ExitReport is the guest's account of how the program ended. Only the
// fields the guest can know are here; timeouts and OOM kills are decided by
// the host.
type ExitReport struct {
	ExitCode    int   `json:"exit_code"` // -1 if killed by a signal
	Signal      int   `json:"signal"`
	CPUUserUs   int64 `json:"cpu_user_us"`
	CPUSysUs    int64 `json:"cpu_sys_us"`
	MaxRSSBytes int64 `json:"max_rss_bytes"`
}

// ErrorReport says why the guest could not run the program.
type ErrorReport struct {
	Message string `json:"message"`
}

// Validate checks a report read from an untrusted guest.
func (r *ExitReport) Validate() error {
	switch {
	case r.ExitCode < -1 || r.ExitCode > 255:
		return fmt.Errorf("exit code %d out of range: %w", r.ExitCode, ErrProtocol)
	case r.Signal < 0 || r.Signal > 64:
		return fmt.Errorf("signal %d out of range: %w", r.Signal, ErrProtocol)
	case r.ExitCode == -1 && r.Signal == 0:
		return fmt.Errorf("no exit code and no signal: %w", ErrProtocol)
	case r.CPUUserUs < 0 || r.CPUSysUs < 0 || r.MaxRSSBytes < 0:
		return fmt.Errorf("negative resource usage: %w", ErrProtocol)
	}
	return nil
}

// ValidatePath checks that p is a clean absolute path under /tmp or
// /workspace, the only writable places in a sandbox.
func ValidatePath(p string) error {
	if p != path.Clean(p) || !path.IsAbs(p) {
		return fmt.Errorf("file path %q is not clean and absolute", p)
	}
	if !strings.HasPrefix(p, "/tmp/") && !strings.HasPrefix(p, "/workspace/") {
		return fmt.Errorf("file path %q is not under /tmp or /workspace", p)
	}
	return nil
}

// WriteFrame writes one frame. It is not safe for concurrent use on one
// writer; callers serialise.
func WriteFrame(w io.Writer, t FrameType, payload []byte) error {
	if len(payload) > MaxPayload {
		return fmt.Errorf("frame of %d bytes exceeds %d: %w", len(payload), MaxPayload, ErrProtocol)
	}
	var hdr [5]byte
	hdr[0] = byte(t)
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	// One write per frame keeps frames whole on pipes shared by goroutines
	// that hold a lock only around this call.
	buf := make([]byte, 0, len(hdr)+len(payload))
	buf = append(append(buf, hdr[:]...), payload...)
	_, err := w.Write(buf)
	return err
}

// WriteJSON marshals v and writes it as one frame.
func WriteJSON(w io.Writer, t FrameType, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return WriteFrame(w, t, b)
}

// ReadFrame reads one frame, refusing payloads over max bytes (max <= 0
// means MaxPayload) and unknown frame types.
func ReadFrame(r io.Reader, max int) (FrameType, []byte, error) {
	if max <= 0 || max > MaxPayload {
		max = MaxPayload
	}
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	t := FrameType(hdr[0])
	switch t {
	case FrameReady, FrameExec, FrameStdout, FrameStderr, FrameExit, FrameError:
	default:
		return 0, nil, fmt.Errorf("unknown frame type 0x%02x: %w", hdr[0], ErrProtocol)
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if int64(n) > int64(max) {
		return 0, nil, fmt.Errorf("frame of %d bytes exceeds %d: %w", n, max, ErrProtocol)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return t, p, nil
}

// DecodeJSON strictly decodes a frame payload into v.
func DecodeJSON(p []byte, v any) error {
	dec := json.NewDecoder(strings.NewReader(string(p)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decoding frame: %v: %w", err, ErrProtocol)
	}
	if dec.More() {
		return fmt.Errorf("decoding frame: trailing data after the JSON value: %w", ErrProtocol)
	}
	return nil
}
