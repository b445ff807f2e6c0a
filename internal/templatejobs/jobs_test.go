package templatejobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/templates"
)

// catalog is a fixed set of templates.
type catalog []templates.Template

func (c catalog) Templates() []templates.Template { return c }
func (c catalog) Get(name string) (templates.Template, error) {
	for _, t := range c {
		if t.Name == name {
			return t, nil
		}
	}
	return templates.Template{}, errdefs.Publicf("unknown template %q: %w", name, errdefs.ErrNotFound)
}

// fakeBuilder builds when told to: each Build reports one progress, then
// waits for release (or its ctx) and ends with fail, or makes a build of
// the template's name and adds whatever adds says.
type fakeBuilder struct {
	mu      sync.Mutex
	current map[string]*client.TemplateBuild
	builds  int
	release chan struct{}
	started chan struct{}
	fail    error
	adds    []client.DebianPackage
}

func newFakeBuilder() *fakeBuilder {
	return &fakeBuilder{current: map[string]*client.TemplateBuild{}, release: make(chan struct{}), started: make(chan struct{}, 16)}
}

func (f *fakeBuilder) Build(ctx context.Context, t templates.Template, pull bool, progress func(image.Progress)) (client.TemplateBuild, bool, error) {
	f.mu.Lock()
	f.builds++
	n := f.builds
	f.mu.Unlock()
	progress(image.Progress{Runtime: t.Name, Stage: "fetching", Packages: 1, Total: 3, Bytes: 1024})
	f.started <- struct{}{}
	select {
	case <-f.release:
	case <-ctx.Done():
		return client.TemplateBuild{}, false, fmt.Errorf("building template %q: %w", t.Name, ctx.Err())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return client.TemplateBuild{}, false, f.fail
	}
	b := client.TemplateBuild{Digest: fmt.Sprintf("sha256:%d", n), Key: "sha256:k", Declaration: DeclarationKey(t), Base: t.Base,
		SBOM: client.SBOM{Debian: slices.Clone(f.adds), Wheels: []client.WheelPackage{{Name: "w", Version: "1", SHA256: "ab"}}}}
	f.current[t.Name] = &b
	return b, false, nil
}

func (f *fakeBuilder) Current(name string) (*client.TemplateBuild, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.current[name], nil
}

// events records appended audit events.
type events struct {
	mu  sync.Mutex
	all []model.NewEvent
}

func (e *events) AppendEvent(_ context.Context, ev model.NewEvent) (model.Event, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
	return model.Event{}, nil
}

func (e *events) last(t *testing.T) model.NewEvent {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.all) == 0 {
		t.Fatal("no audit event")
	}
	return e.all[len(e.all)-1]
}

type golden struct {
	err   error
	calls int
}

func (g *golden) MakeGolden(ctx context.Context, template string) error {
	g.calls++
	return g.err
}

var analytics = templates.Template{Name: "analytics", Base: "python", DebianPackages: []string{"python3-bs4"}, Golden: true}

// wait waits for the job to end and returns it.
func wait(t *testing.T, js *Jobs, id string) Job {
	t.Helper()
	w, err := js.Watch("analytics", id)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case <-w.C:
			if j := w.Job(); j.State.Final() {
				return j
			}
		case <-timeout:
			t.Fatalf("job %s still running: %+v", id, w.Job())
		}
	}
}

