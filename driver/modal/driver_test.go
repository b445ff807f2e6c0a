package modal_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/modal"
	"github.com/stockade-sh/stockade/driver/modal/internal/fake"
	"github.com/stockade-sh/stockade/driver/modal/internal/pb"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/conformance"
)

// The credentials of the tests' fake.
const (
	tokenID     = "ak-test"
	tokenSecret = "as-test"
)

// images are the registry images of the tests, the driver's defaults:
// the fake runs Stockade's image of the runtime for each.
var images = modal.DefaultImages

// fakeAPI starts the fake Modal API, its sandboxes runc sandboxes.
func fakeAPI(t testing.TB) *fake.Server {
	t.Helper()
	return fakeWith(t, nil)
}

// fakeWith starts the fake Modal API with the After hooks of fake.Config.
func fakeWith(t testing.TB, after map[string]func(context.Context) error) *fake.Server {
	t.Helper()
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	m, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t)})
	if err != nil {
		t.Fatal(err)
	}
	f, err := fake.Start(fake.Config{TokenID: tokenID, TokenSecret: tokenSecret, Machines: m, Image: func(tag string) (sandbox.Image, error) {
		for name, t2 := range images {
			if t2 == tag {
				return testenv.Image(t, name), nil
			}
		}
		return sandbox.Image{}, fmt.Errorf("unknown image %q", tag)
	}, After: after})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

func newDriver(t testing.TB, url string) *modal.Driver {
	t.Helper()
	d, err := modal.New(modal.Config{TokenID: tokenID, TokenSecret: tokenSecret, ServerURL: url, Images: images})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestConformance runs the checks of sandbox/conformance that apply to a
// remote driver against the driver over the fake API.
func TestConformance(t *testing.T) {
	f := fakeAPI(t)
	conformance.Run(t, conformance.Harness{Driver: newDriver(t, f.URL()), Image: testenv.Image(t, "shell"), Remote: true})
	if left := f.Running(); len(left) > 0 {
		t.Errorf("sandboxes still running on the fake after the suite: %v", left)
	}
}

// TestCredentials checks that a wrong token is refused as such, that the
// driver sends none of its credentials into the sandbox, and that the
// calls are the ones libmodal makes for a sandbox and its exec.
func TestCredentials(t *testing.T) {
	f := fakeAPI(t)
	d, err := modal.New(modal.Config{TokenID: tokenID, TokenSecret: "wrong", ServerURL: f.URL(), Images: images})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Health(t.Context()); !errdefs.IsUnauthenticated(err) {
		t.Errorf("Health with a wrong secret: got %v, want ErrUnauthenticated", err)
	}
	d = newDriver(t, f.URL())
	if err := d.Health(t.Context()); err != nil {
		t.Fatalf("Health: %v", err)
	}
	sb, err := d.Create(t.Context(), sandbox.Spec{Image: testenv.Image(t, "shell")})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.WithoutCancel(t.Context()))
	res, err := sandbox.Run(t.Context(), sb, sandbox.ExecRequest{
		File: sandbox.File{Name: "main.sh", Data: []byte("read line; echo \"in:$line\"; cat /proc/self/environ; echo; echo err >&2; exit 3")},
		Argv: []string{"/bin/sh", "{file}"}, Env: []string{"A=1"}, Stdin: []byte("hello\n")})
	if err != nil || res.Status != sandbox.StatusFailed || res.ExitCode != 3 || string(res.Stderr) != "err\n" {
		t.Fatalf("got %+v, %v; want exit 3 with stderr err", res, err)
	}
	// The controls: the program's own environment and input.
	for _, want := range []string{"A=1", "in:hello\n"} {
		if !strings.Contains(string(res.Stdout), want) {
			t.Fatalf("the control: stdout %q lacks %q", res.Stdout, want)
		}
	}
	for _, secret := range []string{tokenID, tokenSecret, "PATH="} {
		if strings.Contains(string(res.Stdout), secret) {
			t.Errorf("the sandbox sees %q: %q", secret, res.Stdout)
		}
	}
	calls := f.Calls()
	for _, want := range []string{"AuthTokenGet", "AppGetOrCreate", "ImageGetOrCreate", "ImageJoinStreaming", "SandboxCreate", "SandboxGetTaskId",
		"TaskGetCommandRouterAccess", "TaskExecStart", "TaskExecStdinWrite", "TaskExecStdioRead", "TaskExecWait"} {
		if !slices.Contains(calls, want) {
			t.Errorf("the driver made no %s call: %v", want, calls)
		}
	}
}

