package api_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/internal/templatejobs"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/templates"
)

// tplCatalog is a fixed set of templates.
type tplCatalog []templates.Template

func (c tplCatalog) Templates() []templates.Template { return c }
func (c tplCatalog) Get(name string) (templates.Template, error) {
	for _, t := range c {
		if t.Name == name {
			return t, nil
		}
	}
	return templates.Template{}, errdefs.Publicf("unknown template %q: %w", name, errdefs.ErrNotFound)
}

// gateBuilder builds a template when a value arrives on gate, failing
// with fail if set; it keeps the current build as image.Store does: only
// a build that succeeds replaces it.
type gateBuilder struct {
	gate    chan error
	mu      sync.Mutex
	n       int
	current map[string]*client.TemplateBuild
}

func (g *gateBuilder) Build(ctx context.Context, t templates.Template, pull bool, progress func(image.Progress)) (client.TemplateBuild, bool, error) {
	progress(image.Progress{Runtime: t.Name, Stage: "fetching", Packages: 2, Total: 5, Bytes: 4096})
	var fail error
	select {
	case fail = <-g.gate:
	case <-ctx.Done():
		return client.TemplateBuild{}, false, ctx.Err()
	}
	progress(image.Progress{Runtime: t.Name, Stage: "hashing", Bytes: 8192})
	if fail != nil {
		return client.TemplateBuild{}, false, fail
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n++
	b := &client.TemplateBuild{Digest: fmt.Sprintf("sha256:%064d", g.n), Key: "sha256:key", Declaration: templatejobs.DeclarationKey(t), Base: t.Base,
		SBOM: client.SBOM{Debian: []client.DebianPackage{{Name: "python3-bs4", Version: "4.13.4-2"}}}}
	g.current[t.Name] = b
	return *b, false, nil
}

func (g *gateBuilder) Current(name string) (*client.TemplateBuild, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.current[name], nil
}

// templatesEnv is a daemon over an empty store whose templates a
// gateBuilder builds, with a key of each role.
type templatesEnv struct {
	url                    string
	st                     store.Store
	ws                     model.Workspace
	agent, approver, admin string
	gate                   chan error
}

func newTemplatesEnv(t *testing.T, serve bool) *templatesEnv {
	t.Helper()
	st, err := storeopen.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "stockade.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: "/nonexistent/stockade-guest"})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(map[string]sandbox.Driver{"runc": d}, "runc", image.Open(t.TempDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		t.Fatal(err)
	}
	e := &templatesEnv{st: st, gate: make(chan error)}
	if e.ws, err = st.CreateWorkspace(t.Context(), "tpl", nil); err != nil {
		t.Fatal(err)
	}
	for _, k := range []struct {
		role model.Role
		dst  *string
	}{{model.RoleAgent, &e.agent}, {model.RoleApprover, &e.approver}, {model.RoleAdmin, &e.admin}} {
		*k.dst = "sk_test_" + string(k.role) + "_" + rand.Text()
		if _, err := st.CreateAPIKey(t.Context(), store.NewAPIKey{WorkspaceID: e.ws.ID, Role: k.role, Hash: model.HashKey(*k.dst), Name: string(k.role)}); err != nil {
			t.Fatal(err)
		}
	}
	opts := api.Options{KeepAlive: 50 * time.Millisecond}
	if serve {
		jobs := templatejobs.New(templatejobs.Options{
			Templates: tplCatalog{{Name: "analytics", Base: "python", DebianPackages: []string{"python3-bs4"}, Source: "templates.yaml:2"}},
			Builder:   &gateBuilder{gate: e.gate, current: map[string]*client.TemplateBuild{}}, Audit: st,
			Describe: func(err error) (string, bool) { _, d, hidden := api.Public(err); return d.Message, hidden },
		})
		t.Cleanup(jobs.Close)
		opts.Templates = jobs
	}
	srv := httptest.NewServer(api.New(capability.NewService(eng, st, capability.ServiceOptions{}), st, opts))
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return e
}

