package e2b

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/stockade-sh/stockade/errdefs"
)

// Contexts. A sandbox's code runs in its session's one kernel (python or
// node, the session's runtime: a sandbox starts one kernel, and a second
// kernel of another runtime would need another image). So, in a python
// session:
//
//   - the default python context is the kernel's own namespace: its cells
//     are sent as written (an approver reads them as the client wrote
//     them);
//   - another python context is a fresh namespace (a module of its own)
//     in the same kernel: its variables are its own, while the process
//     (imports, the working directory, the environment) is shared;
//   - a bash context is a bash process that the kernel starts and keeps,
//     one per context, whose variables, functions and directory stay;
//   - a javascript context is a node process kept the same way, where the
//     sandbox's image has node. The python image has none: such a cell
//     ends with the error NodeUnavailable, which says so; a template whose
//     image installs nodejs makes it work unchanged.
//
// Cells of contexts other than the default are sent wrapped: a helper
// (ciHelper) that the kernel defines once, then a call of it with the
// client's code as a string. A node session has the javascript context
// (its kernel) only. Restarting or removing a context runs nothing at
// once: the next cell sent to the kernel does it first, so that context
// calls, which the SDK sends without the sandbox's access token, never
// run code or cost credits. Contexts are the daemon's memory: a restart of
// the daemon forgets those created (their ids answer 404; the kernel's
// state is kept, as the session's is).

// ciDefaultCwd is the directory a context starts in when none is given:
// the session's workspace.
const ciDefaultCwd = "/workspace"

// ciContext is a context as the SDK reads it (Context: id, language, cwd).
type ciContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// ciMaxSandboxes bounds the sandboxes whose contexts the daemon keeps:
// past it, the least recently used sandbox's are forgotten (a sandbox
// that ended never comes back; one still in use lists its default
// context only, and its other contexts' ids answer 404).
const ciMaxSandboxes = 4096

// ciSandbox is the contexts of one sandbox.
type ciSandbox struct {
	used uint64 // the tick of its last use
	list []*ciContext
	// restart are contexts whose state the next cell drops first; drop,
	// removed contexts whose processes or namespaces it ends.
	restart map[string]bool
	drop    []string
	// pending is the cell whose stream ended ApprovalPending, until a
	// stream follows it to its end (see interpreter.reattach).
	pending *ciPending
}

// ciPending is a cell left awaiting approval: its execution and the
// code it was sent as.
type ciPending struct{ id, code string }

// pendingOf returns t's sandbox's pending cell, if any.
func (c *ciContexts) pendingOf(t Target) (ciPending, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.sandbox(t).pending; p != nil {
		return *p, true
	}
	return ciPending{}, false
}

// setPending records p as t's sandbox's pending cell.
func (c *ciContexts) setPending(t Target, p ciPending) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sandbox(t).pending = &p
}

// clearPending forgets t's sandbox's pending cell if it is id.
func (c *ciContexts) clearPending(t Target, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sb := c.sandbox(t); sb.pending != nil && sb.pending.id == id {
		sb.pending = nil
	}
}

// ciContexts is the contexts of every sandbox this daemon serves, by
// session id.
type ciContexts struct {
	mu        sync.Mutex
	max       int
	tick      uint64
	sandboxes map[string]*ciSandbox
}

func newCIContexts(max int) *ciContexts {
	return &ciContexts{max: max, sandboxes: map[string]*ciSandbox{}}
}

// ciLanguage is the language of a client's word for it, "" when Stockade
// has none of that name.
func ciLanguage(s string) string {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "python", "python3", "py":
		return "python"
	case "javascript", "js", "node", "nodejs":
		return "javascript"
	case "bash", "sh", "shell":
		return "bash"
	}
	return ""
}

// ciDefaultLanguage is the language of a session runtime's kernel.
func ciDefaultLanguage(runtime string) string {
	if runtime == "node" {
		return "javascript"
	}
	return "python"
}

// ciUnsupportedError is a language a sandbox cannot run: /execute says so
// as the execution's error (nothing runs, nothing is charged), /contexts
// with a 404 (whose text the SDK shows).
type ciUnsupportedError struct{ name, msg string }

func (e *ciUnsupportedError) Error() string { return e.msg }

