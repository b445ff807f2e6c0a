package guest

import (
	"fmt"
	"io"

	"github.com/stockade-sh/stockade/errdefs"
)

// Range returns the versions a Hello announces: [Min, Max], or
// [Version, Version] from a v1 guest, which sends Version only.
func (h *Hello) Range() (lo, hi int, err error) {
	lo, hi = h.Min, h.Max
	if lo == 0 && hi == 0 {
		lo, hi = h.Version, h.Version
	}
	if lo < 1 || hi < lo || hi > 1<<16 || (h.Min != 0 && (h.Version < lo || h.Version > hi)) {
		return 0, 0, fmt.Errorf("guest announces versions %d..%d (version %d): %w", h.Min, h.Max, h.Version, ErrProtocol)
	}
	return lo, hi, nil
}

// Negotiate picks the highest version in both the guest's range and
// [hostMin, hostMax]. A guest outside the host's range is refused with an
// error (ErrFailedPrecondition) that says what to do.
func Negotiate(h *Hello, hostMin, hostMax int) (int, error) {
	lo, hi, err := h.Range()
	if err != nil {
		return 0, err
	}
	v := min(hi, hostMax)
	if v < max(lo, hostMin) {
		return 0, fmt.Errorf("guest speaks protocol %d..%d, this host %d..%d; reinstall the guest (stockade setup): %w",
			lo, hi, hostMin, hostMax, errdefs.ErrFailedPrecondition)
	}
	return v, nil
}

// ReadHello reads and validates the guest's greeting (the v1 header).
func ReadHello(r io.Reader) (*Hello, error) {
	t, p, err := readHelloFrame(r)
	if err != nil {
		return nil, err
	}
	if t != FrameHello {
		return nil, fmt.Errorf("first frame is %s, not hello: %w", t, ErrProtocol)
	}
	var h Hello
	if err := DecodeLenient(p, &h); err != nil {
		return nil, err
	}
	if len(h.Features) > 64 {
		return nil, fmt.Errorf("hello with %d features: %w", len(h.Features), ErrProtocol)
	}
	if _, _, err := h.Range(); err != nil {
		return nil, err
	}
	return &h, nil
}

// WriteHello writes the guest's greeting (the v1 header).
func WriteHello(w io.Writer, h Hello) error { return writeHelloFrame(w, FrameHello, h) }

// ReadAccept reads the host's answer to the hello (the v1 header), as the
// guest does. A frame of another type is a protocol error.
func ReadAccept(r io.Reader) (*Accept, error) {
	t, p, err := readHelloFrame(r)
	if err != nil {
		return nil, err
	}
	if t != FrameAccept {
		return nil, fmt.Errorf("frame %s before accept: %w", t, ErrProtocol)
	}
	var a Accept
	if err := DecodeStrict(p, &a); err != nil {
		return nil, err
	}
	if a.Version < MinVersion || a.Version > MaxVersion {
		return nil, fmt.Errorf("host accepted version %d, this guest speaks %d..%d: %w", a.Version, MinVersion, MaxVersion, ErrProtocol)
	}
	return &a, nil
}

// AppendAccept appends the host's Accept of version v (the v1 header).
func AppendAccept(buf []byte, v int) []byte {
	return appendHelloFrame(buf, FrameAccept, fmt.Appendf(nil, `{"version":%d}`, v))
}