func TestBuildDone(t *testing.T) {
	b, ev, g := newFakeBuilder(), &events{}, &golden{}
	b.adds = []client.DebianPackage{{Name: "python3-bs4", Version: "4.13"}}
	js := New(Options{Templates: catalog{analytics}, Builder: b, Audit: ev, Golden: g})
	defer js.Close()
	by := Requester{KeyID: "key_admin", WorkspaceID: "ws_1"}
	j, joined, err := js.Start("analytics", true, by)
	if err != nil || joined || j.State != client.BuildRunning {
		t.Fatalf("Start: got %+v, joined %v, %v; want a new running job", j, joined, err)
	}
	<-b.started
	w, err := js.Watch("analytics", j.ID)
	if err != nil {
		t.Fatal(err)
	}
	<-w.C
	if p := w.Job(); p.Progress.Stage != "fetching" || p.Seq != 1 {
		t.Errorf("progress: got %+v (seq %d), want fetching, seq 1", p.Progress, p.Seq)
	}
	w.Close()
	// One build per template: a second request joins the first.
	j2, joined, err := js.Start("analytics", false, Requester{KeyID: "key_other"})
	if err != nil || !joined || j2.ID != j.ID || !j2.Pull {
		t.Errorf("second Start: got %+v, joined %v, %v; want the running job %s (pull kept)", j2, joined, err, j.ID)
	}
	st, err := js.Template("analytics")
	if err != nil || st.Running == nil || st.Running.ID != j.ID || !st.Stale() {
		t.Errorf("Template while building: got %+v, %v; want the running job and stale (never built)", st, err)
	}
	close(b.release)
	done := wait(t, js, j.ID)
	if done.State != client.BuildDone || done.Build == nil || done.Build.Digest != "sha256:1" || done.Golden != "made" || g.calls != 1 {
		t.Fatalf("job: got %+v (golden calls %d), want done with sha256:1 and a golden checkpoint made", done, g.calls)
	}
	st, err = js.Template("analytics")
	if err != nil || st.Running != nil || st.Stale() || st.Build.Digest != "sha256:1" {
		t.Errorf("Template after: got %+v, %v; want the build, not stale, nothing running", st, err)
	}
	e := ev.last(t)
	var data audit.TemplateBuiltEvent
	if err := json.Unmarshal(e.Data, &data); err != nil {
		t.Fatal(err)
	}
	if e.Type != audit.TemplateBuilt || e.Actor != "key_admin" || e.WorkspaceID != "ws_1" || data.Digest != "sha256:1" || !data.Pull ||
		data.SBOM != (audit.TemplateSBOM{Debian: 1, Wheels: 1}) || !slices.Equal(data.Added, []string{"python3-bs4 4.13", "wheel w 1"}) || data.Job != j.ID {
		t.Errorf("audit: got %s %s by %s in %s, data %s", e.Type, e.Code, e.Actor, e.WorkspaceID, e.Data)
	}

	// A second build that adds a package names it, and the build it replaces.
	b.mu.Lock()
	b.adds = append(b.adds, client.DebianPackage{Name: "python3-yaml", Version: "6.0"})
	b.mu.Unlock()
	j3, _, _ := js.Start("analytics", false, by)
	<-b.started
	wait(t, js, j3.ID)
	if err := json.Unmarshal(ev.last(t).Data, &data); err != nil {
		t.Fatal(err)
	}
	if data.PreviousDigest != "sha256:1" || data.Digest != "sha256:2" || !slices.Equal(data.Added, []string{"python3-yaml 6.0"}) || data.Removed != nil {
		t.Errorf("audit of the second build: got %+v, want sha256:1 -> sha256:2 adding python3-yaml", data)
	}
}