// ciSupported says why runtime's sandbox cannot run language lang, or nil.
func ciSupported(runtime, raw, lang string) *ciUnsupportedError {
	switch {
	case lang == "":
		return &ciUnsupportedError{"UnsupportedLanguage", "language " + clipName(raw) +
			" is not supported: this sandbox runs python, bash and javascript (where its image has node)"}
	case ciDefaultLanguage(runtime) == "javascript" && lang != "javascript":
		return &ciUnsupportedError{"UnsupportedLanguage", "this sandbox runs the node runtime, whose kernel runs javascript only: " +
			lang + " contexts need a sandbox of the python runtime (template code-interpreter-v1 or base)"}
	case runtime != "python" && runtime != "node":
		return &ciUnsupportedError{"UnsupportedLanguage", "this sandbox's runtime " + clipName(runtime) + " has no kernel for code contexts"}
	}
	return nil
}

// sandbox returns t's contexts, made with its default context.
func (c *ciContexts) sandbox(t Target) *ciSandbox {
	c.tick++
	sb := c.sandboxes[t.SessionID]
	if sb == nil {
		if len(c.sandboxes) >= ciMaxSandboxes {
			c.evict()
		}
		lang := ciDefaultLanguage(t.Runtime)
		sb = &ciSandbox{list: []*ciContext{{ID: lang, Language: lang, Cwd: ciDefaultCwd}}, restart: map[string]bool{}}
		c.sandboxes[t.SessionID] = sb
	}
	sb.used = c.tick
	return sb
}

// evict forgets the least recently used sandbox's contexts.
func (c *ciContexts) evict() {
	var oldest string
	for id, sb := range c.sandboxes {
		if oldest == "" || sb.used < c.sandboxes[oldest].used {
			oldest = id
		}
	}
	delete(c.sandboxes, oldest)
}

func (sb *ciSandbox) find(id string) *ciContext {
	for _, x := range sb.list {
		if x.ID == id {
			return x
		}
	}
	return nil
}

// ciPlan is the cell /execute sends for a request, and what sending it
// does to its sandbox's contexts.
type ciPlan struct {
	code    string
	context string
	restart bool
	drop    []string
}

// plan makes the cell of req in t's sandbox: the code as written in the
// default context of the kernel's language (without env_vars nor a
// pending restart), the helper's call otherwise.
func (c *ciContexts) plan(t Target, req ciExecuteRequest) (ciPlan, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sb := c.sandbox(t)
	var ctx *ciContext
	if req.ContextID != "" {
		if ctx = sb.find(req.ContextID); ctx == nil {
			return ciPlan{}, errdefs.Publicf("context %s not found in sandbox %s: %w", clipName(req.ContextID), t.SandboxID, errdefs.ErrNotFound)
		}
	} else {
		lang := ciLanguage(req.Language)
		if un := ciSupported(t.Runtime, req.Language, lang); un != nil {
			return ciPlan{}, un
		}
		// A language's default context is made on its first use.
		if ctx = sb.find(lang); ctx == nil {
			if len(sb.list) >= c.max {
				return ciPlan{}, errdefs.Publicf("sandbox %s has %d contexts, the most it may have: remove one: %w", t.SandboxID, c.max, errdefs.ErrResourceExhausted)
			}
			ctx = &ciContext{ID: lang, Language: lang, Cwd: ciDefaultCwd}
			sb.list = append(sb.list, ctx)
		}
	}
	p := ciPlan{context: ctx.ID, restart: sb.restart[ctx.ID], drop: slices.Clone(sb.drop)}
	if ciDefaultLanguage(t.Runtime) == "javascript" {
		p.code = ciNodeCell(req.Code, req.EnvVars)
		return p, nil
	}
	if ctx.ID == "python" && !p.restart && len(p.drop) == 0 && len(req.EnvVars) == 0 {
		p.code = req.Code
		return p, nil
	}
	p.code = ciHelperCell(ctx, req.Code, req.EnvVars, p.restart, p.drop)
	return p, nil
}

// admitted records that plan's cell was admitted: the restart and the
// removals it carries are done by it.
func (c *ciContexts) admitted(t Target, p ciPlan) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sb := c.sandbox(t)
	if p.restart {
		delete(sb.restart, p.context)
	}
	sb.drop = slices.DeleteFunc(sb.drop, func(id string) bool { return slices.Contains(p.drop, id) })
}

