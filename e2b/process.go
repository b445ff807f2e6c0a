package e2b

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
)

// proc is a process envd's process service started: a command cell.
type proc struct {
	pid     uint32
	execID  string
	tag     string
	config  processConfig
	sandbox string
	// cut ends the streams that follow it: its sandbox was killed or
	// paused.
	cut    chan struct{}
	cutOne sync.Once
}

// ErrSandboxGone is the cause of the context of a data-plane request
// whose sandbox was killed, paused or timed out while it was served:
// its handler ends, and a stream in flight is cut.
var ErrSandboxGone = errors.New("e2b: the sandbox was killed or paused")

// procTable numbers the command cells of each sandbox as envd's pids,
// and holds the cancels of the requests each sandbox serves.
type procTable struct {
	mu       sync.Mutex
	next     uint32
	byID     map[string]map[uint32]*proc // sandbox → pid → proc
	requests map[string]map[*context.CancelCauseFunc]struct{}
}

func newProcTable() *procTable {
	return &procTable{next: 1000, byID: map[string]map[uint32]*proc{}, requests: map[string]map[*context.CancelCauseFunc]struct{}{}}
}

// attach returns a context of ctx that ends (ErrSandboxGone) when
// sandbox is dropped, and what detaches it.
func (t *procTable) attach(ctx context.Context, sandbox string) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	t.mu.Lock()
	if t.requests[sandbox] == nil {
		t.requests[sandbox] = map[*context.CancelCauseFunc]struct{}{}
	}
	t.requests[sandbox][&cancel] = struct{}{}
	t.mu.Unlock()
	return ctx, func() {
		t.mu.Lock()
		delete(t.requests[sandbox], &cancel)
		if len(t.requests[sandbox]) == 0 {
			delete(t.requests, sandbox)
		}
		t.mu.Unlock()
		cancel(nil)
	}
}

func (t *procTable) add(p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	p.pid = t.next
	if t.byID[p.sandbox] == nil {
		t.byID[p.sandbox] = map[uint32]*proc{}
	}
	t.byID[p.sandbox][p.pid] = p
}

func (t *procTable) remove(p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.byID[p.sandbox], p.pid)
	if len(t.byID[p.sandbox]) == 0 {
		delete(t.byID, p.sandbox)
	}
}

// find returns sandbox's process that sel names (a pid or a tag).
func (t *procTable) find(sandbox string, sel processSelector) *proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.byID[sandbox] {
		if (sel.Pid != 0 && p.pid == sel.Pid) || (sel.Tag != "" && p.tag == sel.Tag) {
			return p
		}
	}
	return nil
}

func (t *procTable) list(sandbox string) []*proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*proc, 0, len(t.byID[sandbox]))
	for _, p := range t.byID[sandbox] {
		out = append(out, p)
	}
	return out
}

// dropSandbox cuts the streams of sandbox's processes and forgets them:
// it was killed or paused.
func (t *procTable) dropSandbox(sandbox string) {
	t.mu.Lock()
	ps := t.byID[sandbox]
	delete(t.byID, sandbox)
	reqs := t.requests[sandbox]
	delete(t.requests, sandbox)
	t.mu.Unlock()
	for _, p := range ps {
		p.cutOne.Do(func() { close(p.cut) })
	}
	for cancel := range reqs {
		(*cancel)(ErrSandboxGone)
	}
}

// processConfig is process.ProcessConfig.
type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
}

// processSelector is process.ProcessSelector: a pid or a tag.
type processSelector struct {
	Pid uint32 `json:"pid,omitempty"`
	Tag string `json:"tag,omitempty"`
}

// processRequest is the union of the process service's requests this
// server reads.
type processRequest struct {
	Process *json.RawMessage `json:"process"`
	Tag     string           `json:"tag"`
	Stdin   bool             `json:"stdin"`
	Input   struct {
		Stdin string `json:"stdin"`
		Pty   string `json:"pty"`
	} `json:"input"`
	Signal string `json:"signal"`
	// Pty asks for a terminal, which this server does not give.
	Pty *json.RawMessage `json:"pty"`
}

// maxKeepalive bounds the interval of keepalive events.
const maxKeepalive = 50 * time.Second

