package guest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
)

// fakeGuest is the guest's end of a Client on in-memory pipes, scripted by
// a test: it reads the host's frames and writes whatever the test says.
type fakeGuest struct {
	t        *testing.T
	r        *bufio.Reader
	w        *io.PipeWriter
	accepted bool
}

// recorder records the host's writes, to check their grouping.
type recorder struct {
	mu     sync.Mutex
	w      io.Writer
	writes [][]byte
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.writes = append(r.writes, append([]byte(nil), p...))
	r.mu.Unlock()
	return r.w.Write(p)
}

func newPair(t *testing.T) (*Client, *fakeGuest, *recorder) {
	t.Helper()
	hostR, guestW := io.Pipe()
	guestR, hostW := io.Pipe()
	rec := &recorder{w: hostW}
	go WriteHello(guestW, Hello{Version: MaxVersion, Min: MinVersion, Max: MaxVersion})
	c, err := Handshake(t.Context(), bufio.NewReader(hostR), rec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		guestW.Close()
		guestR.Close()
		select {
		case <-c.Done():
		case <-time.After(5 * time.Second):
			t.Error("the client did not end with its streams")
		}
	})
	return c, &fakeGuest{t: t, r: bufio.NewReader(guestR), w: guestW}, rec
}

// next reads the host's next frame (the Accept first, once).
func (g *fakeGuest) next() Frame {
	g.t.Helper()
	if !g.accepted {
		if _, err := ReadAccept(g.r); err != nil {
			g.t.Fatalf("reading accept: %v", err)
		}
		g.accepted = true
	}
	f, err := ReadFrame(g.r, 0)
	if err != nil {
		g.t.Fatalf("reading the host's frame: %v", err)
	}
	return f
}

func (g *fakeGuest) send(t FrameType, id uint32, p string) {
	if err := WriteFrame(g.w, t, id, []byte(p)); err != nil {
		g.t.Errorf("writing %s: %v", t, err)
	}
}

func (g *fakeGuest) expect(t FrameType) Frame {
	g.t.Helper()
	f := g.next()
	if f.Type != t {
		g.t.Fatalf("got %s frame from the host, want %s", f.Type, t)
	}
	return f
}

