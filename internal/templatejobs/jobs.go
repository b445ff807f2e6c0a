// Package templatejobs runs the daemon's builds of templates' images as
// jobs (README, "Templates"): one build per template at a time, its
// progress streamed to whoever watches, cancellable, audited, and the
// outcome of the last jobs kept for those who ask later. After a build the
// template asks a golden checkpoint of (Golden), it makes one where the
// daemon's tier can restore it. The HTTP API (package api) serves it;
// `stockade template build` without a daemon calls the image store
// directly.
//
//	jobs := templatejobs.New(templatejobs.Options{Templates: set, Builder: b, Golden: eng, Audit: st})
//	defer jobs.Close()
//	j, joined, err := jobs.Start("analytics", false, templatejobs.Requester{KeyID: p.KeyID, WorkspaceID: p.WorkspaceID})
package templatejobs

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/stockade-sh/stockade/audit"
	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/templates"
)

// Catalog is the daemon's declared templates (*templates.Set).
type Catalog interface {
	Templates() []templates.Template
	Get(name string) (templates.Template, error)
}

// Builder builds templates' images: image.Store's BuildTemplate and
// ResolveTemplate seen through the wire's SBOM (see StoreBuilder).
type Builder interface {
	// Build builds t's image and makes it t's current build; cacheHit says
	// that the declaration and its inputs were built before and nothing
	// was done. A failed or cancelled build leaves the current one as it
	// was. progress is called as the build moves on.
	Build(ctx context.Context, t templates.Template, pull bool, progress func(image.Progress)) (b client.TemplateBuild, cacheHit bool, err error)
	// Current returns the template's current build, nil when it has none.
	Current(name string) (*client.TemplateBuild, error)
}

// GoldenMaker makes a template's golden checkpoint (engine.MakeGolden).
// It fails with errdefs.ErrFailedPrecondition where the daemon's tier
// cannot restore checkpoints: the template then starts cold.
type GoldenMaker interface {
	MakeGolden(ctx context.Context, template string) error
}

// Auditor appends audit events (the store).
type Auditor interface {
	AppendEvent(ctx context.Context, e model.NewEvent) (model.Event, error)
}

// Options configure Jobs.
type Options struct {
	// Templates are the declared templates; nil is none.
	Templates Catalog
	// Builder builds them. Required.
	Builder Builder
	// Golden makes golden checkpoints; nil means the daemon cannot, and
	// templates asking for one start cold.
	Golden GoldenMaker
	// Audit records template.built and template.build_failed; nil records
	// nothing (tests).
	Audit Auditor
	// Keep is how many ended jobs are kept for Get and Watch; zero is 32.
	Keep int
	// Describe is what the audit event of a failed build says of its
	// error, and whether that hides the error's message (which is then
	// logged): the API's sentence for a client (api.Public). Nil is the
	// error's public message (errdefs.PublicMessage), else "internal
	// error".
	Describe func(error) (msg string, hidden bool)
	// Logger receives what a job could not audit; nil is slog.Default().
	Logger *slog.Logger
	// Prune, if set, runs after each job that made a build (Pruner.Prune):
	// the builds it replaced go once no sandbox uses them.
	Prune func() error
}

// Requester is who asks for a build: a key and its workspace, whose
// audit chain records it.
type Requester struct {
	KeyID, WorkspaceID string
}

// Job is a build job as it is at one moment.
type Job struct {
	ID, Template string
	State        client.BuildState
	Pull         bool
	By           Requester
	Created      time.Time
	// Ended is zero while the job runs.
	Ended    time.Time
	Progress image.Progress
	// Seq counts the progress reports so far: a watcher sends a report
	// when it has grown.
	Seq int
	// Build is the build made, once the job is done.
	Build    *client.TemplateBuild
	CacheHit bool
	// Golden says what became of the golden checkpoint, when the template
	// asks for one: "made"; "cold: <why>" where the daemon cannot make one;
	// "failed: <why>" or "cancelled" when making it failed or the job was
	// cancelled meanwhile. The job is done all the same: the build is the
	// template's current one, and without a checkpoint it starts cold.
	Golden string
	// Err is why the job failed or was cancelled (a *Cancelled).
	Err error
}

// Cancelled is the error of a job that a key, or the daemon's shutdown,
// cancelled.
type Cancelled struct {
	// By is the key that cancelled it; empty is the daemon stopping.
	By string
}

// Public says that its message is fit for a client (errdefs.Publicer).
func (c *Cancelled) Public() bool { return true }

func (c *Cancelled) Error() string {
	if c.By == "" {
		return "the build was cancelled: the daemon is stopping"
	}
	return "the build was cancelled by key " + c.By
}

