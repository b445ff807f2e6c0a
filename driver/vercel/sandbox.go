package vercel

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// killGrace is how long a command may take to end after the driver
// killed it before the driver gives the sandbox up (stops it).
const killGrace = 10 * time.Second

// launcher is the script that starts every Exec's program, with the
// arguments STDIN PROGRAM N K=V (N of them) ARG...: its stdin from the
// file the driver wrote (removed once open), the program found by its
// base name on the sandbox's PATH when the image has it elsewhere than
// Stockade's runtime images (/usr/bin/python3), and exactly its
// environment (env -i), with no shell left between. The loops put the
// program between the environment and the arguments.
const launcher = `in=$1 p=$2 n=$3; shift 3; m=$(($# - n))
exec <"$in" || exit 127
case $in in /dev/null) ;; *) rm -f "$in" ;; esac
if [ ! -x "$p" ]; then q=$(command -v "${p##*/}") && p=$q; fi
i=0; while [ $i -lt $n ]; do set -- "$@" "$1"; shift; i=$((i+1)); done
set -- "$@" "$p"
i=0; while [ $i -lt $m ]; do set -- "$@" "$1"; shift; i=$((i+1)); done
exec /usr/bin/env -i -- "$@"`

// Sandbox is one Vercel sandbox: its name and the id of the session (the
// VM) that runs its commands.
type Sandbox struct {
	d       *Driver
	id      string
	name    string
	session string
	limits  sandbox.Limits

	mu        sync.Mutex
	running   bool
	dead      bool
	destroyed bool
	execs     map[*exec]struct{}
}

var _ sandbox.Sandbox = (*Sandbox)(nil)

func (s *Sandbox) ID() string { return s.id }

// Start writes the code file and the stdin, then runs the program as
// one command whose output streams back.
func (s *Sandbox) Start(ctx context.Context, req sandbox.ExecRequest) (sandbox.Exec, error) {
	if err := sandbox.CheckCommand("vercel", req); err != nil {
		return nil, err
	}
	s.mu.Lock()
	switch {
	case s.dead || s.destroyed:
		s.mu.Unlock()
		return nil, fmt.Errorf("vercel: sandbox %s has ended: %w", s.id, errdefs.ErrFailedPrecondition)
	case s.running:
		s.mu.Unlock()
		return nil, fmt.Errorf("vercel: sandbox %s runs an exec already: %w", s.id, errdefs.ErrConflict)
	}
	s.running = true
	s.mu.Unlock()
	ex, err := s.start(ctx, req)
	if err != nil {
		s.mu.Lock()
		s.running = false
		s.mu.Unlock()
		return nil, err
	}
	return ex, nil
}

