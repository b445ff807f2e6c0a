package guest

// Fuzz targets for every decoder the host runs on the guest's bytes. `go
// test` runs their seeds (below and in testdata/fuzz); CI runs each for a
// few seconds:
//
//	go test ./guest -run '^$' -fuzz FuzzClient -fuzztime 10s

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"sync"
	"testing"
	"time"
)

func FuzzReadFrame(f *testing.F) {
	f.Add(header(FrameStdout, 1, 2), 0)
	f.Add(append(header(FrameExit, 3, 2), "{}"...), 10)
	f.Add(header(FrameExit, 1, 0xffffffff), 0)
	f.Fuzz(func(t *testing.T, wire []byte, max int) {
		r := bytes.NewReader(wire)
		for {
			fr, err := ReadFrame(r, max)
			if err != nil {
				return
			}
			limit := max
			if limit <= 0 || limit > MaxPayload {
				limit = MaxPayload
			}
			if len(fr.Payload) > limit {
				t.Fatalf("got a payload of %d bytes over the bound %d", len(fr.Payload), limit)
			}
			var buf bytes.Buffer
			if err := WriteFrame(&buf, fr.Type, fr.ID, fr.Payload); err != nil {
				t.Fatal(err)
			}
			back, err := ReadFrame(&buf, 0)
			if err != nil || back.Type != fr.Type || back.ID != fr.ID || !bytes.Equal(back.Payload, fr.Payload) {
				t.Fatalf("frame %+v does not round-trip: %+v, %v", fr, back, err)
			}
		}
	})
}

func FuzzHello(f *testing.F) {
	var buf bytes.Buffer
	WriteHello(&buf, Hello{Version: 2, Min: 2, Max: 2, Features: []string{"exec"}})
	f.Add(buf.Bytes())
	f.Add([]byte("H\x00\x00\x00\x0d{\"version\":1}"))
	f.Add([]byte("H\x00\x00\x00\x02{}"))
	f.Fuzz(func(t *testing.T, wire []byte) {
		h, err := ReadHello(bytes.NewReader(wire))
		if err != nil {
			return
		}
		v, err := Negotiate(h, MinVersion, MaxVersion)
		if err != nil {
			return
		}
		lo, hi, _ := h.Range()
		if v < MinVersion || v > MaxVersion || v < lo || v > hi {
			t.Fatalf("negotiated %d with a guest of %d..%d", v, lo, hi)
		}
	})
}

