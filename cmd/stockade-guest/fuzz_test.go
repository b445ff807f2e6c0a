package main

// Fuzz targets for the guest's decoders of what reaches it from outside
// its control: the host's requests (its stdin) and a kernel's events (the
// kernel wire, written by code in the sandbox). `go test` runs their seeds
// (below and in testdata/fuzz); CI runs each for a few seconds:
//
//	go test ./cmd/stockade-guest -run '^$' -fuzz FuzzHostRequests -fuzztime 10s

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/stockade-sh/stockade/guest"
)

// requestOf is the payload type of each request the guest serves, as the
// dispatcher decodes it.
func requestOf(t guest.FrameType) any {
	switch t {
	case guest.FrameExec:
		return &guest.ExecRequest{}
	case guest.FrameSignal:
		return &guest.SignalRequest{}
	case guest.FrameWrite:
		return &guest.WriteRequest{}
	case guest.FrameRead:
		return &guest.ReadRequest{}
	case guest.FrameList, guest.FrameStat, guest.FrameRemove:
		return &guest.PathRequest{}
	case guest.FrameMkdir:
		return &guest.MkdirRequest{}
	case guest.FrameKernel:
		return &guest.KernelRequest{}
	case guest.FrameCell:
		return &guest.CellRequest{}
	}
	return nil
}

// FuzzHostRequests runs the guest's reading of its stdin: the Accept, then
// frames, each decoded strictly as its request type and its paths checked.
func FuzzHostRequests(f *testing.F) {
	accept := guest.AppendAccept(nil, guest.MaxVersion)
	frame := func(t guest.FrameType, id uint32, p string) []byte {
		b, _ := guest.AppendFrame(nil, t, id, []byte(p))
		return b
	}
	f.Add(append(accept, frame(guest.FrameExec, 1, `{"file":{"path":"/tmp/a","data":"eA==","mode":420},"argv":["/bin/sh","{file}"],"env":null,"output_cap":10}`)...))
	f.Add(append(accept, frame(guest.FrameWrite, 2, `{"path":"/tmp/../etc/passwd","mode":0}`)...))
	f.Add(append(accept, frame(guest.FrameRead, 3, `{"path":"/tmp/a\u0000b","max":-1}`)...))
	f.Add(append(accept, frame(guest.FrameCell, 4, `{"kernel":1,"code":"get a","output_cap":5,"extra":1}`)...))
	f.Add(guest.AppendAccept(nil, 1))
	f.Fuzz(func(t *testing.T, wire []byte) {
		r := bufio.NewReader(bytes.NewReader(wire))
		if _, err := guest.ReadAccept(r); err != nil {
			return
		}
		for {
			fr, err := guest.ReadFrame(r, guest.MaxPayload)
			if err != nil {
				return
			}
			v := requestOf(fr.Type)
			if v == nil || guest.DecodeStrict(fr.Payload, v) != nil {
				continue
			}
			var p string
			switch req := v.(type) {
			case *guest.ExecRequest:
				if req.File != nil {
					p = req.File.Path
				}
			case *guest.WriteRequest:
				p = req.Path
			case *guest.ReadRequest:
				p = req.Path
			case *guest.PathRequest:
				p = req.Path
			case *guest.MkdirRequest:
				p = req.Path
			}
			if root, names, err := guest.ValidatePath(p, true); err == nil {
				for _, n := range names {
					if n == ".." || n == "." || n == "" || bytes.ContainsAny([]byte(n), "/\x00") || len(n) > guest.MaxName {
						t.Fatalf("path %q below %s passed with component %q", p, root, n)
					}
				}
			}
		}
	})
}

// FuzzKernelWire runs the guest's reading of a kernel's events: bounded
// lines, each an event whose display and result are checked before they
// are forwarded.
func FuzzKernelWire(f *testing.F) {
	f.Add([]byte(`{"type":"ready"}` + "\n" + `{"type":"display","cell":1,"mime_type":"image/png","data":"iVBORw=="}` + "\n"))
	f.Add([]byte(`{"type":"result","cell":1,"status":"error","error":{"name":"E","value":"v","traceback":"t"}}` + "\n"))
	f.Add([]byte(`{"type":"result","cell":2,"status":"ok","value":{"mime_type":"text/plain","data":"MQ=="}}` + "\n{\n"))
	f.Fuzz(func(t *testing.T, wire []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(wire), 64)
		for {
			line, err := readLine(br, 256)
			if err != nil {
				return
			}
			if len(line) > 256 {
				t.Fatalf("a line of %d bytes over the bound", len(line))
			}
			var ev wireEvent
			if json.Unmarshal(line, &ev) != nil {
				continue
			}
			d := guest.Display{MimeType: ev.MimeType, Data: ev.Data}
			if d.Validate() == nil {
				if _, err := json.Marshal(d); err != nil {
					t.Fatal(err)
				}
			}
			res := guest.CellResult{Status: ev.Status, Error: ev.Error, Value: ev.Value, ExitCode: ev.ExitCode}
			if res.Validate() == nil {
				b, _ := json.Marshal(res)
				var back guest.CellResult
				if guest.DecodeLenient(b, &back) != nil || back.Validate() != nil {
					t.Fatalf("a valid result %s does not decode again", b)
				}
			}
		}
	})
}

func TestParseNotice(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"0\n", 0, true},
		{"7\n", 7, true},
		{"255\n", 255, true},
		{"007\n", 7, true},
		{"256\n", 0, false},
		{"\n", 0, false},
		{"7", 0, false},
		{"-1\n", 0, false},
		{" 7\n", 0, false},
		{"7\n\n", 0, false},
		{"1000\n", 0, false},
	} {
		got, ok := parseNotice([]byte(c.in))
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("parseNotice(%q) = %d, %v; want %d, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

// FuzzParseNotice feeds parseNotice what a program may write on its notice
// descriptor: it accepts exactly one to three digits and a newline, of a
// status up to 255, and gives that status.
func FuzzParseNotice(f *testing.F) {
	for _, s := range []string{"0\n", "255\n", "256\n", "x\n", "", "7"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := parseNotice(b)
		digits, nl := bytes.CutSuffix(b, []byte("\n"))
		n, err := strconv.Atoi(string(digits))
		want := nl && len(digits) >= 1 && len(digits) <= 3 && err == nil && digits[0] != '-' && digits[0] != '+' && n <= 255
		if ok != want || (ok && got != n) {
			t.Errorf("parseNotice(%q) = %d, %v; want %v (%d)", b, got, ok, want, n)
		}
	})
}
