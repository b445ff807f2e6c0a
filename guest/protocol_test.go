package guest

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		t       FrameType
		payload []byte
	}{
		{"ready", FrameReady, []byte(`{"version":1}`)},
		{"empty stdout", FrameStdout, nil},
		{"binary stderr", FrameStderr, []byte{0, 1, 2, 0xff}},
		{"chunk", FrameStdout, bytes.Repeat([]byte("x"), MaxChunk)},
		{"largest", FrameExec, bytes.Repeat([]byte("y"), MaxPayload)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteFrame(&buf, tc.t, tc.payload); err != nil {
				t.Fatal(err)
			}
			if got, want := buf.Len(), 5+len(tc.payload); got != want {
				t.Fatalf("got %d bytes on the wire, want %d", got, want)
			}
			ft, p, err := ReadFrame(&buf, 0)
			if err != nil {
				t.Fatal(err)
			}
			if ft != tc.t || !bytes.Equal(p, tc.payload) {
				t.Errorf("got frame %q of %d bytes, want %q of %d", ft, len(p), tc.t, len(tc.payload))
			}
			if _, _, err := ReadFrame(&buf, 0); err != io.EOF {
				t.Errorf("got %v after the last frame, want io.EOF", err)
			}
		})
	}
}

func TestWriteJSONRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	in := ExecRequest{
		File:      FileSpec{Path: "/tmp/main.py", Data: []byte("print(1)\x00"), Mode: 0o755},
		Argv:      []string{"/usr/bin/python3", "{file}"},
		Env:       []string{"A=1"},
		Stdin:     []byte{0xff, 0},
		OutputCap: 1 << 20,
	}
	if err := WriteJSON(&buf, FrameExec, in); err != nil {
		t.Fatal(err)
	}
	ft, p, err := ReadFrame(&buf, 0)
	if err != nil || ft != FrameExec {
		t.Fatalf("got frame %q, %v", ft, err)
	}
	var out ExecRequest
	if err := DecodeJSON(p, &out); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.File.Data, in.File.Data) || !bytes.Equal(out.Stdin, in.Stdin) ||
		out.File.Path != in.File.Path || out.File.Mode != in.File.Mode || out.OutputCap != in.OutputCap ||
		strings.Join(out.Argv, " ") != strings.Join(in.Argv, " ") || strings.Join(out.Env, " ") != "A=1" {
		t.Errorf("got %+v, want %+v", out, in)
	}
}

func TestWriteFrameRefusesOversize(t *testing.T) {
	var buf bytes.Buffer
	err := WriteFrame(&buf, FrameStdout, make([]byte, MaxPayload+1))
	if !errors.Is(err, ErrProtocol) {
		t.Errorf("got %v, want ErrProtocol", err)
	}
	if buf.Len() != 0 {
		t.Errorf("wrote %d bytes of a refused frame", buf.Len())
	}
}

func header(t FrameType, n uint32) []byte {
	return []byte{byte(t), byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
}

func TestReadFrameRefuses(t *testing.T) {
	for _, tc := range []struct {
		name     string
		wire     []byte
		max      int
		protocol bool  // want an error wrapping ErrProtocol
		want     error // else want this error
	}{
		{"unknown type", append(header('Q', 0), "x"...), 0, true, nil},
		{"zero type", header(0, 0), 0, true, nil},
		{"over MaxPayload", header(FrameExec, MaxPayload+1), 0, true, nil},
		{"over the caller's max", append(header(FrameStdout, 11), make([]byte, 11)...), 10, true, nil},
		{"max above MaxPayload is MaxPayload", header(FrameExec, MaxPayload+1), MaxPayload + 100, true, nil},
		{"huge length", header(FrameExit, 0xffffffff), 0, true, nil},
		{"empty stream", nil, 0, false, io.EOF},
		{"truncated header", []byte{byte(FrameExit), 0, 0}, 0, false, io.ErrUnexpectedEOF},
		{"truncated payload", append(header(FrameExit, 4), "ab"...), 0, false, io.ErrUnexpectedEOF},
		{"missing payload", header(FrameExit, 4), 0, false, io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ReadFrame(bytes.NewReader(tc.wire), tc.max)
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

func TestDecodeJSON(t *testing.T) {
	for _, tc := range []struct {
		name    string
		payload string
		ok      bool
	}{
		{"valid", `{"exit_code":3,"signal":0}`, true},
		{"unknown field", `{"exit_code":3,"extra":1}`, false},
		{"wrong type", `{"exit_code":"3"}`, false},
		{"not an object", `[]`, false},
		{"truncated", `{"exit_code":`, false},
		{"empty", ``, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r ExitReport
			err := DecodeJSON([]byte(tc.payload), &r)
			if tc.ok && err != nil {
				t.Errorf("got %v, want success", err)
			}
			if !tc.ok && !errors.Is(err, ErrProtocol) {
				t.Errorf("got %v, want ErrProtocol", err)
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
		{"usage", ExitReport{ExitCode: 1, CPUUserUs: 10, CPUSysUs: 5, MaxRSSBytes: 4096}, true},
		{"highest signal", ExitReport{ExitCode: -1, Signal: 64}, true},
		{"exit 256", ExitReport{ExitCode: 256}, false},
		{"exit -2", ExitReport{ExitCode: -2, Signal: 9}, false},
		{"signal 65", ExitReport{ExitCode: -1, Signal: 65}, false},
		{"negative signal", ExitReport{ExitCode: -1, Signal: -1}, false},
		{"neither exit nor signal", ExitReport{ExitCode: -1}, false},
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

func TestValidatePath(t *testing.T) {
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"/tmp/main.py", true},
		{"/tmp/a/b/main.py", true},
		{"/workspace/main.py", true},
		{"/tmp", false},
		{"/tmp/", false},
		{"/workspace", false},
		{"/tmpx/main.py", false},
		{"/etc/passwd", false},
		{"tmp/main.py", false},
		{"/tmp/../etc/passwd", false},
		{"/tmp/./main.py", false},
		{"/tmp//main.py", false},
		{"", false},
	} {
		t.Run(tc.path, func(t *testing.T) {
			err := ValidatePath(tc.path)
			if (err == nil) != tc.ok {
				t.Errorf("got %v, want ok=%v", err, tc.ok)
			}
		})
	}
}
