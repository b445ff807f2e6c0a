package api_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// TestPublicAnswers checks what a client reads of errors that wrap a
// database's, the operating system's or the daemon's own words: the
// class's fixed sentence, and nothing of the cause, which is logged.
// Messages made for clients (errdefs.Publicf) stay whole.
func TestPublicAnswers(t *testing.T) {
	// A real connection error of the PostgreSQL driver, as the store
	// classifies it: it names the user, the database and the address.
	_, pgErr := storeopen.Open(t.Context(), "postgres://alice@127.0.0.1:1/secretdb?connect_timeout=5")
	if pgErr == nil {
		t.Fatal("opening a database on port 1: got no error")
	}
	constraint := fmt.Errorf("creating API key: %w: %w", errdefs.ErrConflict, &pgconn.PgError{Code: "23505",
		Message: `duplicate key value violates unique constraint "api_keys_hash_key"`, ConstraintName: "api_keys_hash_key"})
	checkpoint := fmt.Errorf("saving session ses_1: %w: %w", &os.PathError{Op: "mkdir", Path: "/var/lib/stockade/checkpoints/ses_1", Err: os.ErrPermission}, errdefs.ErrFailedPrecondition)
	tests := []struct {
		name   string
		err    error
		status int
		msg    string
		hidden []string // words of the cause the body must not carry
	}{
		{"postgres down", pgErr, http.StatusServiceUnavailable, "the service is unavailable; retry later", []string{"alice", "secretdb", "127.0.0.1", "dial"}},
		{"a constraint", constraint, http.StatusConflict, "the request conflicts with the current state", []string{"api_keys_hash_key", "duplicate key", "23505"}},
		{"a host path", checkpoint, http.StatusConflict, "the request cannot be done in the current state", []string{"/var/lib", "checkpoints", "mkdir"}},
		{"internal", errors.New("open /etc/stockade/secret: permission denied"), http.StatusInternalServerError, "internal error", []string{"/etc"}},
		{"public, wrapped with a path", fmt.Errorf("reading /var/lib/x: %w", errdefs.Publicf("execution %q not found: %w", "ex_x", errdefs.ErrNotFound)),
			http.StatusNotFound, `execution "ex_x" not found`, []string{"/var/lib"}},
		{"a session's", errdefs.Public(&capability.SessionBusyError{SessionID: "ses_1"}), http.StatusConflict, "session ses_1 is running a cell; wait for it to end or interrupt it", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, d, hidden := api.Public(tt.err)
			if status != tt.status || d.Message != tt.msg {
				t.Errorf("got %d %q, want %d %q", status, d.Message, tt.status, tt.msg)
			}
			if want := tt.hidden != nil; hidden != want {
				t.Errorf("hidden: got %v, want %v (error %q)", hidden, want, tt.err)
			}
			for _, w := range tt.hidden {
				if !strings.Contains(tt.err.Error(), w) {
					t.Errorf("the cause %q does not say %q: the check sees nothing", tt.err, w)
				}
				if strings.Contains(d.Message, w) {
					t.Errorf("the answer %q says %q", d.Message, w)
				}
			}
		})
	}
}

// TestRequestID checks that every answer carries an X-Request-Id: the
// client's when it is sane, else a new one.
func TestRequestID(t *testing.T) {
	svc, st, agent := newBareService(t)
	srv := httptest.NewServer(api.New(svc, st, api.Options{}))
	defer srv.Close()
	for _, tt := range []struct {
		name, sent string
		kept       bool
	}{
		{"none", "", false},
		{"sane", "req-42.a_b:c", true},
		{"a forged log line", "x\" status=200 msg=ok", false},
		{"too long", strings.Repeat("a", 129), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var hdr []string
			if tt.sent != "" {
				hdr = []string{"X-Request-Id", tt.sent}
			}
			got := do(t, srv.URL, "GET", "/v1/nope", agent, nil, hdr...).header.Get("X-Request-Id")
			switch {
			case tt.kept && got != tt.sent:
				t.Errorf("got %q, want %q", got, tt.sent)
			case !tt.kept && (got == tt.sent || len(got) != 32):
				t.Errorf("got %q, want a new id of 32 hex digits", got)
			}
		})
	}
	a := do(t, srv.URL, "GET", "/healthz", "", nil).header.Get("X-Request-Id")
	b := do(t, srv.URL, "GET", "/healthz", "", nil).header.Get("X-Request-Id")
	if a == "" || a == b {
		t.Errorf("two requests' ids: got %q and %q, want two", a, b)
	}
}

// cuttable is a TCP relay to a PostgreSQL server: cut ends its every
// connection and refuses new ones, as a server that stopped would.
type cuttable struct {
	ln     net.Listener
	mu     sync.Mutex
	conns  []net.Conn
	closed bool // cut: a connection accepted just before is closed too
}

func relay(t *testing.T, to string) *cuttable {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cuttable{ln: ln}
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", to)
			if err != nil {
				in.Close()
				continue
			}
			c.mu.Lock()
			if c.closed {
				c.mu.Unlock()
				in.Close()
				out.Close()
				continue
			}
			c.conns = append(c.conns, in, out)
			c.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); out.Close() }()
			go func() { _, _ = io.Copy(in, out); in.Close() }()
		}
	}()
	t.Cleanup(c.cut)
	return c
}

func (c *cuttable) cut() {
	c.ln.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = nil
}

