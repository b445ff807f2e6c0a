package guest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/errdefs"
)

func TestFrameRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		t       FrameType
		id      uint32
		payload []byte
	}{
		{"empty stdout", FrameStdout, 1, nil},
		{"binary stderr", FrameStderr, 7, []byte{0, 1, 2, 0xff}},
		{"chunk", FrameStdout, 1 << 31, bytes.Repeat([]byte("x"), MaxChunk)},
		{"largest", FrameExec, 0xffffffff, bytes.Repeat([]byte("y"), MaxPayload)},
		{"unknown type", 'q', 3, []byte("new")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteFrame(&buf, tc.t, tc.id, tc.payload); err != nil {
				t.Fatal(err)
			}
			if got, want := buf.Len(), HeaderSize+len(tc.payload); got != want {
				t.Fatalf("got %d bytes on the wire, want %d", got, want)
			}
			f, err := ReadFrame(&buf, 0)
			if err != nil {
				t.Fatal(err)
			}
			if f.Type != tc.t || f.ID != tc.id || !bytes.Equal(f.Payload, tc.payload) {
				t.Errorf("got frame %s %d of %d bytes, want %s %d of %d", f.Type, f.ID, len(f.Payload), tc.t, tc.id, len(tc.payload))
			}
			if _, err := ReadFrame(&buf, 0); err != io.EOF {
				t.Errorf("got %v after the last frame, want io.EOF", err)
			}
		})
	}
}

func TestWriteFrameRefusesOversize(t *testing.T) {
	var buf bytes.Buffer
	err := WriteFrame(&buf, FrameStdout, 1, make([]byte, MaxPayload+1))
	if !errors.Is(err, ErrProtocol) {
		t.Errorf("got %v, want ErrProtocol", err)
	}
	if buf.Len() != 0 {
		t.Errorf("wrote %d bytes of a refused frame", buf.Len())
	}
}

func header(t FrameType, id, n uint32) []byte {
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32([]byte{byte(t)}, id), n)
}

