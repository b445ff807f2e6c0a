package engine

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/templates"
	"github.com/stockade-sh/stockade/tools"
	"go.yaml.in/yaml/v3"
)

// templateImages are the installed runtime images, with templates dressed
// from them: a template's image is its base's, its manifest says what a
// build would (image.Store.ResolveTemplate).
type templateImages struct {
	*image.Store
	templates map[string]image.TemplateManifest
	// rebuilt, if set, holds builds that replace templates': the same
	// tree under another digest.
	rebuilt *rebuilds
}

// rebuilds are templates rebuilt since a test began.
type rebuilds struct {
	mu sync.Mutex
	m  map[string]image.TemplateManifest
}

func (r *rebuilds) set(m image.TemplateManifest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]image.TemplateManifest{}
	}
	r.m[m.Name] = m
}

func (f templateImages) ResolveTemplate(name string) (sandbox.Image, image.Manifest, error) {
	m, ok := f.templates[name]
	suffix := ""
	if f.rebuilt != nil {
		f.rebuilt.mu.Lock()
		if r, found := f.rebuilt.m[name]; found {
			m, suffix = r, "-rebuilt"
		}
		f.rebuilt.mu.Unlock()
	}
	if !ok {
		return sandbox.Image{}, image.Manifest{}, errdefs.Publicf("template %q is not built: %w", name, errdefs.ErrNotFound)
	}
	img, err := f.Resolve(m.Base)
	if err != nil {
		return sandbox.Image{}, image.Manifest{}, err
	}
	img.Digest += suffix
	if m.Declaration == "" {
		m.Declaration = templates.Key(declarationOf(m))
	}
	return img, image.Manifest{Name: m.Base, Digest: img.Digest, Template: &m}, nil
}

// declarationOf is the declaration boundTools declares of m: the build of
// m is of it unless m says another.
func declarationOf(m image.TemplateManifest) templates.Template {
	return templates.Template{Name: m.Name, Base: m.Base, Env: m.Env, Workdir: m.Workdir, Start: m.Start, Ready: m.Ready, Golden: m.Golden}
}

// testTemplates are the templates of these tests: analytics starts with a
// variable and an import, and prints what must reach no caller; broken's
// start raises.
func testTemplates() templateImages {
	return templateImages{Store: image.Open(testenv.DataDir()), templates: map[string]image.TemplateManifest{
		"analytics": {Name: "analytics", Base: "python", Env: map[string]string{"TPL_GREETING": "hello"}, Workdir: "/usr",
			Start: "import json; X = 41\nprint('started, which no caller sees')", Ready: "assert X == 41"},
		"broken": {Name: "broken", Base: "python", Start: "raise ValueError('no model here')"},
		"shelly": {Name: "shelly", Base: "shell", Env: map[string]string{"TPL_GREETING": "hi"}, Start: "X=41; echo started"},
		"nodey": {Name: "nodey", Base: "node", Env: map[string]string{"TPL_GREETING": "hey"}, Workdir: "/usr",
			Start: "var X = 41; const Y = 1; console.log('started')", Ready: "if (X !== 41) throw new Error('no X')"},
		"nodebroken": {Name: "nodebroken", Base: "node", Start: "throw new TypeError('no module here')"},
	}}
}

