package api_test

// TestWriteFixture writes the store fixture of store/testdata/fixture: a
// database written by this version of Stockade through its real code paths
// (the CLI's admin commands, a `stockade serve` daemon with runc sandboxes,
// its egress proxy and credential broker, a SIGKILL and restarts), so that
// later versions can prove they still read it and that its audit chains
// still verify. See store/testdata/fixture/README.md.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stockade-sh/stockade/api"
	"github.com/stockade-sh/stockade/broker"
	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/docker"
	"github.com/stockade-sh/stockade/driver/runc"
	"github.com/stockade-sh/stockade/egress"
	"github.com/stockade-sh/stockade/engine"
	"github.com/stockade-sh/stockade/image"
	"github.com/stockade-sh/stockade/internal/netns"
	"github.com/stockade-sh/stockade/internal/storeopen"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/internal/witness"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/store"
	"github.com/stockade-sh/stockade/tools"
)

// fixtureEnv is where TestWriteFixture writes the fixture.
const fixtureEnv = "STOCKADE_WRITE_FIXTURE"

// fixtureTools are the tool records of the daemon's first two starts.
// scratch has a small memory limit for the OOM kill; fetch has egress,
// brokered a broker operation; dockered runs on a Docker engine that is
// not there (its launch fails); retired is gone at the third start.
const fixtureTools = `
tools:
  - name: scratch
    input_trust: trusted
    tier: container
    runtimes: [python, shell]
    limits: {memory: 64MiB}
  - name: fetch
    input_trust: trusted
    tier: container
    runtimes: [python]
    egress:
      allow: [allowed.test]
      ports: [80]
  - name: brokered
    input_trust: trusted
    tier: container
    runtimes: [python]
    credentials: [echo]
  - name: dockered
    input_trust: trusted
    tier: docker
    runtimes: [shell]
  - name: retired
    input_trust: trusted
    tier: container
    runtimes: [shell]
`

// fixtureToolsChanged are the records of the third start: fetch's
// allowlist grew (review required), scratch's limits changed, retired is
// removed.
const fixtureToolsChanged = `
tools:
  - name: scratch
    input_trust: trusted
    tier: container
    runtimes: [python, shell]
    limits: {memory: 64MiB, timeout: 20s}
  - name: fetch
    input_trust: trusted
    tier: container
    runtimes: [python]
    egress:
      allow: [allowed.test, more.test]
      ports: [80]
  - name: brokered
    input_trust: trusted
    tier: container
    runtimes: [python]
    credentials: [echo]
  - name: dockered
    input_trust: trusted
    tier: docker
    runtimes: [shell]
`

// floodCode asks for names outside fetch's allowlist until the egress
// proxy has refused far more than the 100 refusals of one execution that
// are audited one by one, after one HTTP request by a refused name and one
// to an IP address.
const floodCode = `
import socket, urllib.request
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")]
host = ns[0] if ns else "127.0.0.1"
def attempt(label, url):
    try:
        urllib.request.urlopen(url, timeout=5).read()
        print(label, "OK")
    except Exception as e:
        print(label, "FAILED", type(e).__name__)
attempt("other-name", "http://other.test/")
attempt("direct-ip", "http://%s:80/" % host)
refused = 0
for i in range(150):
    try:
        socket.getaddrinfo("flood-%d.test" % i, 80, proto=socket.IPPROTO_TCP)
    except OSError:
        refused += 1
print("names refused:", refused)
`

// loopbackCode asks the egress proxy for allowed.test, which the proxy's
// resolver in privateAddressRefusal answers with a loopback address.
const loopbackCode = `
import urllib.request
try:
    urllib.request.urlopen("http://allowed.test/", timeout=10).read()
    print("allowed.test OK")
except Exception as e:
    print("allowed.test FAILED", type(e).__name__)
`

// brokerCode calls the broker's echo operation, which its tool lists, and
// "other", which it does not.
const brokerCode = `
import urllib.request, urllib.error
for op in ["echo", "other"]:
    try:
        r = urllib.request.urlopen("http://broker.stockade.internal/v1/ops/%s?msg=fixture" % op, timeout=10)
        print(op, r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        print(op, e.code, e.read().decode())
`