func TestClientExec(t *testing.T) {
	c, g, rec := newPair(t)
	var mu sync.Mutex
	var seen []string
	ex, err := c.Exec(t.Context(), ExecRequest{Argv: []string{"/bin/true"}, OutputCap: 6}, ExecOptions{
		OutputCap: 5,
		OnOutput: func(s Stream, p []byte) {
			mu.Lock()
			seen = append(seen, string(p))
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	f := g.expect(FrameExec)
	var req ExecRequest
	if err := DecodeStrict(f.Payload, &req); err != nil || req.OutputCap != 6 || f.ID == 0 {
		t.Fatalf("got request %+v (id %d), %v", req, f.ID, err)
	}
	// The Accept and the first request went out in one write.
	if len(rec.writes) == 0 || !bytes.HasPrefix(rec.writes[0], AppendAccept(nil, MaxVersion)) || len(rec.writes[0]) != len(AppendAccept(nil, MaxVersion))+HeaderSize+len(f.Payload) {
		t.Errorf("first write of %d bytes, want the accept and the exec together", len(rec.writes[0]))
	}
	g.send(FrameStarted, f.ID, `{"pid":7,"new_field":1}`)
	g.send(FrameStdout, f.ID, "abc")
	g.send(FrameStderr, f.ID, "e")
	g.send(FrameStdout, f.ID, "defgh")
	g.send(FrameExit, f.ID, `{"exit_code":3,"signal":0,"cpu_user_us":1,"cpu_sys_us":2,"max_rss_bytes":4096}`)
	res, err := ex.Wait(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "abcde" || !res.StdoutTruncated || string(res.Stderr) != "e" || res.StderrTruncated {
		t.Errorf("got stdout %q (truncated %v) stderr %q (truncated %v), want the first 5 bytes, truncated, and e", res.Stdout, res.StdoutTruncated, res.Stderr, res.StderrTruncated)
	}
	if res.PID != 7 || res.Exit == nil || res.Exit.ExitCode != 3 || res.Exit.MaxRSSBytes != 4096 {
		t.Errorf("got pid %d exit %+v, want 7 and exit code 3", res.PID, res.Exit)
	}
	if got := strings.Join(seen, ","); got != "abc,e,de" {
		t.Errorf("OnOutput saw %q, want abc,e,de", got)
	}
}

// TestClientRoutesByID answers two requests in the reverse order and
// checks that each gets its own answer, and that frames of unknown types
// and ids are dropped and counted.
func TestClientRoutesByID(t *testing.T) {
	c, g, _ := newPair(t)
	type answer struct {
		e   *Entry
		err error
	}
	stat := make(chan answer, 1)
	go func() {
		e, err := c.Stat(t.Context(), "/tmp/a")
		stat <- answer{e, err}
	}()
	first := g.expect(FrameStat)
	list := make(chan error, 1)
	go func() {
		l, err := c.ListDir(t.Context(), "/tmp")
		if err == nil && (len(l.Entries) != 1 || l.Entries[0].Name != "b") {
			err = errors.New("wrong listing")
		}
		list <- err
	}()
	second := g.expect(FrameList)
	g.send('q', first.ID, "a type of a newer guest")
	g.send(FrameResult, 0xfeed, `{}`)
	g.send(FrameResult, second.ID, `{"entries":[{"name":"b","type":"dir","size":0,"mode":493,"mtime":1}]}`)
	g.send(FrameResult, first.ID, `{"name":"a","type":"file","size":3,"mode":420,"mtime":1}`)
	if err := <-list; err != nil {
		t.Errorf("list: %v", err)
	}
	if a := <-stat; a.err != nil || a.e.Name != "a" || a.e.Size != 3 {
		t.Errorf("stat: got %+v, %v", a.e, a.err)
	}
	if st := c.Stats(); st.UnknownTypes != 1 || st.UnknownIDs != 1 {
		t.Errorf("got %+v, want one unknown type and one unknown id", st)
	}
	if c.Err() != nil {
		t.Errorf("the connection ended: %v", c.Err())
	}
}

// TestClientViolations checks that a guest that breaks the protocol ends
// the connection: the request fails with ErrProtocol and so does the next.
func TestClientViolations(t *testing.T) {
	big := strings.Repeat("x", MaxChunk+1)
	for _, tc := range []struct {
		name   string
		frames func(id uint32) []Frame
	}{
		{"output before started", func(id uint32) []Frame { return []Frame{{FrameStdout, id, []byte("x")}} }},
		{"exit before started", func(id uint32) []Frame { return []Frame{{FrameExit, id, []byte(`{}`)}} }},
		{"started twice", func(id uint32) []Frame {
			return []Frame{{FrameStarted, id, []byte(`{"pid":2}`)}, {FrameStarted, id, []byte(`{"pid":2}`)}}
		}},
		{"pid 0", func(id uint32) []Frame { return []Frame{{FrameStarted, id, []byte(`{"pid":0}`)}} }},
		{"chunk too big", func(id uint32) []Frame {
			return []Frame{{FrameStarted, id, []byte(`{"pid":2}`)}, {FrameStdout, id, []byte(big)}}
		}},
		{"error after started", func(id uint32) []Frame {
			return []Frame{{FrameStarted, id, []byte(`{"pid":2}`)}, {FrameError, id, []byte(`{"code":"start","message":"x"}`)}}
		}},
		{"exit code out of range", func(id uint32) []Frame {
			return []Frame{{FrameStarted, id, []byte(`{"pid":2}`)}, {FrameExit, id, []byte(`{"exit_code":300}`)}}
		}},
		{"exit not JSON", func(id uint32) []Frame {
			return []Frame{{FrameStarted, id, []byte(`{"pid":2}`)}, {FrameExit, id, []byte(`{`)}}
		}},
		{"a display for an exec", func(id uint32) []Frame {
			return []Frame{{FrameStarted, id, []byte(`{"pid":2}`)}, {FrameDisplay, id, []byte(`{}`)}}
		}},
		{"stdin ack without streamed stdin", func(id uint32) []Frame {
			return []Frame{{FrameStarted, id, []byte(`{"pid":2}`)}, {FrameStdinAck, id, nil}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, g, _ := newPair(t)
			ex, err := c.Exec(t.Context(), ExecRequest{Argv: []string{"/a"}, OutputCap: 10}, ExecOptions{OutputCap: 10})
			if err != nil {
				t.Fatal(err)
			}
			f := g.expect(FrameExec)
			for _, fr := range tc.frames(f.ID) {
				g.send(fr.Type, fr.ID, string(fr.Payload))
			}
			if _, err := ex.Wait(t.Context()); !errors.Is(err, ErrProtocol) || !errors.Is(err, ErrClosed) {
				t.Errorf("got %v, want ErrProtocol and ErrClosed", err)
			}
			if _, err := c.Ping(t.Context()); !errors.Is(err, ErrProtocol) {
				t.Errorf("next request: got %v, want ErrProtocol", err)
			}
		})
	}
}

func TestClientStartError(t *testing.T) {
	c, g, _ := newPair(t)
	ex, _ := c.Exec(t.Context(), ExecRequest{Argv: []string{"/a"}, OutputCap: 1}, ExecOptions{})
	f := g.expect(FrameExec)
	g.send(FrameError, f.ID, `{"code":"start","message":"starting /a: no such file or directory"}`)
	_, err := ex.Wait(t.Context())
	var gerr *Error
	if !errors.As(err, &gerr) || gerr.Code != ErrorStart || !errdefs.IsFailedPrecondition(err) {
		t.Errorf("got %v, want the guest's start error", err)
	}
	if c.Err() != nil {
		t.Errorf("a refused exec ended the connection: %v", c.Err())
	}
}

func TestClientGuestGone(t *testing.T) {
	c, g, _ := newPair(t)
	ex, _ := c.Exec(t.Context(), ExecRequest{Argv: []string{"/a"}, OutputCap: 10}, ExecOptions{OutputCap: 10})
	f := g.expect(FrameExec)
	g.send(FrameStarted, f.ID, `{"pid":2}`)
	g.send(FrameStdout, f.ID, "so far")
	g.send(FrameError, 0, `{"code":"protocol","message":"the guest's last words"}`)
	g.w.Close()
	res, err := ex.Wait(t.Context())
	if !errors.Is(err, ErrClosed) || errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "the guest's last words") {
		t.Errorf("got %v, want ErrClosed with the guest's last words", err)
	}
	if string(res.Stdout) != "so far" {
		t.Errorf("got %q, want the output so far", res.Stdout)
	}
	<-c.Done()
}

// TestClientContext checks that a request whose ctx ends returns at once,
// and that its late answer is dropped.
func TestClientContext(t *testing.T) {
	c, g, _ := newPair(t)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Stat(ctx, "/tmp/a")
		errc <- err
	}()
	f := g.expect(FrameStat)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	g.send(FrameResult, f.ID, `{"name":"a","type":"file"}`)
	ping := make(chan error, 1)
	go func() {
		_, err := c.Ping(t.Context())
		ping <- err
	}()
	p := g.expect(FramePing)
	g.send(FrameResult, p.ID, `{"version":2,"kernels":[],"exec":0}`)
	if err := <-ping; err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.UnknownIDs != 1 {
		t.Errorf("got %+v, want the late answer counted", st)
	}
	if p.ID == f.ID {
		t.Errorf("id %d reused", p.ID)
	}
}

// TestClientStdinWindow checks that streamed stdin goes in chunks of at
// most MaxChunk and that at most StdinWindow chunks are unacknowledged.
func TestClientStdinWindow(t *testing.T) {
	c, g, _ := newPair(t)
	ex, err := c.Exec(t.Context(), ExecRequest{Argv: []string{"/bin/cat"}, StdinStream: true, OutputCap: 1}, ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f := g.expect(FrameExec)
	g.send(FrameStarted, f.ID, `{"pid":2}`)
	data := bytes.Repeat([]byte("s"), (StdinWindow+2)*MaxChunk)
	wrote := make(chan error, 1)
	go func() {
		_, err := ex.Stdin().Write(data)
		if err == nil {
			err = ex.Stdin().Close()
		}
		wrote <- err
	}()
	for i := range StdinWindow {
		if fr := g.expect(FrameStdin); len(fr.Payload) != MaxChunk || fr.ID != f.ID {
			t.Fatalf("chunk %d: %d bytes for %d", i, len(fr.Payload), fr.ID)
		}
	}
	select {
	case err := <-wrote:
		t.Fatalf("the write ended (%v) before any ack", err)
	case <-time.After(50 * time.Millisecond):
	}
	g.send(FrameStdinAck, f.ID, "")
	g.send(FrameStdinAck, f.ID, "")
	g.expect(FrameStdin)
	g.expect(FrameStdin)
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	g.expect(FrameStdinClose)
	g.send(FrameExit, f.ID, `{"exit_code":0}`)
	if _, err := ex.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Stdin().Write([]byte("late")); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("write after the end: got %v, want io.ErrClosedPipe", err)
	}
}

func TestClientSignalCancel(t *testing.T) {
	c, g, _ := newPair(t)
	ex, _ := c.Exec(t.Context(), ExecRequest{Argv: []string{"/a"}, OutputCap: 1}, ExecOptions{})
	f := g.expect(FrameExec)
	if err := ex.Signal(15); err != nil {
		t.Fatal(err)
	}
	if err := ex.Signal(99); !errdefs.IsInvalidArgument(err) {
		t.Errorf("signal 99: got %v, want ErrInvalidArgument", err)
	}
	ex.Cancel()
	if s := g.expect(FrameSignal); s.ID != f.ID || string(s.Payload) != `{"signal":15}` {
		t.Errorf("got signal %q for %d", s.Payload, s.ID)
	}
	if cn := g.expect(FrameCancel); cn.ID != f.ID {
		t.Errorf("got cancel for %d, want %d", cn.ID, f.ID)
	}
}

func TestClientWriteFile(t *testing.T) {
	c, g, _ := newPair(t)
	data := bytes.Repeat([]byte("w"), MaxChunk+10)
	done := make(chan error, 1)
	go func() {
		n, err := c.WriteFile(t.Context(), "/tmp/f", 0o600, bytes.NewReader(data), 1<<20)
		if err == nil && n != int64(len(data)) {
			err = errors.New("wrong size")
		}
		done <- err
	}()
	h := g.expect(FrameWrite)
	if string(h.Payload) != `{"path":"/tmp/f","mode":384}` {
		t.Errorf("got header %s", h.Payload)
	}
	var got []byte
	for {
		f := g.next()
		if f.Type == FrameEnd {
			break
		}
		if f.Type != FrameData || len(f.Payload) > MaxChunk {
			t.Fatalf("got %s of %d bytes", f.Type, len(f.Payload))
		}
		got = append(got, f.Payload...)
	}
	if !bytes.Equal(got, data) {
		t.Errorf("got %d bytes, want %d", len(got), len(data))
	}
	g.send(FrameResult, h.ID, `{"size":32778}`)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Over the bound: the write is cancelled.
	go func() {
		_, err := c.WriteFile(t.Context(), "/tmp/g", 0, bytes.NewReader(data), 10)
		done <- err
	}()
	h = g.expect(FrameWrite)
	if f := g.expect(FrameCancel); f.ID != h.ID {
		t.Errorf("cancel for %d, want %d", f.ID, h.ID)
	}
	if err := <-done; !errdefs.IsTooLarge(err) {
		t.Errorf("got %v, want ErrTooLarge", err)
	}
	for _, p := range []string{"/etc/passwd", "/tmp/../etc/x", "/tmp/a\x00", "/tmp"} {
		if _, err := c.WriteFile(t.Context(), p, 0, bytes.NewReader(nil), 1); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: got %v, want ErrInvalidArgument before anything is sent", p, err)
		}
	}
}

func TestClientReadFile(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer []Frame
		want   string
		proto  bool
	}{
		{"whole", []Frame{{FrameData, 0, []byte("abc")}, {FrameResult, 0, []byte(`{"size":3,"mode":420}`)}}, "abc", false},
		{"more than asked", []Frame{{FrameData, 0, []byte("abcdefghijk")}}, "", true},
		{"size below the data", []Frame{{FrameData, 0, []byte("abc")}, {FrameResult, 0, []byte(`{"size":1,"mode":420}`)}}, "", true},
		{"not regular", []Frame{{FrameError, 0, []byte(`{"code":"not_regular","message":"a fifo"}`)}}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, g, _ := newPair(t)
			type answer struct {
				b   []byte
				err error
			}
			got := make(chan answer, 1)
			go func() {
				b, _, err := c.ReadFile(t.Context(), "/tmp/f", 10)
				got <- answer{b, err}
			}()
			f := g.expect(FrameRead)
			for _, fr := range tc.answer {
				g.send(fr.Type, f.ID, string(fr.Payload))
			}
			a := <-got
			switch {
			case tc.proto:
				if !errors.Is(a.err, ErrProtocol) {
					t.Errorf("got %v, want ErrProtocol", a.err)
				}
			case tc.want == "":
				if !errdefs.IsInvalidArgument(a.err) {
					t.Errorf("got %v, want the guest's refusal", a.err)
				}
			case a.err != nil || string(a.b) != tc.want:
				t.Errorf("got %q, %v; want %q", a.b, a.err, tc.want)
			}
		})
	}
}