func TestBuildFailsOrIsCancelled(t *testing.T) {
	b, ev := newFakeBuilder(), &events{}
	js := New(Options{Templates: catalog{analytics}, Builder: b, Audit: ev})
	defer js.Close()
	by := Requester{KeyID: "key_admin", WorkspaceID: "ws_1"}

	// The first build succeeds; the template asks for a golden checkpoint,
	// which a daemon without a tier that restores cannot make.
	j, _, _ := js.Start("analytics", false, by)
	<-b.started
	b.release <- struct{}{}
	if done := wait(t, js, j.ID); done.State != client.BuildDone || done.Golden == "" || done.Golden[:5] != "cold:" {
		t.Fatalf("first build: got %+v, want done, starting cold", done)
	}

	// A cancelled build keeps the previous one.
	j, _, _ = js.Start("analytics", false, by)
	<-b.started
	got, err := js.Cancel(t.Context(), "analytics", j.ID, "key_admin")
	if err != nil || got.State != client.BuildCancelled || !errors.As(got.Err, new(*Cancelled)) {
		t.Fatalf("Cancel: got %+v, %v; want cancelled", got, err)
	}
	if cur, _ := b.Current("analytics"); cur == nil || cur.Digest != "sha256:1" {
		t.Errorf("current build after the cancel: got %+v, want sha256:1", cur)
	}
	e := ev.last(t)
	var failed audit.TemplateBuildFailedEvent
	if err := json.Unmarshal(e.Data, &failed); err != nil || e.Type != audit.TemplateBuildFailed || !failed.Cancelled || failed.Stage != "fetching" {
		t.Errorf("audit of the cancel: got %s %s (%v)", e.Type, e.Data, err)
	}

	// A failed build says why.
	b.mu.Lock()
	b.fail = errdefs.Publicf(`debian_packages: "python3-nope": no such package: %w`, errdefs.ErrInvalidArgument)
	b.mu.Unlock()
	j, _, _ = js.Start("analytics", false, by)
	<-b.started
	b.release <- struct{}{}
	done := wait(t, js, j.ID)
	if done.State != client.BuildFailed || !errdefs.IsInvalidArgument(done.Err) || done.Build != nil {
		t.Errorf("failed build: got %+v, want failed with the builder's error", done)
	}
	failed = audit.TemplateBuildFailedEvent{}
	if err := json.Unmarshal(ev.last(t).Data, &failed); err != nil || failed.Cancelled || failed.Error != `debian_packages: "python3-nope": no such package: invalid argument` {
		t.Errorf("audit of the failure: got %+v (%v)", failed, err)
	}
}

func TestJobsKept(t *testing.T) {
	b := newFakeBuilder()
	close(b.release)
	js := New(Options{Templates: catalog{analytics}, Builder: b, Keep: 2})
	defer js.Close()
	var ids []string
	for range 3 {
		j, _, err := js.Start("analytics", false, Requester{})
		if err != nil {
			t.Fatal(err)
		}
		<-b.started
		wait(t, js, j.ID)
		ids = append(ids, j.ID)
	}
	if _, err := js.Get("analytics", ids[0]); !errdefs.IsNotFound(err) {
		t.Errorf("the oldest of 3 jobs with Keep 2: got %v, want not found", err)
	}
	if j, err := js.Get("analytics", ids[2]); err != nil || j.State != client.BuildDone {
		t.Errorf("the newest job: got %+v, %v", j, err)
	}
	if _, err := js.Get("other", ids[2]); !errdefs.IsNotFound(err) {
		t.Errorf("a job under another template's name: got %v, want not found", err)
	}
	if _, _, err := js.Start("nope", false, Requester{}); !errdefs.IsNotFound(err) {
		t.Errorf("Start of an unknown template: got %v, want not found", err)
	}
}

func TestCloseCancels(t *testing.T) {
	b := newFakeBuilder()
	js := New(Options{Templates: catalog{analytics}, Builder: b})
	j, _, _ := js.Start("analytics", false, Requester{})
	<-b.started
	js.Close()
	got, err := js.Get("analytics", j.ID)
	var c *Cancelled
	if err != nil || got.State != client.BuildCancelled || !errors.As(got.Err, &c) || c.By != "" {
		t.Errorf("job after Close: got %+v, %v; want cancelled by the daemon", got, err)
	}
	if _, _, err := js.Start("analytics", false, Requester{}); !errdefs.IsUnavailable(err) {
		t.Errorf("Start after Close: got %v, want unavailable", err)
	}
}

// blockingGolden is a GoldenMaker that waits for its ctx and fails with it.
type blockingGolden struct{ started chan struct{} }

func (g blockingGolden) MakeGolden(ctx context.Context, template string) error {
	g.started <- struct{}{}
	<-ctx.Done()
	return fmt.Errorf("checkpointing: %w", ctx.Err())
}

