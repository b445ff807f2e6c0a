package fake

import (
	"context"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stockade-sh/stockade/driver/modal/internal/pb"
	"github.com/stockade-sh/stockade/sandbox"
)

// machinePath is the container's PATH a command of the router gets.
const machinePath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// mexec is one command of a task.
type mexec struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced when output, stdin or the end changes
	out     [2][]byte
	written uint64
	stdin   io.WriteCloser
	ex      sandbox.Exec
	ended   bool
	code    int32
	signal  int32
}

func (e *mexec) notify() {
	close(e.changed)
	e.changed = make(chan struct{})
}

func (e *mexec) output(st sandbox.Stream, p []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	i := 0
	if st == sandbox.Stderr {
		i = 1
	}
	e.out[i] = append(e.out[i], p...)
	e.notify()
}

func (e *mexec) end(res *sandbox.Result, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ended {
		return
	}
	e.ended = true
	switch {
	case err != nil || res == nil:
		e.signal = 9
	case res.Signal != 0:
		e.signal = int32(res.Signal)
	default:
		e.code = int32(res.ExitCode)
	}
	e.notify()
}

// gone ends a command whose sandbox was terminated.
func (e *mexec) gone() { e.end(nil, nil) }

// routerSrv is the task command router's service.
type routerSrv struct {
	pb.UnimplementedTaskCommandRouterServer
	s *Server
}

