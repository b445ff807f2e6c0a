package supervisor

// Fuzz targets for the shim's decoders: of a client's stream and of the
// guest's. `go test` runs their seeds (below and in testdata/fuzz); CI runs
// each for a few seconds:
//
//	go test ./supervisor -run '^$' -fuzz FuzzClientFrames -fuzztime 10s

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/stockade-sh/stockade/guest"
)

func frame(t guest.FrameType, id uint32, p string) []byte {
	b, _ := guest.AppendFrame(nil, t, id, []byte(p))
	return b
}

func FuzzClientFrames(f *testing.F) {
	accept := guest.AppendAccept(nil, guest.MaxVersion)
	f.Add(append(append([]byte{}, accept...), frame(guest.FramePing, 1, "")...))
	f.Add(append(frame(FrameCloseStdin, 0, ""), accept...))
	f.Add(append(append([]byte{}, accept...), frame(guest.FrameExec, 7, `{"argv":["/bin/true"],"env":null,"output_cap":1}`)...))
	f.Add(frame(guest.FramePing, 1, ""))
	f.Add(append(append([]byte{}, accept...), frame(FrameStatus, 0, "{}")...))
	f.Add([]byte("A\x00\x00\x00\x0d{\"version\":9}"))
	f.Fuzz(func(t *testing.T, wire []byte) {
		r := bufio.NewReader(bytes.NewReader(wire))
		accepted := false
		for range 1000 {
			cf, err := readClient(r, accepted)
			if err != nil {
				return
			}
			switch {
			case cf.accept != 0:
				if accepted {
					t.Fatal("a second accept was decoded as one")
				}
				if cf.accept < guest.MinVersion || cf.accept > guest.MaxVersion {
					t.Fatalf("accepted version %d, outside %d..%d", cf.accept, guest.MinVersion, guest.MaxVersion)
				}
				accepted = true
				// What the guest receives for it reads back as an Accept
				// of that version, in either header.
				first, err := guest.ReadAccept(bytes.NewReader(acceptFrame(cf.accept, true)))
				if err != nil || first.Version != cf.accept {
					t.Fatalf("first accept: %+v, %v", first, err)
				}
				later, err := guest.ReadFrame(bytes.NewReader(acceptFrame(cf.accept, false)), 0)
				if err != nil || later.Type != guest.FrameAccept || later.ID != 0 {
					t.Fatalf("later accept: %+v, %v", later, err)
				}
			case cf.control != 0:
				if _, ok := Controls[cf.control]; !ok || cf.control == FrameStatus {
					t.Fatalf("control frame %s is not one a client sends", cf.control)
				}
			default:
				if !accepted {
					t.Fatal("a frame for the guest passed before the accept")
				}
				fr, err := guest.ReadFrame(bytes.NewReader(cf.frame), 0)
				if err != nil || fr.ID != cf.id || len(cf.frame) != guest.HeaderSize+len(fr.Payload) {
					t.Fatalf("passed on %q, which is not one whole frame: %+v, %v", cf.frame, fr, err)
				}
				if _, ok := Controls[fr.Type]; ok {
					t.Fatalf("passed on the shim's own %s frame", fr.Type)
				}
			}
		}
	})
}

func FuzzGuestFrames(f *testing.F) {
	var hello bytes.Buffer
	_ = guest.WriteHello(&hello, guest.Hello{Version: 2, Min: 2, Max: 2, Features: []string{"exec"}})
	f.Add(append(append([]byte{}, hello.Bytes()...), frame(guest.FrameStdout, 1, "hi")...))
	f.Add(append(append([]byte{}, hello.Bytes()...), frame(FrameStatus, 0, `{"id":"x"}`)...))
	f.Add([]byte("H\x00\x00\x00\x0d{\"version\":1}"))
	f.Add(append(append([]byte{}, hello.Bytes()...), byte(guest.FrameExit), 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff))
	f.Fuzz(func(t *testing.T, wire []byte) {
		r := bufio.NewReader(bytes.NewReader(wire))
		h, replay, err := readHello(r)
		if err != nil {
			return
		}
		back, err := guest.ReadHello(bytes.NewReader(replay))
		if err != nil || back.Version != h.Version || back.Min != h.Min || back.Max != h.Max {
			t.Fatalf("the replayed hello %q reads back as %+v, %v; want %+v", replay, back, err, h)
		}
		for range 1000 {
			out, err := readGuest(r)
			if err != nil {
				return
			}
			if out == nil {
				continue
			}
			fr, err := guest.ReadFrame(bytes.NewReader(out), 0)
			if err != nil || len(out) != guest.HeaderSize+len(fr.Payload) {
				t.Fatalf("passed on %q, which is not one whole frame: %v", out, err)
			}
			if _, ok := Controls[fr.Type]; ok {
				t.Fatalf("passed the guest's %s frame on to the client", fr.Type)
			}
		}
	})
}