func TestWriteFixture(t *testing.T) {
	out := os.Getenv(fixtureEnv)
	if out == "" {
		t.Skip("set " + fixtureEnv + "=DIR to write the store fixture (store/testdata/fixture)")
	}
	requireSandboxes(t)
	testenv.Image(t, "node")
	bin := testenv.Build(t, "./cmd/stockade")
	t.Run("sqlite", func(t *testing.T) {
		dir := t.TempDir()
		db := filepath.Join(dir, "stockade.db")
		writeFixture(t, bin, "sqlite:"+db, db+".witness")
		if _, err := os.Stat(db + "-wal"); err == nil {
			t.Fatalf("%s-wal is left: the database is not checkpointed", db)
		}
		dst := filepath.Join(out, "sqlite")
		copyFile(t, db, filepath.Join(dst, "stockade.db"))
		copyDir(t, db+".witness", filepath.Join(dst, "stockade.db.witness"))
	})
	t.Run("postgres", func(t *testing.T) {
		dsn, name := freshDatabase(t, postgresDSN(t))
		dir := t.TempDir()
		writeFixture(t, bin, dsn, filepath.Join(dir, "witness"))
		dst := filepath.Join(out, "postgres")
		if err := os.MkdirAll(dst, 0o755); err != nil {
			t.Fatal(err)
		}
		dump := exec.Command(testenv.RequiresBinary(t, "pg_dump"), "--no-owner", "--no-privileges",
			"--file", filepath.Join(dst, "stockade.sql"), dsn)
		if b, err := dump.CombinedOutput(); err != nil {
			t.Fatalf("pg_dump %s: %v\n%s", name, err, b)
		}
		copyDir(t, filepath.Join(dir, "witness"), filepath.Join(dst, "witness"))
	})
}

// freshDatabase creates an empty database in the server of dsn, dropped
// when the test ends, and returns its DSN and name. A database of its own,
// not a schema, so that its dump restores into any empty database.
func freshDatabase(t *testing.T, dsn string) (string, string) {
	t.Helper()
	name := fmt.Sprintf("stockade_fixture_%d", time.Now().UnixNano())
	exec := func(ctx context.Context, q string) error {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, q)
		return err
	}
	if err := exec(t.Context(), "CREATE DATABASE "+name); err != nil {
		t.Fatalf("creating database %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("dropping database %s: %v", name, err)
		}
	})
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String(), name
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// copyDir copies the regular files of src (the witness: one file per
// chain) into dst, replacing dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.RemoveAll(dst); err != nil {
		t.Fatal(err)
	}
	for _, name := range dirEntries(t, src) {
		if strings.HasPrefix(name, ".") {
			continue
		}
		copyFile(t, filepath.Join(src, name), filepath.Join(dst, name))
	}
}

// fixtureWorkspace is one workspace of the fixture as its keys see it over
// HTTP; url is set for each daemon.
func fixtureWorkspace(t *testing.T, bin, db, name string) *env {
	t.Helper()
	cli(t, bin, "workspace", "create", name, "--db", db)
	e := &env{t: t}
	for _, k := range []struct {
		role string
		dst  *string
	}{{"agent", &e.agent}, {"approver", &e.approver}, {"admin", &e.admin}} {
		*k.dst = strings.TrimSpace(cli(t, bin, "key", "create", "--workspace", name, "--role", k.role, "--name", name+" "+k.role, "--db", db))
	}
	return e
}

// run POSTs req as the workspace's agent, runs it to its end without
// approval and checks that it ended in want.
func (e *env) run(req engine.InvokeRequest, want store.ExecutionStatus) api.ExecutionView {
	e.t.Helper()
	v := e.invoke(req).want(e.t, http.StatusOK).execution(e.t)
	if v.Status != string(want) {
		e.t.Fatalf("%s run: got status %q (result %s), want %s", req.Runtime, v.Status, v.Result, want)
	}
	return v
}

// approve approves v with key (an approver or admin key) and waits for
// its end, which must be want.
func (e *env) approve(v api.ExecutionView, key string, want store.ExecutionStatus) api.ExecutionView {
	e.t.Helper()
	e.do("POST", "/v1/approvals/"+v.ApprovalID+"/approve", key, map[string]string{"reason": "fixture: approved"}).want(e.t, http.StatusOK)
	got := e.wait(v.ID, 50*time.Second)
	if got.Status != string(want) {
		e.t.Fatalf("after approval: got status %q (result %s), want %s", got.Status, got.Result, want)
	}
	return got
}