// task checks a router call's token (the JWT of TaskGetCommandRouterAccess,
// as a bearer token) and returns its task.
func (r *routerSrv) task(ctx context.Context, method, id string) (*msandbox, error) {
	r.s.mu.Lock()
	r.s.calls = append(r.s.calls, method)
	v := r.s.tasks[id]
	r.s.mu.Unlock()
	if v == nil {
		return nil, status.Error(codes.NotFound, "no such task")
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if a := md.Get("authorization"); len(a) != 1 || a[0] != "Bearer "+v.jwt {
		return nil, status.Error(codes.Unauthenticated, "invalid token")
	}
	return v, nil
}

func (r *routerSrv) exec(ctx context.Context, method, task, id string) (*msandbox, *mexec, error) {
	v, err := r.task(ctx, method, task)
	if err != nil {
		return nil, nil, err
	}
	v.mu.Lock()
	e := v.execs[id]
	v.mu.Unlock()
	if e == nil {
		return nil, nil, status.Error(codes.NotFound, "no such exec")
	}
	return v, e, nil
}

func (r *routerSrv) TaskExecStart(ctx context.Context, req *pb.TaskExecStartRequest) (*pb.TaskExecStartResponse, error) {
	v, err := r.task(ctx, "TaskExecStart", req.GetTaskId())
	if err != nil {
		return nil, err
	}
	args := req.GetCommandArgs()
	if req.GetExecId() == "" || len(args) == 0 {
		return nil, status.Error(codes.InvalidArgument, "want an exec id and a command")
	}
	e := &mexec{changed: make(chan struct{})}
	v.mu.Lock()
	switch {
	case v.terminated:
		v.mu.Unlock()
		return nil, status.Error(codes.FailedPrecondition, "the sandbox has terminated")
	case v.execs[req.GetExecId()] != nil:
		v.mu.Unlock()
		return nil, status.Error(codes.AlreadyExists, "exec id in use")
	}
	v.execs[req.GetExecId()] = e
	m := v.machine
	v.mu.Unlock()
	// The machine's guest takes a code file with every Exec: an empty
	// one, which the service has no counterpart of. It runs one Exec at a
	// time; the service runs more.
	mreq := sandbox.ExecRequest{File: sandbox.File{Name: ".fake-command"}, Argv: args, Env: []string{machinePath}, StdinStream: true}
	if req.GetStdoutConfig() == pb.TaskExecStdoutConfig_TASK_EXEC_STDOUT_CONFIG_PIPE || req.GetStderrConfig() == pb.TaskExecStderrConfig_TASK_EXEC_STDERR_CONFIG_PIPE {
		mreq.OnOutput = func(st sandbox.Stream, p []byte) {
			if (st == sandbox.Stdout && req.GetStdoutConfig() == pb.TaskExecStdoutConfig_TASK_EXEC_STDOUT_CONFIG_PIPE) ||
				(st == sandbox.Stderr && req.GetStderrConfig() == pb.TaskExecStderrConfig_TASK_EXEC_STDERR_CONFIG_PIPE) {
				e.output(st, p)
			}
		}
	}
	if req.TimeoutSecs != nil {
		mreq.Timeout = time.Duration(req.GetTimeoutSecs()) * time.Second
	}
	ex, err := m.Start(context.Background(), mreq)
	if err != nil {
		e.end(nil, err)
		return nil, status.Error(codes.Internal, err.Error())
	}
	e.mu.Lock()
	e.ex, e.stdin = ex, ex.Stdin()
	e.mu.Unlock()
	go func() { e.end(ex.Wait(context.Background())) }()
	return &pb.TaskExecStartResponse{}, nil
}

func (r *routerSrv) TaskExecStdinWrite(ctx context.Context, req *pb.TaskExecStdinWriteRequest) (*pb.TaskExecStdinWriteResponse, error) {
	_, e, err := r.exec(ctx, "TaskExecStdinWrite", req.GetTaskId(), req.GetExecId())
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if req.GetOffset() != e.written {
		return nil, status.Errorf(codes.InvalidArgument, "offset %d, want %d", req.GetOffset(), e.written)
	}
	if e.stdin == nil {
		return nil, status.Error(codes.FailedPrecondition, "stdin closed")
	}
	if len(req.GetData()) > 0 {
		if _, err := e.stdin.Write(req.GetData()); err != nil {
			return nil, status.Error(codes.FailedPrecondition, err.Error())
		}
		e.written += uint64(len(req.GetData()))
	}
	if req.GetEof() {
		_ = e.stdin.Close()
		e.stdin = nil
	}
	return &pb.TaskExecStdinWriteResponse{}, nil
}

func (r *routerSrv) TaskExecStdioRead(req *pb.TaskExecStdioReadRequest, st grpc.ServerStreamingServer[pb.TaskExecStdioReadResponse]) error {
	_, e, err := r.exec(st.Context(), "TaskExecStdioRead", req.GetTaskId(), req.GetExecId())
	if err != nil {
		return err
	}
	fd := 0
	if req.GetFileDescriptor() == pb.TaskExecStdioFileDescriptor_TASK_EXEC_STDIO_FILE_DESCRIPTOR_STDERR {
		fd = 1
	}
	off := req.GetOffset()
	for {
		e.mu.Lock()
		out, ended, changed := e.out[fd], e.ended, e.changed
		e.mu.Unlock()
		if off > uint64(len(out)) {
			return status.Error(codes.OutOfRange, "offset beyond the output")
		}
		if off < uint64(len(out)) {
			chunk := out[off:min(uint64(len(out)), off+64<<10)]
			if err := st.Send(&pb.TaskExecStdioReadResponse{Data: chunk}); err != nil {
				return err
			}
			off += uint64(len(chunk))
			continue
		}
		if ended {
			return nil
		}
		select {
		case <-changed:
		case <-st.Context().Done():
			return st.Context().Err()
		}
	}
}

func (r *routerSrv) TaskExecWait(ctx context.Context, req *pb.TaskExecWaitRequest) (*pb.TaskExecWaitResponse, error) {
	_, e, err := r.exec(ctx, "TaskExecWait", req.GetTaskId(), req.GetExecId())
	if err != nil {
		return nil, err
	}
	for {
		e.mu.Lock()
		ended, code, sig, changed := e.ended, e.code, e.signal, e.changed
		e.mu.Unlock()
		if ended {
			if sig != 0 {
				return &pb.TaskExecWaitResponse{ExitStatus: &pb.TaskExecWaitResponse_Signal{Signal: sig}}, nil
			}
			return &pb.TaskExecWaitResponse{ExitStatus: &pb.TaskExecWaitResponse_Code{Code: code}}, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
}
