package vercel_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/driver/vercel"
	"github.com/stockade-sh/stockade/driver/vercel/internal/fake"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/conformance"
)

// The credentials of the tests' fake.
const (
	token   = "test-token"
	team    = "team_test"
	project = "prj_test"
)

// fakeAPI starts the fake Vercel API, its microVMs runc sandboxes: node24
// (Stockade's shell runtime, /bin/sh there) on the shell image, which has
// the busybox the conformance probe is unpacked with, and python3.13 on
// the python image.
func fakeAPI(t testing.TB) (*fake.Server, string) {
	t.Helper()
	testenv.RequiresRoot(t)
	testenv.RequiresBinary(t, "runc")
	m, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t)})
	if err != nil {
		t.Fatal(err)
	}
	images := map[string]string{"node24": "shell", "python3.13": "python"}
	f := fake.New(fake.Config{Token: token, TeamID: team, Machines: m, Image: func(rt string) (sandbox.Image, error) {
		name, ok := images[rt]
		if !ok {
			return sandbox.Image{}, fmt.Errorf("unknown runtime %q", rt)
		}
		return testenv.Image(t, name), nil
	}})
	srv := httptest.NewServer(f)
	t.Cleanup(func() {
		srv.Close()
		f.Close()
	})
	return f, srv.URL
}

func newDriver(t testing.TB, base string) *vercel.Driver {
	t.Helper()
	d, err := vercel.New(vercel.Config{Token: token, TeamID: team, ProjectID: project, BaseURL: base})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestConformance runs the checks of sandbox/conformance that apply to a
// remote driver against the driver over the fake API.
func TestConformance(t *testing.T) {
	f, base := fakeAPI(t)
	conformance.Run(t, conformance.Harness{Driver: newDriver(t, base), Image: testenv.Image(t, "shell"), Remote: true})
	if left := f.Running(); len(left) > 0 {
		t.Errorf("sandboxes still running on the fake after the suite: %v", left)
	}
}

// TestCredentials checks that a wrong token is refused as such, that the
// driver sends none of its credentials into the sandbox, and that the
// file it writes the program's stdin to is gone once the program runs.
func TestCredentials(t *testing.T) {
	_, base := fakeAPI(t)
	d, err := vercel.New(vercel.Config{Token: "wrong", TeamID: team, ProjectID: project, BaseURL: base})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Health(t.Context()); !errdefs.IsUnauthenticated(err) {
		t.Errorf("Health with a wrong token: got %v, want ErrUnauthenticated", err)
	}
	d = newDriver(t, base)
	if err := d.Health(t.Context()); err != nil {
		t.Fatalf("Health: %v", err)
	}
	sb, err := d.Create(t.Context(), sandbox.Spec{Image: testenv.Image(t, "shell")})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.WithoutCancel(t.Context()))
	res, err := sandbox.Run(t.Context(), sb, sandbox.ExecRequest{
		File: sandbox.File{Name: "main.sh", Data: []byte("read line; echo \"in:$line\"; cat /proc/self/environ; echo; cat /proc/1/cmdline; ls -a /tmp")},
		Argv: []string{"/bin/sh", "{file}"}, Env: []string{"A=1"}, Stdin: []byte("hello\n")})
	if err != nil || res.Status != sandbox.StatusSucceeded {
		t.Fatalf("got %+v, %v", res, err)
	}
	// The controls: the program's own environment and input, and the
	// code file in the listing of /tmp, where the stdin file was.
	for _, want := range []string{"A=1", "in:hello\n", "main.sh"} {
		if !strings.Contains(string(res.Stdout), want) {
			t.Fatalf("the control: stdout %q lacks %q", res.Stdout, want)
		}
	}
	for _, secret := range []string{token, team, project} {
		if strings.Contains(string(res.Stdout), secret) {
			t.Errorf("the sandbox sees %q: %q", secret, res.Stdout)
		}
	}
	if strings.Contains(string(res.Stdout), ".stockade-stdin") {
		t.Errorf("the stdin file is left in /tmp: %q", res.Stdout)
	}
}