func TestReadFrameRefuses(t *testing.T) {
	for _, tc := range []struct {
		name     string
		wire     []byte
		max      int
		protocol bool  // want an error wrapping ErrProtocol
		want     error // else want this error
	}{
		{"over MaxPayload", header(FrameExec, 1, MaxPayload+1), 0, true, nil},
		{"over the caller's max", append(header(FrameStdout, 1, 11), make([]byte, 11)...), 10, true, nil},
		{"max above MaxPayload is MaxPayload", header(FrameExec, 1, MaxPayload+1), MaxPayload + 100, true, nil},
		{"huge length", header(FrameExit, 1, 0xffffffff), 0, true, nil},
		{"empty stream", nil, 0, false, io.EOF},
		{"truncated header", []byte{byte(FrameExit), 0, 0}, 0, false, io.ErrUnexpectedEOF},
		{"truncated payload", append(header(FrameExit, 1, 4), "ab"...), 0, false, io.ErrUnexpectedEOF},
		{"missing payload", header(FrameExit, 1, 4), 0, false, io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadFrame(bytes.NewReader(tc.wire), tc.max)
			if tc.protocol {
				if !errors.Is(err, ErrProtocol) {
					t.Errorf("got %v, want ErrProtocol", err)
				}
				return
			}
			if err != tc.want {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// TestFramesTable checks the one table of frame types: every type has a
// name, a direction and a payload, and no two share a name.
func TestFramesTable(t *testing.T) {
	names := map[string]FrameType{}
	for ft, fi := range Frames {
		if fi.Name == "" || fi.Dir == 0 || fi.Doc == "" {
			t.Errorf("frame %q: incomplete entry %+v", byte(ft), fi)
		}
		if other, dup := names[fi.Name]; dup {
			t.Errorf("frames %q and %q share the name %q", byte(ft), byte(other), fi.Name)
		}
		names[fi.Name] = ft
	}
	if got := FrameType('q').String(); got != "unknown(0x71)" {
		t.Errorf("got %q for an unknown type, want unknown(0x71)", got)
	}
}

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		name            string
		payload         string
		strict, lenient bool // whether each decoder accepts it
	}{
		{"valid", `{"exit_code":3,"signal":0}`, true, true},
		{"unknown field", `{"exit_code":3,"extra":1}`, false, true},
		{"wrong type", `{"exit_code":"3"}`, false, false},
		{"not an object", `[]`, false, false},
		{"null", `null`, false, false},
		{"truncated", `{"exit_code":`, false, false},
		{"trailing data", `{"exit_code":3} {}`, false, false},
		{"empty", ``, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r ExitReport
			for _, d := range []struct {
				name string
				fn   func([]byte, any) error
				ok   bool
			}{{"strict", DecodeStrict, tc.strict}, {"lenient", DecodeLenient, tc.lenient}} {
				err := d.fn([]byte(tc.payload), &r)
				if d.ok && err != nil {
					t.Errorf("%s: got %v, want success", d.name, err)
				}
				if !d.ok && !errors.Is(err, ErrProtocol) {
					t.Errorf("%s: got %v, want ErrProtocol", d.name, err)
				}
			}
		})
	}
}

func TestExitReportValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    ExitReport
		ok   bool
	}{
		{"success", ExitReport{}, true},
		{"exit 255", ExitReport{ExitCode: 255}, true},
		{"killed", ExitReport{ExitCode: -1, Signal: 9}, true},
		{"cancelled", ExitReport{ExitCode: -1, Signal: 9, Cancelled: true}, true},
		{"usage", ExitReport{ExitCode: 1, CPUUserUs: 10, CPUSysUs: 5, MaxRSSBytes: 4096}, true},
		{"highest signal", ExitReport{ExitCode: -1, Signal: 64}, true},
		{"exit 256", ExitReport{ExitCode: 256}, false},
		{"exit -2", ExitReport{ExitCode: -2, Signal: 9}, false},
		{"signal 65", ExitReport{ExitCode: -1, Signal: 65}, false},
		{"negative signal", ExitReport{ExitCode: -1, Signal: -1}, false},
		{"neither exit nor signal", ExitReport{ExitCode: -1}, false},
		{"both exit and signal", ExitReport{ExitCode: 1, Signal: 9}, false},
		{"negative user time", ExitReport{CPUUserUs: -1}, false},
		{"negative sys time", ExitReport{CPUSysUs: -1}, false},
		{"negative rss", ExitReport{MaxRSSBytes: -1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.r.Validate()
			if tc.ok && err != nil {
				t.Errorf("got %v, want valid", err)
			}
			if !tc.ok && !errors.Is(err, ErrProtocol) {
				t.Errorf("got %v, want ErrProtocol", err)
			}
		})
	}
}