// waitEvents waits until the workspace has n events of typ, which the
// service writes from a queue after the execution has ended.
func (e *env) waitEvents(typ string, n int) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := len(e.events(typ, ""))
		if got == n {
			return
		}
		if got > n || time.Now().After(deadline) {
			e.t.Fatalf("%s events: got %d, want %d", typ, got, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// writeFixture writes the fixture's history (its README tells it) into
// the empty database db, with the audit chains witnessed in witness: admin
// commands, a daemon, the service in this process, a daemon killed with
// SIGKILL while a sandbox runs, and a daemon with changed tools that
// recovers from it and is stopped while a sandbox runs.
func writeFixture(t *testing.T, bin, db, witness string) {
	dir := t.TempDir()
	t.Setenv("STOCKADE_AUDIT_WITNESS", witness)
	// The docker driver points nowhere: the dockered tool's launch fails,
	// and no daemon's start-up reap touches another Stockade's containers.
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(dir, "no-docker.sock"))
	// The broker's upstream, on loopback, wants the secret the daemon
	// holds.
	const secret = "fixture-secret"
	t.Setenv("FIXTURE_ECHO_TOKEN", secret)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+secret {
			http.Error(w, "bad credential", http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(w, "upstream echo %s", r.URL.Query().Get("msg"))
	}))
	t.Cleanup(up.Close)

	writeConfig := func(name, records, ttl string) string {
		toolsPath := filepath.Join(dir, name+"-tools.yaml")
		if err := os.WriteFile(toolsPath, []byte(records), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg := fmt.Sprintf(`driver: runc
tools: %s
approval_ttl: %s
egress_prefix: stkf
egress_range: 10.213.208.0/20
broker:
  operations:
    - name: echo
      method: GET
      url: %s/echo
      params:
        - {name: msg, required: true}
      credential: {env: FIXTURE_ECHO_TOKEN}
      prefix: "Bearer "
`, toolsPath, ttl, up.URL)
		path := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// The first start lets approvals expire after 2 s; the later ones keep
	// them pending for ten years, so that the fixture's pending approval
	// stays pending.
	expiring := writeConfig("expiring", fixtureTools, "2s")
	lasting := writeConfig("lasting", fixtureTools, "87600h")
	changed := writeConfig("changed", fixtureToolsChanged, "87600h")
	state := filepath.Join(dir, "state")
	serve := func(cfg string) *daemon {
		return startDaemon(t, bin, "--config", cfg, "--db", db, "--state-dir", state, "--guest", testenv.Guest(t),
			"--data-dir", testenv.DataDir(), "--listen", "127.0.0.1:0")
	}

	// Two workspaces with a key of each role. alpha: approval required,
	// network allowed, 100 credits. beta: no approval, python and shell
	// only, 12 credits (six runs).
	alpha := fixtureWorkspace(t, bin, db, "alpha")
	beta := fixtureWorkspace(t, bin, db, "beta")
	cli(t, bin, "credits", "grant", "alpha", "100", "--db", db)
	cli(t, bin, "credits", "grant", "beta", "12", "--db", db)
	cli(t, bin, "policy", "set", "alpha", "--network=allowed", "--db", db)
	cli(t, bin, "policy", "set", "beta", "--approval=none", "--runtimes=python,shell", "--db", db)

	// First start: every way a run ends in beta, the broker, denials, and
	// an approval in alpha that expires.
	d := serve(expiring)
	alpha.url, beta.url = d.url, d.url
	beta.run(engine.InvokeRequest{Runtime: "shell", Code: "echo fixture"}, store.StatusSucceeded)
	beta.run(engine.InvokeRequest{Runtime: "shell", Code: "echo failing >&2; exit 3"}, store.StatusFailed)
	beta.run(engine.InvokeRequest{Runtime: "python", Code: "import time\ntime.sleep(20)\n", TimeoutMS: 1000}, store.StatusTimedOut)
	beta.run(engine.InvokeRequest{Runtime: "python", Tool: "scratch", Code: `b = b"x" * (256 << 20)` + "\n"}, store.StatusOOMKilled)
	beta.run(engine.InvokeRequest{Runtime: "shell", Code: "kill -9 $$"}, store.StatusKilled)
	brokered := beta.run(engine.InvokeRequest{Runtime: "python", Tool: "brokered", Code: brokerCode}, store.StatusSucceeded)
	if res := result(t, brokered); !strings.Contains(res.Stdout, "echo 200 upstream echo fixture") || !strings.Contains(res.Stdout, "other 403") {
		t.Fatalf("broker run: got stdout %q, want echo answered and other refused", res.Stdout)
	}
	beta.waitEvents("broker.call", 1)
	beta.waitEvents("broker.denied", 1)
	beta.invoke(engine.InvokeRequest{Runtime: "shell", Code: "echo no credits"}).wantError(t, http.StatusPaymentRequired, "insufficient_credits")
	beta.invoke(engine.InvokeRequest{Runtime: "node", Code: "console.log(1)"}).wantError(t, http.StatusForbidden, "permission_denied", `runtime "node" is not allowed`)
	beta.do("POST", "/v1/executions", beta.approver, engine.InvokeRequest{Runtime: "shell", Code: "echo approver"}).
		wantError(t, http.StatusForbidden, "permission_denied", "approver keys cannot invoke")
	beta.invoke(engine.InvokeRequest{Runtime: "shell", Tool: "dockered", Code: "echo docker"}).wantError(t, http.StatusServiceUnavailable, "unavailable", "docker")
	expiring1 := alpha.awaitApproval(engine.InvokeRequest{Runtime: "python", Code: "print('never decided')"})
	if got := alpha.wait(expiring1.ID, 20*time.Second); got.Status != string(store.StatusApprovalExpired) {
		t.Fatalf("an approval past its 2 s: got status %q, want approval_expired", got.Status)
	}
	d.stop()

	// Between the starts, the service in this process on the same
	// database: the one refusal the daemon cannot make here, of an allowed
	// name that resolves to a private address.
	privateAddressRefusal(t, db, witness, lasting, alpha)

	// Second start: approvals approved (one run succeeds, one cannot
	// launch), denied, and a network run whose refusals overflow; then a
	// SIGKILL while a sandbox runs.
	d = serve(lasting)
	alpha.url, beta.url = d.url, d.url
	alpha.approve(alpha.awaitApproval(engine.InvokeRequest{Runtime: "shell", Code: "echo approved"}), alpha.approver, store.StatusSucceeded)
	alpha.deny(t, alpha.awaitApproval(engine.InvokeRequest{Runtime: "python", Code: "print('denied')"}), "fixture: denied")
	alpha.approve(alpha.awaitApproval(engine.InvokeRequest{Runtime: "shell", Tool: "dockered", Code: "echo docker"}), alpha.admin, store.StatusLaunchFailed)
	fetch := engine.InvokeRequest{Runtime: "python", Tool: "fetch", Network: "allow", Code: floodCode}
	flood := alpha.approve(alpha.awaitApproval(fetch), alpha.approver, store.StatusSucceeded)
	if res := result(t, flood); !strings.Contains(res.Stdout, "other-name FAILED") || !strings.Contains(res.Stdout, "direct-ip FAILED") || !strings.Contains(res.Stdout, "names refused: 150") {
		t.Fatalf("network run: got stdout %q, want every attempt refused", res.Stdout)
	}
	alpha.waitEvents("egress.refusals_suppressed", 1)
	alpha.waitEvents("egress.denied", 101)
	alpha.do("POST", "/v1/executions", alpha.approver, engine.InvokeRequest{Runtime: "shell", Code: "echo approver"}).
		wantError(t, http.StatusForbidden, "permission_denied", "approver keys cannot invoke")
	cli(t, bin, "credits", "grant", "beta", "10", "--db", db)
	sleeper, interrupted := startSleeper(t, d.url, beta.agent)
	d.kill()
	sleeper.close()

	// Third start, with changed tools: the interrupted run is recovered;
	// alpha, now requiring review of changed tools, is refused fetch until
	// its approver re-approves it, and its next network request stays
	// pending; a run is killed by the daemon's stop.
	cli(t, bin, "policy", "set", "alpha", "--tool-changes=require_review", "--db", db)
	d = serve(changed)
	alpha.url, beta.url = d.url, d.url
	if got := beta.wait(interrupted, 0); got.Status != string(store.StatusFailed) || !strings.Contains(string(got.Result), "interrupted") {
		t.Fatalf("after the restart: got status %q result %s, want failed, interrupted", got.Status, got.Result)
	}
	alpha.invoke(fetch).wantError(t, http.StatusForbidden, "permission_denied", "re-approve")
	alpha.do("POST", "/v1/tools/fetch/approve", alpha.approver, map[string]string{"reason": "fixture: more.test reviewed"}).want(t, http.StatusOK)
	alpha.awaitApproval(fetch)
	sleeper, killed := startSleeper(t, d.url, beta.agent)
	sleeper.close()
	d.stop()

	// The daemon is gone; read what it left with the CLI.
	code, verify, errOut := runBinary(bin, "audit", "verify", "--db", db)
	t.Logf("stockade audit verify:\n%s%s", verify, errOut)
	if code != 0 || strings.Count(verify, "holds the head witnessed") != 3 {
		t.Fatalf("audit verify: exit %d, want 0 and three chains holding their witnessed heads", code)
	}
	st, err := storeopen.Open(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ws, err := st.GetWorkspaceByName(t.Context(), "beta")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := st.GetExecution(t.Context(), ws.ID, killed); err != nil || got.Status != store.StatusKilled {
		t.Fatalf("a run the daemon's stop cut short: got %q (%v), want killed", got.Status, err)
	}
}

// loopbackResolver answers allowed.test with 127.0.0.1, which the egress
// proxy refuses, and nothing else.
type loopbackResolver struct{}

func (loopbackResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if host == allowedName+"." {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return nil, errors.New("no resolver in the fixture")
}

// privateAddressRefusal runs, in this process, what `stockade serve
// --config cfg` runs (the configuration's tools, broker and sandbox
// networks, the runc and docker drivers, the service and the HTTP API) on
// db, but with an egress proxy whose resolver answers allowed.test with a
// loopback address: the daemon's resolver is the host's, which answers no
// name here. An approved network run of fetch in alpha is then refused
// with the address, an egress.denied event whose data has "addr".
func privateAddressRefusal(t *testing.T, db, witnessDir, cfgPath string, alpha *env) {
	t.Helper()
	ctx := t.Context()
	cfg := config.Default()
	if err := cfg.LoadFile(cfgPath); err != nil {
		t.Fatal(err)
	}
	cfg.DataDir, cfg.Egress, cfg.Serving, cfg.LookupEnv = testenv.DataDir(), true, true, os.LookupEnv
	st, err := storeopen.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rc, err := runc.New(runc.Config{StateDir: t.TempDir(), GuestPath: testenv.Guest(t)})
	if err != nil {
		t.Fatal(err)
	}
	dk, err := docker.New(docker.Config{Host: os.Getenv("DOCKER_HOST"), GuestPath: testenv.Guest(t)})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := cfg.NetnsConfig()
	if err != nil {
		t.Fatal(err)
	}
	nets, err := netns.NewManager(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nets.CleanupStale(); err != nil {
		t.Fatal(err)
	}
	var eng *engine.Engine
	proxy, err := egress.New(egress.Config{Resolver: loopbackResolver{}, OnDecision: func(d egress.Decision) { eng.EgressDecision(d) }})
	if err != nil {
		t.Fatal(err)
	}
	b, err := broker.New(broker.Config{Operations: cfg.BrokerOperations(), LookupEnv: cfg.LookupEnv, OnAudit: func(ev broker.Event) { eng.BrokerEvent(ev) }})
	if err != nil {
		t.Fatal(err)
	}
	topts := tools.Options{DataRoot: cfg.MountRoot(), Ceiling: cfg.Ceiling, DefaultTier: sandbox.TierContainer, EgressSupported: true}
	set, err := tools.Load(cfg.Tools, topts)
	if err != nil {
		t.Fatal(err)
	}
	eng, err = engine.New(map[string]sandbox.Driver{"runc": rc, "docker": dk}, "runc", image.Open(cfg.ImageDir()), cfg.Defaults, cfg.Ceiling,
		engine.WithTools(set, topts), engine.WithEgress(nets, proxy, b))
	if err != nil {
		t.Fatal(err)
	}
	svc := engine.NewService(eng, st, engine.ServiceOptions{ApprovalTTL: cfg.ApprovalTTL, Witness: witness.Dir(witnessDir)})
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(svc, api.Options{}))
	alpha.url = srv.URL
	v := alpha.approve(alpha.awaitApproval(engine.InvokeRequest{Runtime: "python", Tool: "fetch", Network: "allow", Code: loopbackCode}), alpha.approver, store.StatusSucceeded)
	if res := result(t, v); !strings.Contains(res.Stdout, "allowed.test FAILED") {
		t.Fatalf("loopback run: got stdout %q, want the request refused", res.Stdout)
	}
	alpha.waitEvents("egress.denied", 1)
	srv.Close()
	svc.Close()
	if left := nets.Leftovers(); len(left) > 0 {
		t.Errorf("sandbox networks left behind: %v", left)
	}
	// The records loaded here are the daemon's: no tool event.
	if h, err := st.ChainHead(ctx, ""); err != nil || h.Seq != 6 {
		t.Fatalf("unattributed chain after the service in process: got seq %d (%v), want the daemon's 6 tool.registered", h.Seq, err)
	}
}

// runBinary runs bin with args and returns its exit status and output.
func runBinary(bin string, args ...string) (int, string, string) {
	cmd := exec.Command(bin, args...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String(), errb.String()
	}
	if err != nil {
		return -1, out.String(), err.Error()
	}
	return 0, out.String(), errb.String()
}
