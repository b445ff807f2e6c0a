package fake

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path"
	"time"

	"github.com/stockade-sh/stockade/sandbox"
)

// runCommand starts a command in v's machine: with wait, the answer is
// the command's NDJSON stream (the command, its logs, the command with
// its exit code); without, the command alone.
func (s *Server) runCommand(w http.ResponseWriter, r *http.Request, v *vsandbox) {
	var in struct {
		Command string            `json:"command"`
		Args    []string          `json:"args"`
		Cwd     string            `json:"cwd"`
		Env     map[string]string `json:"env"`
		Sudo    bool              `json:"sudo"`
		Wait    bool              `json:"wait"`
		Logs    bool              `json:"logs"`
		Timeout int64             `json:"timeout"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 4<<20)).Decode(&in); err != nil || in.Command == "" {
		apiErr(w, http.StatusBadRequest, "bad body")
		return
	}
	argv := append([]string{in.Command}, in.Args...)
	if !path.IsAbs(in.Command) {
		// The provider finds a command on its PATH.
		argv = append([]string{"/bin/sh", "-c", `exec "$0" "$@"`}, argv...)
	}
	// The machine gives the program exactly env; a command found on the
	// PATH gets one.
	var env []string
	if !path.IsAbs(in.Command) {
		env = append(env, "PATH=/usr/local/bin:/usr/bin:/bin")
	}
	for k, val := range in.Env {
		env = append(env, k+"="+val)
	}
	v.mu.Lock()
	switch {
	case v.stopped:
		v.mu.Unlock()
		apiErr(w, http.StatusGone, "sandbox stopped")
		return
	case v.busy:
		// The machine runs one Exec at a time; the provider runs more.
		v.mu.Unlock()
		apiErr(w, http.StatusConflict, "the fake runs one command at a time")
		return
	}
	v.busy = true
	c := &command{id: fmt.Sprintf("cmd_%d", len(v.commands)+1), name: in.Command, args: in.Args, started: time.Now().UnixMilli(), changed: make(chan struct{})}
	v.commands[c.id] = c
	m := v.machine
	v.mu.Unlock()
	// The machine's guest takes a code file with every Exec: an empty
	// one, which the provider has no counterpart of.
	req := sandbox.ExecRequest{File: sandbox.File{Name: ".fake-command"}, Argv: argv, Env: env, OnOutput: c.output}
	if in.Timeout > 0 {
		req.Timeout = time.Duration(in.Timeout) * time.Millisecond
	}
	ex, err := m.Start(context.Background(), req)
	if err != nil {
		v.mu.Lock()
		v.busy = false
		v.mu.Unlock()
		apiErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	c.mu.Lock()
	c.ex = ex
	c.mu.Unlock()
	go func() {
		res, err := ex.Wait(context.Background())
		code := 128 + 9
		if err == nil {
			code = res.ExitCode
			if res.Signal != 0 {
				code = 128 + res.Signal
			}
		}
		v.mu.Lock()
		v.busy = false
		v.mu.Unlock()
		c.mu.Lock()
		c.exit = &code
		c.changedLocked()
		c.mu.Unlock()
	}()
	if !in.Wait {
		writeJSON(w, map[string]any{"command": c.json(v)})
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	_ = enc.Encode(map[string]any{"command": c.jsonAt(v, nil)})
	c.stream(r.Context(), w, func() {
		c.mu.Lock()
		exit := c.exit
		c.mu.Unlock()
		_ = enc.Encode(map[string]any{"command": c.jsonAt(v, exit)})
	})
}

func (c *command) output(st sandbox.Stream, p []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.logs = append(c.logs, logLine{Stream: st.String(), Data: string(p)})
	c.changedLocked()
}

func (c *command) changedLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// stream writes the command's log lines as they come, to its end, then
// calls end.
func (c *command) stream(ctx context.Context, w http.ResponseWriter, end func()) {
	enc := json.NewEncoder(w)
	fl, _ := w.(http.Flusher)
	sent := 0
	for {
		c.mu.Lock()
		logs, exit, changed := c.logs[sent:], c.exit, c.changed
		sent = len(c.logs)
		c.mu.Unlock()
		for _, l := range logs {
			_ = enc.Encode(l)
		}
		if fl != nil {
			fl.Flush()
		}
		if exit != nil {
			if end != nil {
				end()
			}
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

func (c *command) wait(ctx context.Context) {
	for {
		c.mu.Lock()
		exit, changed := c.exit, c.changed
		c.mu.Unlock()
		if exit != nil {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

func (c *command) json(v *vsandbox) map[string]any {
	c.mu.Lock()
	exit := c.exit
	c.mu.Unlock()
	return c.jsonAt(v, exit)
}

func (c *command) jsonAt(v *vsandbox, exit *int) map[string]any {
	m := map[string]any{"id": c.id, "name": c.name, "args": c.args, "cwd": "/vercel/sandbox", "sessionId": v.session, "exitCode": nil, "startedAt": c.started}
	if c.args == nil {
		m["args"] = []string{}
	}
	if exit != nil {
		m["exitCode"] = *exit
		m["durationMs"] = time.Now().UnixMilli() - c.started
	}
	return m
}
