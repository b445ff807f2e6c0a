package e2b

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/wire"
)

// The ports of a sandbox the SDKs name in E2b-Sandbox-Port.
const (
	EnvdPort        = "49983"
	InterpreterPort = "49999"
)

// EnvdVersion is the envd version the control plane reports: the lowest
// whose features the SDK gates on (octet-stream and gzip uploads from
// 0.5.7, closing stdin from 0.5.2, the default user from 0.4.0) that this
// server serves; file metadata (0.6.2) it does not keep.
const EnvdVersion = "0.5.7"

// Backend is what the server needs of the capability layer: the Cells of
// both planes and the command cells of envd's process service.
type Backend interface {
	Cells
	ExecCommand(ctx context.Context, p capability.Principal, id string, req capability.CommandRequest, o capability.InvokeOptions) (*capability.Invocation, error)
	CommandInput(ctx context.Context, p capability.Principal, id, execID string, data []byte, close bool) error
	CommandSignal(ctx context.Context, p capability.Principal, id, execID string, sig syscall.Signal) error
	StatFile(ctx context.Context, p capability.Principal, id, file string) (sandbox.FileInfo, error)
	MakeDir(ctx context.Context, p capability.Principal, id, dir string) error
	MoveFile(ctx context.Context, p capability.Principal, id, from, to string) (sandbox.FileInfo, error)

	// Tools places a template name (a tool of that name, or bound to a
	// template of that name); the snapshot calls serve E2B's snapshots
	// and forks.
	Tools(ctx context.Context, p capability.Principal) ([]capability.ToolStatus, error)
	SnapshotSession(ctx context.Context, p capability.Principal, id string, req wire.SnapshotRequest) (model.Snapshot, time.Duration, error)
	ListSnapshots(ctx context.Context, p capability.Principal, id string) ([]model.Snapshot, error)
	DeleteSnapshot(ctx context.Context, p capability.Principal, id string) error
	ForkSession(ctx context.Context, p capability.Principal, id string, req wire.ForkRequest) (*capability.Forked, error)
}

var _ Backend = (*capability.Service)(nil)

// Store is what the server keeps of its sandboxes beyond their sessions.
type Store interface {
	store.E2BSandboxes
	// GetAPIKey tells whether the key a sandbox acts as is still valid.
	GetAPIKey(ctx context.Context, keyID string) (model.APIKey, error)
}

// Options configure a Server.
type Options struct {
	// Interpreter serves port 49999 (the code interpreter, NewInterpreter)
	// with the Target in its requests' context; nil answers 501.
	Interpreter http.Handler
	// Secret derives the sandboxes' access tokens (LoadSecret); at least
	// 32 bytes.
	Secret []byte
	// TTL and IdleTimeout are what each sandbox's session asks for: the
	// server's ceilings, since an E2B sandbox lives until its own timeout
	// (which the server enforces) however idle it is. Zero takes the
	// configuration's default ceilings (config.DefaultSessions).
	TTL, IdleTimeout time.Duration
	// Logger defaults to slog.Default(); Now to time.Now.
	Logger *slog.Logger
	Now    func() time.Time
}

// Server serves the E2B wire: the control plane and, for requests that
// carry E2b-Sandbox-Id, the sandboxes' envd and code interpreter.
type Server struct {
	svc   Backend
	st    Store
	o     Options
	log   *slog.Logger
	ctl   *http.ServeMux
	envd  *http.ServeMux
	procs *procTable
}

// New returns a Server over svc and st.
func New(svc Backend, st Store, o Options) (*Server, error) {
	if len(o.Secret) < 32 {
		return nil, errors.New("e2b: a secret of at least 32 bytes is required")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if d := config.DefaultSessions(); o.TTL <= 0 || o.IdleTimeout <= 0 {
		o.TTL, o.IdleTimeout = cmp.Or(max(o.TTL, 0), d.MaxTTL), cmp.Or(max(o.IdleTimeout, 0), d.MaxIdleTimeout)
	}
	s := &Server{svc: svc, st: st, o: o, log: o.Logger, ctl: http.NewServeMux(), envd: http.NewServeMux(), procs: newProcTable()}
	s.routeControl()
	s.routeEnvd()
	return s, nil
}

// ServeHTTP routes a request: one that names a sandbox (E2b-Sandbox-Id)
// to the sandbox's port, any other to the control plane.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("E2b-Sandbox-Id")
	if id == "" {
		s.ctl.ServeHTTP(w, r)
		return
	}
	port := r.Header.Get("E2b-Sandbox-Port")
	if port != EnvdPort && port != InterpreterPort {
		refuse(w, r, http.StatusBadGateway, "sandbox "+id+" serves no port "+quote(port))
		return
	}
	t, status, msg := s.resolve(r, id, port)
	if status != 0 {
		refuse(w, r, status, msg)
		return
	}
	// The request ends with its sandbox: a kill, pause or timeout cuts
	// what it serves (ErrSandboxGone).
	ctx, detach := s.procs.attach(r.Context(), id)
	defer detach()
	r = r.WithContext(WithTarget(ctx, t))
	if port == EnvdPort {
		s.envd.ServeHTTP(w, r)
		return
	}
	if s.o.Interpreter == nil {
		writeError(w, http.StatusNotImplemented, "this server has no code interpreter")
		return
	}
	s.o.Interpreter.ServeHTTP(w, r)
}