// TestPostgresOutage serves the API on PostgreSQL, then stops the
// database under it (the daemon's connections to it end and new ones are
// refused) and sends requests of every kind: no answer names the
// database's user, host, port or name, nor SQL, nor a host path; each
// 5xx's cause is logged with the request id that its answer carries.
func TestPostgresOutage(t *testing.T) {
	dsn := freshSchema(t, postgresDSN(t))
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	r := relay(t, u.Host)
	u.Host = r.ln.Addr().String()
	var logs testenv.Buffer
	c := envConfig{sessions: true, policy: noApproval, credits: 100}
	c.api.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	e := newEnv(t, backend{"postgres via a relay", func(*testing.T) string { return u.String() }}, c)
	ex := e.invoke(capability.InvokeRequest{Runtime: "shell", Code: "echo up"}).want(t, http.StatusOK).execution(t)

	r.cut()
	_, port, _ := net.SplitHostPort(u.Host)
	secrets := []string{u.User.Username(), "127.0.0.1", port, strings.TrimPrefix(u.Path, "/"), u.Query().Get("search_path"),
		"SELECT", "INSERT", "dial", "/tmp", "/var/lib"}
	answers := 0
	for _, rq := range []struct {
		method, path, key string
		body              any
	}{
		{"GET", "/v1/workspace", e.agent, nil},
		{"GET", "/v1/executions/" + ex.ID, e.agent, nil},
		{"GET", "/v1/executions/ex_nope", e.agent, nil},
		{"POST", "/v1/executions", e.agent, capability.InvokeRequest{Runtime: "shell", Code: "echo down"}},
		{"POST", "/v1/sessions", e.agent, capability.CreateSessionRequest{Runtime: "shell"}},
		{"GET", "/v1/approvals", e.approver, nil},
		{"POST", "/v1/approvals/apr_nope/approve", e.approver, nil},
		{"GET", "/v1/audit/events", e.admin, nil},
		{"GET", "/v1/tool-calls", e.admin, nil},
		{"GET", "/v1/workspace", "sk_unknown", nil},
	} {
		t.Run(rq.method+" "+rq.path, func(t *testing.T) {
			a := e.do(rq.method, rq.path, rq.key, rq.body)
			id := a.header.Get("X-Request-Id")
			if a.code < 500 {
				t.Fatalf("got %d %s, want a 5xx while the database is down", a.code, a.body)
			}
			a.wantError(t, a.code, "unavailable", "the service is unavailable; retry later")
			for _, s := range secrets {
				if s != "" && bytes.Contains(a.body, []byte(s)) {
					t.Errorf("the body %s says %q", a.body, s)
				}
			}
			line := ""
			for l := range strings.Lines(logs.String()) {
				if strings.Contains(l, "request_id="+id) {
					line = l
				}
			}
			if id == "" || !strings.Contains(line, "status=503") || !strings.Contains(line, "err=") {
				t.Errorf("no log line of request %q with its status and cause: got %q", id, line)
			}
			answers++
		})
	}
	if answers == 0 {
		t.Fatal("no request was answered")
	}
	// What the answers hid is in the log: the connection error that names
	// the database's user and port.
	named := false
	for l := range strings.Lines(logs.String()) {
		named = named || strings.Contains(l, "request failed") && strings.Contains(l, "user="+u.User.Username()) && strings.Contains(l, ":"+port)
	}
	if !named {
		t.Errorf("no log line names the cause (the database's user and port): got %s", logs.String())
	}
}

// TestRefusedCheckpointNamesNoPath checks that a refused pause names no
// host path: on runc, whose refusal (409) gives the driver's reason; on
// gVisor, when the checkpoint directory cannot be made, an internal
// error (500) whose cause, the path, is only logged, with the request's
// id.
func TestRefusedCheckpointNamesNoPath(t *testing.T) {
	checkpoints := filepath.Join(t.TempDir(), "checkpoints")
	noPath := func(t *testing.T, a reply) {
		t.Helper()
		for _, p := range []string{checkpoints, "/tmp", filepath.Base(filepath.Dir(checkpoints))} {
			if bytes.Contains(a.body, []byte(p)) {
				t.Errorf("the refused pause: got %s, which says %q", a.body, p)
			}
		}
	}
	t.Run("runc", func(t *testing.T) {
		c := envConfig{sessions: true, policy: noApproval, credits: 100}
		c.svc.Sessions.CheckpointDir = checkpoints
		e := newEnv(t, backends[0], c)
		ss := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "shell"})
		a := e.do("POST", "/v1/sessions/"+ss.ID+"/pause", e.agent, nil)
		a.wantError(t, http.StatusConflict, "failed_precondition", "cannot pause", "CRIU")
		noPath(t, a)
	})
	t.Run("gvisor", func(t *testing.T) {
		testenv.RequiresBinary(t, "runsc")
		gv, err := gvisor.New(gvisor.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
		if err != nil {
			t.Fatal(err)
		}
		var logs testenv.Buffer
		c := envConfig{sessions: true, policy: noApproval, credits: 100, drivers: map[string]sandbox.Driver{"gvisor": gv}, defaultDriver: "gvisor"}
		c.svc.Sessions.CheckpointDir = checkpoints
		c.api.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		e := newEnv(t, backends[0], c)
		// Once the daemon has started, a file takes the checkpoint
		// directory's place.
		if err := os.WriteFile(checkpoints, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(checkpoints)
		ss := e.openSession(e.agent, capability.CreateSessionRequest{Runtime: "python"})
		a := e.do("POST", "/v1/sessions/"+ss.ID+"/pause", e.agent, nil)
		a.wantError(t, http.StatusInternalServerError, "internal", "internal error")
		noPath(t, a)
		id := a.header.Get("X-Request-Id")
		if l := logs.String(); id == "" || !strings.Contains(l, "request_id="+id) || !strings.Contains(l, checkpoints) {
			t.Errorf("the log: got %q, want a line of request %q with the path %s", l, id, checkpoints)
		}
	})
}
