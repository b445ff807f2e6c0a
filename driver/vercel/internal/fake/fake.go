// Package fake is a fake of the Vercel Sandbox REST API, for the vercel
// driver's tests: the endpoints, requests and answers as the official SDK
// (@vercel/sandbox 3.5.0) sends and reads them (driver/vercel's
// sdk_test.go runs the SDK itself against it), each "microVM" a sandbox
// of another driver (runc in the tests). It is no model of the service's
// isolation, limits or network: only of its API.
//
// It records every request's shape (Shapes), so that a test can compare
// what the driver sends with what the SDK sends.
package fake

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/sandbox"
)

// Config configures a fake.
type Config struct {
	// Token and TeamID are the credentials the fake accepts.
	Token, TeamID string
	// Machines creates the sandbox behind each Vercel sandbox.
	Machines sandbox.Driver
	// Image returns the image of a Vercel runtime ("node24",
	// "python3.13"); an error refuses the runtime.
	Image func(runtime string) (sandbox.Image, error)
}

// Shape is what the fake saw of one request: its method, its route (the
// path with its ids as {name}, {session}, {cmd}), the keys of its query
// and of its JSON body, and its content type.
type Shape struct {
	Method, Route, ContentType string
	Query, Body                []string
}

func (s Shape) String() string {
	return fmt.Sprintf("%s %s query%v body%v %s", s.Method, s.Route, s.Query, s.Body, s.ContentType)
}

// Server is the fake API, an http.Handler.
type Server struct {
	cfg Config

	mu        sync.Mutex
	seq       int
	sandboxes map[string]*vsandbox // by name
	sessions  map[string]*vsandbox // by session id
	shapes    []Shape
}

// New returns a fake.
func New(cfg Config) *Server {
	return &Server{cfg: cfg, sandboxes: map[string]*vsandbox{}, sessions: map[string]*vsandbox{}}
}

// Shapes returns the shapes of the requests seen so far.
func (s *Server) Shapes() []Shape {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.shapes)
}

// Running returns the names of the sandboxes that run.
func (s *Server) Running() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var names []string
	for n, v := range s.sandboxes {
		if v.status() == "running" {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// Policy returns the network policy sandbox name was created with, as
// the request sent it; nil for no sandbox.
func (s *Server) Policy(name string) json.RawMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.sandboxes[name]; v != nil {
		return v.policy
	}
	return nil
}

// Close destroys every sandbox still there.
func (s *Server) Close() {
	s.mu.Lock()
	all := make([]*vsandbox, 0, len(s.sandboxes))
	for _, v := range s.sandboxes {
		all = append(all, v)
	}
	s.mu.Unlock()
	for _, v := range all {
		v.stop()
	}
}

// vsandbox is one Vercel sandbox and its one session.
type vsandbox struct {
	name, session, runtime string
	vcpus                  int
	timeout                int64
	tags                   map[string]string
	policy                 json.RawMessage
	created                int64

	mu       sync.Mutex
	stopped  bool
	machine  sandbox.Sandbox
	commands map[string]*command
	busy     bool
}

func (v *vsandbox) status() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.stopped {
		return "stopped"
	}
	return "running"
}

func (v *vsandbox) stop() {
	v.mu.Lock()
	m := v.machine
	v.stopped, v.machine = true, nil
	v.mu.Unlock()
	if m != nil {
		_ = m.Destroy(context.Background())
	}
}

// command is one command and its log.
type command struct {
	id, name string
	args     []string
	started  int64

	mu      sync.Mutex
	logs    []logLine
	exit    *int
	changed chan struct{} // closed and replaced on every change
	ex      sandbox.Exec
}