// boundTools loads tools on tier, one per entry of bound, each running
// the template its entry names (tool name -> template), with those
// templates declared as the manifests say: a record's `template:` binds
// them, as in a configuration.
func boundTools(tb testing.TB, tier string, bound map[string]image.TemplateManifest) Option {
	tb.Helper()
	var decls []map[string]any
	var b strings.Builder
	b.WriteString("tools:\n")
	seen := map[string]bool{}
	for _, tool := range slices.Sorted(maps.Keys(bound)) {
		tm := bound[tool]
		fmt.Fprintf(&b, "  - name: %s\n    input_trust: trusted\n    tier: %s\n    template: %s\n", tool, tier, tm.Name)
		if seen[tm.Name] {
			continue
		}
		seen[tm.Name] = true
		d := map[string]any{"name": tm.Name, "base": tm.Base, "start": tm.Start, "ready": tm.Ready, "golden": tm.Golden}
		if len(tm.Env) > 0 {
			d["env"] = tm.Env
		}
		if tm.Workdir != "" {
			d["workdir"] = tm.Workdir
		}
		decls = append(decls, d)
	}
	data, err := yaml.Marshal(map[string]any{"templates": decls})
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	file := filepath.Join(dir, "templates.yaml")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		tb.Fatal(err)
	}
	set, err := templates.Load(file, templates.Options{DataRoot: dir})
	if err != nil {
		tb.Fatal(err)
	}
	opts := tools.Options{Drivers: DriverCapabilities(), Templates: set}
	file = filepath.Join(dir, "tools.yaml")
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		tb.Fatal(err)
	}
	ts, err := tools.Load(file, opts)
	if err != nil {
		tb.Fatal(err)
	}
	return WithTools(ts, opts)
}

// templateTools are tools analytics, broken, shelly, nodey and
// nodebroken, each of the template of the same name, on tier.
func templateTools(t *testing.T, tier string) []Option {
	bound := map[string]image.TemplateManifest{}
	for name, tm := range testTemplates().templates {
		bound[name] = tm
	}
	return []Option{boundTools(t, tier, bound)}
}

// runcTemplateEngine is an engine over runc with the templates' tools.
func runcTemplateEngine(t *testing.T, opts ...Option) *Engine {
	return runcTemplateEngineOver(t, testTemplates(), opts...)
}