// TestRefusals checks that what the provider cannot do is refused with
// the reason before anything is created, and that the API is reached by
// plain http on loopback only.
func TestRefusals(t *testing.T) {
	d, err := vercel.New(vercel.Config{Token: token, TeamID: team, ProjectID: project, BaseURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	for name, spec := range map[string]sandbox.Spec{
		"template": {Image: sandbox.Image{Name: "my-template"}},
		"detached": {Image: sandbox.Image{Name: "python"}, Detached: true},
		"egress":   {Image: sandbox.Image{Name: "python"}, Network: sandbox.NetworkEgress},
		"mounts":   {Image: sandbox.Image{Name: "python"}, Mounts: []sandbox.Mount{{Source: "/etc", Target: "/data"}}},
		"cpu":      {Image: sandbox.Image{Name: "python"}, Limits: sandbox.Limits{CPU: vercel.MaxCPU + 1}},
	} {
		if _, err := d.Create(t.Context(), spec); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := vercel.New(vercel.Config{TeamID: team}); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), vercel.EnvToken) {
		t.Errorf("New without a token: got %v, want ErrInvalidArgument naming %s", err, vercel.EnvToken)
	}
	for base, ok := range map[string]bool{
		"http://127.0.0.1:1": true, "http://[::1]:8080/api": true, "http://localhost:1": true, "https://proxy.example.com/api": true,
		"http://proxy.example.com/api": false, "http://10.0.0.1:8080": false, "http://[::ffff:10.0.0.1]/": false, "ftp://127.0.0.1/": false,
	} {
		_, err := vercel.New(vercel.Config{Token: token, TeamID: team, ProjectID: project, BaseURL: base})
		if ok && err != nil {
			t.Errorf("New with the API at %s: %v", base, err)
		}
		if !ok && !errdefs.IsInvalidArgument(err) {
			t.Errorf("New with the API at %s: got %v, want ErrInvalidArgument", base, err)
		}
	}
	caps := d.Capabilities()
	for _, flag := range []string{"Kernels", "Bind", "Reattach", "Snapshots", "Files"} {
		if caps.Lacks[flag] == "" {
			t.Errorf("Capabilities lack %s without a reason", flag)
		}
	}
}

// TestReapAndLeftovers checks that Reap finds the driver's sandboxes by
// their labels and that Leftovers sees them until they are gone.
func TestReapAndLeftovers(t *testing.T) {
	_, base := fakeAPI(t)
	d := newDriver(t, base)
	run := "reap-" + time.Now().Format("150405.000000")
	var ids []string
	for _, group := range []string{"a", "b"} {
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
	if reaped, err := d.Reap(t.Context(), map[string]string{"run": run}); err != nil || !slices.Equal(reaped, ids[1:]) {
		t.Errorf("Reap run: got %v, %v; want %v", reaped, err, ids[1:])
	}
}

// TestProgramOnPath checks the launcher: a program that is not where
// Stockade's runtime images have it is found by its base name on the
// sandbox's PATH, and the environment and arguments keep their order.
func TestProgramOnPath(t *testing.T) {
	_, base := fakeAPI(t)
	sb, err := newDriver(t, base).Create(t.Context(), sandbox.Spec{Image: testenv.Image(t, "shell")})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.WithoutCancel(t.Context()))
	res, err := sandbox.Run(t.Context(), sb, sandbox.ExecRequest{Argv: []string{"/nowhere/busybox", "sh", "-c", `echo "$0 $1 $A $B"`, "x y", "z"}, Env: []string{"A=a b", "B="}})
	if err != nil || res.Status != sandbox.StatusSucceeded || string(res.Stdout) != "x y z a b \n" {
		t.Errorf("got %+v, %v; want stdout %q", res, err, "x y z a b \n")
	}
	res, err = sandbox.Run(t.Context(), sb, sandbox.ExecRequest{Argv: []string{"/nowhere/not-a-program"}})
	if err != nil || res.Status != sandbox.StatusFailed || res.ExitCode != 127 {
		t.Errorf("a program that is nowhere: got %+v, %v; want exit 127", res, err)
	}
}
