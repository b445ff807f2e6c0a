package supervisor

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"

	"github.com/stockade-sh/stockade/guest"
)

// The shim's decoders. Both ends are untrusted in their own way: the guest
// is inside the attacker's box, and a client is any root process that
// connects (normally a daemon, possibly one that dies in the middle of a
// frame). Every frame is read whole and bounded (guest.ReadFrame) before
// anything of it is passed on, so that what reaches the other end is a
// sequence of whole, well-formed frames whatever arrived. The decoders are
// fuzzed (fuzz_test.go).

// clientFrame is one frame a client sent, decoded.
type clientFrame struct {
	// accept is the version of a client's Accept, 0 for other frames.
	accept int
	// control is the type of one of the shim's own frames, 0 otherwise;
	// deadline is a FrameDeadline's.
	control  guest.FrameType
	deadline Deadline
	// frame is a whole v2 frame for the guest (a request, or a control
	// frame of one), nil otherwise; id is its request id.
	frame []byte
	id    uint32
}

// readClient reads a client's next frame. Until its Accept, a client may
// send only the Accept (the v1 header, as guest.Client sends it) and the
// shim's control frames; after it, control frames and frames for the
// guest, which pass on whatever their type (the guest answers a type it
// does not serve itself).
func readClient(r *bufio.Reader, accepted bool) (clientFrame, error) {
	t, err := r.Peek(1)
	if err != nil {
		return clientFrame{}, err
	}
	if !accepted && guest.FrameType(t[0]) == guest.FrameAccept {
		a, err := guest.ReadAccept(r)
		if err != nil {
			return clientFrame{}, fmt.Errorf("reading the client's accept: %w", err)
		}
		return clientFrame{accept: a.Version}, nil
	}
	f, err := guest.ReadFrame(r, guest.MaxPayload)
	if err != nil {
		return clientFrame{}, err
	}
	if _, ok := Controls[f.Type]; ok {
		malformed := fmt.Errorf("malformed %s control frame from the client: %w", Controls[f.Type], guest.ErrProtocol)
		switch {
		case f.Type == FrameStatus || f.ID != 0:
			return clientFrame{}, malformed
		case f.Type == FrameDeadline:
			var d Deadline
			if len(f.Payload) > maxStatus || guest.DecodeLenient(f.Payload, &d) != nil {
				return clientFrame{}, malformed
			}
			return clientFrame{control: f.Type, deadline: d}, nil
		case len(f.Payload) != 0:
			return clientFrame{}, malformed
		}
		return clientFrame{control: f.Type}, nil
	}
	if !accepted {
		return clientFrame{}, fmt.Errorf("%s frame from the client before its accept: %w", f.Type, guest.ErrProtocol)
	}
	b, err := guest.AppendFrame(nil, f.Type, f.ID, f.Payload)
	if err != nil {
		return clientFrame{}, err
	}
	return clientFrame{frame: b, id: f.ID}, nil
}

// acceptFrame is a client's Accept of version v as the guest reads it: in
// the v1 header when it is the guest's first, in the v2 header (id 0)
// after (see guest.Frames).
func acceptFrame(v int, first bool) []byte {
	if first {
		return guest.AppendAccept(nil, v)
	}
	b, _ := guest.AppendFrame(nil, guest.FrameAccept, 0, []byte(`{"version":`+strconv.Itoa(v)+`}`))
	return b
}

// readHello reads the guest's greeting and returns it as the shim replays
// it: validated, and encoded again (the v1 header).
func readHello(r *bufio.Reader) (*guest.Hello, []byte, error) {
	h, err := guest.ReadHello(r)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the guest's hello: %w", err)
	}
	b, err := helloFrame(*h)
	return h, b, err
}

// helloFrame encodes a greeting as the guest sends it.
func helloFrame(h guest.Hello) ([]byte, error) {
	var buf bytes.Buffer
	if err := guest.WriteHello(&buf, h); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// readGuest reads the guest's next frame after its hello and returns it
// whole as the shim passes it on, or nil for a frame the shim drops: one
// of the shim's own types, which only the shim may send a client.
func readGuest(r *bufio.Reader) ([]byte, error) {
	f, err := guest.ReadFrame(r, guest.MaxPayload)
	if err != nil {
		return nil, err
	}
	if _, ok := Controls[f.Type]; ok {
		return nil, nil
	}
	return guest.AppendFrame(nil, f.Type, f.ID, f.Payload)
}