// FuzzReplies decodes a payload as every reply type the host reads. A
// reply that decodes and validates must re-encode to one that does too.
func FuzzReplies(f *testing.F) {
	for _, s := range []string{
		`{"pid":7}`, `{"exit_code":0,"signal":0,"cpu_user_us":1}`, `{"exit_code":-1,"signal":9,"cancelled":true}`,
		`{"size":3,"mode":420,"truncated":true}`, `{"entries":[{"name":"a","type":"file","size":1,"mode":420,"mtime":5}]}`,
		`{"name":"a","type":"symlink"}`, `{"mime_type":"image/png","data":"iVBORw=="}`,
		`{"status":"error","error":{"name":"E","value":"v","traceback":"t"},"value":{"mime_type":"text/plain","data":"MQ=="}}`,
		`{"exit_code":3,"signal":0}`, `{"version":2,"kernels":[1,2],"exec":3}`, `{"code":"not_found","message":"x"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		for _, v := range []any{
			&Started{}, &ExitReport{}, &ReadResult{}, &ListResult{}, &Entry{}, &Display{},
			&CellResult{}, &KernelExit{}, &Pong{}, &WriteResult{},
		} {
			if decodeReply(p, v) != nil {
				continue
			}
			b, err := marshal(v)
			if err != nil {
				t.Fatalf("%T %+v does not marshal: %v", v, v, err)
			}
			if err := decodeReply(b, v); err != nil {
				t.Fatalf("%T re-encoded as %s fails: %v", v, b, err)
			}
		}
		if err := replyError("op", p); err != nil {
			if e, ok := err.(*Error); ok && (len(e.Message) > MaxMessage || len(e.Code) > 32) {
				t.Fatalf("an error reply kept %d bytes of message and code %q", len(e.Message), e.Code)
			}
		}
	})
}

// countingWriter signals each write of the host.
type countingWriter struct {
	mu     sync.Mutex
	writes int
	ch     chan struct{}
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.writes++
	w.mu.Unlock()
	select {
	case w.ch <- struct{}{}:
	default:
	}
	return len(p), nil
}

// FuzzClient feeds the guest's side of a connection, after a valid hello,
// to a Client with requests of every kind in flight (ids 1 to 5): whatever
// the guest sends, the client must not panic or hang, and must keep no
// more than its bounds.
func FuzzClient(f *testing.F) {
	frame := func(t FrameType, id uint32, p string) []byte {
		b, _ := AppendFrame(nil, t, id, []byte(p))
		return b
	}
	join := func(fs ...[]byte) []byte { return bytes.Join(fs, nil) }
	f.Add(join(frame(FrameStarted, 1, `{"pid":2}`), frame(FrameStdout, 1, "hello"), frame(FrameExit, 1, `{"exit_code":0}`)))
	f.Add(join(frame(FrameStarted, 1, `{"pid":2}`), frame(FrameStdinAck, 1, ""), frame(FrameStdout, 1, "0123456789abcdef"), frame(FrameError, 1, `{}`)))
	f.Add(join(frame(FrameData, 3, "abc"), frame(FrameResult, 3, `{"size":3,"mode":420}`), frame(FrameResult, 2, `{"name":"a","type":"file"}`)))
	f.Add(join(frame(FrameStarted, 4, `{"pid":9}`), frame(FrameKernelExit, 4, `{"exit_code":0}`), frame('q', 9, "x"), frame(FrameResult, 5, `{"version":2,"kernels":[4],"exec":1}`)))
	f.Fuzz(func(t *testing.T, data []byte) {
		const outCap, readMax = 8, 16
		// Below the fuzzing worker's own 10 s limit on one input, so that
		// a client that hangs is reported as such, with its input, rather
		// than as a worker that hung.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		pr, pw := io.Pipe()
		go func() {
			WriteHello(pw, Hello{Version: MaxVersion, Min: MinVersion, Max: MaxVersion})
		}()
		w := &countingWriter{ch: make(chan struct{}, 1)}
		c, err := Handshake(ctx, bufio.NewReader(pr), w)
		if err != nil {
			t.Fatal(err)
		}
		ex, err := c.Exec(ctx, ExecRequest{Argv: []string{"/a"}, StdinStream: true, OutputCap: outCap + 1}, ExecOptions{OutputCap: outCap})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(4)
		registered := make(chan struct{}, 4)
		var stat *Entry
		var read []byte
		go func() { defer wg.Done(); registered <- struct{}{}; stat, _ = c.Stat(ctx, "/tmp/a") }()
		go func() { defer wg.Done(); registered <- struct{}{}; read, _, _ = c.ReadFile(ctx, "/tmp/b", readMax) }()
		go func() {
			defer wg.Done()
			registered <- struct{}{}
			if k, err := c.StartKernel(ctx, KernelRequest{Argv: []string{"/k"}}); err == nil {
				out, _ := k.Run(ctx, "x", CellOptions{OutputCap: outCap, MaxDisplays: 1})
				if out != nil && (len(out.Stdout) > outCap || len(out.Displays) > 1) {
					t.Errorf("a cell kept %d bytes and %d displays", len(out.Stdout), len(out.Displays))
				}
			}
		}()
		go func() { defer wg.Done(); registered <- struct{}{}; c.Ping(ctx) }()
		for range 4 {
			<-registered
		}
		// Wait until the four requests are written (the exec and the
		// accept went in the first write).
		for deadline := time.After(3 * time.Second); ; {
			w.mu.Lock()
			n := w.writes
			w.mu.Unlock()
			if n >= 5 {
				break
			}
			select {
			case <-w.ch:
			case <-deadline:
				t.Fatal("the requests were not written")
			}
		}
		pw.Write(data)
		pw.Close()
		<-c.Done()
		res, _ := ex.Wait(ctx)
		if len(res.Stdout) > outCap || len(res.Stderr) > outCap {
			t.Errorf("the exec kept %d and %d bytes over a cap of %d", len(res.Stdout), len(res.Stderr), outCap)
		}
		wg.Wait()
		if len(read) > readMax {
			t.Errorf("a read kept %d bytes over its bound %d", len(read), readMax)
		}
		if stat != nil && stat.Validate() != nil {
			t.Errorf("stat returned an invalid entry %+v", stat)
		}
		if ctx.Err() != nil {
			t.Error("the client hung")
		}
	})
}
