package api_test

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/capability"
	"github.com/stockade-sh/stockade/client"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/gvisor"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/internal/templatejobs"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/internal/wiring"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/templates"
	"github.com/stockade-sh/stockade/tools"
	"github.com/stockade-sh/stockade/wire"
)

// buildWheel writes a pure-python wheel (PEP 427) of project name at
// version into dir, its module printing nothing and holding VERSION, and
// returns its file name and SHA-256: what an operator's wheelhouse holds.
func buildWheel(t *testing.T, dir, name, version string) (file, sum string) {
	t.Helper()
	distInfo := name + "-" + version + ".dist-info"
	files := []struct{ path, body string }{
		{name + "/__init__.py", fmt.Sprintf("VERSION = %q\n\ndef greet(who):\n    return 'hello ' + who\n", version)},
		{distInfo + "/METADATA", fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\n", name, version)},
		{distInfo + "/WHEEL", "Wheel-Version: 1.0\nGenerator: stockade-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	for _, f := range files {
		w, err := zw.Create(f.path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = w.Write([]byte(f.body))
		h := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.path, base64.RawURLEncoding.EncodeToString(h[:]), len(f.body))
	}
	record.WriteString(distInfo + "/RECORD,,\n")
	w, err := zw.Create(distInfo + "/RECORD")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = w.Write([]byte(record.String()))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	file = fmt.Sprintf("%s-%s-py3-none-any.whl", name, version)
	if err := os.WriteFile(filepath.Join(dir, file), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(buf.Bytes())
	return file, hex.EncodeToString(h[:])
}

// linkedImageStore returns an image store in a temporary directory whose
// images of the runtimes names are the installed ones, linked, never
// written: template builds copy their base.
func linkedImageStore(t *testing.T, names ...string) string {
	t.Helper()
	root := t.TempDir()
	// runc's sandboxes, in a user namespace, traverse it to their image.
	for _, d := range []string{filepath.Dir(root), root} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"images/sha256", "images/refs"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o711); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range names {
		img := testenv.Image(t, n)
		hex := strings.TrimPrefix(img.Digest, "sha256:")
		if err := os.Symlink(filepath.Join(testenv.DataDir(), "images", "sha256", hex), filepath.Join(root, "images", "sha256", hex)); err != nil {
			t.Fatal(err)
		}
		ref, err := os.ReadFile(filepath.Join(testenv.DataDir(), "images", "refs", n))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "images", "refs", n), ref, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// templateDaemon is a daemon serving templates from files: its store,
// engine (runc and gVisor, sessions with the runtimes' kernels), service,
// build jobs and API.
type templateDaemon struct {
	t       *testing.T
	url     string
	svc     *capability.Service
	jobs    *templatejobs.Jobs
	srv     *httptest.Server
	gvState string // the gVisor driver's state directory
}

// close stops the daemon and checks that no runtime process of its
// gVisor driver is left (a golden template's sandbox created ahead ends
// with the service).
func (d *templateDaemon) close() {
	d.srv.Close()
	d.jobs.Close()
	if err := d.svc.Close(context.Background()); err != nil {
		d.t.Errorf("closing the service: %v", err)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), d.gvState) {
			d.t.Errorf("left running after the service closed: %s", strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}

// startTemplateDaemon starts a daemon on st over the image store images
// with the templates and tools files given.
func startTemplateDaemon(t *testing.T, st store.Store, images, dataRoot, wheelhouse, templatesFile, toolsFile, goldenDir string) *templateDaemon {
	t.Helper()
	set, err := templates.Load(templatesFile, templates.Options{DataRoot: dataRoot})
	if err != nil {
		t.Fatalf("loading the templates: %v", err)
	}
	topts := tools.Options{DataRoot: dataRoot, Drivers: wiring.DriverCapabilities(config.Default()), EgressSupported: true, Templates: set}
	ts, err := tools.Load(toolsFile, topts)
	if err != nil {
		t.Fatalf("loading the tools: %v", err)
	}
	rc, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	gvState := t.TempDir()
	gv, err := gvisor.New(gvisor.Config{StateDir: gvState, GuestPath: testenv.Guest(t), Shim: testenv.Shim(t)})
	if err != nil {
		t.Fatal(err)
	}
	imgs := image.Open(images)
	eng, err := engine.New(map[string]sandbox.Driver{"runc": rc, "gvisor": gv}, "gvisor", imgs, sandbox.DefaultLimits(), sandbox.DefaultCeiling(),
		engine.WithTools(ts, topts), engine.WithGolden(engine.GoldenOptions{Dir: goldenDir, Workspace: 256 << 20}))
	if err != nil {
		t.Fatal(err)
	}
	svc := capability.NewService(eng, st, capability.ServiceOptions{})
	if err := svc.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	jo := templatejobs.Options{Templates: set, Audit: st,
		Builder:  templatejobs.StoreBuilder{Store: imgs, Options: image.TemplateOptions{Sources: image.TemplateSources{Wheelhouse: wheelhouse, DataRoot: dataRoot}, StateDir: t.TempDir()}},
		Describe: func(err error) (string, bool) { _, d, hidden := api.Public(err); return d.Message, hidden }}
	jo.Golden = eng
	d := &templateDaemon{t: t, svc: svc, jobs: templatejobs.New(jo), gvState: gvState}
	d.srv = httptest.NewServer(api.New(svc, st, api.Options{Templates: d.jobs}))
	d.url = d.srv.URL
	return d
}

// openTemplateSession opens a session with the agent key; the test
// deletes it.
func openTemplateSession(e *env, req capability.CreateSessionRequest) wire.Session {
	e.t.Helper()
	var v wire.Session
	e.do("POST", "/v1/sessions", e.agent, req).want(e.t, http.StatusCreated).decode(e.t, &v)
	return v
}

// buildAndWait builds the template through the API and follows its events
// to the end, which it returns with the progress stages seen.
func buildAndWait(t *testing.T, c *client.Client, name string) (client.TemplateBuildJob, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	job, err := c.BuildTemplate(ctx, name, client.BuildRequest{})
	if err != nil {
		t.Fatalf("building %s: %v", name, err)
	}
	s, err := c.WatchTemplateBuild(ctx, name, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var stages []string
	for {
		ev, err := s.Next()
		if err != nil {
			t.Fatalf("the events of %s's build after %q: %v", name, stages, err)
		}
		if ev.Final() {
			return ev.Job, stages
		}
		if len(stages) == 0 || stages[len(stages)-1] != ev.Progress.Stage {
			stages = append(stages, ev.Progress.Stage)
		}
	}
}

const e2eTools = `
tools:
  - name: analyst
    input_trust: trusted
    tier: container
    template: analytics
  - name: analyst-gvisor
    input_trust: untrusted
    tier: gvisor
    template: analytics
  - name: web
    input_trust: untrusted
    tier: gvisor
    template: web
  - name: warm
    input_trust: untrusted
    tier: gvisor
    template: warm
`

// TestTemplatesEndToEnd is the first "done when": a template
// analytics (Debian packages, a wheel of the operator's wheelhouse, a
// file, start: import sympy) and a node template with an npm package,
// built through the API as jobs with their progress streamed; sessions of
// them on runc and gVisor import everything; the template lists its SBOM
// with versions; a second build is a cache hit; a build that fails leaves
// the previous one serving; a declaration that adds a package builds a new
// digest, audited with the diff, and its tools await re-approval and,
// until the build, are refused as stale.
func TestTemplatesEndToEnd(t *testing.T) {
	requireSandboxes(t)
	testenv.RequiresBinary(t, "runsc")
	testenv.RequiresBinary(t, "apt-get")
	images := linkedImageStore(t, "python", "node")
	work := t.TempDir()
	dataRoot, wheelhouse := filepath.Join(work, "data"), filepath.Join(work, "wheelhouse")
	for _, d := range []string{dataRoot, wheelhouse} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	wheel, wheelSum := buildWheel(t, wheelhouse, "tinyutil", "1.2.0")
	if err := os.WriteFile(filepath.Join(dataRoot, "rates.json"), []byte(`{"eur": 0.92}`), 0o644); err != nil {
		t.Fatal(err)
	}
	declare := func(debian string) string {
		file := filepath.Join(work, "templates.yaml")
		yaml := fmt.Sprintf(`templates:
  - name: analytics
    base: python
    debian_packages: [%s]
    python_wheels: [{file: %s, sha256: %s}]
    files: [{source: %s, target: /opt/rates.json}]
    env: {RATES: /opt/rates.json}
    start: "import sympy"
    ready: "assert sympy.sqrt(4) == 2"
  - name: web
    base: node
    npm_packages: [left-pad@1.3.0]
  - name: warm
    base: python
    start: "import os, sympy; x = sympy.Symbol('x'); BOOT = os.urandom(8).hex()"
    golden: true
`, debian, wheel, wheelSum, filepath.Join(dataRoot, "rates.json"))
		if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		return file
	}
	goldenDir := filepath.Join(work, "golden")
	toolsFile := filepath.Join(work, "tools.yaml")
	if err := os.WriteFile(toolsFile, []byte(e2eTools), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := storeopen.Open(t.Context(), "sqlite:"+filepath.Join(work, "stockade.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ws, err := st.CreateWorkspace(t.Context(), "e2e", nil)
	if err != nil {
		t.Fatal(err)
	}
	admin, agent, approver := "sk_test_admin_"+rand.Text(), "sk_test_agent_"+rand.Text(), "sk_test_approver_"+rand.Text()
	for key, role := range map[string]model.Role{admin: model.RoleAdmin, agent: model.RoleAgent, approver: model.RoleApprover} {
		if _, err := st.CreateAPIKey(t.Context(), store.NewAPIKey{WorkspaceID: ws.ID, Role: role, Hash: model.HashKey(key), Name: string(role)}); err != nil {
			t.Fatal(err)
		}
	}
	pol, err := st.GetPolicy(t.Context(), ws.ID)
	if err != nil {
		t.Fatal(err)
	}
	pol.Approval, pol.ToolChanges = model.ApprovalNone, model.ToolChangesRequireReview
	if _, err := st.SetPolicy(t.Context(), ws.ID, pol, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GrantCredits(t.Context(), ws.ID, 1000, "e2e", nil); err != nil {
		t.Fatal(err)
	}

	d := startTemplateDaemon(t, st, images, dataRoot, wheelhouse, declare("python3-bs4, python3-yaml"), toolsFile, goldenDir)
	defer func() { d.close() }()
	adminC, err := client.New(d.url, admin)
	if err != nil {
		t.Fatal(err)
	}

	// The builds, as jobs with their progress.
	start := time.Now()
	job, stages := buildAndWait(t, adminC, "analytics")
	if job.State != client.BuildDone || job.Build == nil {
		t.Fatalf("building analytics: got %+v (error %+v) after stages %q", job, job.Error, stages)
	}
	t.Logf("analytics built in %v, stages %q: %s", time.Since(start).Round(time.Millisecond), stages, job.Build.Digest)
	if !slices.Contains(stages, "installing") || !slices.Contains(stages, "hashing") {
		t.Errorf("progress stages: got %q, want installing and hashing among them", stages)
	}
	digest := job.Build.Digest

	// The SBOM, with versions and hashes.
	tpl, err := adminC.Template(t.Context(), "analytics")
	if err != nil {
		t.Fatal(err)
	}
	sbom := tpl.Build.SBOM
	var debs []string
	for _, p := range sbom.Debian {
		if p.Version == "" {
			t.Errorf("SBOM: %s without a version", p.Name)
		}
		debs = append(debs, p.Name)
	}
	for _, want := range []string{"python3-bs4", "python3-yaml", "python3-soupsieve"} {
		if !slices.Contains(debs, want) {
			t.Errorf("SBOM Debian packages: got %q, want %s among them", debs, want)
		}
	}
	if len(sbom.Wheels) != 1 || sbom.Wheels[0].Name != "tinyutil" || sbom.Wheels[0].Version != "1.2.0" || sbom.Wheels[0].SHA256 != wheelSum {
		t.Errorf("SBOM wheels: got %+v, want tinyutil 1.2.0 %s", sbom.Wheels, wheelSum)
	}
	if len(sbom.Files) != 1 || sbom.Files[0].Target != "/opt/rates.json" || sbom.Files[0].SHA256 == "" {
		t.Errorf("SBOM files: got %+v, want /opt/rates.json with its hash", sbom.Files)
	}
	if tpl.Stale {
		t.Errorf("analytics is stale right after its build")
	}

	// Sessions of the templates, on runc and gVisor, import everything.
	e := &env{t: t, st: st, svc: d.svc, url: d.url, ws: ws, agent: agent, approver: approver, admin: admin}
	for _, tool := range []string{"analyst", "analyst-gvisor"} {
		s := openTemplateSession(e, capability.CreateSessionRequest{Runtime: "python", Tool: tool})
		c := e.cell(agent, s.ID, `import os, json, bs4, yaml, sympy, tinyutil
print(tinyutil.greet("analytics"), tinyutil.VERSION, yaml.safe_load("a: 1")["a"], bs4.BeautifulSoup("<b>x</b>", "html.parser").b.text,
      sympy.sqrt(16), json.load(open(os.environ["RATES"]))["eur"])`)
		if c.Status != "succeeded" || strings.TrimSpace(c.Stdout) != "hello analytics 1.2.0 1 x 4 0.92" {
			t.Errorf("a cell of %s: got status %s, stdout %q, stderr %q", tool, c.Status, c.Stdout, c.Stderr)
		}
		e.do("DELETE", "/v1/sessions/"+s.ID, agent, nil).want(t, http.StatusOK)
	}

	// A second build of the same declaration is a cache hit.
	start = time.Now()
	again, _ := buildAndWait(t, adminC, "analytics")
	if again.State != client.BuildDone || !again.CacheHit || again.Build.Digest != digest {
		t.Errorf("a second build: got %+v, want a cache hit of %s", again, digest)
	}
	t.Logf("the second build took %v", time.Since(start).Round(time.Millisecond))

	// The node template, with an npm package from the registry.
	webJob, stages := buildAndWait(t, adminC, "web")
	if webJob.State != client.BuildDone || webJob.Build == nil {
		t.Errorf("building web: got %+v (error %+v) after stages %q", webJob, webJob.Error, stages)
	} else if n := webJob.Build.SBOM.NPM; len(n) != 1 || n[0].Name != "left-pad" || n[0].Version != "1.3.0" || !strings.HasPrefix(n[0].Integrity, "sha512-") {
		t.Errorf("web's npm packages: got %+v, want left-pad 1.3.0 with its integrity", n)
	}
	if webJob.State == client.BuildDone {
		ws2 := openTemplateSession(e, capability.CreateSessionRequest{Runtime: "node", Tool: "web"})
		if c := e.cell(agent, ws2.ID, `console.log(require("left-pad")("7", 3, "0"))`); c.Status != "succeeded" || strings.TrimSpace(c.Stdout) != "007" {
			t.Errorf("a cell of web: got status %s, stdout %q, stderr %q", c.Status, c.Stdout, c.Stderr)
		}
		e.do("DELETE", "/v1/sessions/"+ws2.ID, agent, nil).want(t, http.StatusOK)
	}

	// A template that asks for a golden checkpoint gets one on gVisor, and
	// a session of it restores it, Start's work done.
	warmJob, stages := buildAndWait(t, adminC, "warm")
	if warmJob.State != client.BuildDone || warmJob.Golden != "made" || !slices.Contains(stages, "golden") {
		t.Errorf("building warm: got %+v (error %+v) after stages %q, want done with a golden checkpoint made", warmJob, warmJob.Error, stages)
	}
	if tpl, err := adminC.Template(t.Context(), "warm"); err != nil || !tpl.Golden || tpl.LastJob == nil || tpl.LastJob.Golden != "made" {
		t.Errorf("the warm template: got %+v, %v; want its last job's golden checkpoint made", tpl, err)
	}
	// Both sessions came from the checkpoint: they have the BOOT Start
	// drew once, where sessions started cold would each draw their own.
	var boots []string
	for range 2 {
		ws3 := openTemplateSession(e, capability.CreateSessionRequest{Runtime: "python", Tool: "warm"})
		if c := e.cell(agent, ws3.ID, "print(sympy.expand((x + 1)**2))"); c.Status != "succeeded" || strings.TrimSpace(c.Stdout) != "x**2 + 2*x + 1" {
			t.Errorf("a cell of warm: got status %s, stdout %q, stderr %q", c.Status, c.Stdout, c.Stderr)
		}
		boots = append(boots, strings.TrimSpace(e.cell(agent, ws3.ID, "print(BOOT)").Stdout))
		e.do("DELETE", "/v1/sessions/"+ws3.ID, agent, nil).want(t, http.StatusOK)
	}
	if len(boots[0]) != 16 || boots[0] != boots[1] {
		t.Errorf("BOOT of two sessions of warm: %q; want one value: both restored from the golden checkpoint", boots)
	}

	// The daemon restarts with a declaration that adds a package that does
	// not exist: the build fails naming it, and the previous build serves.
	d.close()
	d = startTemplateDaemon(t, st, images, dataRoot, wheelhouse, declare("python3-bs4, python3-yaml, python3-no-such-package"), toolsFile, goldenDir)
	adminC, _ = client.New(d.url, admin)
	failed, _ := buildAndWait(t, adminC, "analytics")
	if failed.State != client.BuildFailed || failed.Error == nil || !strings.Contains(failed.Error.Message, "python3-no-such-package") {
		t.Errorf("a build of a package that does not exist: got %+v (error %+v), want failed naming it", failed, failed.Error)
	}
	if tpl, err := adminC.Template(t.Context(), "analytics"); err != nil || tpl.Build == nil || tpl.Build.Digest != digest || !tpl.Stale {
		t.Errorf("after the failed build: got %+v, %v; want %s still serving, stale", tpl, err, digest)
	}

	// Then with one that adds a package that exists: a new digest, the
	// build audited with what it added, the change of the tools' records
	// audited with the diff, and the tools refused until re-approved.
	d.close()
	d = startTemplateDaemon(t, st, images, dataRoot, wheelhouse, declare("python3-bs4, python3-yaml, python3-tabulate"), toolsFile, goldenDir)
	adminC, _ = client.New(d.url, admin)
	e.svc, e.url = d.svc, d.url
	// Until it is built the template is stale: its tools are refused
	// rather than run the build of the old declaration.
	e.do("POST", "/v1/sessions", agent, capability.CreateSessionRequest{Runtime: "python", Tool: "analyst"}).
		wantError(t, http.StatusConflict, "failed_precondition", `template "analytics" is stale`, "stockade template build analytics")
	if tpl, err := adminC.Template(t.Context(), "analytics"); err != nil || !tpl.Stale {
		t.Errorf("before the build: got %+v, %v; want analytics stale", tpl, err)
	}
	grown, _ := buildAndWait(t, adminC, "analytics")
	if grown.State != client.BuildDone || grown.Build.Digest == digest {
		t.Fatalf("the grown template's build: got %+v (error %+v), want a new digest", grown, grown.Error)
	}
	built := eventData[struct {
		Digest         string   `json:"digest"`
		PreviousDigest string   `json:"previous_digest"`
		Added          []string `json:"added"`
	}](t, e, "template.built")
	if len(built) == 0 || built[0].Digest != grown.Build.Digest || built[0].PreviousDigest != digest || !slices.ContainsFunc(built[0].Added, func(s string) bool { return strings.HasPrefix(s, "python3-tabulate ") }) {
		t.Errorf("template.built: got %+v, want %s -> %s adding python3-tabulate", built, digest, grown.Build.Digest)
	}
	changed := eventData[struct {
		Tool           string   `json:"tool"`
		Diff           []string `json:"diff"`
		ReviewRequired bool     `json:"review_required"`
	}](t, e, "tool.changed")
	var seen []string
	for _, c := range changed {
		if c.ReviewRequired && strings.Contains(strings.Join(c.Diff, "\n"), "python3-tabulate") {
			seen = append(seen, c.Tool)
		}
	}
	slices.Sort(seen)
	if !slices.Contains(seen, "analyst") {
		t.Errorf("tool.changed events asking for review of python3-tabulate: got %q (events %+v), want analyst's", seen, changed)
	}
	e.do("POST", "/v1/sessions", agent, capability.CreateSessionRequest{Runtime: "python", Tool: "analyst"}).want(t, http.StatusForbidden)
	e.do("POST", "/v1/tools/analyst/approve", approver, nil).want(t, http.StatusOK)
	s := openTemplateSession(e, capability.CreateSessionRequest{Runtime: "python", Tool: "analyst"})
	if c := e.cell(agent, s.ID, "import tabulate, bs4; print(tabulate.tabulate([[1, 2]]).count('1'))"); c.Status != "succeeded" {
		t.Errorf("a cell of the re-approved tool: got status %s, stderr %q", c.Status, c.Stderr)
	}
	e.do("DELETE", "/v1/sessions/"+s.ID, agent, nil).want(t, http.StatusOK)
	if ok, broken, err := st.VerifyChain(t.Context(), ws.ID); !ok || err != nil {
		t.Errorf("the workspace's chain: ok %v, broken %+v, err %v", ok, broken, err)
	}
}
