package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
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
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/model"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/templates"
)

// writeFile writes body to dir/name and returns its path.
func writeFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestTemplateUsage checks the template command's usage, help and bad
// input.
func TestTemplateUsage(t *testing.T) {
	if code, out, errOut := runCLI(t, nil, "template"); code != exitUsage || out != "" || !strings.HasPrefix(errOut, "usage: stockade template list") {
		t.Errorf("template without a verb: got exit %d, stdout %q, stderr %q; want exit 2 and the usage on stderr", code, out, errOut)
	}
	for _, args := range [][]string{{"template", "--help"}, {"template", "build", "--help"}, {"template", "show", "-h"}, {"help", "template"}} {
		if code, out, _ := runCLI(t, nil, args...); code != 0 || !strings.HasPrefix(out, "usage: stockade template") {
			t.Errorf("%q: got exit %d, stdout %q; want the usage", args, code, out)
		}
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"template", "frobnicate"}, `unknown template command "frobnicate"`},
		{[]string{"template", "show"}, "template show: got 0 arguments, want 1"},
		{[]string{"template", "build", "a", "b"}, "template build: got 2 arguments, want 1"},
		{[]string{"template", "list", "--data-dir", dir}, "no templates: name them with --templates FILE|DIR or --config FILE"},
		{[]string{"template", "show", "x", "--url", "http://127.0.0.1:1", "--templates", "t.yaml"}, "--templates does not apply with --url"},
		{[]string{"template", "build", "x", "--url", "http://127.0.0.1:1"}, "no API key"},
	} {
		code, out, errOut := runCLIEnv(t, nil, []string{}, tc.args...)
		if code != exitUsage || out != "" || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%q: got exit %d, stdout %q, stderr %q; want exit 2 and one line saying %q", tc.args, code, out, errOut, tc.want)
		}
	}
}