// requeue gives plan's restart and removals back to the next cell of t's
// sandbox: its cell ran nothing.
func (c *ciContexts) requeue(t Target, p ciPlan) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sb := c.sandbox(t)
	if p.restart && sb.find(p.context) != nil {
		sb.restart[p.context] = true
	}
	for _, id := range p.drop {
		if !slices.Contains(sb.drop, id) {
			sb.drop = append(sb.drop, id)
		}
	}
}

// ciNewContextID is a fresh context id.
func ciNewContextID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "ctx_" + hex.EncodeToString(b[:])
}

func (in *interpreter) listContexts(w http.ResponseWriter, r *http.Request) {
	t, err := in.target(r)
	if err != nil {
		in.ciError(w, r, err)
		return
	}
	in.ctxs.mu.Lock()
	out := []ciContext{}
	for _, x := range in.ctxs.sandbox(t).list {
		out = append(out, *x)
	}
	in.ctxs.mu.Unlock()
	ciJSON(w, http.StatusOK, out)
}

// ciMaxContextBody bounds a POST /contexts body.
const ciMaxContextBody = 64 << 10

func (in *interpreter) createContext(w http.ResponseWriter, r *http.Request) {
	t, err := in.target(r)
	if err != nil {
		in.ciError(w, r, err)
		return
	}
	var req struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, ciMaxContextBody)).Decode(&req); err != nil {
		in.ciError(w, r, errdefs.Publicf("the request body is not a JSON object of language and cwd: %w", errdefs.ErrInvalidArgument))
		return
	}
	lang := ciLanguage(req.Language)
	if un := ciSupported(t.Runtime, req.Language, lang); un != nil {
		in.ciError(w, r, errdefs.Publicf("%s: %w", un.msg, errdefs.ErrNotFound))
		return
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = ciDefaultCwd
	}
	if !strings.HasPrefix(cwd, "/") || len(cwd) > 4096 || strings.IndexByte(cwd, 0) >= 0 {
		in.ciError(w, r, errdefs.Publicf("cwd must be an absolute path: %w", errdefs.ErrInvalidArgument))
		return
	}
	if ciDefaultLanguage(t.Runtime) == "javascript" {
		// The node kernel has one global scope: its context is the one.
		in.ciError(w, r, errdefs.Publicf("this sandbox runs the node runtime, whose one kernel is its only context (id javascript): %w", errdefs.ErrNotFound))
		return
	}
	in.ctxs.mu.Lock()
	sb := in.ctxs.sandbox(t)
	if len(sb.list) >= in.ctxs.max {
		in.ctxs.mu.Unlock()
		in.ciError(w, r, errdefs.Publicf("sandbox %s has %d contexts, the most it may have: remove one: %w", t.SandboxID, in.ctxs.max, errdefs.ErrResourceExhausted))
		return
	}
	ctx := &ciContext{ID: ciNewContextID(), Language: lang, Cwd: cwd}
	sb.list = append(sb.list, ctx)
	in.ctxs.mu.Unlock()
	ciJSON(w, http.StatusOK, ctx)
}

func (in *interpreter) removeContext(w http.ResponseWriter, r *http.Request) {
	in.editContext(w, r, func(sb *ciSandbox, x *ciContext) {
		sb.list = slices.DeleteFunc(sb.list, func(c *ciContext) bool { return c == x })
		delete(sb.restart, x.ID)
		sb.drop = append(sb.drop, x.ID)
	})
}

func (in *interpreter) restartContext(w http.ResponseWriter, r *http.Request) {
	in.editContext(w, r, func(sb *ciSandbox, x *ciContext) { sb.restart[x.ID] = true })
}

// editContext applies edit to the context of the request's path, 404
// when its sandbox has none of that id.
func (in *interpreter) editContext(w http.ResponseWriter, r *http.Request, edit func(*ciSandbox, *ciContext)) {
	t, err := in.target(r)
	if err != nil {
		in.ciError(w, r, err)
		return
	}
	id := r.PathValue("id")
	in.ctxs.mu.Lock()
	sb := in.ctxs.sandbox(t)
	x := sb.find(id)
	if x != nil {
		edit(sb, x)
	}
	in.ctxs.mu.Unlock()
	if x == nil {
		in.ciError(w, r, errdefs.Publicf("context %s not found in sandbox %s: %w", clipName(id), t.SandboxID, errdefs.ErrNotFound))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// ciJSON answers v as JSON.
func ciJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