type logLine struct {
	Stream string `json:"stream"`
	Data   string `json:"data"`
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	route, ids := routeOf(r.URL.Path)
	s.record(r, route)
	if r.Header.Get("Authorization") != "Bearer "+s.cfg.Token {
		apiErr(w, http.StatusUnauthorized, "not authenticated")
		return
	}
	if r.URL.Query().Get("teamId") != s.cfg.TeamID {
		apiErr(w, http.StatusForbidden, "not a member of the team")
		return
	}
	key := r.Method + " " + route
	switch key {
	case "POST /v2/sandboxes":
		s.create(w, r)
		return
	case "GET /v2/sandboxes":
		s.list(w, r)
		return
	}
	if strings.HasPrefix(route, "/v2/sandboxes/{name}") {
		v := s.byName(ids["name"])
		if v == nil {
			apiErr(w, http.StatusNotFound, "sandbox not found")
			return
		}
		switch r.Method {
		case http.MethodGet:
			writeJSON(w, map[string]any{"sandbox": sandboxJSON(v), "session": sessionJSON(v), "routes": []any{}})
		case http.MethodDelete:
			v.stop()
			s.mu.Lock()
			delete(s.sandboxes, v.name)
			delete(s.sessions, v.session)
			s.mu.Unlock()
			writeJSON(w, map[string]any{"sandbox": sandboxJSON(v)})
		default:
			apiErr(w, http.StatusMethodNotAllowed, "method not allowed")
		}
		return
	}
	v := s.bySession(ids["session"])
	if v == nil {
		apiErr(w, http.StatusNotFound, "session not found")
		return
	}
	switch key {
	case "POST /v2/sandboxes/sessions/{session}/stop":
		v.stop()
		writeJSON(w, map[string]any{"session": sessionJSON(v), "sandbox": sandboxJSON(v)})
	case "POST /v2/sandboxes/sessions/{session}/cmd":
		s.runCommand(w, r, v)
	case "GET /v2/sandboxes/sessions/{session}/cmd/{cmd}":
		c := v.command(ids["cmd"])
		if c == nil {
			apiErr(w, http.StatusNotFound, "command not found")
			return
		}
		if r.URL.Query().Get("wait") == "true" {
			c.wait(r.Context())
		}
		writeJSON(w, map[string]any{"command": c.json(v)})
	case "GET /v2/sandboxes/sessions/{session}/cmd/{cmd}/logs":
		c := v.command(ids["cmd"])
		if c == nil {
			apiErr(w, http.StatusNotFound, "command not found")
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		c.stream(r.Context(), w, nil)
	case "POST /v2/sandboxes/sessions/{session}/cmd/{cmd}/kill":
		c := v.command(ids["cmd"])
		var in struct {
			Signal *int `json:"signal"`
		}
		if c == nil {
			apiErr(w, http.StatusNotFound, "command not found")
			return
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<10)).Decode(&in); err != nil || in.Signal == nil || *in.Signal < 1 || *in.Signal > 64 {
			apiErr(w, http.StatusBadRequest, "signal must be a number")
			return
		}
		if c.ex != nil {
			_ = c.ex.Signal(syscall.Signal(*in.Signal))
		}
		writeJSON(w, map[string]any{"command": c.json(v)})
	case "POST /v2/sandboxes/sessions/{session}/fs/write":
		s.writeFiles(w, r, v)
	case "POST /v2/sandboxes/sessions/{session}/fs/read":
		s.readFile(w, r, v)
	case "POST /v2/sandboxes/sessions/{session}/fs/mkdir":
		var in struct{ Path, Cwd string }
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&in); err != nil {
			apiErr(w, http.StatusBadRequest, "bad body")
			return
		}
		files, ok := v.files()
		if !ok {
			apiErr(w, http.StatusGone, "sandbox stopped")
			return
		}
		if err := files.Mkdir(r.Context(), resolve(in.Cwd, in.Path), 0o755); err != nil {
			apiErr(w, http.StatusBadRequest, err.Error())
			return
		}
		writeJSON(w, map[string]any{})
	default:
		apiErr(w, http.StatusNotFound, "no such route: "+key)
	}
}

// routeOf names the route of p and the ids in it.
func routeOf(p string) (string, map[string]string) {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	ids := map[string]string{}
	if len(parts) < 2 || parts[0] != "v2" || parts[1] != "sandboxes" {
		return p, ids
	}
	if len(parts) >= 4 && parts[2] == "sessions" {
		ids["session"] = parts[3]
		parts[3] = "{session}"
		if len(parts) >= 6 && parts[4] == "cmd" {
			ids["cmd"] = parts[5]
			parts[5] = "{cmd}"
		}
	} else if len(parts) >= 3 && parts[2] != "sessions" && parts[2] != "snapshots" && parts[2] != "drives" {
		ids["name"] = parts[2]
		parts[2] = "{name}"
	}
	return "/" + strings.Join(parts, "/"), ids
}