// TestRefusals checks that what the driver cannot do is refused with the
// reason before anything is created, and that the API is reached by
// plain http on loopback only.
func TestRefusals(t *testing.T) {
	d, err := modal.New(modal.Config{TokenID: tokenID, TokenSecret: tokenSecret, ServerURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for name, spec := range map[string]sandbox.Spec{
		"image":    {Image: sandbox.Image{Name: "my-template"}},
		"detached": {Image: sandbox.Image{Name: "python"}, Detached: true},
		"egress":   {Image: sandbox.Image{Name: "python"}, Network: sandbox.NetworkEgress},
		"entry":    {Image: sandbox.Image{Name: "python"}, Network: sandbox.NetworkAllowlist, Allow: []string{"example.com", "http://x/"}},
		"empty":    {Image: sandbox.Image{Name: "python"}, Network: sandbox.NetworkAllowlist},
		"mounts":   {Image: sandbox.Image{Name: "python"}, Mounts: []sandbox.Mount{{Source: "/etc", Target: "/data"}}},
		"cpu":      {Image: sandbox.Image{Name: "python"}, Limits: sandbox.Limits{CPU: modal.MaxCPU + 1}},
	} {
		if _, err := d.Create(t.Context(), spec); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := modal.New(modal.Config{TokenID: tokenID}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), modal.EnvTokenSecret) {
		t.Errorf("New without a secret: got %v, want ErrInvalidArgument naming %s", err, modal.EnvTokenSecret)
	}
	for url, ok := range map[string]bool{
		"http://127.0.0.1:1": true, "http://[::1]:8080": true, "http://localhost:1": true, "https://api.modal.com:443": true, "https://api.modal.com": true,
		"http://api.modal.com": false, "http://10.0.0.1:8080": false, "ftp://127.0.0.1/": false, "https://api.modal.com/x": false,
		"https://user:hunter2@api.modal.com": false, "http://user@127.0.0.1:1": false,
	} {
		d, err := modal.New(modal.Config{TokenID: tokenID, TokenSecret: tokenSecret, ServerURL: url})
		if ok && err != nil {
			t.Errorf("New with the API at %s: %v", url, err)
		}
		if !ok && !errdefs.IsInvalidArgument(err) {
			t.Errorf("New with the API at %s: got %v, want ErrInvalidArgument", url, err)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("New with the API at %s: the password in %q", url, err)
		}
		if d != nil {
			d.Close()
		}
	}
	caps := d.Capabilities()
	if caps.Sessions {
		t.Error("Capabilities declare sessions: a timeout ends the sandbox")
	}
	for _, flag := range []string{"Kernels", "Bind", "Reattach", "Snapshots", "Files"} {
		if caps.Lacks[flag] == "" {
			t.Errorf("Capabilities lack %s without a reason", flag)
		}
	}
}

// TestEgress checks the network access the driver asks for: blocked by
// default, the allowlist's domains (and ranges) with network, as Modal's
// Python client sends its outbound allowlists.
func TestEgress(t *testing.T) {
	f := fakeAPI(t)
	d := newDriver(t, f.URL())
	for _, c := range []struct {
		spec           sandbox.Spec
		typ            pb.NetworkAccess_NetworkAccessType
		domains, cidrs []string
	}{
		{sandbox.Spec{ID: "sbx-egress-none"}, pb.NetworkAccess_BLOCKED, nil, nil},
		{sandbox.Spec{ID: "sbx-egress-allow", Network: sandbox.NetworkAllowlist, Allow: []string{"pypi.org", "*.example.com", "192.0.2.7", "198.51.100.0/24"}},
			pb.NetworkAccess_ALLOWLIST, []string{"pypi.org", "*.example.com"}, []string{"192.0.2.7/32", "198.51.100.0/24"}},
	} {
		c.spec.Image = testenv.Image(t, "shell")
		sb, err := d.Create(t.Context(), c.spec)
		if err != nil {
			t.Fatal(err)
		}
		acc := f.Access("stockade-" + c.spec.ID)
		if acc == nil {
			t.Fatalf("the control: the fake has no sandbox %s", c.spec.ID)
		}
		if acc.GetNetworkAccessType() != c.typ || !slices.Equal(acc.GetAllowedDomains(), c.domains) || !slices.Equal(acc.GetAllowedCidrs(), c.cidrs) {
			t.Errorf("%s: got %v %v %v, want %v %v %v", c.spec.ID, acc.GetNetworkAccessType(), acc.GetAllowedDomains(), acc.GetAllowedCidrs(), c.typ, c.domains, c.cidrs)
		}
		if err := sb.Destroy(t.Context()); err != nil {
			t.Error(err)
		}
	}
}

// TestTimeoutEndsSandbox checks that a timeout ends the program with its
// sandbox, promptly, and that Leftovers sees the sandbox until then.
func TestTimeoutEndsSandbox(t *testing.T) {
	f := fakeAPI(t)
	d := newDriver(t, f.URL())
	sb, err := d.Create(t.Context(), sandbox.Spec{Image: testenv.Image(t, "shell")})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.WithoutCancel(t.Context()))
	if left := d.Leftovers(t.Context(), sb.ID()); len(left) == 0 {
		t.Fatalf("the control: Leftovers of a running sandbox %s says nothing", sb.ID())
	}
	start := time.Now()
	res, err := sandbox.Run(t.Context(), sb, sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo started; sleep 60"}, Timeout: 2 * time.Second})
	if err != nil || res.Status != sandbox.StatusTimedOut || string(res.Stdout) != "started\n" || time.Since(start) > 20*time.Second {
		t.Errorf("got %+v, %v after %v; want timed out with started", res, err, time.Since(start))
	}
	if left := d.Leftovers(t.Context(), sb.ID()); len(left) > 0 {
		t.Errorf("after the timeout: %v", left)
	}
	if _, err := sb.Start(t.Context(), sandbox.ExecRequest{Argv: []string{"/bin/true"}}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("an Exec after the timeout: got %v, want ErrFailedPrecondition (the sandbox ended)", err)
	}
}

// TestCheckCommand runs `stockade driver check modal` against the fake
// (MODAL_SERVER_URL): every step passes with the fake's credentials, and
// a wrong secret fails the first step and the command.
func TestCheckCommand(t *testing.T) {
	f := fakeAPI(t)
	bin := testenv.Build(t, "./cmd/stockade")
	run := func(secret string) (string, error) {
		cmd := exec.CommandContext(t.Context(), bin, "driver", "check", "modal")
		cmd.Env = append(os.Environ(), "MODAL_SERVER_URL="+f.URL(), "MODAL_TOKEN_ID="+tokenID, "MODAL_TOKEN_SECRET="+secret)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run(tokenSecret)
	t.Logf("stockade driver check modal:\n%s", out)
	if err != nil {
		t.Fatalf("got %v, want success", err)
	}
	for _, s := range []string{"credentials", "create", "run", "environment", "no network", "timeout", "destroy"} {
		if !strings.Contains(out, "ok    "+s+"\n") {
			t.Errorf("step %q did not pass", s)
		}
	}
	if left := f.Running(); len(left) > 0 {
		t.Errorf("the check left sandboxes running: %v", left)
	}
	out, err = run("wrong")
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(out, "FAIL  credentials") {
		t.Errorf("with a wrong secret: got %v and %q, want exit 1 and the credentials step failed", err, out)
	}
}

// TestRunCommand runs `stockade run --driver modal` against the fake:
// the wiring builds the driver from the environment, and the engine's
// one-shot reaches the provider's API.
func TestRunCommand(t *testing.T) {
	f := fakeAPI(t)
	bin := testenv.Build(t, "./cmd/stockade")
	cmd := exec.CommandContext(t.Context(), bin, "run", "--driver", "modal", "--runtime", "python", "--data-dir", testenv.DataDir(),
		"--state-dir", t.TempDir(), "--json", "-c", "import sys, os; print(sys.stdin.read().upper(), sorted(os.environ)); sys.exit(4)")
	cmd.Env = append(os.Environ(), "MODAL_SERVER_URL="+f.URL(), "MODAL_TOKEN_ID="+tokenID, "MODAL_TOKEN_SECRET="+tokenSecret)
	cmd.Stdin = strings.NewReader("from stdin")
	out, err := cmd.Output()
	t.Logf("stockade run --driver modal: %s", out)
	var res struct {
		Status   string `json:"status"`
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
	}
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		t.Fatalf("%v: %v %s", err, jerr, out)
	}
	if res.ExitCode != 4 || !strings.HasPrefix(res.Stdout, "FROM STDIN") || strings.Contains(res.Stdout, "MODAL") {
		t.Errorf("got %+v, want exit 4, the stdin upper-cased and no MODAL_ variable", res)
	}
}

// TestReap checks that Reap finds the driver's sandboxes by their labels
// (the fake's small pages make it page) and that Leftovers sees them
// until they are gone.
func TestReap(t *testing.T) {
	f := fakeAPI(t)
	d := newDriver(t, f.URL())
	run := "reap-" + time.Now().Format("150405.000000")
	var ids []string
	for _, group := range []string{"a", "b", "b", "b"} {
		sb, err := d.Create(t.Context(), sandbox.Spec{Image: testenv.Image(t, "shell"), Labels: map[string]string{"run": run, "group": group}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID())
	}
	if left := d.Leftovers(t.Context(), ids[0]); len(left) == 0 {
		t.Fatalf("the control: Leftovers of a running sandbox %s says nothing", ids[0])
	}
	reaped, err := d.Reap(t.Context(), map[string]string{"run": run, "group": "a"})
	if err != nil || !slices.Equal(reaped, ids[:1]) {
		t.Fatalf("Reap group a: got %v, %v; want %v", reaped, err, ids[:1])
	}
	if left := d.Leftovers(t.Context(), ids[0]); len(left) > 0 {
		t.Errorf("after Reap: %v", left)
	}
	reaped, err = d.Reap(t.Context(), map[string]string{"run": run})
	slices.Sort(reaped)
	want := slices.Sorted(slices.Values(ids[1:]))
	if err != nil || !slices.Equal(reaped, want) {
		t.Errorf("Reap run: got %v, %v; want %v", reaped, err, want)
	}
	if left := f.Running(); len(left) > 0 {
		t.Errorf("running after Reap: %v", left)
	}
}