// TestTemplateLint lints templates and the tools that name them.
func TestTemplateLint(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, data, "rates.json", "{}")
	good := writeFile(t, dir, "good.yaml", fmt.Sprintf(`templates:
  - name: analytics
    base: python
    debian_packages: [python3-bs4]
    files: [{source: %s/rates.json, target: /opt/rates.json}]
    start: "import bs4"
`, data))
	toolsOK := writeFile(t, dir, "tools.yaml", "tools:\n  - name: analyst\n    input_trust: trusted\n    tier: container\n    template: analytics\n")
	toolsBad := writeFile(t, dir, "tools-bad.yaml", "tools:\n  - name: analyst\n    input_trust: trusted\n    tier: container\n    runtimes: [node]\n    template: analytics\n")
	bad := writeFile(t, dir, "bad.yaml", `templates:
  - name: Analytics
    base: ruby
    files: [{source: /etc/passwd, target: /opt/p}]
`)
	env := []string{}
	dataDir := []string{"--data-dir", dir}
	if code, out, errOut := runCLIEnv(t, nil, env, append([]string{"template", "lint", "--templates", good, "--tools", toolsOK}, dataDir...)...); code != 0 || out != "ok: 1 template\n" {
		t.Errorf("lint of a good template: got exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut := runCLIEnv(t, nil, env, append([]string{"template", "lint", "analytics", "--templates", good, "--tools", toolsBad}, dataDir...)...)
	if code != exitFailure || out != "" || !strings.Contains(errOut, "template \"analytics\" extends python") || !strings.Contains(errOut, "stockade: templates refused: 1 problem") {
		t.Errorf("lint of a tool whose runtimes leave the base out: got exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut = runCLIEnv(t, nil, env, append([]string{"template", "lint", "--templates", bad}, dataDir...)...)
	if code != exitFailure || out != "" || !strings.Contains(errOut, "bad.yaml:2") || !strings.Contains(errOut, "/etc/passwd") || !strings.Contains(errOut, "templates refused: ") {
		t.Errorf("lint of bad templates: got exit %d, stdout %q, stderr %q; want exit 1 naming the lines and the file outside the data root", code, out, errOut)
	}
	if code, _, errOut := runCLIEnv(t, nil, env, append([]string{"template", "lint", "nope", "--templates", good}, dataDir...)...); code != exitUsage || !strings.Contains(errOut, `unknown template "nope"`) {
		t.Errorf("lint of an unknown template: got exit %d, stderr %q", code, errOut)
	}
}

// cliBuilder builds any template in a few steps of progress.
type cliBuilder struct {
	mu      sync.Mutex
	current map[string]*client.TemplateBuild
}

func (b *cliBuilder) Build(ctx context.Context, t templates.Template, pull bool, progress func(image.Progress)) (client.TemplateBuild, bool, error) {
	if t.Name == "slow" {
		progress(image.Progress{Runtime: t.Name, Stage: "downloading", Packages: 1, Total: 9})
		<-ctx.Done()
		return client.TemplateBuild{}, false, ctx.Err()
	}
	for i, stage := range []string{"resolving", "downloading", "installing", "hashing"} {
		progress(image.Progress{Runtime: t.Name, Stage: stage, Packages: i, Total: 3, Bytes: int64(i) << 20, Elapsed: time.Duration(i) * time.Second})
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return client.TemplateBuild{}, false, ctx.Err()
		}
	}
	if strings.Contains(strings.Join(t.DebianPackages, " "), "nope") {
		return client.TemplateBuild{}, false, errdefs.Publicf(`debian_packages: "python3-nope": no such package: %w`, errdefs.ErrInvalidArgument)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	hit := b.current[t.Name] != nil
	tb := &client.TemplateBuild{Digest: "sha256:" + strings.Repeat("ab", 32), Key: "sha256:k", Declaration: templates.Key(t), Base: t.Base,
		Created: time.Now(), SizeBytes: 3 << 20, SBOM: client.SBOM{
			Debian:   []client.DebianPackage{{Name: "python3-bs4", Version: "4.13.4-2"}},
			Wheels:   []client.WheelPackage{{Name: "tinyutil", Version: "1.2.0", SHA256: strings.Repeat("cd", 32)}},
			NPM:      []client.NPMPackage{{Name: "left-pad", Version: "1.3.0", Integrity: "sha512-XI5MPzVNApjAyhQzphX8BkmKsKUxD4LdyK24iZeQEMgIzy/PqM4kjbOh8pU45rK2eQBFOJe/FsTQU/IirN48aw=="}},
			Files:    []client.TemplateFile{{Target: "/opt/rates.json", SHA256: strings.Repeat("ef", 32)}},
			Packages: map[string]string{"python3": "3.13.5-1", "python3-bs4": "4.13.4-2"}}}
	b.current[t.Name] = tb
	return *tb, hit, nil
}

func (b *cliBuilder) Current(name string) (*client.TemplateBuild, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.current[name], nil
}

// TestTemplateRemote drives a daemon's templates with the CLI: list, a
// build with its progress, show with the SBOM, a failed build, and a key
// that may not build.
func TestTemplateRemote(t *testing.T) {
	st, err := storeopen.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "stockade.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	d, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: "/nonexistent/stockade-guest"})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(map[string]sandbox.Driver{"runc": d}, "runc", image.Open(t.TempDir()), sandbox.DefaultLimits(), sandbox.DefaultCeiling())
	if err != nil {
		t.Fatal(err)
	}
	ws, err := st.CreateWorkspace(t.Context(), "tpl", nil)
	if err != nil {
		t.Fatal(err)
	}
	admin, agent := "sk_test_admin_"+rand.Text(), "sk_test_agent_"+rand.Text()
	for key, role := range map[string]model.Role{admin: model.RoleAdmin, agent: model.RoleAgent} {
		if _, err := st.CreateAPIKey(t.Context(), store.NewAPIKey{WorkspaceID: ws.ID, Role: role, Hash: model.HashKey(key), Name: string(role)}); err != nil {
			t.Fatal(err)
		}
	}
	file := writeFile(t, t.TempDir(), "templates.yaml", `templates:
  - name: analytics
    base: python
    debian_packages: [python3-bs4]
  - name: broken
    base: python
    debian_packages: [python3-nope]
  - name: slow
    base: shell
`)
	set, err := templates.Load(file, templates.Options{})
	if err != nil {
		t.Fatal(err)
	}
	jobs := templatejobs.New(templatejobs.Options{Templates: set, Builder: &cliBuilder{current: map[string]*client.TemplateBuild{}}, Audit: st})
	defer jobs.Close()
	srv := httptest.NewServer(api.New(capability.NewService(eng, st, capability.ServiceOptions{}), st, api.Options{Templates: jobs}))
	defer srv.Close()
	env := []string{"STOCKADE_URL=" + srv.URL, "STOCKADE_KEY=" + admin}

	code, out, errOut := runCLIEnv(t, nil, env, "template", "list")
	if code != 0 || !regexp.MustCompile(`(?m)^analytics +python +not built +- +- +/\S+/templates\.yaml:2$`).MatchString(out) {
		t.Errorf("list before a build: got exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut = runCLIEnv(t, nil, env, "template", "build", "analytics")
	if code != 0 || !strings.Contains(errOut, "analytics: installing 2 of 3 packages, 2.0 MiB so far") ||
		!strings.HasPrefix(out, "analytics: sha256:abab") || !strings.Contains(out, "1 Debian package, 1 wheel, 1 npm package, 1 file") {
		t.Errorf("build: got exit %d, stdout %q, stderr %q; want its progress and its digest", code, out, errOut)
	}
	if code, out, _ := runCLIEnv(t, nil, env, "template", "build", "analytics", "--pull"); code != 0 || !strings.Contains(out, "cache hit") {
		t.Errorf("a second build: got exit %d, stdout %q; want a cache hit", code, out)
	}
	code, out, errOut = runCLIEnv(t, nil, env, "template", "show", "analytics")
	for _, re := range []string{
		`^template analytics \(base python\), defined in /\S+/templates\.yaml:2\n`,
		`(?m)^  debian_packages: +\["python3-bs4"\]$`,
		`(?m)^build +sha256:(ab){32}  3\.0 MiB `,
		`(?m)^KIND +NAME +VERSION +HASH$`,
		`(?m)^debian +python3-bs4 +4\.13\.4-2 +-$`,
		`(?m)^wheel +tinyutil +1\.2\.0 +sha256:(cd){32}$`,
		`(?m)^npm +left-pad +1\.3\.0 +sha512-XI5M`,
		`(?m)^file +/opt/rates\.json +- +sha256:(ef){32}$`,
		`(?m)^1 Debian package added \(of 2 in the image\), 1 wheel, 1 npm package, 1 file$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("show: stdout lacks %s:\n%s(stderr %q, exit %d)", re, out, errOut, code)
		}
	}
	if code, out, _ := runCLIEnv(t, nil, env, "template", "show", "analytics", "--json"); code != 0 || !strings.Contains(out, `"integrity": "sha512-`) {
		t.Errorf("show --json: got exit %d, stdout %q", code, out)
	}
	code, out, errOut = runCLIEnv(t, nil, env, "template", "build", "broken")
	if code != exitFailure || !strings.Contains(errOut, `stockade: debian_packages: "python3-nope": no such package`) {
		t.Errorf("a failed build: got exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, out, _ := runCLIEnv(t, nil, env, "template", "show", "broken"); code != 0 || !regexp.MustCompile(`(?m)^last build job +tb_\w+ failed: debian_packages: "python3-nope": no such package$`).MatchString(out) {
		t.Errorf("show after a failed build: got exit %d, stdout %q; want the last job's failure", code, out)
	}

	// Ctrl-C cancels the daemon's job.
	cmd := exec.Command(testenv.Build(t, "./cmd/stockade"), "template", "build", "slow")
	cmd.Env = append(os.Environ(), env...)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(stderr.String(), "slow: downloading") && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Signal(os.Interrupt)
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitInterrupted || !strings.Contains(stderr.String(), "cancelled; the previous build still serves") {
		t.Errorf("Ctrl-C on a build: got %v, stderr %q; want exit 130 saying the job was cancelled", err, stderr.String())
	}
	st2, err := jobs.Template("slow")
	if err != nil || st2.Running != nil || st2.Last == nil || st2.Last.State != client.BuildCancelled {
		t.Errorf("the daemon's job after Ctrl-C: got %+v, %v; want it cancelled", st2.Last, err)
	}

	code, _, errOut = runCLIEnv(t, nil, []string{"STOCKADE_URL=" + srv.URL, "STOCKADE_KEY=" + agent}, "template", "build", "analytics")
	if code != exitUsage || !strings.Contains(errOut, "only admin keys may build templates") {
		t.Errorf("a build with an agent key: got exit %d, stderr %q", code, errOut)
	}
}

// TestTemplateLocal builds a shell template here, without a daemon, on an
// image store whose shell image is the installed one (linked, never
// written): the build's progress, show with the file in the SBOM, list,
// and a second build that is a cache hit. Ctrl-C cancels a build and
// leaves the store as it was.
func TestTemplateLocal(t *testing.T) {
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runsc")
	img := testenv.Image(t, "shell")
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"images/sha256", "images/refs", "data"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	hex := strings.TrimPrefix(img.Digest, "sha256:")
	if err := os.Symlink(filepath.Join(testenv.DataDir(), "images", "sha256", hex), filepath.Join(dir, "images", "sha256", hex)); err != nil {
		t.Fatal(err)
	}
	ref, err := os.ReadFile(filepath.Join(testenv.DataDir(), "images", "refs", "shell"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "images", "refs"), "shell", string(ref))
	writeFile(t, filepath.Join(dir, "data"), "motd.txt", "hello from a template\n")
	file := writeFile(t, dir, "templates.yaml", fmt.Sprintf(`templates:
  - name: greeter
    base: shell
    files: [{source: %s/data/motd.txt, target: /opt/motd.txt}]
    env: {MOTD: /opt/motd.txt}
    start: "cat /opt/motd.txt"
    ready: "test -s /opt/motd.txt"
`, dir))
	args := []string{"--templates", file, "--data-dir", dir, "--state-dir", t.TempDir()}
	code, out, errOut := runCLIEnv(t, nil, []string{}, append([]string{"template", "build", "greeter"}, args...)...)
	if code != 0 || !regexp.MustCompile(`^greeter: sha256:[0-9a-f]{64}  [0-9.]+ MiB  \(built in `).MatchString(out) || !strings.Contains(out, "0 Debian packages, 0 wheels, 0 npm packages, 1 file") ||
		!strings.Contains(errOut, "greeter: hashing") {
		t.Fatalf("build: got exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	digest := regexp.MustCompile(`sha256:[0-9a-f]{64}`).FindString(out)
	if code, out, errOut := runCLIEnv(t, nil, []string{}, append([]string{"template", "build", "greeter"}, args[:4]...)...); code != 0 || !strings.Contains(out, digest+"  ") || !strings.Contains(out, "cache hit") {
		t.Errorf("a second build: got exit %d, stdout %q, stderr %q; want a cache hit of %s", code, out, errOut, digest)
	}
	code, out, errOut = runCLIEnv(t, nil, []string{}, append([]string{"template", "show", "greeter"}, args[:4]...)...)
	if code != 0 || !strings.Contains(out, "build            "+digest) || !regexp.MustCompile(`(?m)^file +/opt/motd\.txt +- +sha256:[0-9a-f]{64}$`).MatchString(out) {
		t.Errorf("show: got exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, _ = runCLIEnv(t, nil, []string{}, append([]string{"template", "list"}, args[:4]...)...)
	if code != 0 || !regexp.MustCompile(`(?m)^greeter +shell +current +`+regexp.QuoteMeta(digest[:19])).MatchString(out) {
		t.Errorf("list: got exit %d, stdout %q", code, out)
	}

	// A build of a changed declaration, interrupted while its start runs
	// (a start that sleeps, so that the interrupt cannot come too late):
	// exit 130, and the previous build still current.
	writeFile(t, dir, "templates.yaml", strings.Replace(mustRead(t, file), `start: "cat /opt/motd.txt"`, `start: "sleep 50"`, 1))
	cmd := exec.Command(testenv.Build(t, "./cmd/stockade"), append([]string{"template", "build", "greeter"}, args...)...)
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	sc := bufio.NewScanner(pipe)
	for sc.Scan() {
		stderr.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), "greeter: checking") {
			_ = cmd.Process.Signal(os.Interrupt)
			break
		}
	}
	_, _ = io.Copy(&stderr, pipe)
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != exitInterrupted {
		t.Errorf("an interrupted build: got %v, stderr %q; want exit 130", err, stderr.String())
	}
	code, out, _ = runCLIEnv(t, nil, []string{}, append([]string{"template", "list"}, args[:4]...)...)
	if code != 0 || !regexp.MustCompile(`(?m)^greeter +shell +stale +`+regexp.QuoteMeta(digest[:19])).MatchString(out) {
		t.Errorf("list after the interrupted build: got exit %d, stdout %q; want the previous build, stale", code, out)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(ents) != 0 {
		t.Errorf("the interrupted build left %d entries in the store's tmp", len(ents))
	}
}

// syncBuffer is a strings.Builder safe for a process's writes and the
// test's reads at once.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