func (s *Server) record(r *http.Request, route string) {
	sh := Shape{Method: r.Method, Route: route, ContentType: r.Header.Get("Content-Type")}
	for k := range r.URL.Query() {
		sh.Query = append(sh.Query, k)
	}
	slices.Sort(sh.Query)
	if strings.HasPrefix(sh.ContentType, "application/json") && r.Body != nil {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 8<<20))
		var m map[string]json.RawMessage
		if json.Unmarshal(b, &m) == nil {
			for k, v := range m {
				if string(v) != "null" {
					sh.Body = append(sh.Body, k)
				}
			}
			slices.Sort(sh.Body)
		}
		r.Body = io.NopCloser(strings.NewReader(string(b)))
	}
	s.mu.Lock()
	s.shapes = append(s.shapes, sh)
	s.mu.Unlock()
}

func (s *Server) byName(n string) *vsandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sandboxes[n]
}

func (s *Server) bySession(id string) *vsandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[id]
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var in struct {
		ProjectID string `json:"projectId"`
		Name      string `json:"name"`
		Timeout   *int64 `json:"timeout"`
		Resources *struct {
			VCPUs int `json:"vcpus"`
		} `json:"resources"`
		Runtime       string            `json:"runtime"`
		NetworkPolicy json.RawMessage   `json:"networkPolicy"`
		Tags          map[string]string `json:"tags"`
	}
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	if err := dec.Decode(&in); err != nil {
		apiErr(w, http.StatusBadRequest, "bad body: "+err.Error())
		return
	}
	if in.ProjectID == "" {
		apiErr(w, http.StatusBadRequest, "projectId is required")
		return
	}
	if err := checkPolicy(in.NetworkPolicy); err != nil {
		apiErr(w, http.StatusBadRequest, err.Error())
		return
	}
	img, err := s.cfg.Image(in.Runtime)
	if err != nil {
		apiErr(w, http.StatusBadRequest, err.Error())
		return
	}
	v := &vsandbox{name: in.Name, runtime: in.Runtime, vcpus: 2, timeout: 300_000, tags: in.Tags, policy: in.NetworkPolicy, created: time.Now().UnixMilli(), commands: map[string]*command{}}
	if in.Resources != nil && in.Resources.VCPUs > 0 {
		v.vcpus = in.Resources.VCPUs
	}
	if in.Timeout != nil {
		v.timeout = *in.Timeout
	}
	s.mu.Lock()
	s.seq++
	v.session = fmt.Sprintf("sbx_fake%06d", s.seq)
	if v.name == "" {
		v.name = "sandbox-" + strconv.Itoa(s.seq)
	}
	_, taken := s.sandboxes[v.name]
	s.mu.Unlock()
	if taken {
		apiErr(w, http.StatusConflict, "a sandbox of that name exists")
		return
	}
	// The machine's limits are the provider's business: generous ones,
	// so that the driver's own bounds are what a test sees.
	m, err := s.cfg.Machines.Create(r.Context(), sandbox.Spec{Image: img, Limits: sandbox.Limits{CPU: 1, OutputCap: 16 << 20, Timeout: time.Duration(v.timeout) * time.Millisecond}, Labels: map[string]string{"vercel-fake": v.name}})
	if err != nil {
		apiErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	v.machine = m
	s.mu.Lock()
	s.sandboxes[v.name], s.sessions[v.session] = v, v
	s.mu.Unlock()
	writeJSON(w, map[string]any{"sandbox": sandboxJSON(v), "session": sessionJSON(v), "routes": []any{}})
}

