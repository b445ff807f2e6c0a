// Package console is Stockade's approval console: server-rendered pages,
// served by the daemon at /ui/, where an approver or admin signs in with
// their API key and sees each approval request the moment it arrives (the
// code, highlighted, with the tool's isolation record, the risk, the
// network and stdin asked for, who asked and when it expires), approves
// or denies it, and follows executions, the workspace's credits, policy
// and tools, and the audit trail.
//
// The console is a view over the capability layer in the daemon's
// process: it reads through the store's query methods (Store) and acts only
// through capability.Service (Decide, ApproveTool), which applies the same
// rules as the HTTP API; nothing here decides anything. Templates, the
// style sheet and the script are embedded; no page loads anything from
// another host.
//
//	mux.Handle("/ui/", console.New(svc, st, console.Options{Witness: dir}))
package console

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/internal/witness"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/store"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Options configure the console. Zero fields take the documented defaults.
type Options struct {
	// Witness is the daemon's audit witness directory, for the audit
	// page's verdict; "" means none, which the page warns about.
	Witness witness.Dir
	// SecureCookies marks the cookies Secure on every request: set it
	// when the daemon is reached through a proxy that terminates TLS.
	// Requests that came over TLS get Secure cookies regardless.
	SecureCookies bool
	// SessionTTL is how long a sign-in lasts; zero means 8 hours.
	SessionTTL time.Duration
	// Recheck is how often a live page's event stream checks that its
	// key is still valid and its session unexpired; zero means 10 s.
	Recheck time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now defaults to time.Now.
	Now func() time.Time
}

// records is what the console reads of the store's records itself:
// every change goes through the capability layer.
type records interface {
	GetAPIKey(ctx context.Context, keyID string) (model.APIKey, error)
	GetWorkspace(ctx context.Context, id string) (model.Workspace, error)
	GetPolicy(ctx context.Context, workspaceID string) (model.Policy, error)
	GetCredits(ctx context.Context, workspaceID string) (model.Credits, error)
	ListLedger(ctx context.Context, workspaceID string, p store.PageRequest) (store.Page[model.LedgerEntry], error)
	GetExecution(ctx context.Context, workspaceID, executionID string) (model.Execution, error)
	GetToolCall(ctx context.Context, workspaceID, executionID string) (model.ToolCall, error)
	ListToolCalls(ctx context.Context, workspaceID string, f store.ToolCallFilter) (store.Page[model.ToolCall], error)
	GetApproval(ctx context.Context, workspaceID, approvalID string) (model.Approval, error)
	ListApprovals(ctx context.Context, workspaceID string, f store.ApprovalFilter) (store.Page[model.Approval], error)
}

// chains is what the console's audit pages read: the events and the
// chains that link them.
type chains interface {
	ListEvents(ctx context.Context, workspaceID string, f store.EventFilter) (store.Page[model.Event], error)
	ChainHead(ctx context.Context, workspaceID string) (model.ChainHead, error)
	VerifyChain(ctx context.Context, workspaceID string, witnessed ...model.ChainHead) (bool, *model.BrokenLink, error)
}

// Console is the console's HTTP handler. It is safe for concurrent use.
type Console struct {
	svc      *capability.Service
	st       records
	chains   chains
	opts     Options
	log      *slog.Logger
	pages    *template.Template
	static   fs.FS
	versions map[string]string // static file name -> content hash
	sessions *sessions
	signins  *limiter
	mux      *http.ServeMux
}

// Sign-in attempts allowed: per client address, 10 at once and one more
// every 6 s; over all clients, 60 at once and one more every second.
var (
	signinPerAddr = rate{burst: 10, every: 6 * time.Second}
	signinGlobal  = rate{burst: 60, every: time.Second}
)

// maxLimitedAddrs bounds the addresses the sign-in limiter remembers.
const maxLimitedAddrs = 4096

// New returns the console's handler over svc, reading st for what it
// shows, to be mounted at /ui/.
func New(svc *capability.Service, st store.Store, o Options) *Console {
	if o.SessionTTL <= 0 {
		o.SessionTTL = 8 * time.Hour
	}
	if o.Recheck <= 0 {
		o.Recheck = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed
	}
	c := &Console{
		svc: svc, st: st, chains: st, opts: o, log: o.Logger, static: static, versions: map[string]string{},
		sessions: newSessions(o.SessionTTL, o.Now),
		signins:  newLimiter(signinPerAddr, signinGlobal, maxLimitedAddrs),
	}
	_ = fs.WalkDir(static, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := fs.ReadFile(static, p)
			sum := sha256.Sum256(b)
			c.versions[p] = hex.EncodeToString(sum[:8])
		}
		return nil
	})
	c.pages = template.Must(template.New("").Funcs(c.funcs()).ParseFS(templateFS, "templates/*.html"))
	c.routes()
	return c
}