func (e *templatesEnv) client(t *testing.T, key string) *client.Client {
	t.Helper()
	c, err := client.New(e.url, key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// follow reads a build's events to the end and returns the progress
// stages seen and the final event.
func follow(t *testing.T, c *client.Client, id string, onProgress func()) ([]string, client.BuildEvent) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	s, err := c.WatchTemplateBuild(ctx, "analytics", id)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var stages []string
	for {
		ev, err := s.Next()
		if err != nil {
			t.Fatalf("events of %s after %q: %v", id, stages, err)
		}
		if ev.Final() {
			return stages, ev
		}
		stages = append(stages, ev.Progress.Stage)
		if onProgress != nil {
			onProgress()
			onProgress = nil
		}
	}
}

// TestTemplateBuilds drives a template's builds through the API: who may
// read and build, the job and its events, one build at a time, a failed
// and a cancelled build leaving the previous one serving, and the audit
// events.
func TestTemplateBuilds(t *testing.T) {
	e := newTemplatesEnv(t, true)
	ctx := t.Context()
	admin, approver, agent := e.client(t, e.admin), e.client(t, e.approver), e.client(t, e.agent)

	if _, err := agent.Templates(ctx); !errdefs.IsPermissionDenied(err) {
		t.Errorf("an agent key lists templates: got %v, want permission denied", err)
	}
	list, err := approver.Templates(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "analytics" || !list[0].Stale || list[0].Build != nil || list[0].DeclarationKey == "" {
		t.Fatalf("an approver lists templates: got %+v, %v; want analytics, never built", list, err)
	}
	if _, err := approver.BuildTemplate(ctx, "analytics", client.BuildRequest{}); !errdefs.IsPermissionDenied(err) {
		t.Errorf("an approver builds: got %v, want permission denied", err)
	}
	if _, err := admin.BuildTemplate(ctx, "nope", client.BuildRequest{}); !errdefs.IsNotFound(err) {
		t.Errorf("building an unknown template: got %v, want not found", err)
	}
	do(t, e.url, "POST", "/v1/templates/analytics/builds", e.admin, `{"pull":true,"force":1}`).wantError(t, http.StatusBadRequest, "invalid_argument", `unknown field "force"`)

	// A build: 202 with the job; a second request joins it.
	r := do(t, e.url, "POST", "/v1/templates/analytics/builds", e.admin, client.BuildRequest{Pull: true}).want(t, http.StatusAccepted)
	var job client.TemplateBuildJob
	r.decode(t, &job)
	if job.State != client.BuildRunning || !job.Pull || job.Joined || r.header.Get("Location") != "/v1/templates/analytics/builds/"+job.ID {
		t.Fatalf("POST: got %s (Location %q), want a running job", r.body, r.header.Get("Location"))
	}
	again, err := admin.BuildTemplate(ctx, "analytics", client.BuildRequest{})
	if err != nil || again.ID != job.ID || !again.Joined {
		t.Errorf("a second POST while it runs: got %+v, %v; want job %s joined", again, err, job.ID)
	}
	stages, end := follow(t, admin, job.ID, func() { e.gate <- nil })
	if len(stages) == 0 || stages[0] != "fetching" || end.Name != "done" || end.Job.State != client.BuildDone || end.Job.Build == nil || end.Job.Ended == nil {
		t.Fatalf("events: got progress %q then %+v, want fetching... then done with the build", stages, end)
	}
	digest := end.Job.Build.Digest
	tpl, err := approver.Template(ctx, "analytics")
	if err != nil || tpl.Stale || tpl.Build == nil || tpl.Build.Digest != digest || len(tpl.Build.SBOM.Debian) != 1 || tpl.Job != nil ||
		tpl.LastJob == nil || tpl.LastJob.ID != job.ID {
		t.Fatalf("the template after its build: got %+v, %v; want build %s with its SBOM, not stale", tpl, err, digest)
	}
	// A job that has ended answers its end at once.
	if _, end := follow(t, admin, job.ID, nil); end.Name != "done" {
		t.Errorf("events of an ended job: got %+v, want done", end)
	}

	// A failed build says why, and the previous build still serves.
	job2, err := admin.BuildTemplate(ctx, "analytics", client.BuildRequest{})
	if err != nil || job2.ID == job.ID || job2.Joined {
		t.Fatalf("a build after the first ended: got %+v, %v; want a new job", job2, err)
	}
	_, end = follow(t, admin, job2.ID, func() {
		e.gate <- errdefs.Publicf(`debian_packages: "python3-nope": no such package in trixie: %w`, errdefs.ErrInvalidArgument)
	})
	if end.Name != "failed" || end.Job.Error == nil || end.Job.Error.Code != "invalid_argument" || end.Job.Error.Message != `debian_packages: "python3-nope": no such package in trixie` {
		t.Errorf("a failed build: got %+v (error %+v), want failed naming the package", end, end.Job.Error)
	}
	if tpl, err := admin.Template(ctx, "analytics"); err != nil || tpl.Build == nil || tpl.Build.Digest != digest {
		t.Errorf("after a failed build: got %+v, %v; want build %s still current", tpl, err, digest)
	}

	// A build cancelled while it runs ends cancelled; the previous build serves.
	job3, err := admin.BuildTemplate(ctx, "analytics", client.BuildRequest{})
	if err != nil {
		t.Fatal(err)
	}
	cancelled, err := admin.CancelTemplateBuild(ctx, "analytics", job3.ID)
	if err != nil || cancelled.State != client.BuildCancelled || cancelled.Error == nil || cancelled.Error.Code != "cancelled" {
		t.Errorf("DELETE: got %+v, %v; want cancelled", cancelled, err)
	}
	if got, err := admin.TemplateBuild(ctx, "analytics", job3.ID); err != nil || got.State != client.BuildCancelled {
		t.Errorf("GET of the cancelled job: got %+v, %v", got, err)
	}
	if tpl, err := admin.Template(ctx, "analytics"); err != nil || tpl.Build == nil || tpl.Build.Digest != digest {
		t.Errorf("after a cancelled build: got %+v, %v; want build %s still current", tpl, err, digest)
	}
	if _, err := admin.TemplateBuild(ctx, "analytics", "tb_nope"); !errdefs.IsNotFound(err) {
		t.Errorf("an unknown job: got %v, want not found", err)
	}

	// Each end is audited in the admin's workspace, by its key.
	page, err := e.st.ListEvents(ctx, e.ws.ID, store.EventFilter{Types: []string{"template.built", "template.build_failed"}})
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	for _, ev := range page.Items {
		codes = append(codes, ev.Code)
		if ev.Actor == "" || ev.Actor == "system" {
			t.Errorf("event %s: actor %q, want the admin key's id", ev.Code, ev.Actor)
		}
	}
	if fmt.Sprint(codes) != "[TPL002W TPL002W TPL001I]" {
		t.Errorf("audit events, newest first: got %v, want the cancel, the failure, the build", codes)
	}
}

// TestNoTemplates checks a daemon without templates: an empty list, and
// a template that does not exist.
func TestNoTemplates(t *testing.T) {
	e := newTemplatesEnv(t, false)
	admin := e.client(t, e.admin)
	if list, err := admin.Templates(t.Context()); err != nil || len(list) != 0 {
		t.Errorf("list: got %+v, %v; want none", list, err)
	}
	do(t, e.url, "GET", "/v1/templates/analytics", e.admin, nil).wantError(t, http.StatusNotFound, "not_found", "no templates")
	do(t, e.url, "POST", "/v1/templates/analytics/builds", e.agent, nil).wantError(t, http.StatusForbidden, "permission_denied", "admin")
}