func TestClientKernel(t *testing.T) {
	c, g, _ := newPair(t)
	kc := make(chan *Kernel, 1)
	go func() {
		k, err := c.StartKernel(t.Context(), KernelRequest{Argv: []string{"/k"}})
		if err != nil {
			t.Error(err)
		}
		kc <- k
	}()
	kf := g.expect(FrameKernel)
	g.send(FrameStarted, kf.ID, `{"pid":5}`)
	k := <-kc
	if k == nil {
		t.FailNow()
	}
	type run struct {
		out *CellOutput
		err error
	}
	rc := make(chan run, 1)
	go func() {
		out, err := k.Run(t.Context(), "get a", CellOptions{OutputCap: 4, MaxDisplays: 1})
		rc <- run{out, err}
	}()
	cf := g.expect(FrameCell)
	var req CellRequest
	if err := DecodeStrict(cf.Payload, &req); err != nil || req.Kernel != kf.ID || req.Code != "get a" || req.OutputCap != 5 {
		t.Fatalf("got cell %+v, %v", req, err)
	}
	g.send(FrameStdout, cf.ID, "1\n")
	g.send(FrameDisplay, cf.ID, `{"mime_type":"text/plain","data":"MQ=="}`)
	g.send(FrameDisplay, cf.ID, `{"mime_type":"text/plain","data":"Mg=="}`)
	g.send(FrameResult, cf.ID, `{"status":"ok","value":{"mime_type":"text/plain","data":"MQ=="}}`)
	r := <-rc
	if r.err != nil || string(r.out.Stdout) != "1\n" || r.out.Result.Status != CellOK || string(r.out.Result.Value.Data) != "1" {
		t.Fatalf("got %+v, %v", r.out, r.err)
	}
	if len(r.out.Displays) != 1 || string(r.out.Displays[0].Data) != "1" || r.out.DisplaysDropped != 1 {
		t.Errorf("got displays %+v, %d dropped; want one kept and one dropped", r.out.Displays, r.out.DisplaysDropped)
	}
	// The kernel dies during a cell.
	go func() {
		out, err := k.Run(t.Context(), "exit 3", CellOptions{OutputCap: 4})
		rc <- run{out, err}
	}()
	cf = g.expect(FrameCell)
	g.send(FrameError, cf.ID, `{"code":"kernel_gone","message":"ended"}`)
	g.send(FrameKernelExit, kf.ID, `{"exit_code":3,"signal":0}`)
	r = <-rc
	var gerr *Error
	if !errors.As(r.err, &gerr) || gerr.Code != ErrorKernelGone {
		t.Errorf("got %v, want kernel_gone", r.err)
	}
	<-k.Done()
	if x := k.Exit(); x == nil || x.ExitCode != 3 {
		t.Errorf("got exit %+v, want exit code 3", x)
	}
}

