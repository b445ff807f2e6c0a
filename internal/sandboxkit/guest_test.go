package sandboxkit

import (
	"bufio"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/guest"
	"github.com/stockade-sh/stockade/sandbox"
)

// fakeGuest is the guest's end of a Guest on in-memory pipes: it answers
// each FrameExec by running answer on the frames it sends back. Kill ends
// its stream, as killing a sandbox's PID 1 does. It is for unit tests of
// the session; the drivers' conformance suites run the real guest.
type fakeGuest struct {
	g      *Guest
	out    *io.PipeWriter // guest -> host
	killed chan struct{}
	once   sync.Once
}

func newFakeGuest(t *testing.T, limits sandbox.Limits, answer func(w io.Writer, req guest.ExecRequest)) *fakeGuest {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	f := &fakeGuest{out: outW, killed: make(chan struct{})}
	f.g = &Guest{Sandbox: "sbx-test", Limits: limits, In: inW, Frames: bufio.NewReader(outR), Kill: f.kill}
	go func() {
		for {
			typ, p, err := guest.ReadFrame(inR, 0)
			if err != nil {
				return
			}
			var req guest.ExecRequest
			if typ != guest.FrameExec || guest.DecodeJSON(p, &req) != nil {
				outW.CloseWithError(errors.New("bad request"))
				return
			}
			answer(outW, req)
		}
	}()
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

func exit(w io.Writer, r guest.ExitReport) { _ = guest.WriteJSON(w, guest.FrameExit, r) }

func TestGuestExec(t *testing.T) {
	limits := sandbox.Limits{Memory: 64 << 20, Timeout: time.Minute, OutputCap: 4}
	req := sandbox.ExecRequest{File: sandbox.File{Name: "main.sh"}, Argv: []string{"/bin/sh", "{file}"}}
	tests := []struct {
		name       string
		req        sandbox.ExecRequest
		answer     func(w io.Writer, req guest.ExecRequest)
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
			answer: func(w io.Writer, _ guest.ExecRequest) {
				_ = guest.WriteFrame(w, guest.FrameStdout, []byte("hi\n"))
				exit(w, guest.ExitReport{MaxRSSBytes: 1 << 20})
			},
			wantStatus: sandbox.StatusSucceeded, wantStdout: "hi\n",
		},
		{
			name:       "failed",
			req:        req,
			answer:     func(w io.Writer, _ guest.ExecRequest) { exit(w, guest.ExitReport{ExitCode: 3}) },
			wantStatus: sandbox.StatusFailed, wantExit: 3,
		},
		{
			name:       "killed by a signal",
			req:        req,
			answer:     func(w io.Writer, _ guest.ExecRequest) { exit(w, guest.ExitReport{ExitCode: -1, Signal: 9}) },
			wantStatus: sandbox.StatusKilled, wantExit: -1,
		},
		{
			name: "output over the cap",
			req:  req,
			answer: func(w io.Writer, _ guest.ExecRequest) {
				_ = guest.WriteFrame(w, guest.FrameStdout, []byte("hello"))
				exit(w, guest.ExitReport{})
			},
			wantStatus: sandbox.StatusSucceeded, wantStdout: "hell", wantTrunc: true,
		},
		{
			name: "program not started",
			req:  req,
			answer: func(w io.Writer, _ guest.ExecRequest) {
				_ = guest.WriteJSON(w, guest.FrameError, guest.ErrorReport{Message: "exec format error\nno such file"})
			},
			wantErr: errdefs.IsFailedPrecondition,
		},
		{
			name:       "guest died",
			req:        req,
			answer:     func(w io.Writer, _ guest.ExecRequest) { w.(*io.PipeWriter).Close() },
			wantStatus: sandbox.StatusKilled, wantExit: -1, wantGone: true,
		},
		{
			name: "guest broke the protocol",
			req:  req,
			answer: func(w io.Writer, _ guest.ExecRequest) {
				exit(w, guest.ExitReport{ExitCode: 300})
			},
			wantStatus: sandbox.StatusKilled, wantExit: -1, wantGone: true,
		},
		{
			name: "timed out",
			req: sandbox.ExecRequest{
				File: req.File, Argv: req.Argv, Timeout: 50 * time.Millisecond,
			},
			answer: func(w io.Writer, _ guest.ExecRequest) {
				_ = guest.WriteFrame(w, guest.FrameStdout, []byte("so"))
			},
			wantStatus: sandbox.StatusTimedOut, wantExit: -1, wantStdout: "so", wantGone: true,
		},
		{
			name:    "file name with a slash",
			req:     sandbox.ExecRequest{File: sandbox.File{Name: "a/b"}, Argv: req.Argv},
			answer:  func(io.Writer, guest.ExecRequest) {},
			wantErr: errdefs.IsInvalidArgument,
		},
		{
			name:    "relative argv[0]",
			req:     sandbox.ExecRequest{File: req.File, Argv: []string{"sh"}},
			answer:  func(io.Writer, guest.ExecRequest) {},
			wantErr: errdefs.IsInvalidArgument,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeGuest(t, limits, tt.answer)
			res, err := f.g.Exec(t.Context(), tt.req)
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
			_, err = f.g.Exec(t.Context(), req)
			if gone := errdefs.IsFailedPrecondition(err); gone != tt.wantGone {
				t.Errorf("next Exec: got %v, want gone %v", err, tt.wantGone)
			}
		})
	}
}