// process serves process.Process.
func (s *Server) process(w http.ResponseWriter, r *http.Request) {
	t := target(r)
	method := r.PathValue("method")
	streaming := method == "Start" || method == "Connect"
	switch method {
	case "Start", "Connect", "List", "SendInput", "SendSignal", "CloseStdin":
	default:
		writeUnary(w, nil, &rpcError{Code: "unimplemented", Message: "process.Process/" + method + " is not served"})
		return
	}
	var req processRequest
	if err := rpcRequest(r, streaming, &req); err != nil {
		if streaming {
			openStream(w).end(err)
			return
		}
		writeUnary(w, nil, err)
		return
	}
	switch method {
	case "Start":
		s.start(w, r, t, req)
	case "Connect":
		sel, err := selectorOf(req.Process)
		if err != nil {
			openStream(w).end(err)
			return
		}
		p := s.procs.find(t.SandboxID, sel)
		if p == nil {
			openStream(w).end(&rpcError{Code: "not_found", Message: "no process " + describe(sel)})
			return
		}
		s.follow(w, r, t, p, nil)
	case "List":
		out := []map[string]any{}
		for _, p := range s.procs.list(t.SandboxID) {
			e := map[string]any{"pid": p.pid, "config": p.config}
			if p.tag != "" {
				e["tag"] = p.tag
			}
			out = append(out, e)
		}
		writeUnary(w, map[string]any{"processes": out}, nil)
	case "SendInput", "CloseStdin":
		p, err := s.selected(t, req.Process)
		if err != nil {
			writeUnary(w, nil, err)
			return
		}
		var data []byte
		if method == "SendInput" {
			in := req.Input.Stdin
			if in == "" {
				in = req.Input.Pty
			}
			if data, err = base64.StdEncoding.DecodeString(in); err != nil {
				writeUnary(w, nil, &rpcError{Code: "invalid_argument", Message: "input is not base64"})
				return
			}
		}
		writeUnary(w, struct{}{}, s.svc.CommandInput(r.Context(), t.Principal, t.SessionID, p.execID, data, method == "CloseStdin"))
	case "SendSignal":
		p, err := s.selected(t, req.Process)
		if err != nil {
			writeUnary(w, nil, err)
			return
		}
		sig := syscall.SIGKILL
		switch req.Signal {
		case "SIGNAL_SIGTERM", "15":
			sig = syscall.SIGTERM
		case "SIGNAL_SIGKILL", "9":
		default:
			writeUnary(w, nil, &rpcError{Code: "invalid_argument", Message: "signal " + quote(req.Signal) + " is not SIGNAL_SIGTERM or SIGNAL_SIGKILL"})
			return
		}
		writeUnary(w, struct{}{}, s.svc.CommandSignal(r.Context(), t.Principal, t.SessionID, p.execID, sig))
	}
}

func selectorOf(raw *json.RawMessage) (processSelector, error) {
	var sel processSelector
	if raw == nil {
		return sel, &rpcError{Code: "invalid_argument", Message: "a process selector (pid or tag) is required"}
	}
	if err := json.Unmarshal(*raw, &sel); err != nil || (sel.Pid == 0 && sel.Tag == "") {
		return sel, &rpcError{Code: "invalid_argument", Message: "a process selector needs a pid or a tag"}
	}
	return sel, nil
}

func describe(sel processSelector) string {
	if sel.Tag != "" {
		return "tagged " + quote(sel.Tag)
	}
	return "with pid " + strconv.FormatUint(uint64(sel.Pid), 10)
}

func (s *Server) selected(t Target, raw *json.RawMessage) (*proc, error) {
	sel, err := selectorOf(raw)
	if err != nil {
		return nil, err
	}
	p := s.procs.find(t.SandboxID, sel)
	if p == nil {
		return nil, &rpcError{Code: "not_found", Message: "no process " + describe(sel)}
	}
	return p, nil
}

// basicUser is the user of a request's HTTP Basic auth (envd's user to
// run as), empty when none.
func basicUser(r *http.Request) string {
	u, _, ok := r.BasicAuth()
	if !ok {
		return ""
	}
	return u
}