// TestGoldenFailsOrIsCancelled checks that once the build is made, the
// template's current one, the job is done and audited as built with its
// diff even when the golden checkpoint then fails or the job is
// cancelled meanwhile: the golden outcome says so.
func TestGoldenFailsOrIsCancelled(t *testing.T) {
	builtEvent := func(ev *events) (model.NewEvent, audit.TemplateBuiltEvent) {
		t.Helper()
		e := ev.last(t)
		var data audit.TemplateBuiltEvent
		if err := json.Unmarshal(e.Data, &data); err != nil {
			t.Fatal(err)
		}
		return e, data
	}
	by := Requester{KeyID: "key_admin", WorkspaceID: "ws_1"}

	t.Run("failed", func(t *testing.T) {
		b, ev := newFakeBuilder(), &events{}
		b.adds = []client.DebianPackage{{Name: "python3-bs4", Version: "4.13"}}
		close(b.release)
		js := New(Options{Templates: catalog{analytics}, Builder: b, Audit: ev,
			Golden: &golden{err: errdefs.Publicf("runsc checkpoint failed: %w", errdefs.ErrUnavailable)}})
		defer js.Close()
		j, _, _ := js.Start("analytics", false, by)
		<-b.started
		done := wait(t, js, j.ID)
		if done.State != client.BuildDone || done.Err != nil || done.Build == nil || done.Build.Digest != "sha256:1" ||
			done.Golden != "failed: runsc checkpoint failed: unavailable" {
			t.Errorf("job: got %+v, want done with sha256:1, its golden failed", done)
		}
		e, data := builtEvent(ev)
		if e.Type != audit.TemplateBuilt || data.Digest != "sha256:1" || data.Golden != done.Golden || !slices.Equal(data.Added, []string{"python3-bs4 4.13", "wheel w 1"}) {
			t.Errorf("audit: got %s %s, want template.built of sha256:1 with its diff and golden failed", e.Type, e.Data)
		}
	})

	t.Run("cancelled", func(t *testing.T) {
		b, ev := newFakeBuilder(), &events{}
		close(b.release)
		g := blockingGolden{started: make(chan struct{}, 1)}
		js := New(Options{Templates: catalog{analytics}, Builder: b, Audit: ev, Golden: g})
		defer js.Close()
		j, _, _ := js.Start("analytics", false, by)
		<-b.started
		<-g.started
		got, err := js.Cancel(t.Context(), "analytics", j.ID, "key_admin")
		if err != nil || got.State != client.BuildDone || got.Err != nil || got.Build == nil || got.Build.Digest != "sha256:1" || got.Golden != "cancelled" {
			t.Errorf("Cancel during golden: got %+v, %v; want done with sha256:1, its golden cancelled", got, err)
		}
		if cur, _ := b.Current("analytics"); cur == nil || cur.Digest != "sha256:1" {
			t.Errorf("current build: got %+v, want sha256:1", cur)
		}
		e, data := builtEvent(ev)
		if e.Type != audit.TemplateBuilt || data.Digest != "sha256:1" || data.Golden != "cancelled" {
			t.Errorf("audit: got %s %s, want template.built of sha256:1, golden cancelled", e.Type, e.Data)
		}
	})
}

// TestPruneAfterBuild checks that a job that made a build prunes after
// it, and one that failed does not.
func TestPruneAfterBuild(t *testing.T) {
	b := newFakeBuilder()
	var mu sync.Mutex
	prunes := 0
	pruned := make(chan struct{}, 4)
	js := New(Options{Templates: catalog{analytics}, Builder: b, Prune: func() error {
		mu.Lock()
		prunes++
		mu.Unlock()
		pruned <- struct{}{}
		return nil
	}})
	defer js.Close()
	j, _, _ := js.Start("analytics", false, Requester{})
	<-b.started
	b.release <- struct{}{}
	wait(t, js, j.ID)
	select {
	case <-pruned:
	case <-time.After(10 * time.Second):
		t.Fatal("no prune after a build")
	}
	b.mu.Lock()
	b.fail = errors.New("no")
	b.mu.Unlock()
	j, _, _ = js.Start("analytics", false, Requester{})
	<-b.started
	b.release <- struct{}{}
	wait(t, js, j.ID)
	js.Close()
	mu.Lock()
	defer mu.Unlock()
	if prunes != 1 {
		t.Errorf("got %d prunes, want 1: none after the failed build", prunes)
	}
}