// Jobs runs build jobs. It is safe for concurrent use; Close cancels the
// running jobs and waits for them.
type Jobs struct {
	o      Options
	ctx    context.Context
	stop   context.CancelCauseFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	closed bool
	// running maps a template to its running job; jobs holds every job
	// running or kept, by id; ended lists the ended ones, oldest first.
	running map[string]*job
	jobs    map[string]*job
	ended   []string
	// last maps a template to its job that ended last.
	last map[string]*job
}

// job is one job and those watching it.
type job struct {
	// template is the job's template, as in snap (which is read under mu).
	template string
	mu       sync.Mutex
	snap     Job
	cancel   context.CancelCauseFunc
	done     chan struct{}
	watchers map[chan struct{}]struct{}
}

// New returns the jobs of o.
func New(o Options) *Jobs {
	if o.Keep <= 0 {
		o.Keep = 32
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Describe == nil {
		o.Describe = func(err error) (string, bool) {
			if msg, ok := errdefs.PublicMessage(err); ok {
				return msg, msg != err.Error()
			}
			return "internal error", true
		}
	}
	ctx, stop := context.WithCancelCause(context.Background())
	return &Jobs{o: o, ctx: ctx, stop: stop, running: map[string]*job{}, jobs: map[string]*job{}, last: map[string]*job{}}
}

// Close cancels the running jobs and waits for them to end.
func (js *Jobs) Close() {
	js.mu.Lock()
	js.closed = true
	js.mu.Unlock()
	js.stop(&Cancelled{})
	js.wg.Wait()
}

// Templates returns the declared templates, each with its current build
// and running job.
func (js *Jobs) Templates() ([]Status, error) {
	var out []Status
	if js.o.Templates == nil {
		return out, nil
	}
	for _, t := range js.o.Templates.Templates() {
		st, err := js.status(t)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// Template returns one declared template with its current build and
// running job; an unknown name is ErrNotFound.
func (js *Jobs) Template(name string) (Status, error) {
	t, err := js.lookup(name)
	if err != nil {
		return Status{}, err
	}
	return js.status(t)
}

// Status is a declared template with its current build and running job.
type Status struct {
	Template templates.Template
	// Build is the current build; nil when there is none.
	Build *client.TemplateBuild
	// Running is the job building it, if any; Last is the last job of
	// the template that ended, if the daemon keeps it (its outcome, its
	// golden checkpoint).
	Running, Last *Job
}

// Stale reports whether the current build is not of the declaration (or
// there is none).
func (s Status) Stale() bool {
	return s.Build == nil || s.Build.Declaration != DeclarationKey(s.Template)
}

func (js *Jobs) status(t templates.Template) (Status, error) {
	b, err := js.o.Builder.Current(t.Name)
	if err != nil {
		return Status{}, fmt.Errorf("reading the current build of template %q: %w", t.Name, err)
	}
	st := Status{Template: t, Build: b}
	js.mu.Lock()
	j, last := js.running[t.Name], js.last[t.Name]
	js.mu.Unlock()
	if j != nil {
		snap := j.snapshot()
		st.Running = &snap
	}
	if last != nil {
		snap := last.snapshot()
		st.Last = &snap
	}
	return st, nil
}

func (js *Jobs) lookup(name string) (templates.Template, error) {
	if js.o.Templates == nil {
		return templates.Template{}, errdefs.Publicf("no template %q: the daemon has no templates configured: %w", name, errdefs.ErrNotFound)
	}
	return js.o.Templates.Get(name)
}

// Start starts a build of the template and returns its job. If a build
// of the template runs already, Start starts none and returns that job
// with joined true: one build per template at a time, and a second
// request watches the first (whose pull it keeps).
func (js *Jobs) Start(name string, pull bool, by Requester) (j Job, joined bool, err error) {
	t, err := js.lookup(name)
	if err != nil {
		return Job{}, false, err
	}
	js.mu.Lock()
	defer js.mu.Unlock()
	if js.closed {
		return Job{}, false, errdefs.Publicf("the daemon is stopping: %w", errdefs.ErrUnavailable)
	}
	if r := js.running[name]; r != nil {
		return r.snapshot(), true, nil
	}
	ctx, cancel := context.WithCancelCause(js.ctx)
	nj := &job{template: name, cancel: cancel, done: make(chan struct{}), watchers: map[chan struct{}]struct{}{},
		snap: Job{ID: "tb_" + rand.Text()[:16], Template: name, State: client.BuildRunning, Pull: pull, By: by, Created: time.Now().UTC()}}
	js.running[name], js.jobs[nj.snap.ID] = nj, nj
	js.wg.Add(1)
	go func() {
		defer js.wg.Done()
		js.run(ctx, nj, t)
	}()
	return nj.snapshot(), false, nil
}

// get returns the job id of the template.
func (js *Jobs) get(name, id string) (*job, error) {
	js.mu.Lock()
	j := js.jobs[id]
	js.mu.Unlock()
	if j == nil || j.template != name {
		return nil, errdefs.Publicf("template %q has no build job %q (the daemon keeps the last %d): %w", name, id, js.o.Keep, errdefs.ErrNotFound)
	}
	return j, nil
}

// Get returns the build job id of the template.
func (js *Jobs) Get(name, id string) (Job, error) {
	j, err := js.get(name, id)
	if err != nil {
		return Job{}, err
	}
	return j.snapshot(), nil
}

// Cancel cancels the build job id of the template, by the key by, and
// returns it once it has ended (or ctx has: then as it is). A job that
// has ended is returned as it is.
func (js *Jobs) Cancel(ctx context.Context, name, id, by string) (Job, error) {
	j, err := js.get(name, id)
	if err != nil {
		return Job{}, err
	}
	j.cancel(&Cancelled{By: by})
	select {
	case <-j.done:
	case <-ctx.Done():
	}
	return j.snapshot(), nil
}

// Watch is a subscription to a job's changes.
type Watch struct {
	// C receives a value when the job has changed since it was last read;
	// changes in between are merged. It is never closed.
	C     <-chan struct{}
	j     *job
	c     chan struct{}
	close func()
}

// Job returns the job as it is now.
func (w *Watch) Job() Job { return w.j.snapshot() }

// Close ends the subscription.
func (w *Watch) Close() { w.close() }

// Watch subscribes to the changes of the build job id of the template.
// C has a value at once, so that the first read shows the job as it is.
func (js *Jobs) Watch(name, id string) (*Watch, error) {
	j, err := js.get(name, id)
	if err != nil {
		return nil, err
	}
	c := make(chan struct{}, 1)
	c <- struct{}{}
	j.mu.Lock()
	j.watchers[c] = struct{}{}
	j.mu.Unlock()
	return &Watch{C: c, j: j, c: c, close: func() {
		j.mu.Lock()
		delete(j.watchers, c)
		j.mu.Unlock()
	}}, nil
}

func (j *job) snapshot() Job {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.snap
}

// update changes the job with f and tells the watchers.
func (j *job) update(f func(*Job)) {
	j.mu.Lock()
	defer j.mu.Unlock()
	f(&j.snap)
	for c := range j.watchers {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// run runs the job to its end.
func (js *Jobs) run(ctx context.Context, j *job, t templates.Template) {
	defer j.cancel(nil)
	prev, err := js.o.Builder.Current(t.Name)
	var b client.TemplateBuild
	var hit bool
	if err == nil {
		b, hit, err = js.o.Builder.Build(ctx, t, j.snapshot().Pull, func(p image.Progress) {
			j.update(func(s *Job) { s.Progress, s.Seq = p, s.Seq+1 })
		})
	}
	// Once Build returned, the build is the template's current one: the
	// job is done and audited as built whatever becomes of the golden
	// checkpoint, which Golden says.
	golden := ""
	if err == nil && t.Golden {
		golden = js.golden(ctx, j, t)
	}
	state := client.BuildDone
	var c *Cancelled
	switch {
	case err != nil && errors.As(context.Cause(ctx), &c):
		state, err = client.BuildCancelled, c
	case err != nil:
		state = client.BuildFailed
	}
	final := j.snapshot()
	final.State, final.Ended, final.Err, final.CacheHit, final.Golden = state, time.Now().UTC(), err, hit, golden
	if state == client.BuildDone {
		final.Build = &b
	}
	js.audit(final, t, prev)
	// The template is free for the next build before anyone learns that
	// this one ended: a request that follows starts a new one.
	js.mu.Lock()
	delete(js.running, t.Name)
	js.last[t.Name] = j
	js.ended = append(js.ended, final.ID)
	for len(js.ended) > js.o.Keep {
		if old := js.jobs[js.ended[0]]; old != nil && js.last[old.template] == old {
			delete(js.last, old.template)
		}
		delete(js.jobs, js.ended[0])
		js.ended = js.ended[1:]
	}
	js.mu.Unlock()
	j.update(func(s *Job) { *s = final })
	close(j.done)
	if state == client.BuildDone && js.o.Prune != nil {
		if err := js.o.Prune(); err != nil {
			js.o.Logger.Error("pruning after a template build", "template", t.Name, "job", final.ID, "err", err)
		}
	}
}

// golden makes the template's golden checkpoint where the daemon can, and
// says what became of it: "made", "cold: ..." where the template starts
// cold by design, "failed: ..." or "cancelled" (then it starts cold too).
func (js *Jobs) golden(ctx context.Context, j *job, t templates.Template) string {
	if js.o.Golden == nil {
		return "cold: the daemon has no tier that can restore a checkpoint"
	}
	j.update(func(s *Job) {
		s.Progress = image.Progress{Runtime: t.Name, Stage: "golden", Elapsed: time.Since(s.Created)}
		s.Seq++
	})
	err := js.o.Golden.MakeGolden(ctx, t.Name)
	var c *Cancelled
	switch {
	case err == nil:
		return "made"
	case ctx.Err() != nil && errors.As(context.Cause(ctx), &c):
		return "cancelled"
	case errdefs.IsFailedPrecondition(err) && ctx.Err() == nil:
		msg, ok := errdefs.PublicMessage(err)
		if !ok {
			msg = "the daemon's tier cannot restore a checkpoint"
		}
		return "cold: " + msg
	}
	msg, hidden := js.o.Describe(err)
	if hidden {
		js.o.Logger.Warn("making a golden checkpoint", "template", t.Name, "job", j.snapshot().ID, "err", err)
	}
	return "failed: " + msg
}

// audit records the job's end in the chain of its requester's workspace.
func (js *Jobs) audit(j Job, t templates.Template, prev *client.TemplateBuild) {
	if js.o.Audit == nil {
		return
	}
	meta := audit.Meta{WorkspaceID: j.By.WorkspaceID, Actor: j.By.KeyID}
	var ev audit.Event
	if j.State == client.BuildDone {
		meta.Reason = "template image built"
		if j.CacheHit {
			meta.Reason = "template image unchanged: a cache hit"
		}
		e := audit.TemplateBuiltEvent{Meta: meta, Template: t.Name, Digest: j.Build.Digest, Key: j.Build.Key,
			Declaration: j.Build.Declaration, CacheHit: j.CacheHit, Pull: j.Pull, Golden: j.Golden, Job: j.ID,
			SBOM: audit.TemplateSBOM{Debian: len(j.Build.SBOM.Debian), Wheels: len(j.Build.SBOM.Wheels),
				NPM: len(j.Build.SBOM.NPM), Files: len(j.Build.SBOM.Files)}}
		if prev != nil {
			e.PreviousDigest = prev.Digest
			e.Added, e.Removed = sbomDiff(prev.SBOM, j.Build.SBOM)
		} else {
			e.Added, _ = sbomDiff(client.SBOM{}, j.Build.SBOM)
		}
		ev = e
	} else {
		meta.Reason = "template build " + string(j.State)
		msg, hidden := js.o.Describe(j.Err)
		if hidden {
			js.o.Logger.Warn("template build failed", "template", t.Name, "job", j.ID, "err", j.Err)
		}
		ev = audit.TemplateBuildFailedEvent{Meta: meta, Template: t.Name, Declaration: DeclarationKey(t), Pull: j.Pull,
			Stage: j.Progress.Stage, Error: msg, Cancelled: j.State == client.BuildCancelled, Job: j.ID}
	}
	// The job has ended: its audit does not end with the request that
	// started it, only with the daemon.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(js.ctx), 10*time.Second)
	defer cancel()
	if _, err := js.o.Audit.AppendEvent(ctx, audit.NewEvent(ev)); err != nil {
		js.o.Logger.Error("auditing a template build", "template", t.Name, "job", j.ID, "err", err)
	}
}

// sbomDiff lists what b has that a has not (added) and the reverse: Debian
// packages, wheels and npm packages as "name version", files as their
// target.
func sbomDiff(a, b client.SBOM) (added, removed []string) {
	entries := func(s client.SBOM) []string {
		var out []string
		for _, p := range s.Debian {
			out = append(out, p.Name+" "+p.Version)
		}
		for _, w := range s.Wheels {
			out = append(out, "wheel "+w.Name+" "+w.Version)
		}
		for _, n := range s.NPM {
			out = append(out, "npm "+n.Name+" "+n.Version)
		}
		for _, f := range s.Files {
			out = append(out, "file "+f.Target)
		}
		return out
	}
	ea, eb := entries(a), entries(b)
	for _, e := range eb {
		if !slices.Contains(ea, e) {
			added = append(added, e)
		}
	}
	for _, e := range ea {
		if !slices.Contains(eb, e) {
			removed = append(removed, e)
		}
	}
	return added, removed
}