func (c *Console) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /ui/{$}", c.signedIn(func(w http.ResponseWriter, r *http.Request, v *visit) {
		http.Redirect(w, r, "/ui/approvals", http.StatusSeeOther)
	}))
	m.HandleFunc("GET /ui/static/{file}", c.serveStatic)
	m.HandleFunc("GET /ui/sign-in", c.signInPage)
	m.HandleFunc("POST /ui/sign-in", c.signIn)
	m.HandleFunc("POST /ui/sign-out", c.signedIn(c.changes(c.signOut)))
	m.HandleFunc("GET /ui/approvals", c.signedIn(c.approvalsPage))
	m.HandleFunc("GET /ui/approvals/{id}", c.signedIn(c.approvalPage))
	m.HandleFunc("POST /ui/approvals/{id}/approve", c.signedIn(c.changes(c.decide(true))))
	m.HandleFunc("POST /ui/approvals/{id}/deny", c.signedIn(c.changes(c.decide(false))))
	m.HandleFunc("GET /ui/fragments/card/{id}", c.signedIn(c.cardFragment))
	m.HandleFunc("GET /ui/fragments/pending", c.signedIn(c.pendingFragment))
	m.HandleFunc("GET /ui/fragments/executions", c.signedIn(c.executionsFragment))
	m.HandleFunc("GET /ui/executions", c.signedIn(c.executionsPage))
	m.HandleFunc("GET /ui/executions/{id}", c.signedIn(c.executionPage))
	m.HandleFunc("GET /ui/workspace", c.signedIn(c.workspacePage))
	m.HandleFunc("POST /ui/tools/{name}/approve", c.signedIn(c.changes(c.approveTool)))
	m.HandleFunc("GET /ui/audit", c.signedIn(c.auditPage))
	m.HandleFunc("GET /ui/events", c.signedIn(c.events))
	m.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) {
		c.errorPage(w, r, http.StatusNotFound, "There is no such page.")
	})
	c.mux = m
}

// contentSecurityPolicy allows the console's own script, style sheet and
// event stream, and nothing else: no inline script or style, no plugin,
// no frame, no form posted elsewhere.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// crossOrigin refuses state-changing requests that a browser says come
// from another site (Sec-Fetch-Site, else Origin against Host): defence in
// depth behind the CSRF tokens and SameSite=Strict cookies.
var crossOrigin = http.NewCrossOriginProtection()

// ServeHTTP serves the console's pages under /ui/.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	if err := crossOrigin.Check(r); err != nil {
		c.errorPage(w, r, http.StatusForbidden, "This request came from another site, and was refused.")
		return
	}
	c.mux.ServeHTTP(w, r)
}

func (c *Console) serveStatic(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("file")
	v, ok := c.versions[name]
	if !ok {
		http.NotFound(w, r)
		return
	}
	b, _ := fs.ReadFile(c.static, name)
	w.Header().Set("ETag", `"`+v+`"`)
	if r.URL.Query().Get("v") == v {
		w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		w.Header().Set("Cache-Control", "no-cache")
	}
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
}

// asset is the URL of a static file, with its content hash, so that a
// browser caches it until it changes.
func (c *Console) asset(name string) string {
	return "/ui/static/" + path.Base(name) + "?v=" + c.versions[name]
}

// maxForm bounds a form's body: a reason of up to 4 KiB and a token.
const maxForm = 64 << 10

// wantsFragment reports whether the page's script asked for the piece of
// the page a request changes, rather than a whole page.
func wantsFragment(r *http.Request) bool { return r.Header.Get("X-Stockade-Fragment") == "1" }

// render writes the template name with data.
func (c *Console) render(w http.ResponseWriter, code int, name string, data any) {
	var b bytes.Buffer
	if err := c.pages.ExecuteTemplate(&b, name, data); err != nil {
		c.log.Error("rendering a console page", "template", name, "err", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(b.Bytes())
}

// errorPage answers with a page that says what went wrong, or the bare
// message for the page's script.
func (c *Console) errorPage(w http.ResponseWriter, r *http.Request, code int, msg string) {
	if wantsFragment(r) {
		c.render(w, code, "flash", msg)
		return
	}
	c.render(w, code, "error.html", &page{Title: http.StatusText(code), Flash: msg, c: c})
}

// failure answers err, which a store or service call returned, while
// doing what: its class picks the status, and the message is the one the
// API would answer (api.Public).
func (c *Console) failure(w http.ResponseWriter, r *http.Request, what string, err error) {
	code, msg := c.describe(r, what, err)
	c.errorPage(w, r, code, msg)
}

// describe is the status and the message a person sees for err, met
// while doing what. It logs err as the API does (api.Report): a 5xx or a
// message hidden, with its cause and the request's id, which an internal
// error's message names.
func (c *Console) describe(r *http.Request, what string, err error) (int, string) {
	code, d := api.Report(r.Context(), c.log.With("doing", what), err)
	if code == http.StatusInternalServerError || errors.Is(err, errInternal) {
		if code != http.StatusInternalServerError {
			c.log.Error(what, "request_id", api.RequestID(r.Context()), "err", err)
		}
		msg := "Something went wrong on the server; the log has the details."
		if id := api.RequestID(r.Context()); id != "" {
			msg = "Something went wrong on the server; the log has the details (request " + id + ")."
		}
		return http.StatusInternalServerError, msg
	}
	msg := []rune(d.Message)
	if len(msg) == 0 {
		return code, http.StatusText(code) + "."
	}
	return code, strings.ToUpper(string(msg[:1])) + string(msg[1:]) + "."
}

var errInternal = errors.New("internal")

// page is what every full page's template receives.
type page struct {
	Title   string
	Section string // the navigation entry to mark current
	Flash   string
	Data    any
	// live makes the page follow the workspace's changes.
	live bool
	v    *visit // nil on the sign-in page
	c    *Console
}

// Visit is the signed-in visitor, or nil.
func (p *page) Visit() *visit { return p.v }

// Asset is the URL of a static file.
func (p *page) Asset(name string) string { return p.c.asset(name) }

// Live says whether the page follows the workspace's changes.
func (p *page) Live() bool { return p.v != nil && p.live }

// Sections are the navigation's entries. Sessions, once Stockade has them,
// are one more entry here and one more page.
func (p *page) Sections() []section { return sections }

type section struct{ Name, Label, Path string }

var sections = []section{
	{"approvals", "Approvals", "/ui/approvals"},
	{"executions", "Executions", "/ui/executions"},
	{"workspace", "Workspace", "/ui/workspace"},
	{"audit", "Audit", "/ui/audit"},
}
