// Package guest is protocol v2, spoken between the host and stockade-guest,
// the agent that runs as PID 1 inside every sandbox, over the sandbox's
// stdin (host to guest) and stdout (guest to host), or over descriptors 3
// and 4 (see ChannelEnv); Client is the host's end.
//
// # Channel
//
// By default the frames are the guest's stdin and stdout. A runtime that
// copies a container's stdio through pipes of its own (runc run without
// runc's --detach) would put its copy loop between the host and the guest on
// every frame, and keep a thread of its own busy; for it the host passes
// the two pipes as the guest's descriptors ChannelIn and ChannelOut and
// sets ChannelEnv to ChannelFDs in the guest's environment. The guest's
// stdio then carries nothing but its diagnostics.
//
// # Handshake
//
// The guest starts by sending FrameHello with the range of versions it
// speaks; the host answers FrameAccept with one version of both ranges, or
// refuses the guest (a v1 guest, which sends {"version":1}, is refused with
// a message that says to reinstall it). Both frames use the v1 header: a
// 1-byte type and a 4-byte big-endian payload length. Every later frame
// uses the v2 header: a 1-byte type, a 4-byte big-endian request id and a
// 4-byte big-endian length, then at most MaxPayload bytes of payload.
//
// # Requests and ids
//
// Every host request carries a non-zero id chosen by the host, and every
// guest frame about it names that id: an exec's output, a read's data, one
// reply (FrameResult, FrameExit or FrameError). Control frames (stdin,
// signal, cancel, a write's data and end) name the id of the request they
// act on. Id 0 is the guest's own: a fatal FrameError before it exits.
// Frames lists every type with its direction and payload.
//
// # Evolution
//
// A guest answers a request type it does not know with ErrorUnsupported and
// stays up; the host drops (and counts) frame types and ids it does not
// know, and decodes the guest's JSON leniently about fields it does not
// know, so that a newer guest may add either. The guest decodes host
// requests strictly: within one version the host knows every field.
//
// # Re-attaching
//
// A guest may outlive its host's connection when a relay in between owns
// its stdio (package supervisor): the relay replays the guest's hello to
// each new client and passes that client's Accept on in the v2 header (id
// 0), which the guest takes again. The new client reserves the ids the
// earlier ones used (Client.ReserveIDs), asks for the guest's state
// (Client.Ping) and adopts its kernels (Client.AdoptKernel), and the exec
// an earlier client left waiting for its stdin when it means to go on
// with it (Client.AdoptExec: a restored pool interpreter); frames for
// the earlier clients' requests are dropped as ids it does not know.
//
// # Trust
//
// The guest is inside the attacker's box. Everything the host reads is
// bounded and validated before use: frame sizes (ReadFrame), ids (Client
// routes them and nothing more), JSON shapes and numeric ranges (the
// Validate methods), and the output the host keeps (its own caps, not the
// guest's). The decoders are fuzzed (fuzz_test.go).
package guest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
)

// ChannelEnv names the variable of the guest's environment that says where
// its frames go: unset, on its stdin and stdout; ChannelFDs, on the
// descriptors ChannelIn (host to guest) and ChannelOut (guest to host),
// which the runtime passes on from the host. See the package's Channel.
const (
	ChannelEnv = "STOCKADE_GUEST_CHANNEL"
	ChannelFDs = "fds"

	ChannelIn  = 3
	ChannelOut = 4
)

// The versions this package speaks, for both ends: a guest announces
// [MinVersion, MaxVersion] and a host accepts a version in it and in its
// own range.
const (
	MinVersion = 2
	MaxVersion = 2
)

// FrameType identifies a frame's payload.
type FrameType byte