func (s *Sandbox) start(ctx context.Context, req sandbox.ExecRequest) (*exec, error) {
	files := map[string]fileEntry{}
	filePath := ""
	if req.File.Name != "" {
		filePath = "/tmp/" + req.File.Name
		mode := req.File.Mode
		if mode == 0 {
			mode = 0o644
		}
		files[filePath] = fileEntry{data: req.File.Data, mode: int64(mode & 0o7777)}
	}
	stdin := "/dev/null"
	if req.Stdin != nil {
		var b [8]byte
		_, _ = rand.Read(b[:])
		stdin = "/tmp/.stockade-stdin-" + hex.EncodeToString(b[:])
		files[stdin] = fileEntry{data: req.Stdin, mode: 0o600}
	}
	if len(files) > 0 {
		if err := s.writeFiles(ctx, files); err != nil {
			return nil, err
		}
	}
	args := []string{"-c", launcher, "sh", stdin, strings.ReplaceAll(req.Argv[0], "{file}", filePath), strconv.Itoa(len(req.Env))}
	args = append(args, req.Env...)
	for _, a := range req.Argv[1:] {
		args = append(args, strings.ReplaceAll(a, "{file}", filePath))
	}
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = s.limits.Timeout
	}
	body, err := json.Marshal(commandRequest{
		Command: "/bin/sh", Args: args, Env: map[string]string{}, Wait: true, Logs: true,
		// The provider's own bound, behind the driver's.
		Timeout: (timeout + killGrace).Milliseconds(),
	})
	if err != nil {
		return nil, err
	}
	// The stream lives as long as the command, not as ctx: when ctx ends
	// the driver kills the command and reads on to its end. Until the
	// answer starts, though, nothing can be killed (the command's id is
	// in the answer): ctx and the Exec's timeout cut the request itself.
	streamCtx, cancelStream := context.WithCancel(context.WithoutCancel(ctx))
	hreq, err := s.d.request(streamCtx, http.MethodPost, "/v2/sandboxes/sessions/"+url.PathEscape(s.session)+"/cmd", nil, bytes.NewReader(body), "application/json")
	if err != nil {
		cancelStream()
		return nil, err
	}
	began := time.Now()
	deadline := began.Add(timeout)
	var cutMu sync.Mutex
	answered := false
	var cut error // why the request was cut before its answer started
	cutBy := func(why func() error) func() {
		return func() {
			cutMu.Lock()
			defer cutMu.Unlock()
			if !answered && cut == nil {
				cut = why()
				cancelStream()
			}
		}
	}
	stopCtx := context.AfterFunc(ctx, cutBy(func() error {
		return fmt.Errorf("vercel: running a command: no answer before the caller gave up: %w", context.Cause(ctx))
	}))
	timer := time.AfterFunc(timeout, cutBy(func() error {
		return fmt.Errorf("vercel: running a command: no answer within the Exec's timeout of %v: %w", timeout, errdefs.ErrUnavailable)
	}))
	resp, err := s.d.cfg.Client.Do(hreq)
	cutMu.Lock()
	answered = true
	why := cut
	cutMu.Unlock()
	stopCtx()
	timer.Stop()
	if why != nil {
		// The command may run in the sandbox without anyone to watch or
		// kill it: the sandbox serves no more Execs.
		if err == nil {
			resp.Body.Close()
		}
		cancelStream()
		s.markDead()
		return nil, why
	}
	if err != nil {
		cancelStream()
		return nil, fmt.Errorf("vercel: running a command: %v: %w", err, errdefs.ErrUnavailable)
	}
	if resp.StatusCode/100 != 2 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/x-ndjson") {
		b, _ := readBody(resp.Body)
		resp.Body.Close()
		cancelStream()
		if resp.StatusCode/100 == 2 {
			return nil, fmt.Errorf("vercel: running a command: an answer of type %q, want a stream of command data: %w", clip(resp.Header.Get("Content-Type")), errdefs.ErrUnavailable)
		}
		err := apiError("running a command", resp.StatusCode, b)
		if resp.StatusCode == http.StatusGone || resp.StatusCode == http.StatusNotFound {
			s.markDead()
		}
		return nil, err
	}
	ex := &exec{s: s, req: req, began: began, cap: s.limits.OutputCap, done: make(chan struct{}), started: make(chan struct{}), cancelStream: cancelStream}
	s.mu.Lock()
	if s.execs == nil {
		s.execs = map[*exec]struct{}{}
	}
	s.execs[ex] = struct{}{}
	s.mu.Unlock()
	go ex.read(resp.Body)
	go ex.watch(ctx, time.Until(deadline))
	return ex, nil
}

type fileEntry struct {
	data []byte
	mode int64
}