func TestRepliesValidate(t *testing.T) {
	long := strings.Repeat("a", MaxName+1)
	for _, tc := range []struct {
		name string
		v    validator
		ok   bool
	}{
		{"started", &Started{PID: 2}, true},
		{"started pid 0", &Started{}, false},
		{"started huge pid", &Started{PID: 1 << 30}, false},
		{"entry", &Entry{Name: "a", Type: TypeFile, Size: 1, Mode: 0o644}, true},
		{"entry with a slash", &Entry{Name: "a/b", Type: TypeFile}, false},
		{"entry dot dot", &Entry{Name: "..", Type: TypeDir}, false},
		{"entry with NUL", &Entry{Name: "a\x00", Type: TypeFile}, false},
		{"entry name too long", &Entry{Name: long, Type: TypeFile}, false},
		{"entry of unknown type", &Entry{Name: "a", Type: "socket"}, false},
		{"entry negative size", &Entry{Name: "a", Type: TypeFile, Size: -1}, false},
		{"entry mode bits", &Entry{Name: "a", Type: TypeFile, Mode: 0o10000}, false},
		{"list", &ListResult{Entries: []Entry{{Name: "a", Type: TypeDir}}}, true},
		{"list too long", &ListResult{Entries: make([]Entry, MaxListEntries+1)}, false},
		{"list with a bad entry", &ListResult{Entries: []Entry{{Name: "", Type: TypeDir}}}, false},
		{"read result", &ReadResult{Size: 3, Mode: 0o600}, true},
		{"read negative size", &ReadResult{Size: -1}, false},
		{"display", &Display{MimeType: "image/png", Data: []byte{1}}, true},
		{"display without subtype", &Display{MimeType: "image"}, false},
		{"display with a space", &Display{MimeType: "text/plain; x"}, false},
		{"display too large", &Display{MimeType: "a/b", Data: make([]byte, MaxDisplay+1)}, false},
		{"cell ok", &CellResult{Status: CellOK}, true},
		{"cell error", &CellResult{Status: CellError, Error: &CellFailure{Name: "E"}}, true},
		{"cell error without exception", &CellResult{Status: CellError}, false},
		{"cell status unknown", &CellResult{Status: "maybe"}, false},
		{"cell traceback too long", &CellResult{Status: CellError, Error: &CellFailure{Traceback: strings.Repeat("x", maxFailureText+1)}}, false},
		{"cell bad value", &CellResult{Status: CellOK, Value: &Display{MimeType: "x"}}, false},
		{"cell exit code", &CellResult{Status: CellError, Error: &CellFailure{Name: "ExitStatus"}, ExitCode: ptr(255)}, true},
		{"cell exit code negative", &CellResult{Status: CellOK, ExitCode: ptr(-1)}, false},
		{"cell exit code out of range", &CellResult{Status: CellOK, ExitCode: ptr(256)}, false},
		{"kernel exit", &KernelExit{ExitCode: 0}, true},
		{"kernel exit signal", &KernelExit{ExitCode: -1, Signal: 9}, true},
		{"kernel exit out of range", &KernelExit{ExitCode: 300}, false},
		{"pong", &Pong{Version: 2, Kernels: []uint32{1}}, true},
		{"pong kernel 0", &Pong{Version: 2, Kernels: []uint32{0}}, false},
		{"pong too many kernels", &Pong{Version: 2, Kernels: make([]uint32, MaxKernels+1)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.v.Validate()
			if tc.ok && err != nil {
				t.Errorf("got %v, want valid", err)
			}
			if !tc.ok && !errors.Is(err, ErrProtocol) {
				t.Errorf("got %v, want ErrProtocol", err)
			}
		})
	}
}

func TestErrorReplySanitize(t *testing.T) {
	e := ErrorReply{Code: "Not-A-Code", Message: strings.Repeat("é", MaxMessage)}
	e.Sanitize()
	if e.Code != ErrorIO || len(e.Message) > MaxMessage || !strings.HasPrefix(e.Message, "é") {
		t.Errorf("got code %q and a message of %d bytes, want %q and at most %d", e.Code, len(e.Message), ErrorIO, MaxMessage)
	}
	for code, class := range map[string]error{
		ErrorNotFound: errdefs.ErrNotFound, ErrorSymlink: errdefs.ErrInvalidArgument, ErrorBusy: errdefs.ErrConflict,
		ErrorTooLarge: errdefs.ErrTooLarge, ErrorDenied: errdefs.ErrPermissionDenied, ErrorStart: errdefs.ErrFailedPrecondition,
		"unheard_of": errdefs.ErrUnavailable,
	} {
		if err := (&Error{Op: "x", ErrorReply: ErrorReply{Code: code}}); !errors.Is(err, class) {
			t.Errorf("code %s: got %v, want class %v", code, err, class)
		}
	}
}