// The frame types. Frames says which end sends each and what it carries.
const (
	FrameHello  FrameType = 'H'
	FrameAccept FrameType = 'A'

	FrameExec       FrameType = 'X'
	FrameStdin      FrameType = 'I'
	FrameStdinClose FrameType = 'J'
	FrameSignal     FrameType = 'S'
	FrameCancel     FrameType = 'C'
	FrameWrite      FrameType = 'W'
	FrameEnd        FrameType = 'N'
	FrameRead       FrameType = 'R'
	FrameList       FrameType = 'L'
	FrameStat       FrameType = 'T'
	FrameRemove     FrameType = 'U'
	FrameMkdir      FrameType = 'M'
	FrameKernel     FrameType = 'K'
	FrameCell       FrameType = 'Y'
	FramePing       FrameType = 'P'

	FrameData FrameType = 'D'

	FrameStarted    FrameType = 'B'
	FrameStdout     FrameType = 'O'
	FrameStderr     FrameType = 'E'
	FrameStdinAck   FrameType = '+'
	FrameExit       FrameType = 'Z'
	FrameResult     FrameType = 'V'
	FrameDisplay    FrameType = 'F'
	FrameKernelExit FrameType = 'Q'
	FrameError      FrameType = '!'
)

// Direction says which end sends a frame type.
type Direction uint8

const (
	ToGuest Direction = 1 << iota
	ToHost
)

// FrameInfo describes one frame type.
type FrameInfo struct {
	Name string
	Dir  Direction
	// Payload is the Go type of a JSON payload, "raw" for bytes passed
	// through, or "" for an empty payload.
	Payload string
	// Doc says what the frame's id names and what answers it.
	Doc string
}

// Frames is the protocol: every frame type of this version. It is the one
// table both ends read (the guest to refuse what it does not serve, the host
// to drop what it does not know).
var Frames = map[FrameType]FrameInfo{
	FrameHello:  {"hello", ToHost, "Hello", "v1 header; the guest's first frame"},
	FrameAccept: {"accept", ToGuest, "Accept", "v1 header, answers the hello; after it, once more in the v2 header (id 0) from a host that re-attached"},

	FrameExec:       {"exec", ToGuest, "ExecRequest", "new id; answered by FrameStarted, output, then FrameExit, or by FrameError"},
	FrameStdin:      {"stdin", ToGuest, "raw", "exec id; at most MaxChunk bytes for the program's stdin; acknowledged by FrameStdinAck"},
	FrameStdinClose: {"stdin close", ToGuest, "", "exec id; closes the program's stdin"},
	FrameSignal:     {"signal", ToGuest, "SignalRequest", "exec id (its process group) or kernel id (the kernel process); no answer"},
	FrameCancel:     {"cancel", ToGuest, "", "exec id: kill its tree (FrameExit still comes); write id: drop the file; kernel id: stop it (FrameKernelExit comes); cell id: interrupt the kernel"},
	FrameWrite:      {"write", ToGuest, "WriteRequest", "new id; FrameData then FrameEnd follow; answered by FrameResult (WriteResult) or FrameError"},
	FrameData:       {"data", ToGuest | ToHost, "raw", "write id (host) or read id (guest); at most MaxChunk bytes"},
	FrameEnd:        {"end", ToGuest, "", "write id; the file is complete"},
	FrameRead:       {"read", ToGuest, "ReadRequest", "new id; answered by FrameData chunks then FrameResult (ReadResult), or FrameError"},
	FrameList:       {"list", ToGuest, "PathRequest", "new id; answered by FrameResult (ListResult) or FrameError"},
	FrameStat:       {"stat", ToGuest, "PathRequest", "new id; answered by FrameResult (Entry) or FrameError"},
	FrameRemove:     {"remove", ToGuest, "PathRequest", "new id; answered by FrameResult ({}) or FrameError"},
	FrameMkdir:      {"mkdir", ToGuest, "MkdirRequest", "new id; answered by FrameResult ({}) or FrameError"},
	FrameKernel:     {"kernel", ToGuest, "KernelRequest", "new id, which names the kernel; answered by FrameStarted or FrameError; FrameKernelExit when it ends"},
	FrameCell:       {"cell", ToGuest, "CellRequest", "new id; answered by output, FrameDisplay, then FrameResult (CellResult) or FrameError"},
	FramePing:       {"ping", ToGuest, "", "new id; answered by FrameResult (Pong)"},

	FrameStarted:    {"started", ToHost, "Started", "exec or kernel id"},
	FrameStdout:     {"stdout", ToHost, "raw", "exec or cell id; at most MaxChunk bytes"},
	FrameStderr:     {"stderr", ToHost, "raw", "exec or cell id; at most MaxChunk bytes"},
	FrameStdinAck:   {"stdin ack", ToHost, "", "exec id; one FrameStdin was consumed"},
	FrameExit:       {"exit", ToHost, "ExitReport", "exec id; its last frame"},
	FrameResult:     {"result", ToHost, "per request", "the request's last frame"},
	FrameDisplay:    {"display", ToHost, "Display", "cell id"},
	FrameKernelExit: {"kernel exit", ToHost, "KernelExit", "kernel id; the kernel ended"},
	FrameError:      {"error", ToHost, "ErrorReply", "the request's last frame; id 0: the guest is exiting"},
}

