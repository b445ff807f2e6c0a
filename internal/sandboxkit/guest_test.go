package sandboxkit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/sandbox"
)

func TestMain(m *testing.M) {
	// A fake guest that ignores a cancel is killed after the grace: keep
	// the tests short.
	cancelGrace = 200 * time.Millisecond
	os.Exit(m.Run())
}

// fakeGuest is the guest's end of a Guest on in-memory pipes: it answers
// each FrameExec by running answer with a writer of frames for that exec.
// Kill ends its stream, as killing a sandbox's PID 1 does. It is for unit
// tests of the session; the drivers' conformance suites run the real guest.
type fakeGuest struct {
	g      *Guest
	out    *io.PipeWriter // guest -> host
	killed chan struct{}
	once   sync.Once
	// onStdin, if set before the first Start, is called for each
	// FrameStdin with its payload.
	onStdin func(f frames, p []byte)
}

// frames writes the frames of one request.
type frames struct {
	w  io.Writer
	id uint32
}

func (f frames) raw(t guest.FrameType, p []byte) { _ = guest.WriteFrame(f.w, t, f.id, p) }
func (f frames) json(t guest.FrameType, v any)   { _ = guest.WriteJSON(f.w, t, f.id, v) }
func (f frames) started()                        { f.json(guest.FrameStarted, guest.Started{PID: 2}) }
func (f frames) exit(r guest.ExitReport)         { f.json(guest.FrameExit, r) }

// hello writes the guest's greeting of this version.
func hello(w io.Writer) {
	_ = guest.WriteHello(w, guest.Hello{Version: guest.MaxVersion, Min: guest.MinVersion, Max: guest.MaxVersion})
}

// newFakeGuest starts a fake guest; onCancel, if given, is called for each
// FrameCancel (a guest that ignores cancels has none).
func newFakeGuest(t *testing.T, limits sandbox.Limits, answer func(f frames, req guest.ExecRequest), onCancel ...func(f frames)) *fakeGuest {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	f := &fakeGuest{out: outW, killed: make(chan struct{})}
	f.g = &Guest{Sandbox: "sbx-test", Limits: limits, In: inW, Frames: bufio.NewReader(outR), Kill: f.kill}
	go func() {
		hello(outW)
		br := bufio.NewReader(inR)
		if _, err := guest.ReadAccept(br); err != nil {
			outW.CloseWithError(err)
			return
		}
		for {
			fr, err := guest.ReadFrame(br, 0)
			if err != nil {
				return
			}
			if fr.Type == guest.FrameCancel {
				for _, c := range onCancel {
					c(frames{w: outW, id: fr.ID})
				}
			}
			if fr.Type == guest.FrameStdin && f.onStdin != nil {
				f.onStdin(frames{w: outW, id: fr.ID}, fr.Payload)
			}
			if fr.Type != guest.FrameExec {
				continue
			}
			var req guest.ExecRequest
			if guest.DecodeStrict(fr.Payload, &req) != nil {
				outW.CloseWithError(errors.New("bad request"))
				return
			}
			answer(frames{w: outW, id: fr.ID}, req)
		}
	}()
	if err := f.g.AwaitReady(t.Context(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		inW.Close()
		f.kill(context.Background())
	})
	return f
}

func (f *fakeGuest) kill(context.Context) {
	f.once.Do(func() {
		close(f.killed)
		f.out.Close()
	})
}