// start serves Start: a command cell, streamed as envd streams a process
// (start with its pid, data as base64, end with its exit), with
// keepalives while it waits for an approval or prints nothing.
func (s *Server) start(w http.ResponseWriter, r *http.Request, t Target, req processRequest) {
	if req.Pty != nil {
		openStream(w).end(&rpcError{Code: "unimplemented", Message: "a pseudo-terminal (pty) is not served: run commands without one"})
		return
	}
	var cfg processConfig
	if req.Process != nil {
		if err := json.Unmarshal(*req.Process, &cfg); err != nil {
			openStream(w).end(&rpcError{Code: "invalid_argument", Message: "process is not a ProcessConfig"})
			return
		}
	}
	timeout, err := connectTimeout(r)
	if err != nil {
		openStream(w).end(err)
		return
	}
	if cfg.Cmd == "" {
		openStream(w).end(&rpcError{Code: "invalid_argument", Message: "process.cmd is required"})
		return
	}
	argv := append([]string{cfg.Cmd}, cfg.Args...)
	if !strings.HasPrefix(cfg.Cmd, "/") {
		argv = append([]string{"/usr/bin/env", "--"}, argv...)
	}
	cwd := ""
	if cfg.Cwd != "" {
		inner, _, err := sandboxPath(cfg.Cwd)
		switch {
		case err == nil:
			cwd = inner
		case strings.HasPrefix(cfg.Cwd, "/") && !strings.ContainsRune(cfg.Cwd, 0):
			cwd = cfg.Cwd // a directory outside the writable tree is readable
		default:
			openStream(w).end(err)
			return
		}
	}
	env := map[string]string{"HOME": workspaceDir, "USER": "user"}
	for k, v := range t.Envs {
		env[k] = v
	}
	for k, v := range cfg.Envs {
		env[k] = v
	}
	user := basicUser(r)
	execID := capability.NewExecutionID()
	events, unsubscribe := s.svc.Subscribe(execID)
	defer unsubscribe()
	inv, err := s.svc.ExecCommand(r.Context(), t.Principal, t.SessionID, capability.CommandRequest{Argv: argv, Env: env, Cwd: cwd, User: user,
		Stdin: req.Stdin, TimeoutMS: timeout.Milliseconds(), TimeoutUpTo: true}, capability.InvokeOptions{ExecutionID: execID})
	if err != nil {
		if errdefs.IsConflict(err) {
			// One cell at a time per session: a command or code cell
			// still runs (a background command until it ends).
			err = &rpcError{Code: "aborted", Message: messageOf(err) + "; wait for it or kill it, then run this one"}
		}
		openStream(w).end(err)
		return
	}
	if inv.Execution.Status == model.StatusDenied {
		openStream(w).end(&rpcError{Code: "permission_denied", Message: "the workspace policy denied the command (execution " + execID + ")"})
		return
	}
	p := &proc{execID: execID, tag: req.Tag, config: cfg, sandbox: t.SandboxID, cut: make(chan struct{})}
	s.procs.add(p)
	defer s.procs.remove(p)
	s.follow(w, r, t, p, events)
}

// follow streams process p: its start, its output as it comes, its end.
// events is the subscription Start made before admitting it; nil (a
// Connect) subscribes now. The client's going away, or its
// Connect-Timeout-Ms passing, ends the process of a Start.
func (s *Server) follow(w http.ResponseWriter, r *http.Request, t Target, p *proc, events <-chan capability.StreamEvent) {
	owner := events != nil
	if !owner {
		var unsubscribe func()
		events, unsubscribe = s.svc.Subscribe(p.execID)
		defer unsubscribe()
	}
	ctx := r.Context()
	if d, err := connectTimeout(r); err == nil && d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	interval := 30 * time.Second
	if v, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval")); err == nil && v > 0 {
		interval = min(time.Duration(v)*time.Second, maxKeepalive)
	}
	st := openStream(w)
	if err := st.send(map[string]any{"event": map[string]any{"start": map[string]any{"pid": p.pid}}}); err != nil {
		s.stop(t, p, owner, "the client went away")
		return
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				s.finish(st, t, p)
				return
			}
			if ev.Type != "stdout" && ev.Type != "stderr" {
				continue
			}
			var d struct {
				Data string `json:"data"`
			}
			if json.Unmarshal(ev.Data, &d) != nil {
				continue
			}
			if err := st.send(map[string]any{"event": map[string]any{"data": map[string]string{ev.Type: base64.StdEncoding.EncodeToString([]byte(d.Data))}}}); err != nil {
				s.stop(t, p, owner, "the client went away")
				return
			}
		case <-tick.C:
			if ex, err := s.svc.Wait(context.WithoutCancel(ctx), t.Principal, p.execID, 0); err == nil && ex.Status.Terminal() {
				s.finish(st, t, p)
				return
			}
			if err := st.send(map[string]any{"event": map[string]any{"keepalive": map[string]any{}}}); err != nil {
				s.stop(t, p, owner, "the client went away")
				return
			}
		case <-p.cut:
			st.end(&rpcError{Code: "unavailable", Message: "the sandbox was killed or paused"})
			return
		case <-ctx.Done():
			if context.Cause(ctx) == ErrSandboxGone {
				st.end(&rpcError{Code: "unavailable", Message: "the sandbox was killed or paused"})
				return
			}
			if errors.Is(ctx.Err(), context.DeadlineExceeded) && r.Context().Err() == nil {
				msg := "the process ran past the request's timeout and was ended"
				if ex, err := s.svc.Wait(context.WithoutCancel(ctx), t.Principal, p.execID, 0); err == nil && ex.Status == model.StatusAwaitingApproval {
					msg = "the command still awaits approval " + ex.ApprovalID + " (execution " + ex.ID + "): it was cancelled, uncharged; " +
						"have it approved (POST /v1/approvals/" + ex.ApprovalID + "/approve) while a command waits, or pass a longer timeoutMs"
				}
				s.stop(t, p, true, "its Connect-Timeout-Ms passed")
				st.end(&rpcError{Code: "deadline_exceeded", Message: msg})
				return
			}
			s.stop(t, p, owner, "the client went away")
			return
		}
	}
}