func (t FrameType) String() string {
	if fi, ok := Frames[t]; ok {
		return fi.Name
	}
	return fmt.Sprintf("unknown(0x%02x)", byte(t))
}

// Bounds of the protocol.
const (
	// MaxPayload bounds one frame. An ExecRequest carries at most 1 MiB
	// of code and 1 MiB of stdin, base64-encoded.
	MaxPayload = 3 << 20
	// MaxChunk is the largest raw payload (output, stdin, file data).
	MaxChunk = 32 << 10
	// HeaderSize is the size of the v2 header; HelloHeaderSize of the v1
	// header that the handshake uses.
	HeaderSize      = 9
	HelloHeaderSize = 5
	// MaxPath is the longest path a request may name, MaxName the longest
	// component.
	MaxPath = 4096
	MaxName = 255
	// MaxListEntries bounds a ListResult; a longer directory is truncated.
	MaxListEntries = 4096
	// MaxDisplay bounds the decoded data of one display or cell value.
	MaxDisplay = 1 << 20
	// MaxMessage bounds the text of an error the host keeps.
	MaxMessage = 1024
	// MaxKernels bounds the kernels one guest runs at once.
	MaxKernels = 16
	// StdinWindow is how many FrameStdin frames a host may have sent
	// without their FrameStdinAck: the guest buffers at most that many.
	StdinWindow = 8
)

// ErrProtocol is wrapped by every error caused by a malformed frame.
var ErrProtocol = errors.New("guest protocol violation")

// Frame is one v2 frame.
type Frame struct {
	Type    FrameType
	ID      uint32
	Payload []byte
}

// AppendFrame appends the v2 encoding of one frame to buf.
func AppendFrame(buf []byte, t FrameType, id uint32, payload []byte) ([]byte, error) {
	if len(payload) > MaxPayload {
		return buf, fmt.Errorf("frame of %d bytes exceeds %d: %w", len(payload), MaxPayload, ErrProtocol)
	}
	buf = append(buf, byte(t))
	buf = binary.BigEndian.AppendUint32(buf, id)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(payload)))
	return append(buf, payload...), nil
}

// WriteFrame writes one v2 frame in one Write call, which keeps frames
// whole on a stream shared by goroutines that hold a lock around the call.
// It is not safe for concurrent use on one writer.
func WriteFrame(w io.Writer, t FrameType, id uint32, payload []byte) error {
	buf, err := AppendFrame(make([]byte, 0, HeaderSize+len(payload)), t, id, payload)
	if err != nil {
		return err
	}
	_, err = w.Write(buf)
	return err
}

// WriteJSON marshals v and writes it as one v2 frame.
func WriteJSON(w io.Writer, t FrameType, id uint32, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return WriteFrame(w, t, id, b)
}