func TestGuestExec(t *testing.T) {
	limits := sandbox.Limits{Memory: 64 << 20, Timeout: time.Minute, OutputCap: 4}
	req := sandbox.ExecRequest{File: sandbox.File{Name: "main.sh"}, Argv: []string{"/bin/sh", "{file}"}}
	tests := []struct {
		name       string
		req        sandbox.ExecRequest
		answer     func(f frames, req guest.ExecRequest)
		wantStatus sandbox.Status
		wantExit   int
		wantStdout string
		wantTrunc  bool
		wantErr    func(error) bool // nil: no error
		wantGone   bool             // later Execs fail, the sandbox was killed
	}{
		{
			name: "succeeded",
			req:  req,
			answer: func(f frames, _ guest.ExecRequest) {
				f.started()
				f.raw(guest.FrameStdout, []byte("hi\n"))
				f.exit(guest.ExitReport{MaxRSSBytes: 1 << 20})
			},
			wantStatus: sandbox.StatusSucceeded, wantStdout: "hi\n",
		},
		{
			name:       "failed",
			req:        req,
			answer:     func(f frames, _ guest.ExecRequest) { f.started(); f.exit(guest.ExitReport{ExitCode: 3}) },
			wantStatus: sandbox.StatusFailed, wantExit: 3,
		},
		{
			name:       "killed by a signal",
			req:        req,
			answer:     func(f frames, _ guest.ExecRequest) { f.started(); f.exit(guest.ExitReport{ExitCode: -1, Signal: 9}) },
			wantStatus: sandbox.StatusKilled, wantExit: -1,
		},
		{
			name: "output over the cap",
			req:  req,
			answer: func(f frames, _ guest.ExecRequest) {
				f.started()
				f.raw(guest.FrameStdout, []byte("hello"))
				f.exit(guest.ExitReport{})
			},
			wantStatus: sandbox.StatusSucceeded, wantStdout: "hell", wantTrunc: true,
		},
		{
			name: "program not started",
			req:  req,
			answer: func(f frames, _ guest.ExecRequest) {
				f.json(guest.FrameError, guest.ErrorReply{Code: guest.ErrorStart, Message: "exec format error\nno such file"})
			},
			wantErr: errdefs.IsFailedPrecondition,
		},
		{
			name:       "guest died",
			req:        req,
			answer:     func(f frames, _ guest.ExecRequest) { f.started(); f.w.(*io.PipeWriter).Close() },
			wantStatus: sandbox.StatusKilled, wantExit: -1, wantGone: true,
		},
		{
			name: "guest broke the protocol",
			req:  req,
			answer: func(f frames, _ guest.ExecRequest) {
				f.started()
				f.exit(guest.ExitReport{ExitCode: 300})
			},
			wantStatus: sandbox.StatusKilled, wantExit: -1, wantGone: true,
		},
		{
			name: "timed out",
			req: sandbox.ExecRequest{
				File: req.File, Argv: req.Argv, Timeout: 50 * time.Millisecond,
			},
			answer: func(f frames, _ guest.ExecRequest) {
				f.started()
				f.raw(guest.FrameStdout, []byte("so"))
			},
			wantStatus: sandbox.StatusTimedOut, wantExit: -1, wantStdout: "so", wantGone: true,
		},
		{
			name:    "file name with a slash",
			req:     sandbox.ExecRequest{File: sandbox.File{Name: "a/b"}, Argv: req.Argv},
			answer:  func(frames, guest.ExecRequest) {},
			wantErr: errdefs.IsInvalidArgument,
		},
		{
			name:    "relative argv[0]",
			req:     sandbox.ExecRequest{File: req.File, Argv: []string{"sh"}},
			answer:  func(frames, guest.ExecRequest) {},
			wantErr: errdefs.IsInvalidArgument,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeGuest(t, limits, tt.answer)
			res, err := execOn(t.Context(), f.g, tt.req)
			if tt.wantErr != nil {
				if !tt.wantErr(err) {
					t.Fatalf("got error %v, want its class", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			if res.Status != tt.wantStatus || res.ExitCode != tt.wantExit {
				t.Errorf("got %s exit %d, want %s exit %d", res.Status, res.ExitCode, tt.wantStatus, tt.wantExit)
			}
			if string(res.Stdout) != tt.wantStdout || res.StdoutTruncated != tt.wantTrunc {
				t.Errorf("got stdout %q truncated %v, want %q truncated %v", res.Stdout, res.StdoutTruncated, tt.wantStdout, tt.wantTrunc)
			}
			select {
			case <-f.killed:
				if !tt.wantGone {
					t.Errorf("the sandbox was killed")
				}
			default:
				if tt.wantGone {
					t.Errorf("the sandbox was not killed")
				}
			}
			_, err = execOn(t.Context(), f.g, req)
			if gone := errdefs.IsFailedPrecondition(err); gone != tt.wantGone {
				t.Errorf("next Exec: got %v, want gone %v", err, tt.wantGone)
			}
		})
	}
}

func TestGuestExecRequest(t *testing.T) {
	got := make(chan guest.ExecRequest, 1)
	f := newFakeGuest(t, sandbox.Limits{Timeout: time.Minute, OutputCap: 10}, func(f frames, req guest.ExecRequest) {
		got <- req
		f.started()
		f.exit(guest.ExitReport{})
	})
	if _, err := execOn(t.Context(), f.g, sandbox.ExecRequest{File: sandbox.File{Name: "x.py", Data: []byte("1")}, Argv: []string{"/usr/bin/python3", "{file}"}}); err != nil {
		t.Fatalf("Exec: %v", err)
	}
	r := <-got
	if r.File.Path != "/tmp/x.py" || r.File.Mode != 0o644 || r.OutputCap != 11 {
		t.Errorf("got file %s mode %o output cap %d, want /tmp/x.py 644 11", r.File.Path, r.File.Mode, r.OutputCap)
	}
}

// TestGuestExecCancelled checks that a timeout, a cancelled ctx or Cancel
// cancels the exec: a guest that ends it within cancelGrace keeps its
// sandbox, one that does not is killed.
func TestGuestExecCancelled(t *testing.T) {
	a := sandbox.ExecRequest{File: sandbox.File{Name: "a"}, Argv: []string{"/a"}}
	for _, tt := range []struct {
		name     string
		end      string // what ends the exec: "timeout", "ctx" or "cancel"
		complies bool
	}{
		{"ctx, guest complies", "ctx", true},
		{"ctx, guest ignores the cancel", "ctx", false},
		{"timeout, guest complies", "timeout", true},
		{"timeout, guest ignores the cancel", "timeout", false},
		{"Cancel, guest complies", "cancel", true},
		{"Cancel, guest ignores the cancel", "cancel", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			second := false
			answer := func(f frames, _ guest.ExecRequest) {
				f.started()
				if second {
					f.exit(guest.ExitReport{})
				}
				second = true
				f.raw(guest.FrameStdout, []byte("so"))
			}
			var cancels []func(frames)
			if tt.complies {
				cancels = append(cancels, func(f frames) { f.exit(guest.ExitReport{ExitCode: -1, Signal: 9, Cancelled: true}) })
			}
			f := newFakeGuest(t, sandbox.Limits{Timeout: time.Minute, OutputCap: 10}, answer, cancels...)
			ctx, req := t.Context(), a
			switch tt.end {
			case "timeout":
				req.Timeout = 50 * time.Millisecond
			case "ctx":
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
				defer cancel()
			}
			ex, err := f.g.Start(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if tt.end == "cancel" {
				if _, err := f.g.Start(t.Context(), a); !errdefs.IsConflict(err) {
					t.Errorf("Start while an exec runs: got %v, want ErrConflict", err)
				}
				if err := ex.Cancel(); err != nil {
					t.Fatal(err)
				}
			}
			res, err := ex.Wait(t.Context())
			switch {
			case tt.end == "timeout" && (err != nil || res.Status != sandbox.StatusTimedOut || string(res.Stdout) != "so"):
				t.Errorf("got %+v, %v; want timed out with the output so far", res, err)
			case tt.end == "ctx" && !errors.Is(err, context.DeadlineExceeded):
				t.Errorf("got %v, want the context's deadline", err)
			case tt.end == "cancel" && (err != nil || res.Status != sandbox.StatusKilled || string(res.Stdout) != "so"):
				t.Errorf("got %+v, %v; want killed with the output so far", res, err)
			}
			if again, err2 := ex.Wait(t.Context()); again != res || err2 != err {
				t.Errorf("a second Wait: got %v, %v; want the first's %v, %v", again, err2, res, err)
			}
			res, err = execOn(t.Context(), f.g, a)
			if tt.complies {
				if err != nil || res.Status != sandbox.StatusSucceeded {
					t.Errorf("next Exec: got %+v, %v; want it to run", res, err)
				}
				select {
				case <-f.killed:
					t.Error("the sandbox was killed")
				default:
				}
				return
			}
			if !errdefs.IsFailedPrecondition(err) {
				t.Errorf("next Exec: got %v, want ErrFailedPrecondition", err)
			}
		})
	}
}

// unreadGuest is a Guest whose guest said hello and then reads nothing.
func unreadGuest(t *testing.T, limits sandbox.Limits, kill func(context.Context), in io.Writer, out *io.PipeReader, outW *io.PipeWriter) *Guest {
	t.Helper()
	go hello(outW)
	g := &Guest{Sandbox: "sbx-test", Limits: limits, In: in, Frames: bufio.NewReader(out), Kill: kill}
	if err := g.AwaitReady(t.Context(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return g
}

// TestGuestExecGuestNotReading checks that a guest that stops reading
// cannot hold Exec past its timeout or its ctx while the program is sent:
// the sandbox is killed, which ends the write.
func TestGuestExecGuestNotReading(t *testing.T) {
	for _, cancel := range []bool{false, true} {
		inR, inW := io.Pipe()
		outR, outW := io.Pipe()
		kill := func(context.Context) {
			inR.CloseWithError(errors.New("killed"))
			outW.Close()
		}
		g := unreadGuest(t, sandbox.Limits{Timeout: time.Minute, OutputCap: 1 << 20}, kill, inW, outR, outW)
		req := sandbox.ExecRequest{File: sandbox.File{Name: "a", Data: make([]byte, 200<<10)}, Argv: []string{"/a"}}
		ctx := t.Context()
		if cancel {
			var stop context.CancelFunc
			ctx, stop = context.WithTimeout(ctx, 100*time.Millisecond)
			defer stop()
		} else {
			// Above the sandbox's limit, which is its ceiling.
			g.Limits.Timeout, req.Timeout = 100*time.Millisecond, time.Hour
		}
		type ret struct {
			res *sandbox.Result
			err error
		}
		got := make(chan ret, 1)
		go func() {
			res, err := execOn(ctx, g, req)
			got <- ret{res, err}
		}()
		select {
		case r := <-got:
			switch {
			case cancel && !errors.Is(r.err, context.DeadlineExceeded):
				t.Errorf("cancelled: got %v, want the context's deadline", r.err)
			case !cancel && (r.err != nil || r.res.Status != sandbox.StatusTimedOut):
				t.Errorf("timeout: got %+v, %v; want timed out", r.res, r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Exec (cancel %v) still blocked sending the program", cancel)
		}
	}
}

// TestGuestExecKillFails checks that Exec returns after a timeout even
// when killing the sandbox does not end the guest's stream: with an error,
// after killGrace.
func TestGuestExecKillFails(t *testing.T) {
	defer func(k, c time.Duration) { killGrace, cancelGrace = k, c }(killGrace, cancelGrace)
	killGrace, cancelGrace = 100*time.Millisecond, 100*time.Millisecond
	_, inW := io.Pipe()
	outR, outW := io.Pipe()
	// What Destroy does: the writer and the reader then return.
	defer inW.Close()
	defer outR.Close()
	g := unreadGuest(t, sandbox.Limits{Timeout: 50 * time.Millisecond, OutputCap: 1 << 20}, func(context.Context) {}, inW, outR, outW)
	got := make(chan error, 1)
	go func() {
		_, err := execOn(t.Context(), g, sandbox.ExecRequest{File: sandbox.File{Name: "a"}, Argv: []string{"/a"}})
		got <- err
	}()
	select {
	case err := <-got:
		if !errdefs.IsUnavailable(err) || !strings.Contains(err.Error(), "did not end") {
			t.Errorf("got %v, want ErrUnavailable: the sandbox did not end", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Exec waits for a stream that never ends")
	}
}

func TestExitStatus(t *testing.T) {
	tests := []struct {
		name string
		r    guest.ExitReport
		oom  bool
		want sandbox.Status
	}{
		{"exit 0", guest.ExitReport{}, false, sandbox.StatusSucceeded},
		{"exit 0 with an OOM kill of a child", guest.ExitReport{}, true, sandbox.StatusSucceeded},
		{"exit 1", guest.ExitReport{ExitCode: 1}, false, sandbox.StatusFailed},
		{"signal", guest.ExitReport{ExitCode: -1, Signal: 9}, false, sandbox.StatusKilled},
		{"signal with an OOM kill", guest.ExitReport{ExitCode: -1, Signal: 9}, true, sandbox.StatusOOMKilled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := exitStatus(&tt.r, tt.oom); got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}

func TestAwaitReady(t *testing.T) {
	tests := []struct {
		name    string
		send    func(w io.Writer)
		wantErr string // in the error; "" for none
	}{
		{"ready", hello, ""},
		{"a v1 guest", func(w io.Writer) { w.Write([]byte("H\x00\x00\x00\x0d{\"version\":1}")) }, "guest speaks protocol 1..1, this host 2..2; reinstall the guest (stockade setup)"},
		{"a newer guest", func(w io.Writer) { _ = guest.WriteHello(w, guest.Hello{Version: 9, Min: 9, Max: 9}) }, "guest speaks protocol 9..9"},
		{"other frame", func(w io.Writer) { _ = guest.WriteFrame(w, guest.FrameStdout, 0, []byte("x")) }, "not hello"},
		{"stream ends", func(w io.Writer) { w.(*io.PipeWriter).Close() }, "EOF"},
		{"silence", func(io.Writer) {}, "did not start within"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, w := io.Pipe()
			defer w.Close()
			go tt.send(w)
			g := &Guest{Frames: r}
			err := g.AwaitReady(t.Context(), 100*time.Millisecond)
			if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("got %v, want an error saying %q", err, tt.wantErr)
			}
		})
	}
}

func TestStartError(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		stderr string
		want   string
		check  func(error) bool
	}{
		{"stderr explains", errors.New("EOF"), "warning\nruntime: no such image", "starting sandbox with runc: runtime: no such image", errdefs.IsUnavailable},
		{"no stderr", errors.New("guest did not start within 1s"), "", "starting sandbox with runc: guest did not start within 1s", errdefs.IsUnavailable},
		{"cancelled", context.Canceled, "ignored", "starting sandbox: context canceled", func(err error) bool { return errors.Is(err, context.Canceled) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := StartError("runc", tt.err, tt.stderr)
			if !strings.HasPrefix(err.Error(), tt.want) || !tt.check(err) {
				t.Errorf("got %v, want %q of its class", err, tt.want)
			}
		})
	}
}

// TestGuestExecCgroupNumbers checks the numbers a run takes from its
// cgroup, on a v1 and a v2 tree of the test's own: a timed-out run, whose
// guest never reports, gets the CPU time used since the Exec began and the
// peak memory; under CPUFromCgroup so does a run that ended, and a pool's
// run from the moment its code is written to its stdin; a sandbox
// OOM-killed whole reports the kill's SIGKILL.
func TestGuestExecCgroupNumbers(t *testing.T) {
	const path = "/stockade/sbx-test"
	for _, layout := range []struct {
		name              string
		v2                bool
		cpu, peak, events string // files below the root
		cpuText           func(time.Duration) string
		oomText           string
	}{
		{
			name: "v1", cpu: "cpuacct" + path + "/cpuacct.usage", peak: "memory" + path + "/memory.max_usage_in_bytes", events: "memory" + path + "/memory.oom_control",
			cpuText: func(d time.Duration) string { return strconv.FormatInt(d.Nanoseconds(), 10) + "\n" },
			oomText: "oom_kill_disable 0\nunder_oom 0\noom_kill %d\n",
		},
		{
			name: "v2", v2: true, cpu: path[1:] + "/cpu.stat", peak: path[1:] + "/memory.peak", events: path[1:] + "/memory.events",
			cpuText: func(d time.Duration) string {
				return fmt.Sprintf("usage_usec %d\nuser_usec 1\nsystem_usec 1\n", d.Microseconds())
			},
			oomText: "low 0\nhigh 0\nmax 3\noom 1\noom_kill %d\n",
		},
	} {
		t.Run(layout.name, func(t *testing.T) {
			root := t.TempDir()
			write := func(name, content string) {
				p := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cg := Cgroup{V2: layout.v2, Path: path, Root: root}
			limits := sandbox.Limits{Memory: 64 << 20, Timeout: time.Minute, OutputCap: 10, CPU: 1}
			req := sandbox.ExecRequest{File: sandbox.File{Name: "a"}, Argv: []string{"/a"}}
			started := time.Second // the guest's own CPU time before the Exec

			t.Run("timed out", func(t *testing.T) {
				write(layout.cpu, layout.cpuText(started))
				write(layout.events, fmt.Sprintf(layout.oomText, 0))
				f := newFakeGuest(t, limits, func(fr frames, _ guest.ExecRequest) {
					write(layout.cpu, layout.cpuText(started+400*time.Millisecond))
					write(layout.peak, "50000000\n")
				})
				f.g.Cgroup = cg
				r := req
				r.Timeout = 100 * time.Millisecond
				res, err := execOn(t.Context(), f.g, r)
				if err != nil {
					t.Fatal(err)
				}
				if res.Status != sandbox.StatusTimedOut || res.CPUTime != 400*time.Millisecond || res.PeakMemory != 50000000 {
					t.Errorf("got %s with CPU %s and peak %d, want timed_out with 400ms and 50000000", res.Status, res.CPUTime, res.PeakMemory)
				}
			})
			// A guest counts 700 ms for its program while the cgroup counts
			// 500 ms over the Exec (gVisor's Sentry counts a throttled
			// task as running): CPUFromCgroup takes the host's count.
			for _, tt := range []struct {
				name       string
				fromCgroup bool
				want       time.Duration
			}{
				{"CPU time from the guest", false, 700 * time.Millisecond},
				{"CPU time from the cgroup", true, 500 * time.Millisecond},
			} {
				t.Run(tt.name, func(t *testing.T) {
					write(layout.cpu, layout.cpuText(started))
					write(layout.events, fmt.Sprintf(layout.oomText, 0))
					f := newFakeGuest(t, limits, func(fr frames, _ guest.ExecRequest) {
						write(layout.cpu, layout.cpuText(started+500*time.Millisecond))
						fr.started()
						fr.exit(guest.ExitReport{CPUUserUs: 600_000, CPUSysUs: 100_000})
					})
					f.g.Cgroup, f.g.CPUFromCgroup = cg, tt.fromCgroup
					res, err := execOn(t.Context(), f.g, req)
					if err != nil {
						t.Fatal(err)
					}
					if res.Status != sandbox.StatusSucceeded || res.CPUTime != tt.want {
						t.Errorf("got %s with CPU %s, want succeeded with %s", res.Status, res.CPUTime, tt.want)
					}
				})
			}
			// A pool's Exec (an exit notice, its code streamed to its
			// stdin) uses 300 ms of the cgroup's CPU time waiting for its
			// code (the interpreter's start and imports), then 500 ms
			// running it, for which the guest counts 900 ms: under
			// CPUFromCgroup the run's CPU time is the 500 ms counted from
			// the code's first write, without the wait; otherwise the
			// guest's count.
			for _, tt := range []struct {
				name       string
				fromCgroup bool
				want       time.Duration
			}{
				{"pooled CPU time from the guest", false, 900 * time.Millisecond},
				{"pooled CPU time from the cgroup", true, 500 * time.Millisecond},
			} {
				t.Run(tt.name, func(t *testing.T) {
					write(layout.cpu, layout.cpuText(started))
					write(layout.events, fmt.Sprintf(layout.oomText, 0))
					waiting := make(chan struct{})
					f := newFakeGuest(t, limits, func(fr frames, _ guest.ExecRequest) {
						write(layout.cpu, layout.cpuText(started+300*time.Millisecond))
						fr.started()
						close(waiting)
					})
					var once sync.Once
					f.onStdin = func(fr frames, _ []byte) {
						once.Do(func() {
							write(layout.cpu, layout.cpuText(started+800*time.Millisecond))
							fr.exit(guest.ExitReport{CPUUserUs: 800_000, CPUSysUs: 100_000})
						})
					}
					f.g.Cgroup, f.g.CPUFromCgroup = cg, tt.fromCgroup
					r := req
					r.ExitNotice, r.StdinStream = true, true
					ex, err := f.g.Start(t.Context(), r)
					if err != nil {
						t.Fatal(err)
					}
					<-waiting
					if _, err := ex.Stdin().Write([]byte("print(1)\n")); err != nil {
						t.Fatal(err)
					}
					res, err := ex.Wait(t.Context())
					if err != nil {
						t.Fatal(err)
					}
					if res.Status != sandbox.StatusSucceeded || res.CPUTime != tt.want {
						t.Errorf("got %s with CPU %s, want succeeded with %s", res.Status, res.CPUTime, tt.want)
					}
				})
			}
			// A restored pool's Exec is primed first (pool.py's warm-up,
			// 200 ms), then written its code (500 ms): under
			// CPUFromCgroup the run's CPU time is the code's 500 ms.
			t.Run("primed pooled CPU time from the cgroup", func(t *testing.T) {
				write(layout.cpu, layout.cpuText(started))
				write(layout.events, fmt.Sprintf(layout.oomText, 0))
				waiting := make(chan struct{})
				f := newFakeGuest(t, limits, func(fr frames, _ guest.ExecRequest) {
					fr.started()
					close(waiting)
				})
				var writes int
				warmed := make(chan struct{})
				f.onStdin = func(fr frames, _ []byte) {
					writes++
					switch writes {
					case 1:
						write(layout.cpu, layout.cpuText(started+200*time.Millisecond))
						close(warmed)
					case 2:
						write(layout.cpu, layout.cpuText(started+700*time.Millisecond))
						fr.exit(guest.ExitReport{CPUUserUs: 800_000})
					}
				}
				f.g.Cgroup, f.g.CPUFromCgroup = cg, true
				r := req
				r.ExitNotice, r.StdinStream = true, true
				ex, err := f.g.Start(t.Context(), r)
				if err != nil {
					t.Fatal(err)
				}
				<-waiting
				pr, ok := ex.Stdin().(interface{ Prime([]byte) error })
				if !ok {
					t.Fatalf("a pool Exec's stdin %T cannot be primed", ex.Stdin())
				}
				if err := pr.Prime([]byte("{\"warm\": true}\n")); err != nil {
					t.Fatal(err)
				}
				<-warmed
				if _, err := ex.Stdin().Write([]byte("print(1)\n")); err != nil {
					t.Fatal(err)
				}
				res, err := ex.Wait(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				if res.Status != sandbox.StatusSucceeded || res.CPUTime != 500*time.Millisecond {
					t.Errorf("got %s with CPU %s, want succeeded with 500ms (not the warm-up's 200ms)", res.Status, res.CPUTime)
				}
			})
			t.Run("OOM-killed sandbox", func(t *testing.T) {
				write(layout.events, fmt.Sprintf(layout.oomText, 0))
				f := newFakeGuest(t, limits, func(fr frames, _ guest.ExecRequest) {
					write(layout.events, fmt.Sprintf(layout.oomText, 1))
					fr.w.(*io.PipeWriter).Close()
				})
				f.g.Cgroup = cg
				res, err := execOn(t.Context(), f.g, req)
				if err != nil {
					t.Fatal(err)
				}
				if res.Status != sandbox.StatusOOMKilled || res.Signal != 9 {
					t.Errorf("got %s with signal %d, want oom_killed with 9", res.Status, res.Signal)
				}
			})
		})
	}
}

// execOn runs req on g to its end, as sandbox.Run does on a sandbox.
func execOn(ctx context.Context, g *Guest, req sandbox.ExecRequest) (*sandbox.Result, error) {
	ex, err := g.Start(ctx, req)
	if err != nil {
		return nil, err
	}
	return ex.Wait(context.WithoutCancel(ctx))
}

// startedReader closes started at its first Read, and blocks it until
// release is closed: the file operation reading it is in flight meanwhile.
type startedReader struct {
	started, release chan struct{}
	once             sync.Once
}

func (r *startedReader) Read([]byte) (int, error) {
	r.once.Do(func() { close(r.started) })
	<-r.release
	return 0, errors.New("the reader fails")
}

// TestFreezeRefusesAFileOperationInFlight checks that Freeze refuses a
// guest while a WriteFile is in flight, and freezes it once it returned.
func TestFreezeRefusesAFileOperationInFlight(t *testing.T) {
	f := newFakeGuest(t, sandbox.Limits{Timeout: time.Minute}, func(frames, guest.ExecRequest) {})
	r := &startedReader{started: make(chan struct{}), release: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = f.g.WriteFile(t.Context(), "/tmp/half", 0o644, r, 1<<20)
	}()
	<-r.started
	if _, _, err := f.g.Freeze(); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Freeze with a WriteFile in flight: got %v, want ErrFailedPrecondition", err)
		f.g.Thaw()
	}
	close(r.release)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("WriteFile did not return after its reader failed")
	}
	if _, _, err := f.g.Freeze(); err != nil {
		t.Errorf("Freeze once WriteFile returned: got %v, want nil", err)
	}
}

// TestRetuneWhileRunning checks that a Retune while an Exec runs may
// change the limits the host enforces and not those the Exec started with.
func TestRetuneWhileRunning(t *testing.T) {
	base := sandbox.Limits{Memory: 512 << 20, CPU: 1, Pids: 128, Timeout: time.Minute, OutputCap: 10}
	for _, tt := range []struct {
		name   string
		change func(*sandbox.Limits)
		ok     bool
	}{
		{"memory", func(l *sandbox.Limits) { l.Memory = 256 << 20 }, true},
		{"cpu and pids", func(l *sandbox.Limits) { l.CPU, l.Pids = 0.5, 64 }, true},
		{"timeout", func(l *sandbox.Limits) { l.Timeout = time.Second }, false},
		{"output cap", func(l *sandbox.Limits) { l.OutputCap = 5 }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeGuest(t, base, func(f frames, _ guest.ExecRequest) { f.started() })
			if _, err := f.g.Start(t.Context(), sandbox.ExecRequest{File: sandbox.File{Name: "a"}, Argv: []string{"/a"}}); err != nil {
				t.Fatal(err)
			}
			next := base
			tt.change(&next)
			applied := false
			err := f.g.Retune(next, func() error { applied = true; return nil })
			if tt.ok && (err != nil || !applied || f.g.limits() != next) {
				t.Errorf("got %v, applied %v, limits %+v; want %+v applied", err, applied, f.g.limits(), next)
			}
			if !tt.ok && (!errdefs.IsFailedPrecondition(err) || applied || f.g.limits() != base) {
				t.Errorf("got %v, applied %v, limits %+v; want ErrFailedPrecondition, nothing applied", err, applied, f.g.limits())
			}
		})
	}
}

// TestFreezeAPoolExecWaiting checks that Freeze saves a guest whose one
// Exec is a pool's interpreter still waiting for its program, and refuses
// any other Exec and a pool's once its program was written.
func TestFreezeAPoolExecWaiting(t *testing.T) {
	pool := sandbox.ExecRequest{File: sandbox.File{Name: "a"}, Argv: []string{"/a"}, StdinStream: true, ExitNotice: true}
	for _, tt := range []struct {
		name  string
		req   sandbox.ExecRequest
		write bool
		ok    bool
	}{
		{"pool exec waiting", pool, false, true},
		{"pool exec fed", pool, true, false},
		{"other exec", sandbox.ExecRequest{File: sandbox.File{Name: "a"}, Argv: []string{"/a"}, StdinStream: true}, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeGuest(t, sandbox.Limits{Timeout: time.Minute, OutputCap: 10}, func(f frames, _ guest.ExecRequest) { f.started() })
			ex, err := f.g.Start(t.Context(), tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if tt.write {
				if _, err := ex.Stdin().Write([]byte("x")); err != nil {
					t.Fatal(err)
				}
			}
			_, _, err = f.g.Freeze()
			if tt.ok && err != nil {
				t.Errorf("Freeze: got %v, want nil", err)
			}
			if !tt.ok && !errdefs.IsFailedPrecondition(err) {
				t.Errorf("Freeze: got %v, want ErrFailedPrecondition", err)
			}
			f.g.Thaw()
		})
	}
}