// TestClientOnOutputMayCallTheExec checks that OnOutput runs without the
// exec's lock: it may ask for the output so far.
func TestClientOnOutputMayCallTheExec(t *testing.T) {
	c, g, _ := newPair(t)
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	var ex *Exec
	seen := make(chan int, 1)
	ex, err := c.Exec(t.Context(), ExecRequest{Argv: []string{"/a"}, OutputCap: 10}, ExecOptions{
		OutputCap: 10,
		OnOutput: func(Stream, []byte) {
			res, _ := ex.Wait(cancelled)
			seen <- len(res.Stdout)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	f := g.expect(FrameExec)
	g.send(FrameStarted, f.ID, `{"pid":2}`)
	g.send(FrameStdout, f.ID, "abc")
	select {
	case n := <-seen:
		if n != 3 {
			t.Errorf("OnOutput saw %d bytes so far, want 3", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnOutput deadlocked calling Wait")
	}
}

// TestClientReattach checks what a client that re-attaches to a guest
// through a relay needs: its ids start above the reserved ones, and it
// adopts a kernel that an earlier client started, whose cells it runs and
// whose end it hears.
func TestClientReattach(t *testing.T) {
	c, g, _ := newPair(t)
	c.ReserveIDs(10)
	c.ReserveIDs(3) // never lowers
	if got := c.LastID(); got != 10 {
		t.Fatalf("LastID after reserving 10: got %d, want 10", got)
	}
	for _, tt := range []struct {
		name string
		id   uint32
	}{{"id 0", 0}, {"above the reserved ids", 11}} {
		if _, err := c.AdoptKernel(tt.id); !errdefs.IsInvalidArgument(err) {
			t.Errorf("adopting %s: got %v, want ErrInvalidArgument", tt.name, err)
		}
	}
	k, err := c.AdoptKernel(4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AdoptKernel(4); !errdefs.IsInvalidArgument(err) {
		t.Errorf("adopting kernel 4 twice: got %v, want ErrInvalidArgument", err)
	}
	type run struct {
		out *CellOutput
		err error
	}
	rc := make(chan run, 1)
	go func() {
		out, err := k.Run(t.Context(), "get a", CellOptions{OutputCap: 4})
		rc <- run{out, err}
	}()
	cf := g.expect(FrameCell)
	var req CellRequest
	if err := DecodeStrict(cf.Payload, &req); err != nil || req.Kernel != 4 || cf.ID != 11 {
		t.Fatalf("got cell %+v with id %d, %v; want one for kernel 4 with id 11", req, cf.ID, err)
	}
	// A frame of an old client's request is dropped, not taken for ours.
	g.send(FrameStdout, 7, "old")
	g.send(FrameStdout, cf.ID, "1\n")
	g.send(FrameResult, cf.ID, `{"status":"ok"}`)
	if r := <-rc; r.err != nil || string(r.out.Stdout) != "1\n" {
		t.Fatalf("got %+v, %v; want the cell's output", r.out, r.err)
	}
	g.send(FrameKernelExit, 4, `{"exit_code":-1,"signal":9}`)
	select {
	case <-k.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the adopted kernel's exit was not heard")
	}
	if x := k.Exit(); x == nil || x.Signal != 9 {
		t.Errorf("got exit %+v, want signal 9", x)
	}
	if s := c.Stats(); s.UnknownIDs != 1 {
		t.Errorf("got %d frames of unknown ids, want the old client's one", s.UnknownIDs)
	}
}

// TestClientSendAfterEnd sends frames once the connection has ended and
// its writer has stopped: each send must fail with ErrClosed at once. The
// queue has room, so enqueue may queue the frame where no writer will
// take it (its select between the queue and the connection's end is a
// coin toss); a send that waited for that write hung until its ctx
// ended (found by FuzzClient, once in about 1,500 runs of one input).
func TestClientSendAfterEnd(t *testing.T) {
	c, g, _ := newPair(t)
	g.w.Close()
	<-c.Done()
	// The writer drains the queue once after the end, then returns.
	time.Sleep(50 * time.Millisecond)
	for i := range 64 {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		err := c.send(ctx, FramePing, uint32(100+i), nil)
		cancel()
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("send %d after the end: got %v, want ErrClosed at once", i, err)
		}
	}
}

// TestClientAdoptExec checks that a client that re-attached to a guest
// adopts the exec an earlier client left waiting for its stdin: the
// stdin it writes goes to the exec's id, the exec's output and exit are
// heard, and the ids it may not adopt are refused.
func TestClientAdoptExec(t *testing.T) {
	c, g, _ := newPair(t)
	c.ReserveIDs(10)
	for _, tt := range []struct {
		name string
		id   uint32
	}{{"id 0", 0}, {"above the reserved ids", 11}} {
		if _, err := c.AdoptExec(tt.id, true, ExecOptions{OutputCap: 8}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("adopting %s: got %v, want ErrInvalidArgument", tt.name, err)
		}
	}
	var seen []byte
	ex, err := c.AdoptExec(5, true, ExecOptions{OutputCap: 8, OnOutput: func(_ Stream, p []byte) { seen = append(seen, p...) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AdoptExec(5, true, ExecOptions{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("adopting exec 5 twice: got %v, want ErrInvalidArgument", err)
	}
	go func() {
		_, _ = ex.Stdin().Write([]byte("code"))
		_ = ex.Stdin().Close()
	}()
	f := g.expect(FrameStdin)
	if f.ID != 5 || string(f.Payload) != "code" {
		t.Fatalf("got stdin %q for id %d, want \"code\" for 5", f.Payload, f.ID)
	}
	if f := g.expect(FrameStdinClose); f.ID != 5 {
		t.Fatalf("got stdin close for id %d, want 5", f.ID)
	}
	g.send(FrameStdinAck, 5, "")
	g.send(FrameStdout, 5, "hi")
	g.send(FrameExit, 5, `{"exit_code":3}`)
	res, err := ex.Wait(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if res.Exit == nil || res.Exit.ExitCode != 3 || string(res.Stdout) != "hi" || string(seen) != "hi" {
		t.Errorf("got %+v (seen %q), want exit 3 with \"hi\"", res, seen)
	}
}