// writeFiles writes files (absolute paths) with the provider's file API:
// a gzipped tar extracted at /, as the SDK's writeFiles sends it.
func (s *Sandbox) writeFiles(ctx context.Context, files map[string]fileEntry) error {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for p, f := range files {
		hdr := &tar.Header{Name: strings.TrimPrefix(p, "/"), Mode: f.mode, Size: int64(len(f.data)), Typeflag: tar.TypeReg, ModTime: time.Now()}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	_, _, err := s.d.send(ctx, apiCall{what: "writing files", method: http.MethodPost,
		path: "/v2/sandboxes/sessions/" + url.PathEscape(s.session) + "/fs/write",
		body: buf.Bytes(), contentType: "application/gzip", header: map[string]string{"X-Cwd": "/"}})
	return err
}

// ReadFile reads at most limit bytes of the file at p (absolute) with the
// provider's file API. It is no sandbox.Files: the provider follows
// symbolic links (see Capabilities' Lacks). A file that is not there is
// ErrNotFound.
func (s *Sandbox) ReadFile(ctx context.Context, p string, limit int64) ([]byte, error) {
	if !path.IsAbs(p) || path.Clean(p) != p {
		return nil, errdefs.Publicf("vercel: path %q is not absolute and clean: %w", p, errdefs.ErrInvalidArgument)
	}
	body, err := json.Marshal(map[string]string{"path": p, "cwd": "/"})
	if err != nil {
		return nil, err
	}
	data, ct, err := s.d.send(ctx, apiCall{what: "reading " + p, method: http.MethodPost,
		path: "/v2/sandboxes/sessions/" + url.PathEscape(s.session) + "/fs/read",
		body: body, contentType: "application/json", max: max(limit, 1)})
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(ct, "application/octet-stream") {
		return nil, fmt.Errorf("vercel: reading %s: an answer of type %q: %w", p, clip(ct), errdefs.ErrUnavailable)
	}
	return data[:min(int64(len(data)), max(limit, 0))], nil
}

// Destroy stops the sandbox's session and deletes the sandbox; one the
// provider no longer knows is gone already. It bounds itself (see
// remove): ctx may have no deadline.
func (s *Sandbox) Destroy(ctx context.Context) error {
	s.mu.Lock()
	s.destroyed = true
	for ex := range s.execs {
		ex.cancelStream()
	}
	s.mu.Unlock()
	return s.remove(ctx)
}

// remove stops the session and deletes the sandbox, each call bounded
// by the call timeout (Config.CallTimeout) whatever ctx is: the engine
// destroys on a context without a deadline, and a kill gives a sandbox
// up on none.
func (s *Sandbox) remove(ctx context.Context) error {
	var errs []error
	if s.session != "" {
		if _, err := s.d.call(ctx, "stopping a sandbox", http.MethodPost, "/v2/sandboxes/sessions/"+url.PathEscape(s.session)+"/stop", nil, nil); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	if _, err := s.d.call(ctx, "deleting a sandbox", http.MethodDelete, "/v2/sandboxes/"+url.PathEscape(s.name), url.Values{"projectId": {s.d.cfg.ProjectID}}, nil); err != nil && !errdefs.IsNotFound(err) {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("vercel: sandbox %s is left: %w", s.id, errors.Join(errs...))
	}
	return nil
}

func (s *Sandbox) markDead() {
	s.mu.Lock()
	s.dead = true
	s.mu.Unlock()
}

// exec is one command.
type exec struct {
	s            *Sandbox
	req          sandbox.ExecRequest
	began        time.Time
	cap          int64
	cancelStream context.CancelFunc

	started chan struct{} // closed once the command's id is known (or the stream ended)
	done    chan struct{} // closed once res or err is set

	mu       sync.Mutex
	cmdID    string
	ending   sandbox.Status // the status the driver's kill gives, "" if none
	signaled int            // a signal the driver sent
	cutShort error          // the Start ctx's error, when it ended the program
	res      *sandbox.Result
	err      error
}

// read reads the command's stream to its end.
func (e *exec) read(body io.ReadCloser) {
	defer body.Close()
	res := &sandbox.Result{ExitCode: -1}
	var streamErr error
	exited := false
	lr := newLineReader(body)
	for !exited {
		line, err := lr.next()
		if err != nil {
			if err != io.EOF {
				streamErr = err
			}
			break
		}
		ev, err := decodeLine(line)
		if err != nil {
			streamErr = fmt.Errorf("vercel: command stream: %v", err)
			break
		}
		switch ev.kind {
		case kindStarted:
			e.setID(ev.cmdID)
		case kindStdout:
			e.output(res, sandbox.Stdout, ev.data)
		case kindStderr:
			e.output(res, sandbox.Stderr, ev.data)
		case kindError:
			streamErr = fmt.Errorf("vercel: command stream: %s: %s", ev.errCode, ev.errMsg)
			exited = true
		case kindExit:
			e.setID(ev.cmdID)
			res.ExitCode, exited = ev.exitCode, true
		}
	}
	e.finish(res, exited && streamErr == nil)
}

func (e *exec) output(res *sandbox.Result, st sandbox.Stream, p []byte) {
	out, trunc := &res.Stdout, &res.StdoutTruncated
	if st == sandbox.Stderr {
		out, trunc = &res.Stderr, &res.StderrTruncated
	}
	room := e.cap - int64(len(*out))
	if int64(len(p)) > room {
		p, *trunc = p[:max(room, 0)], true
	}
	if len(p) == 0 {
		return
	}
	*out = append(*out, p...)
	if e.req.OnOutput != nil {
		e.req.OnOutput(st, p)
	}
}

func (e *exec) setID(id string) {
	e.mu.Lock()
	first := e.cmdID == ""
	if first {
		e.cmdID = id
	}
	e.mu.Unlock()
	if first {
		close(e.started)
	}
}

// finish sets the result: the exit code the provider reported, or, when
// the stream ended without one, a program killed with its sandbox.
func (e *exec) finish(res *sandbox.Result, exited bool) {
	e.mu.Lock()
	res.Duration = time.Since(e.began)
	switch {
	case e.ending != "":
		res.Status, res.ExitCode, res.Signal = e.ending, -1, int(syscall.SIGKILL)
	case !exited:
		res.Status, res.ExitCode, res.Signal = sandbox.StatusKilled, -1, int(syscall.SIGKILL)
	case res.ExitCode == 0:
		res.Status = sandbox.StatusSucceeded
	case e.signaled != 0 && res.ExitCode == 128+e.signaled:
		res.Status, res.Signal, res.ExitCode = sandbox.StatusKilled, e.signaled, -1
	default:
		res.Status = sandbox.StatusFailed
	}
	if e.cutShort != nil {
		e.err = &sandbox.CutShortError{Result: res, Err: e.cutShort}
	}
	e.res = res
	e.mu.Unlock()
	if !exited {
		// A stream that ended without the command's end: the sandbox is
		// gone or unreachable, and serves no more Execs.
		e.s.markDead()
	}
	select {
	case <-e.started:
	default:
		close(e.started)
	}
	e.s.mu.Lock()
	e.s.running = false
	delete(e.s.execs, e)
	e.s.mu.Unlock()
	e.cancelStream()
	close(e.done)
}

// watch ends the program at its timeout or when ctx ends.
func (e *exec) watch(ctx context.Context, timeout time.Duration) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-e.done:
		return
	case <-t.C:
		e.end(sandbox.StatusTimedOut, nil)
	case <-ctx.Done():
		e.end(sandbox.StatusKilled, ctx.Err())
	}
}

