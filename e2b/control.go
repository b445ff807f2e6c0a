package e2b

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

// maxBody bounds a control-plane request's body.
const maxBody = 1 << 20

// defaultTimeout is an E2B sandbox's timeout when the request names none
// (the SDKs' DEFAULT_SANDBOX_TIMEOUT_MS).
const defaultTimeout = 300 * time.Second

// newSandbox is the body of POST /sandboxes and /v2/sandboxes: the
// fields this server reads (others, such as mcp or volumeMounts, are
// ignored).
type newSandbox struct {
	TemplateID string            `json:"templateID"`
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
	// Timeout is in seconds.
	Timeout             *int64 `json:"timeout"`
	AllowInternetAccess *bool  `json:"allow_internet_access"`
	AutoPause           *bool  `json:"autoPause"`
}

// sandboxAnswer is E2B's Sandbox: the answer of a create or connect.
type sandboxAnswer struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken string  `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// listedSandbox is E2B's ListedSandbox, and with the token its
// SandboxDetail.
type listedSandbox struct {
	TemplateID          string            `json:"templateID"`
	SandboxID           string            `json:"sandboxID"`
	Alias               string            `json:"alias,omitempty"`
	ClientID            string            `json:"clientID"`
	StartedAt           time.Time         `json:"startedAt"`
	EndAt               time.Time         `json:"endAt"`
	CPUCount            int               `json:"cpuCount"`
	MemoryMB            int               `json:"memoryMB"`
	DiskSizeMB          int               `json:"diskSizeMB"`
	Metadata            map[string]string `json:"metadata"`
	State               string            `json:"state"`
	EnvdVersion         string            `json:"envdVersion"`
	EnvdAccessToken     string            `json:"envdAccessToken,omitempty"`
	AllowInternetAccess *bool             `json:"allowInternetAccess,omitempty"`
	Domain              *string           `json:"domain"`
}

// clientID is the clientID of every answer: E2B's names the node that
// runs the sandbox; here there is one.
const clientID = "stockade"

func (s *Server) routeControl() {
	m := s.ctl
	m.HandleFunc("POST /sandboxes", s.authed(func(w http.ResponseWriter, r *http.Request, p capability.Principal) { s.create(w, r, p, false) }))
	m.HandleFunc("POST /v2/sandboxes", s.authed(func(w http.ResponseWriter, r *http.Request, p capability.Principal) { s.create(w, r, p, true) }))
	m.HandleFunc("GET /sandboxes", s.authed(s.listV1))
	m.HandleFunc("GET /v2/sandboxes", s.authed(s.listV2))
	m.HandleFunc("GET /sandboxes/{id}", s.authed(s.get))
	m.HandleFunc("DELETE /sandboxes/{id}", s.authed(s.kill))
	m.HandleFunc("POST /sandboxes/{id}/timeout", s.authed(s.setTimeout))
	m.HandleFunc("POST /sandboxes/{id}/refreshes", s.authed(s.refresh))
	m.HandleFunc("POST /sandboxes/{id}/pause", s.authed(s.pause))
	m.HandleFunc("POST /sandboxes/{id}/resume", s.authed(s.connect))
	m.HandleFunc("POST /sandboxes/{id}/connect", s.authed(s.connect))
	m.HandleFunc("POST /v2/sandboxes/{id}/connect", s.authed(s.connect))
	m.HandleFunc("POST /sandboxes/{id}/snapshots", s.authed(s.createSnapshot))
	m.HandleFunc("GET /snapshots", s.authed(s.listSnapshots))
	m.HandleFunc("DELETE /templates/{id}", s.authed(s.deleteSnapshot))
	m.HandleFunc("POST /sandboxes/{id}/fork", s.authed(s.fork))
	m.HandleFunc("PUT /sandboxes/{id}/network", s.authed(s.updateNetwork))
	m.HandleFunc("GET /sandboxes/{id}/metrics", s.authed(s.metrics))
	m.HandleFunc("GET /sandboxes/metrics", s.authed(s.allMetrics))
	m.HandleFunc("GET /sandboxes/{id}/logs", s.authed(s.logs))
	m.HandleFunc("GET /v2/sandboxes/{id}/logs", s.authed(s.logs))
	// The SDKs' downloadUrl() and uploadUrl() name no sandbox: their
	// signature does (signed.go).
	m.HandleFunc("GET /files", s.signedFiles)
	m.HandleFunc("POST /files", s.signedFiles)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "this server has no "+r.Method+" "+quote(r.URL.Path))
	})
}

// authed authenticates the X-API-Key (a Stockade agent key) of a
// control-plane request: none or a bad one is 401.
func (s *Server) authed(h func(http.ResponseWriter, *http.Request, capability.Principal)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-Key")
		if key == "" {
			if a, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
				key = a
			}
		}
		if key == "" {
			writeError(w, http.StatusUnauthorized, "an API key (X-API-Key) is required")
			return
		}
		p, err := s.svc.Authenticate(r.Context(), key)
		if err != nil {
			if statusOf(err) >= 500 {
				s.fail(w, r, err)
				return
			}
			writeError(w, http.StatusUnauthorized, "invalid API key")
			return
		}
		h(w, r, p)
	}
}

// decode reads a JSON body of at most maxBody into v; an empty body
// leaves v as it is.
func decode(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return errdefs.Publicf("reading the request: %w", errdefs.ErrInvalidArgument)
	}
	if len(b) > maxBody {
		return errdefs.Publicf("a request body of more than %d bytes: %w", maxBody, errdefs.ErrTooLarge)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return errdefs.Publicf("the request is not valid JSON: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// runtimeOf maps a template name that names no tool onto a runtime and
// tool: base and the code interpreter's templates are the python runtime
// on the default tool; node and shell their runtimes; any other name a
// tool of that name, in python.
func runtimeOf(template string) (runtime, tool string) {
	switch template {
	case "", "base", "code-interpreter-v1", "code-interpreter", "code-interpreter-beta", "python":
		return "python", ""
	case "node", "shell":
		return template, ""
	}
	return "python", template
}

// placement is where a sandbox of template runs for p: a snapshot's id
// (E2B's Sandbox.create(snapshotId)) starts a session from it; a tool
// named so, or bound to a template named so, runs it (in its template's
// base runtime); any other name is runtimeOf's.
func (s *Server) placement(ctx context.Context, p capability.Principal, template string) (capability.CreateSessionRequest, error) {
	if strings.HasPrefix(template, "snp_") {
		return capability.CreateSessionRequest{Snapshot: template}, nil
	}
	ts, err := s.svc.Tools(ctx, p)
	if err != nil {
		return capability.CreateSessionRequest{}, err
	}
	for _, byTemplate := range []bool{false, true} {
		for _, t := range ts {
			if (!byTemplate && t.Tool.Name != template) || (byTemplate && (t.Tool.Template == "" || t.Tool.Template != template)) {
				continue
			}
			rt := "python"
			if d, ok := t.Tool.TemplateDeclaration(); ok && d.Base != "" {
				rt = d.Base
			} else if len(t.Tool.Runtimes) > 0 && !slices.Contains(t.Tool.Runtimes, rt) {
				rt = t.Tool.Runtimes[0]
			}
			return capability.CreateSessionRequest{Runtime: rt, Tool: t.Tool.Name}, nil
		}
	}
	rt, tool := runtimeOf(template)
	return capability.CreateSessionRequest{Runtime: rt, Tool: tool}, nil
}

// secondsOf is a timeout in seconds as a duration, refusing what is out
// of range.
func secondsOf(n int64, ceiling time.Duration) (time.Duration, error) {
	if n < 0 || n > int64(ceiling/time.Second) {
		return 0, errdefs.Publicf("timeout %d s is out of range: 0 to %d: %w", n, int64(ceiling/time.Second), errdefs.ErrInvalidArgument)
	}
	return time.Duration(n) * time.Second, nil
}

// create creates a sandbox: a session. v2 says the request came to
// /v2/sandboxes, whose SDKs (2.51 on) send allow_internet_access only
// when the program asks for it; the SDKs of /sandboxes send true
// always, which therefore says nothing and is not read.
func (s *Server) create(w http.ResponseWriter, r *http.Request, p capability.Principal, v2 bool) {
	var req newSandbox
	if err := decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	timeout := defaultTimeout
	if req.Timeout != nil {
		d, err := secondsOf(*req.Timeout, s.o.TTL)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		timeout = d
	}
	template := req.TemplateID
	if template == "" {
		template = "base"
	}
	req0, err := s.placement(r.Context(), p, template)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// E2B's sandboxes reach the internet unless asked not to; here a
	// sandbox has a network only when it asks (allow_internet_access:
	// true on /v2), and the policy and the tool's egress record decide:
	// a refusal is the session's, in E2B's error shape.
	network := "deny"
	if v2 && req.AllowInternetAccess != nil && *req.AllowInternetAccess {
		network = "allow"
	}
	req0.Network, req0.TTLMS, req0.IdleTimeoutMS = network, s.o.TTL.Milliseconds(), s.o.IdleTimeout.Milliseconds()
	if req0.Snapshot != "" {
		// A snapshot's sessions have no network: asked for, it is refused
		// by the service; "deny" is the default a snapshot start takes.
		if network == "deny" {
			req0.Network = ""
		}
	}
	created, err := s.svc.CreateSession(r.Context(), p, req0, capability.CreateSessionOptions{})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	onTimeout := "kill"
	if req.AutoPause != nil && *req.AutoPause {
		onTimeout = "pause"
	}
	rec, err := s.record(r.Context(), p, created.Session, store.E2BSandbox{Template: template, Metadata: req.Metadata, Envs: req.EnvVars, OnTimeout: onTimeout}, timeout)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.answer(rec))
}

// record records session ss as a sandbox of p like tmpl (its template,
// metadata, envs and what its timeout does) ending after timeout; when
// that fails it closes the session.
func (s *Server) record(ctx context.Context, p capability.Principal, ss model.Session, tmpl store.E2BSandbox, timeout time.Duration) (store.E2BSandbox, error) {
	rec := store.E2BSandbox{SessionID: ss.ID, WorkspaceID: p.WorkspaceID, KeyID: p.KeyID, Role: string(p.Role), Template: tmpl.Template,
		Metadata: tmpl.Metadata, Envs: tmpl.Envs, OnTimeout: tmpl.OnTimeout, EndAt: minTime(s.o.Now().Add(timeout), ss.ExpiresAt), CreatedAt: ss.CreatedAt}
	if err := s.st.PutE2BSandbox(ctx, rec); err != nil {
		if _, cerr := s.svc.CloseSession(context.WithoutCancel(ctx), p, ss.ID); cerr != nil {
			s.log.Error("e2b: closing a session whose sandbox was not recorded", "session", ss.ID, "err", cerr)
		}
		return rec, err
	}
	return rec, nil
}

func minTime(a, b time.Time) time.Time {
	if b.IsZero() || a.Before(b) {
		return a
	}
	return b
}

func (s *Server) answer(rec store.E2BSandbox) sandboxAnswer {
	return sandboxAnswer{TemplateID: rec.Template, SandboxID: rec.SessionID, ClientID: clientID, EnvdVersion: EnvdVersion,
		EnvdAccessToken: s.accessToken(rec.SessionID), TrafficAccessToken: s.trafficToken(rec.SessionID)}
}

// sandbox returns sandbox id of p's workspace and its session: another
// workspace's, or one this server did not create, is ErrNotFound.
func (s *Server) sandbox(ctx context.Context, p capability.Principal, id string) (store.E2BSandbox, model.Session, error) {
	rec, err := s.st.GetE2BSandbox(ctx, id)
	if err == nil && rec.WorkspaceID != p.WorkspaceID {
		err = errdefs.Publicf("sandbox %q not found: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return rec, model.Session{}, err
	}
	ss, err := s.svc.GetSession(ctx, p, id)
	return rec, ss, err
}

// live is sandbox as sandbox(), refusing an ended one (ErrNotFound).
func (s *Server) live(ctx context.Context, p capability.Principal, id string) (store.E2BSandbox, model.Session, error) {
	rec, ss, err := s.sandbox(ctx, p, id)
	if err == nil && ss.State == model.SessionEnded {
		err = errdefs.Publicf("sandbox %q not found: it ended (%s): %w", id, ss.EndReason, errdefs.ErrNotFound)
	}
	return rec, ss, err
}

func stateOf(ss model.Session) string {
	if ss.State == model.SessionPaused {
		return "paused"
	}
	return "running"
}

func (s *Server) listed(rec store.E2BSandbox, ss model.Session, token bool) listedSandbox {
	out := listedSandbox{TemplateID: rec.Template, SandboxID: rec.SessionID, ClientID: clientID, StartedAt: ss.CreatedAt, EndAt: rec.EndAt,
		CPUCount: 1, MemoryMB: 512, Metadata: rec.Metadata, State: stateOf(ss), EnvdVersion: EnvdVersion, AllowInternetAccess: new(ss.Network)}
	if out.Metadata == nil {
		out.Metadata = map[string]string{}
	}
	if token {
		out.EnvdAccessToken = s.accessToken(rec.SessionID)
	}
	return out
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	rec, ss, err := s.live(r.Context(), p, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.listed(rec, ss, true))
}

// listFilter is what a list asks for: metadata pairs all of which must
// match, and the states (running, paused) to list.
type listFilter struct {
	metadata map[string]string
	states   map[string]bool
	limit    int
}

// parseList reads a list's query: metadata is itself a query string
// (k=v&k2=v2, each part escaped), state repeated or comma-separated.
func parseList(q url.Values, defStates ...string) (listFilter, error) {
	f := listFilter{metadata: map[string]string{}, states: map[string]bool{}, limit: 1000}
	if m := q.Get("metadata"); m != "" {
		vs, err := url.ParseQuery(m)
		if err != nil {
			return f, errdefs.Publicf("metadata %q is not a query string: %w", m, errdefs.ErrInvalidArgument)
		}
		for k := range vs {
			f.metadata[k] = vs.Get(k)
		}
	}
	for _, v := range q["state"] {
		for st := range strings.SplitSeq(v, ",") {
			switch st {
			case "running", "paused":
				f.states[st] = true
			case "":
			default:
				return f, errdefs.Publicf("state %q is not running or paused: %w", st, errdefs.ErrInvalidArgument)
			}
		}
	}
	if len(f.states) == 0 {
		for _, st := range defStates {
			f.states[st] = true
		}
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			return f, errdefs.Publicf("limit %q is not 1 to 1000: %w", l, errdefs.ErrInvalidArgument)
		}
		f.limit = n
	}
	return f, nil
}

func (s *Server) listV1(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	s.list(w, r, p, "running")
}

func (s *Server) listV2(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	s.list(w, r, p, "running", "paused")
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, p capability.Principal, defStates ...string) {
	f, err := parseList(r.URL.Query(), defStates...)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	recs, err := s.st.ListE2BSandboxes(r.Context(), p.WorkspaceID, 1000)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := []listedSandbox{}
	for _, rec := range recs {
		if len(out) == f.limit {
			break
		}
		if !matches(rec.Metadata, f.metadata) {
			continue
		}
		ss, err := s.svc.GetSession(r.Context(), p, rec.SessionID)
		if err != nil || ss.State == model.SessionEnded || !f.states[stateOf(ss)] {
			continue
		}
		out = append(out, s.listed(rec, ss, false))
	}
	writeJSON(w, http.StatusOK, out)
}

func matches(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	id := r.PathValue("id")
	if _, _, err := s.live(r.Context(), p, id); err != nil {
		s.fail(w, r, err)
		return
	}
	// The streams in flight are cut first: they end with an error, not
	// with the end of the commands the kill ends.
	s.procs.dropSandbox(id)
	if _, err := s.svc.CloseSession(r.Context(), p, id); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// metrics answers a sandbox's metrics: none are sampled per sandbox
// here, so an empty list (the SDK's answer for a sandbox without any).
func (s *Server) metrics(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	if _, _, err := s.live(r.Context(), p, r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, []struct{}{})
}

func (s *Server) allMetrics(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": map[string]any{}})
}

// logs answers a sandbox's logs: its output is in its cells' records
// (the Stockade API), not in a log here.
func (s *Server) logs(w http.ResponseWriter, r *http.Request, p capability.Principal) {
	if _, _, err := s.sandbox(r.Context(), p, r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"logs": []any{}, "logEntries": []any{}})
}