// ReadFrame reads one v2 frame, refusing payloads over max bytes (max <= 0
// or above MaxPayload means MaxPayload) before allocating them. It does not
// look at the type: the reader decides what it knows. A stream that ends
// inside a frame is io.ErrUnexpectedEOF; between frames, io.EOF.
func ReadFrame(r io.Reader, max int) (Frame, error) {
	if max <= 0 || max > MaxPayload {
		max = MaxPayload
	}
	var hdr [HeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Frame{}, err
	}
	f := Frame{Type: FrameType(hdr[0]), ID: binary.BigEndian.Uint32(hdr[1:5])}
	n := binary.BigEndian.Uint32(hdr[5:])
	if int64(n) > int64(max) {
		return Frame{}, fmt.Errorf("%s frame of %d bytes exceeds %d: %w", f.Type, n, max, ErrProtocol)
	}
	f.Payload = make([]byte, n)
	if _, err := io.ReadFull(r, f.Payload); err != nil {
		return Frame{}, unexpected(err)
	}
	return f, nil
}

// writeHelloFrame writes one frame in the v1 header (handshake only).
func writeHelloFrame(w io.Writer, t FrameType, v any) error {
	p, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(appendHelloFrame(nil, t, p))
	return err
}

func appendHelloFrame(buf []byte, t FrameType, p []byte) []byte {
	buf = append(buf, byte(t))
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(p)))
	return append(buf, p...)
}

// maxHello bounds a handshake frame: a hello is a few dozen bytes.
const maxHello = 4 << 10

// readHelloFrame reads one frame in the v1 header, of at most maxHello
// bytes.
func readHelloFrame(r io.Reader) (FrameType, []byte, error) {
	var hdr [HelloHeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxHello {
		return 0, nil, fmt.Errorf("handshake frame of %d bytes exceeds %d: %w", n, maxHello, ErrProtocol)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, unexpected(err)
	}
	return FrameType(hdr[0]), p, nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// DecodeStrict decodes a JSON payload into v, refusing unknown fields and
// trailing data: the guest's decoder of host requests.
func DecodeStrict(p []byte, v any) error {
	return decode(p, v, true)
}

// DecodeLenient decodes a JSON payload into v, ignoring unknown fields (a
// newer guest may add some) but refusing anything but one JSON object: the
// host's decoder of guest replies.
func DecodeLenient(p []byte, v any) error {
	return decode(p, v, false)
}

func decode(p []byte, v any, strict bool) error {
	i := 0
	for i < len(p) && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r') {
		i++
	}
	if i == len(p) || p[i] != '{' {
		return fmt.Errorf("decoding frame: not a JSON object: %w", ErrProtocol)
	}
	dec := json.NewDecoder(bytes.NewReader(p))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decoding frame: %v: %w", err, ErrProtocol)
	}
	if dec.More() {
		return fmt.Errorf("decoding frame: trailing data after the JSON value: %w", ErrProtocol)
	}
	return nil
}

// The roots below which the guest touches files on the host's behalf: the
// sandbox's only writable places.
var Roots = []string{"/tmp", "/workspace"}

// ValidatePath checks a path a request names: absolute, clean, without NUL,
// at most MaxPath bytes with components of at most MaxName, and below one
// of Roots. The root itself is allowed when root is true (to list or stat
// it). It returns the root and the components below it.
func ValidatePath(p string, root bool) (string, []string, error) {
	switch {
	case len(p) > MaxPath:
		return "", nil, fmt.Errorf("path of %d bytes is longer than %d", len(p), MaxPath)
	case strings.IndexByte(p, 0) >= 0:
		return "", nil, fmt.Errorf("path %q contains NUL", p)
	case !path.IsAbs(p) || p != path.Clean(p):
		return "", nil, fmt.Errorf("path %q is not clean and absolute", p)
	}
	for _, r := range Roots {
		if p == r {
			if !root {
				return "", nil, fmt.Errorf("path %q is the root itself", p)
			}
			return r, nil, nil
		}
		if rest, ok := strings.CutPrefix(p, r+"/"); ok {
			names := strings.Split(rest, "/")
			for _, n := range names {
				// Clean removed "." and empty components; ".." can only
				// remain at the start of an absolute path, which Clean
				// removes too: checked all the same.
				if len(n) > MaxName || n == ".." || n == "." || n == "" {
					return "", nil, fmt.Errorf("path %q has a component that is not a plain name of at most %d bytes", p, MaxName)
				}
			}
			return r, names, nil
		}
	}
	return "", nil, fmt.Errorf("path %q is not under /tmp or /workspace", p)
}