// end kills the program with status; when it does not end within
// killGrace, the sandbox is stopped.
func (e *exec) end(status sandbox.Status, cause error) {
	e.mu.Lock()
	if e.res != nil || e.ending != "" {
		e.mu.Unlock()
		return
	}
	e.ending, e.cutShort = status, cause
	e.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), killGrace)
		defer cancel()
		_ = e.kill(ctx, syscall.SIGKILL)
		select {
		case <-e.done:
		case <-ctx.Done():
			// The provider did not end it: give the sandbox up.
			e.s.markDead()
			e.cancelStream()
			_ = e.s.remove(context.Background())
		}
	}()
}

// kill sends sig to the command, once its id is known.
func (e *exec) kill(ctx context.Context, sig syscall.Signal) error {
	select {
	case <-e.started:
	case <-ctx.Done():
		return ctx.Err()
	}
	e.mu.Lock()
	id := e.cmdID
	e.mu.Unlock()
	if id == "" {
		return nil
	}
	_, err := e.s.d.call(ctx, "signalling a command", http.MethodPost,
		"/v2/sandboxes/sessions/"+url.PathEscape(e.s.session)+"/cmd/"+url.PathEscape(id)+"/kill", nil, killRequest{Signal: int(sig)})
	select {
	case <-e.done:
		return nil // ended meanwhile: no error
	default:
	}
	return err
}

func (e *exec) Wait(ctx context.Context) (*sandbox.Result, error) {
	select {
	case <-e.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err != nil {
		return nil, e.err
	}
	return e.res, nil
}

func (e *exec) Signal(sig syscall.Signal) error {
	select {
	case <-e.done:
		return nil
	default:
	}
	e.mu.Lock()
	e.signaled = int(sig)
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return e.kill(ctx, sig)
}

func (e *exec) Cancel() error {
	e.end(sandbox.StatusKilled, nil)
	return nil
}

func (e *exec) Stdin() io.WriteCloser { return nil }