func runcTemplateEngineOver(t *testing.T, imgs templateImages, opts ...Option) *Engine {
	t.Helper()
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	d, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(map[string]sandbox.Driver{"runc": d}, "runc", imgs, sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
		append(templateTools(t, "container"), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// seesTemplate is python code that prints what a template's Start and
// Env and Workdir gave it; wantTemplate is what it prints.
const (
	seesTemplate = "import os\nprint(X + 1, json.dumps([1]), os.environ['TPL_GREETING'], os.getcwd())"
	wantTemplate = "42 [1] hello /usr\n"
)

func openTemplate(t *testing.T, e *Engine, tool, runtime string) (*Session, error) {
	s, err := e.OpenSession(t.Context(), SessionSpec{Tool: tool, Runtime: runtime, Workspace: poolWorkspace,
		Labels: map[string]string{LabelOwner: poolOwner, LabelSession: "ses_" + strings.ReplaceAll(t.Name(), "/", "_")}})
	if err == nil {
		t.Cleanup(func() { _ = s.Close(context.Background()) })
	}
	return s, err
}

// TestTemplateRuns runs a template's tool on runc: a session's first cell,
// and a one-shot, see what Start made (X, json), the template's Env and
// Workdir, and nothing Start printed; a request naming another runtime
// than the template's base is refused naming both; a shell template's
// session has its Start's variable.
func TestTemplateRuns(t *testing.T) {
	e := runcTemplateEngine(t)
	t.Run("session", func(t *testing.T) {
		s, err := openTemplate(t, e, "analytics", "")
		if err != nil {
			t.Fatal(err)
		}
		if s.Runtime.Name != "python" {
			t.Errorf("got runtime %q, want the template's base, python", s.Runtime.Name)
		}
		r := pyCell(t, s, seesTemplate)
		if r.Status != sandbox.StatusSucceeded || r.Stdout != wantTemplate || r.Stderr != "" {
			t.Errorf("got %s, stdout %q, stderr %q, error %+v; want succeeded, %q", r.Status, r.Stdout, r.Stderr, r.Error, wantTemplate)
		}
		// A restarted kernel runs Start again.
		if r := pyCell(t, s, "import os; os._exit(3)"); !r.KernelRestarted {
			t.Fatalf("got %+v, want the kernel restarted", r)
		}
		if r := pyCell(t, s, seesTemplate); r.Stdout != wantTemplate {
			t.Errorf("after a restart: got stdout %q, stderr %q; want %q", r.Stdout, r.Stderr, wantTemplate)
		}
	})
	t.Run("one-shot", func(t *testing.T) {
		res, err := e.Run(t.Context(), Request{Tool: "analytics", Code: []byte(seesTemplate + "\nimport sys; print(sys.argv, __name__)")})
		if err != nil {
			t.Fatal(err)
		}
		want := wantTemplate + "['/tmp/main.py'] __main__\n"
		if res.Status != sandbox.StatusSucceeded || res.Stdout != want || res.Stderr != "" {
			t.Errorf("got %s, stdout %q, stderr %q; want succeeded, %q", res.Status, res.Stdout, res.Stderr, want)
		}
		if res.Runtime != "python" {
			t.Errorf("got runtime %q, want python", res.Runtime)
		}
		res, err = e.Run(t.Context(), Request{Tool: "analytics", Runtime: "python", Code: []byte("import sys\nprint(sys.stdin.read())\nraise SystemExit(4)"), Stdin: []byte("in")})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != sandbox.StatusFailed || res.ExitCode != 4 || res.Stdout != "in\n" {
			t.Errorf("got %s exit %d stdout %q; want failed exit 4 stdout %q", res.Status, res.ExitCode, res.Stdout, "in\n")
		}
	})
	t.Run("other runtime", func(t *testing.T) {
		_, err := openTemplate(t, e, "analytics", "node")
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `"python"`) || !strings.Contains(err.Error(), `"node"`) {
			t.Errorf("a session of runtime node: got %v, want ErrInvalidArgument naming python and node", err)
		}
		_, err = e.Run(t.Context(), Request{Tool: "analytics", Runtime: "shell", Code: []byte("true")})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `"shell"`) {
			t.Errorf("a one-shot of runtime shell: got %v, want ErrInvalidArgument naming shell", err)
		}
	})
	t.Run("node and shell one-shots", func(t *testing.T) {
		for _, c := range []struct{ tool, code, stdin, want string }{
			{"nodey", "console.log(X + Y, process.env.TPL_GREETING, process.cwd(), process.argv.slice(1), require.main === module)", "",
				"42 hey /usr [ '/tmp/main.js' ] true\n"},
			{"shelly", `read l; echo "$((X + 1)) $TPL_GREETING $(pwd) $0 $l"`, "in\n", "42 hi /tmp /tmp/main.sh in\n"},
		} {
			res, err := e.Run(t.Context(), Request{Tool: c.tool, Code: []byte(c.code), Stdin: []byte(c.stdin)})
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != sandbox.StatusSucceeded || res.Stdout != c.want || res.Stderr != "" {
				t.Errorf("%s: got %s, stdout %q, stderr %q; want succeeded, %q", c.tool, res.Status, res.Stdout, res.Stderr, c.want)
			}
		}
		s, err := openTemplate(t, e, "nodey", "")
		if err != nil {
			t.Fatal(err)
		}
		if r := pyCell(t, s, "console.log(X + Y, process.env.TPL_GREETING, process.cwd())"); r.Stdout != "42 hey /usr\n" {
			t.Errorf("a node session: got stdout %q, stderr %q, error %+v; want %q", r.Stdout, r.Stderr, r.Error, "42 hey /usr\n")
		}
		res, err := e.Run(t.Context(), Request{Tool: "shelly", Code: []byte("exit 3")})
		if err != nil || res.ExitCode != 3 {
			t.Errorf("a shell one-shot's exit 3: got %+v, %v; want exit code 3", res, err)
		}
	})
	t.Run("shell session", func(t *testing.T) {
		s, err := openTemplate(t, e, "shelly", "shell")
		if err != nil {
			t.Fatal(err)
		}
		if r := pyCell(t, s, `echo "$((X + 1)) $TPL_GREETING $(pwd)"`); r.Stdout != "42 hi /workspace\n" {
			t.Errorf("got stdout %q, stderr %q; want %q", r.Stdout, r.Stderr, "42 hi /workspace\n")
		}
	})
}

// TestTemplateStartFails checks that a template whose Start raises makes
// neither a session nor a one-shot, with an error naming the template and
// what was raised, and leaves no sandbox.
func TestTemplateStartFails(t *testing.T) {
	e := runcTemplateEngine(t)
	check := func(what string, err error) {
		t.Helper()
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `template "broken"`) ||
			!strings.Contains(err.Error(), "start failed") || !strings.Contains(err.Error(), "ValueError: no model here") {
			t.Errorf("%s: got %v, want ErrFailedPrecondition naming the template, its start and the ValueError", what, err)
		}
	}
	_, err := openTemplate(t, e, "broken", "")
	check("a session", err)
	_, err = e.Run(t.Context(), Request{Tool: "broken", Code: []byte("print('never')")})
	check("a one-shot", err)
	_, err = e.Run(t.Context(), Request{Tool: "nodebroken", Code: []byte("console.log('never')")})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `template "nodebroken"`) || !strings.Contains(err.Error(), "TypeError: no module here") {
		t.Errorf("a node one-shot: got %v, want ErrFailedPrecondition naming the template and the TypeError", err)
	}
	e.mem.mu.Lock()
	n := e.mem.used
	e.mem.mu.Unlock()
	if n != 0 {
		t.Errorf("after the failures the budget counts %d bytes, want 0", n)
	}
}