func TestValidatePath(t *testing.T) {
	for _, tc := range []struct {
		path  string
		root  bool // allow the root itself
		ok    bool
		names int
	}{
		{"/tmp/main.py", false, true, 1},
		{"/tmp/a/b/main.py", false, true, 3},
		{"/workspace/main.py", false, true, 1},
		{"/tmp", false, false, 0},
		{"/tmp", true, true, 0},
		{"/workspace", true, true, 0},
		{"/tmp/", true, false, 0},
		{"/tmpx/main.py", false, false, 0},
		{"/etc/passwd", false, false, 0},
		{"tmp/main.py", false, false, 0},
		{"/tmp/../etc/passwd", false, false, 0},
		{"/tmp/a/../../etc", false, false, 0},
		{"/tmp/./main.py", false, false, 0},
		{"/tmp//main.py", false, false, 0},
		{"/tmp/a\x00b", false, false, 0},
		{"/tmp/" + strings.Repeat("a", MaxName), false, true, 1},
		{"/tmp/" + strings.Repeat("a", MaxName+1), false, false, 0},
		{"/tmp/" + strings.Repeat("a/", MaxPath/2), false, false, 0},
		{"", false, false, 0},
	} {
		t.Run(tc.path, func(t *testing.T) {
			_, names, err := ValidatePath(tc.path, tc.root)
			if (err == nil) != tc.ok || len(names) != tc.names {
				t.Errorf("got %d names, %v; want ok=%v with %d names", len(names), err, tc.ok, tc.names)
			}
		})
	}
}

func TestNegotiate(t *testing.T) {
	for _, tc := range []struct {
		name      string
		hello     Hello
		want      int
		refused   bool   // ErrFailedPrecondition: no common version
		message   string // in the refusal
		malformed bool   // ErrProtocol
	}{
		{"this version", Hello{Version: 2, Min: 2, Max: 2}, 2, false, "", false},
		{"a wider guest", Hello{Version: 5, Min: 1, Max: 5}, 2, false, "", false},
		{"a v1 guest", Hello{Version: 1}, 0, true, "guest speaks protocol 1..1, this host 2..2; reinstall the guest (stockade setup)", false},
		{"a newer guest", Hello{Version: 3, Min: 3, Max: 4}, 0, true, "guest speaks protocol 3..4", false},
		{"no version", Hello{}, 0, false, "", true},
		{"min above max", Hello{Version: 3, Min: 3, Max: 2}, 0, false, "", true},
		{"version outside its range", Hello{Version: 7, Min: 2, Max: 3}, 0, false, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Negotiate(&tc.hello, MinVersion, MaxVersion)
			switch {
			case tc.refused:
				if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), tc.message) {
					t.Errorf("got %v, want a refusal saying %q", err, tc.message)
				}
			case tc.malformed:
				if !errors.Is(err, ErrProtocol) {
					t.Errorf("got %v, want ErrProtocol", err)
				}
			case err != nil || v != tc.want:
				t.Errorf("got %d, %v; want %d", v, err, tc.want)
			}
		})
	}
}

func TestHelloRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteHello(&buf, Hello{Version: 2, Min: 2, Max: 2, Features: []string{"exec"}}); err != nil {
		t.Fatal(err)
	}
	if buf.Bytes()[0] != 'H' || binary.BigEndian.Uint32(buf.Bytes()[1:5]) != uint32(buf.Len()-HelloHeaderSize) {
		t.Fatalf("hello %q is not in the v1 header", buf.Bytes())
	}
	h, err := ReadHello(&buf)
	if err != nil || h.Max != 2 || len(h.Features) != 1 {
		t.Fatalf("got %+v, %v", h, err)
	}
	a := AppendAccept(nil, 2)
	acc, err := ReadAccept(bytes.NewReader(a))
	if err != nil || acc.Version != 2 {
		t.Errorf("got %+v, %v; want version 2", acc, err)
	}
	for name, wire := range map[string][]byte{
		"oversize hello":   {'H', 0, 0, 0x10, 0x01},
		"not a hello":      AppendAccept(nil, 2),
		"hello not json":   {'H', 0, 0, 0, 1, '{'},
		"huge hello":       {'H', 0xff, 0xff, 0xff, 0xff},
		"truncated header": {'H', 0},
	} {
		if _, err := ReadHello(bytes.NewReader(wire)); err == nil {
			t.Errorf("%s: got a hello, want an error", name)
		}
	}
	if _, err := ReadAccept(bytes.NewReader(AppendAccept(nil, 1))); !errors.Is(err, ErrProtocol) {
		t.Errorf("accept of version 1: got %v, want ErrProtocol", err)
	}
}

func ptr[T any](v T) *T { return &v }