// refuse answers a data-plane request the router refuses: a Connect
// call with a Connect error (code unavailable for 502, which the SDKs
// take for a sandbox that is not running; unauthenticated for 401),
// any other with E2B's error body.
func refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if !isConnectCall(r.URL.Path) {
		writeError(w, status, msg)
		return
	}
	code := "unavailable"
	switch status {
	case http.StatusUnauthorized:
		code = "unauthenticated"
	case http.StatusServiceUnavailable:
		code = "unavailable"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(rpcError{Code: code, Message: msg})
}

// isConnectCall says whether path is a method of envd's Connect
// services.
func isConnectCall(path string) bool {
	return strings.HasPrefix(path, "/process.Process/") || strings.HasPrefix(path, "/filesystem.Filesystem/")
}

// resolve finds the running sandbox id and checks the request's token:
// X-Access-Token (envd's, and the interpreter's /execute) or, on the
// interpreter's port only, E2B-Traffic-Access-Token (its /contexts calls,
// which carry no access token). An unknown, ended or paused sandbox is
// 502, as E2B's proxy answers, which the SDKs take for a sandbox that is
// not running; a wrong token 401.
func (s *Server) resolve(r *http.Request, id, port string) (Target, int, string) {
	gone := func() (Target, int, string) {
		return Target{}, http.StatusBadGateway, "sandbox " + id + " is not running"
	}
	rec, err := s.st.GetE2BSandbox(r.Context(), id)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return gone()
		}
		s.log.Error("e2b: resolving a sandbox", "sandbox", id, "err", err)
		return Target{}, http.StatusServiceUnavailable, "the sandbox could not be resolved; retry"
	}
	ok := tokenEqual(r.Header.Get("X-Access-Token"), s.accessToken(id))
	if !ok && port == InterpreterPort {
		ok = tokenEqual(r.Header.Get("E2B-Traffic-Access-Token"), s.trafficToken(id))
	}
	if !ok {
		return Target{}, http.StatusUnauthorized, "a valid access token for sandbox " + id + " is required"
	}
	return s.targetOf(r, rec)
}

// targetOf is the Target of sandbox rec, whose token the request showed:
// 502 when it is not running, 401 when its key was revoked.
func (s *Server) targetOf(r *http.Request, rec store.E2BSandbox) (Target, int, string) {
	id := rec.SessionID
	gone := func() (Target, int, string) {
		return Target{}, http.StatusBadGateway, "sandbox " + id + " is not running"
	}
	// The data plane acts as the key that created the sandbox, while it
	// is valid.
	key, err := s.st.GetAPIKey(r.Context(), rec.KeyID)
	if err != nil || !key.RevokedAt.IsZero() {
		return Target{}, http.StatusUnauthorized, "the key that created sandbox " + id + " is revoked"
	}
	rec.Role = string(key.Role)
	p := principalOf(rec)
	ss, err := s.svc.GetSession(r.Context(), p, id)
	if err != nil || ss.State != model.SessionActive {
		return gone()
	}
	return Target{SandboxID: id, SessionID: id, Principal: p, Runtime: ss.Runtime, Envs: rec.Envs}, 0, ""
}

// principalOf is the key that created rec, which its data plane acts as.
func principalOf(rec store.E2BSandbox) capability.Principal {
	return capability.Principal{KeyID: rec.KeyID, WorkspaceID: rec.WorkspaceID, Role: model.Role(rec.Role)}
}

// accessToken is sandbox id's envd access token: stable across connect,
// pause and resume, and across restarts of the daemon, since it is
// derived from the server's secret.
func (s *Server) accessToken(id string) string { return s.derive("envd", id) }

// trafficToken is sandbox id's traffic access token, which the code
// interpreter SDK sends on its /contexts calls.
func (s *Server) trafficToken(id string) string { return s.derive("traffic", id) }

func (s *Server) derive(kind, id string) string {
	m := hmac.New(sha256.New, s.o.Secret)
	m.Write([]byte(kind))
	m.Write([]byte{0})
	m.Write([]byte(id))
	return hex.EncodeToString(m.Sum(nil))
}

func tokenEqual(got, want string) bool {
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func quote(s string) string {
	if len(s) > 64 {
		s = s[:64]
	}
	return "\"" + strings.ToValidUTF8(s, "?") + "\""
}