// TestTemplatePools checks that a template's pools, one-shot and session,
// hand out sandboxes whose Start has run: a pooled run and a pooled
// session's first cell see X, the Env and the Workdir.
func TestTemplatePools(t *testing.T) {
	e := runcTemplateEngine(t, WithPools(PoolOptions{Pools: []PoolSpec{{Tool: "analytics", Size: 1, Sessions: 1}}, SessionWorkspace: poolWorkspace}))
	counts := &poolCounts{}
	e.SetPoolObserver(counts)
	stop, err := e.StartPools(context.Background(), map[string]string{LabelOwner: poolOwner})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	waitReady(t, e, 1)
	// Let the one-shot pool's loader finish Start before the run.
	time.Sleep(time.Second)
	res, err := e.Run(t.Context(), Request{Tool: "analytics", Code: []byte(seesTemplate)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != wantTemplate || res.Stderr != "" {
		t.Errorf("pooled one-shot: got stdout %q, stderr %q; want %q", res.Stdout, res.Stderr, wantTemplate)
	}
	if h, _ := counts.get(); h != 1 {
		t.Fatalf("got %d pool hits, want 1: the run was not served by the pool", h)
	}
	s, err := openTemplate(t, e, "analytics", "python")
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := counts.get(); h != 2 {
		t.Fatalf("got %d pool hits, want 2: the session was not served by the pool", h)
	}
	if r := pyCell(t, s, seesTemplate+"\nimport sys; print('pandas' in sys.modules)"); r.Stdout != wantTemplate+"True\n" {
		t.Errorf("pooled session: got stdout %q, stderr %q, error %+v; want %q", r.Stdout, r.Stderr, r.Error, wantTemplate+"True\n")
	}
}

// TestTemplatePoolRebuilt checks that a pool of a template rebuilt since
// its sandboxes were made does not hand them out: every run after the
// rebuild sees the new build's Start, and the pool refills with the new
// build.
func TestTemplatePoolRebuilt(t *testing.T) {
	imgs := testTemplates()
	imgs.rebuilt = &rebuilds{}
	e := runcTemplateEngineOver(t, imgs, WithPools(PoolOptions{Pools: []PoolSpec{{Tool: "analytics", Size: 1}}}))
	counts := &poolCounts{}
	e.SetPoolObserver(counts)
	stop, err := e.StartPools(context.Background(), map[string]string{LabelOwner: poolOwner})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	waitReady(t, e, 1)
	// A build of the same declaration (with --pull, say), whose Start
	// differs only so that the test tells the builds apart.
	m := imgs.templates["analytics"]
	m.Declaration = templates.Key(declarationOf(m))
	m.Start = "import json; X = 98"
	m.Ready = ""
	imgs.rebuilt.set(m)
	run := func() string {
		res, err := e.Run(t.Context(), Request{Tool: "analytics", Code: []byte(seesTemplate)})
		if err != nil {
			t.Fatal(err)
		}
		return res.Stdout
	}
	// Every run after the rebuild sees the new build's Start: the old
	// build's sandbox is never handed out. The first may miss the pool or
	// take a sandbox of the new build that a refill already made; within
	// a few runs, once the pool has refilled, one is served by it.
	for i := 0; ; i++ {
		hits, _ := counts.get()
		if got, want := run(), "99 [1] hello /usr\n"; got != want {
			t.Fatalf("run %d after the rebuild: got %q, want %q (the new build's start)", i+1, got, want)
		}
		if h, _ := counts.get(); h > hits {
			break
		}
		if i == 4 {
			t.Fatalf("no run of 5 after the rebuild was served by the pool: it did not refill with the new build")
		}
		waitReady(t, e, 1)
		time.Sleep(time.Second)
	}
}

// TestTemplateStale checks that a tool whose template's current build is
// of another declaration than its record carries (a declaration changed
// and not built yet, or a build made by hand of another) is refused, a
// one-shot and a session, with ErrFailedPrecondition saying the template
// is stale and how to build it; that its pools are left out rather than
// failing the start; and that a build of its declaration runs again.
func TestTemplateStale(t *testing.T) {
	imgs := testTemplates()
	imgs.rebuilt = &rebuilds{}
	e := runcTemplateEngineOver(t, imgs, WithPools(PoolOptions{Pools: []PoolSpec{{Tool: "analytics", Size: 1}}}))
	m := imgs.templates["analytics"]
	m.Start, m.Ready = "import json; X = 98", ""
	imgs.rebuilt.set(m)
	check := func(what string, err error) {
		t.Helper()
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), `template "analytics" is stale`) ||
			!strings.Contains(err.Error(), "stockade template build analytics") {
			t.Errorf("%s: got %v, want ErrFailedPrecondition saying analytics is stale", what, err)
		}
		if msg, ok := errdefs.PublicMessage(err); !ok || !strings.Contains(msg, "is stale") {
			t.Errorf("%s: public message %q, %v; want the stale sentence", what, msg, ok)
		}
	}
	_, err := e.Run(t.Context(), Request{Tool: "analytics", Code: []byte(seesTemplate)})
	check("a one-shot", err)
	_, err = openTemplate(t, e, "analytics", "")
	check("a session", err)
	stop, err := e.StartPools(context.Background(), map[string]string{LabelOwner: poolOwner})
	if err != nil {
		t.Fatalf("StartPools with a stale template's pool: %v, want it left out", err)
	}
	e.poolsMu.Lock()
	n := len(e.pools)
	e.poolsMu.Unlock()
	stop()
	if n != 0 {
		t.Errorf("got %d pools, want the stale template's left out", n)
	}
	// Built again, of the tool's declaration.
	m.Declaration = templates.Key(declarationOf(imgs.templates["analytics"]))
	imgs.rebuilt.set(m)
	res, err := e.Run(t.Context(), Request{Tool: "analytics", Code: []byte(seesTemplate)})
	if err != nil || res.Stdout != "99 [1] hello /usr\n" {
		t.Errorf("after the build: got %+v, %v; want the new build's start", res, err)
	}
}