// checkPolicy accepts a network policy the SDK's validator would: a mode
// of allow-all or deny-all, or an allow list and subnets.
func checkPolicy(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var p struct {
		Mode    *string          `json:"mode"`
		Allow   json.RawMessage  `json:"allow"`
		Subnets *json.RawMessage `json:"subnets"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return fmt.Errorf("networkPolicy: %v", err)
	}
	if p.Mode != nil && *p.Mode != "allow-all" && *p.Mode != "deny-all" {
		return fmt.Errorf("networkPolicy: unknown mode %q", *p.Mode)
	}
	if len(p.Allow) > 0 {
		var list []string
		var byDomain map[string][]json.RawMessage
		if json.Unmarshal(p.Allow, &list) != nil && json.Unmarshal(p.Allow, &byDomain) != nil {
			return errors.New("networkPolicy: allow is no list of domains")
		}
	}
	return nil
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	prefix := r.URL.Query().Get("namePrefix")
	s.mu.Lock()
	var all []map[string]any
	for _, v := range s.sandboxes {
		if strings.HasPrefix(v.name, prefix) {
			all = append(all, sandboxJSON(v))
		}
	}
	s.mu.Unlock()
	if all == nil {
		all = []map[string]any{}
	}
	writeJSON(w, map[string]any{"sandboxes": all, "pagination": map[string]any{"count": len(all), "next": nil}})
}

func sandboxJSON(v *vsandbox) map[string]any {
	m := map[string]any{"name": v.name, "persistent": false, "region": "iad1", "vcpus": v.vcpus, "memory": v.vcpus * 2048,
		"runtime": v.runtime, "timeout": v.timeout, "createdAt": v.created, "updatedAt": v.created,
		"currentSessionId": v.session, "status": v.status(), "cwd": "/vercel/sandbox"}
	if v.tags != nil {
		m["tags"] = v.tags
	}
	if len(v.policy) > 0 {
		m["networkPolicy"] = v.policy
	}
	return m
}

func sessionJSON(v *vsandbox) map[string]any {
	return map[string]any{"id": v.session, "memory": v.vcpus * 2048, "vcpus": v.vcpus, "region": "iad1", "runtime": v.runtime,
		"timeout": v.timeout, "status": v.status(), "requestedAt": v.created, "startedAt": v.created, "createdAt": v.created,
		"updatedAt": v.created, "cwd": "/vercel/sandbox"}
}

func (v *vsandbox) files() (sandbox.Files, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	f, ok := v.machine.(sandbox.Files)
	return f, ok && !v.stopped
}

func (v *vsandbox) command(id string) *command {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.commands[id]
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// apiErr answers the API's error body, which the SDK reads.
func apiErr(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": http.StatusText(status), "message": msg}})
}

func resolve(cwd, p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	if cwd == "" {
		cwd = "/vercel/sandbox"
	}
	return path.Join(cwd, p)
}

func (s *Server) writeFiles(w http.ResponseWriter, r *http.Request, v *vsandbox) {
	if r.Header.Get("Content-Type") != "application/gzip" {
		apiErr(w, http.StatusBadRequest, "want application/gzip")
		return
	}
	files, ok := v.files()
	if !ok {
		apiErr(w, http.StatusGone, "sandbox stopped")
		return
	}
	zr, err := gzip.NewReader(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		apiErr(w, http.StatusBadRequest, err.Error())
		return
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			apiErr(w, http.StatusBadRequest, err.Error())
			return
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		p := resolve(r.Header.Get("X-Cwd"), h.Name)
		if _, err := files.WriteFile(r.Context(), p, 0o7777&h.FileInfo().Mode().Perm(), tr, 16<<20); err != nil {
			apiErr(w, http.StatusBadRequest, fmt.Sprintf("writing %s: %v", p, err))
			return
		}
	}
	writeJSON(w, map[string]any{})
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request, v *vsandbox) {
	var in struct{ Path, Cwd string }
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&in); err != nil {
		apiErr(w, http.StatusBadRequest, "bad body")
		return
	}
	files, ok := v.files()
	if !ok {
		apiErr(w, http.StatusGone, "sandbox stopped")
		return
	}
	data, _, err := files.ReadFile(r.Context(), resolve(in.Cwd, in.Path), 16<<20)
	if err != nil {
		apiErr(w, http.StatusNotFound, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = w.Write(data)
}