// stop ends p's command cell when the stream that started it ends
// (owner); a Connect's stream ending leaves it running.
func (s *Server) stop(t Target, p *proc, owner bool, why string) {
	if !owner {
		return
	}
	if _, err := s.svc.Cancel(context.Background(), t.Principal, p.execID, "e2b: "+why); err != nil && !errdefs.IsNotFound(err) && !errdefs.IsFailedPrecondition(err) && !errdefs.IsConflict(err) {
		s.log.Warn("e2b: ending a command", "execution", p.execID, "err", err)
	}
}

// finish sends p's end: its exit code and status, as envd's EndEvent, or
// the error that kept it from running (denied, not approved in time,
// not started).
func (s *Server) finish(st *stream, t Target, p *proc) {
	ex, err := s.svc.Wait(context.Background(), t.Principal, p.execID, 5*time.Second)
	if err != nil {
		st.end(err)
		return
	}
	switch ex.Status {
	case model.StatusDenied:
		st.end(&rpcError{Code: "permission_denied", Message: "the command was denied (execution " + ex.ID + ")"})
		return
	case model.StatusApprovalExpired:
		st.end(&rpcError{Code: "permission_denied", Message: "the command's approval expired (execution " + ex.ID + ")"})
		return
	case model.StatusLaunchFailed:
		st.end(&rpcError{Code: "unavailable", Message: "the command could not start (execution " + ex.ID + ")"})
		return
	case model.StatusCancelled:
		st.end(&rpcError{Code: "canceled", Message: "the command was cancelled (execution " + ex.ID + ")"})
		return
	}
	var doc capability.CommandResultDoc
	_ = json.Unmarshal(ex.Result, &doc)
	if doc.EndedBy == engine.EndedBySessionEnd || doc.EndedBy == engine.EndedByShutdown {
		st.end(&rpcError{Code: "unavailable", Message: "the sandbox ended while the command ran (execution " + ex.ID + ")"})
		return
	}
	end := map[string]any{"exited": doc.ExitCode >= 0, "exitCode": doc.ExitCode, "status": "exit status " + strconv.Itoa(doc.ExitCode)}
	if doc.ExitCode > 0 {
		// CommandExitError's message, as envd says it.
		end["error"] = "exit status " + strconv.Itoa(doc.ExitCode)
	}
	switch {
	case ex.Status == model.StatusTimedOut:
		end["exitCode"], end["exited"], end["status"] = -1, false, "signal: killed"
		end["error"] = "the command ran past its timeout"
	case doc.Signal != 0 || doc.ExitCode < 0:
		end["exitCode"], end["exited"], end["status"] = -1, false, "signal: "+strconv.Itoa(doc.Signal)
		end["error"] = "the command was ended by signal " + strconv.Itoa(doc.Signal)
	}
	if err := st.send(map[string]any{"event": map[string]any{"end": end}}); err == nil {
		st.end(nil)
	}
}