func TestGuestExecRequest(t *testing.T) {
	got := make(chan guest.ExecRequest, 1)
	f := newFakeGuest(t, sandbox.Limits{Timeout: time.Minute, OutputCap: 10}, func(w io.Writer, req guest.ExecRequest) {
		got <- req
		exit(w, guest.ExitReport{})
	})
	if _, err := f.g.Exec(t.Context(), sandbox.ExecRequest{File: sandbox.File{Name: "x.py", Data: []byte("1")}, Argv: []string{"/usr/bin/python3", "{file}"}}); err != nil {
		t.Fatalf("Exec: %v", err)
	}
	r := <-got
	if r.File.Path != "/tmp/x.py" || r.File.Mode != 0o644 || r.OutputCap != 11 {
		t.Errorf("got file %s mode %o output cap %d, want /tmp/x.py 644 11", r.File.Path, r.File.Mode, r.OutputCap)
	}
}

func TestGuestExecCancelled(t *testing.T) {
	f := newFakeGuest(t, sandbox.Limits{Timeout: time.Minute}, func(io.Writer, guest.ExecRequest) {})
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := f.g.Exec(ctx, sandbox.ExecRequest{File: sandbox.File{Name: "a"}, Argv: []string{"/a"}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want the context's deadline", err)
	}
	if _, err := f.g.Exec(t.Context(), sandbox.ExecRequest{File: sandbox.File{Name: "a"}, Argv: []string{"/a"}}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("next Exec: got %v, want ErrFailedPrecondition", err)
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
		wantErr bool
	}{
		{"ready", func(w io.Writer) { _ = guest.WriteJSON(w, guest.FrameReady, guest.Ready{Version: guest.Version}) }, false},
		{"other version", func(w io.Writer) { _ = guest.WriteJSON(w, guest.FrameReady, guest.Ready{Version: guest.Version + 1}) }, true},
		{"other frame", func(w io.Writer) { _ = guest.WriteFrame(w, guest.FrameStdout, []byte("x")) }, true},
		{"stream ends", func(w io.Writer) { w.(*io.PipeWriter).Close() }, true},
		{"silence", func(io.Writer) {}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, w := io.Pipe()
			defer w.Close()
			go tt.send(w)
			g := &Guest{Frames: r}
			if err := g.AwaitReady(t.Context(), 100*time.Millisecond); (err != nil) != tt.wantErr {
				t.Errorf("got %v, want error %v", err, tt.wantErr)
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
