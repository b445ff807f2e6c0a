//go:build kubecluster

package kubernetes_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/stockade-sh/stockade/driver/kubernetes"
	"github.com/stockade-sh/stockade/internal/testenv"
)

// TestClusterDaemon runs the README's API example (approval, 2 credits,
// audit) against `stockade serve` with STOCKADE_DRIVER=kubernetes, on
// gVisor pods of the cluster (the built-in tool's tier), then kills the
// daemon (SIGKILL) while a run's pod is up and shows that the restarted
// daemon reaps that pod and records the run as recovered; then runs the
// README's session there (state, files, a PNG) and kills the daemon with
// the session's pod up: the next daemon deletes the pod and ends the
// session interrupted, saying why (the driver cannot re-attach). Its data
// directory is a temporary one holding a copy of the python image; the
// image is imported on the node. Needs podPidsLimit 320 (gVisor).
func TestClusterDaemon(t *testing.T) {
	kc := os.Getenv("STOCKADE_TEST_KUBECONFIG")
	ctr := strings.Fields(os.Getenv("STOCKADE_TEST_KUBE_CTR"))
	if kc == "" || len(ctr) == 0 {
		t.Fatal("set STOCKADE_TEST_KUBECONFIG and STOCKADE_TEST_KUBE_CTR (see cluster_test.go)")
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := k8s.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ns := "stockade-daemon-test"
	ensureNamespace(t, cs, ns)

	bin, guest := testenv.Build(t, "./cmd/stockade"), testenv.Guest(t)
	img := testenv.Image(t, "python")
	importImage(t, ctr, img, guest)
	data, state := t.TempDir(), t.TempDir()
	hex := strings.TrimPrefix(img.Digest, "sha256:")
	for _, dir := range []string{"images/refs", "images/sha256"} {
		if err := os.MkdirAll(filepath.Join(data, dir), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"images/refs/python", "images/sha256/" + hex} {
		if out, err := exec.Command("cp", "-a", filepath.Join(testenv.DataDir(), p), filepath.Join(data, p)).CombinedOutput(); err != nil {
			t.Fatalf("copying the python image: %v: %s", err, out)
		}
	}
	seccomp := os.Getenv("STOCKADE_TEST_KUBE_SECCOMP_DIR")
	if seccomp == "" {
		seccomp = "/var/lib/stockade-kube/kubelet/seccomp"
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	env := append(os.Environ(), "STOCKADE_DATA_DIR="+data, "STOCKADE_DRIVER=kubernetes", "STOCKADE_KUBECONFIG="+kc,
		"STOCKADE_KUBERNETES_NAMESPACE="+ns, "STOCKADE_KUBERNETES_GVISOR_CLASS=gvisor-nonet",
		"STOCKADE_KUBERNETES_CONTAINER_CLASS=runc-nonet", "STOCKADE_KUBERNETES_SECCOMP_DIR="+seccomp)
	// The daemon's log, of both its runs: a file, which the test reads
	// while the daemon writes it.
	logf, err := os.Create(filepath.Join(t.TempDir(), "daemon.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	readLog := func() string {
		b, _ := os.ReadFile(logf.Name())
		return string(b)
	}
	// No warm pools: the driver binds, and the default configuration's
	// python pool would keep pods of its own beside the run's and the
	// session's, which this test counts (TestClusterPool tests pools).
	conf := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(conf, []byte("pools: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	serve := func() *exec.Cmd {
		cmd := exec.Command(bin, "serve", "--config", conf, "--state-dir", state, "--listen", addr, "--egress=false", "--guest", guest)
		cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if r, err := http.Get("http://" + addr + "/healthz"); err == nil {
				r.Body.Close()
				if r.StatusCode == http.StatusOK {
					return cmd
				}
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("the daemon did not serve in 30 s: %s", readLog())
			}
		}
	}
	daemon := serve()
	defer func() {
		daemon.Process.Signal(syscall.SIGTERM)
		daemon.Wait()
		t.Logf("daemon's log:\n%s", readLog())
	}()
	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("stockade %v: %v", args, err)
		}
		return strings.TrimSpace(string(out))
	}
	call := func(method, path, key, body string, want int) map[string]any {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		if r.StatusCode != want {
			t.Fatalf("%s %s: got %d %s, want %d", method, path, r.StatusCode, b, want)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
		return m
	}

	// The README's session.
	cli("workspace", "create", "demo")
	agent := cli("key", "create", "--workspace", "demo", "--role", "agent")
	approver := cli("key", "create", "--workspace", "demo", "--role", "approver")
	admin := cli("key", "create", "--workspace", "demo", "--role", "admin")
	cli("credits", "grant", "demo", "100")
	ex := call("POST", "/v1/executions", agent, `{"runtime":"python","code":"print(6*7)"}`, http.StatusAccepted)
	id, approval := ex["id"].(string), ex["approval_id"].(string)
	if ex["status"] != "awaiting_approval" || approval == "" {
		t.Fatalf("POST /v1/executions: got %v, want awaiting_approval with an approval", ex)
	}
	if pending := call("GET", "/v1/approvals?status=pending", approver, "", http.StatusOK); !strings.Contains(fmt.Sprint(pending["items"]), approval) {
		t.Errorf("pending approvals %v lack %s", pending, approval)
	}
	call("POST", "/v1/approvals/"+approval+"/approve", agent, "", http.StatusForbidden)
	call("POST", "/v1/approvals/"+approval+"/approve", approver, "", http.StatusOK)
	start := time.Now()
	res := call("GET", "/v1/executions/"+id+"?wait=60s", agent, "", http.StatusOK)
	result, _ := res["result"].(map[string]any)
	t.Logf("approved to result: %s; %v", time.Since(start).Round(time.Millisecond), result)
	if res["status"] != "succeeded" || result["stdout"] != "42\n" || res["driver"] != "kubernetes" {
		t.Errorf("execution: got status %v driver %v result %v, want 42 from driver kubernetes", res["status"], res["driver"], result)
	}
	credits, _ := call("GET", "/v1/workspace", agent, "", http.StatusOK)["credits"].(map[string]any)
	if credits["available"] != float64(98) {
		t.Errorf("credits: got %v, want 98 available", credits)
	}
	if out := cli("audit", "verify", "--workspace", "demo"); !strings.Contains(out, ": ok (") {
		t.Errorf("audit verify: %s", out)
	}
	events := func() string {
		return fmt.Sprint(call("GET", "/v1/audit/events", admin, "", http.StatusOK)["items"])
	}
	for _, e := range []string{"approval.requested", "approval.approved", "execution.finished"} {
		if !strings.Contains(events(), e) {
			t.Errorf("audit events lack %s", e)
		}
	}

	// Kill the daemon while a run's pod is up; the restarted daemon reaps
	// the pod and records the run as recovered.
	cli("policy", "set", "demo", "--approval=none")
	go func() {
		req, _ := http.NewRequest("POST", "http://"+addr+"/v1/executions", strings.NewReader(`{"runtime":"python","code":"import time\ntime.sleep(25)"}`))
		req.Header.Set("Authorization", "Bearer "+agent)
		if r, err := http.DefaultClient.Do(req); err == nil {
			r.Body.Close()
		}
	}()
	pods := func() []corev1.Pod {
		list, err := cs.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: kubernetes.LabelManaged + "=" + kubernetes.ManagedBy})
		if err != nil {
			t.Fatal(err)
		}
		return list.Items
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if p := pods(); len(p) == 1 && p[0].Status.Phase == corev1.PodRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no running pod of the run in 60 s: %v", pods())
		}
	}
	daemon.Process.Kill()
	daemon.Wait()
	if len(pods()) != 1 {
		t.Fatalf("the killed daemon's pod is gone already, so the check cannot see a reap")
	}
	start = time.Now()
	daemon = serve()
	for deadline := time.Now().Add(30 * time.Second); len(pods()) > 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the restarted daemon left the pod: %v", pods())
		}
	}
	t.Logf("restart to the pod reaped: %s", time.Since(start).Round(time.Millisecond))
	if !strings.Contains(readLog(), "destroyed orphaned sandboxes") {
		t.Errorf("the daemon's log does not say it destroyed the orphan")
	}
	if !strings.Contains(events(), "execution.recovered") {
		t.Errorf("audit events lack execution.recovered")
	}

	// The README's session, on a gVisor pod: state across cells, a file
	// written by one cell and read by the next and through the files
	// API, a file put there read by a cell, a matplotlib figure as a PNG.
	// The driver cannot re-attach a pod, so the session lives as long as
	// its daemon: killed, the next daemon deletes the pod and ends the
	// session interrupted, saying why.
	raw := func(method, path, body string, want int) []byte {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+agent)
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		if r.StatusCode != want {
			t.Fatalf("%s %s: got %d %s, want %d", method, path, r.StatusCode, b, want)
		}
		return b
	}
	start = time.Now()
	ses := call("POST", "/v1/sessions", agent, `{"runtime":"python"}`, http.StatusCreated)
	sid, _ := ses["id"].(string)
	t.Logf("session %s opened in %s on driver %v", sid, time.Since(start).Round(time.Millisecond), ses["driver"])
	if ses["driver"] != "kubernetes" || ses["state"] != "active" {
		t.Fatalf("POST /v1/sessions: got %v, want an active session on driver kubernetes", ses)
	}
	cell := func(code string) map[string]any {
		t.Helper()
		b, _ := json.Marshal(map[string]string{"code": code})
		start := time.Now()
		c := call("POST", "/v1/sessions/"+sid+"/exec", agent, string(b), http.StatusOK)
		if c["status"] != "succeeded" {
			t.Fatalf("cell %q: got %v, want succeeded", code, c)
		}
		t.Logf("cell %q: %s", code, time.Since(start).Round(time.Millisecond))
		return c
	}
	cell("x = 6 * 7")
	if c := cell("print(x)"); c["stdout"] != "42\n" {
		t.Errorf("a variable across cells: got stdout %q, want 42", c["stdout"])
	}
	cell(`open("note.txt", "w").write("from a cell")`)
	if c := cell(`print(open("note.txt").read())`); c["stdout"] != "from a cell\n" {
		t.Errorf("a file across cells: got stdout %q, want the first cell's text", c["stdout"])
	}
	if got := string(raw("GET", "/v1/sessions/"+sid+"/files?path=note.txt", "", http.StatusOK)); got != "from a cell" {
		t.Errorf("GET the cell's file: got %q, want its text", got)
	}
	raw("PUT", "/v1/sessions/"+sid+"/files?path=sales.csv", "region,total\nnorth,42\nsouth,8\n", http.StatusCreated)
	cell(`import pandas as pd; df = pd.read_csv("sales.csv")`)
	if c := cell("print(df.total.sum())"); c["stdout"] != "50\n" {
		t.Errorf("the file put through the API: got stdout %q, want 50", c["stdout"])
	}
	c := cell(`df.plot.bar(x="region")`)
	outs, _ := c["outputs"].([]any)
	png := false
	for _, o := range outs {
		o, _ := o.(map[string]any)
		if o["mime_type"] != "image/png" {
			continue
		}
		data, _ := o["data"].(string)
		b, err := base64.StdEncoding.DecodeString(data)
		png = err == nil && strings.HasPrefix(string(b), "\x89PNG\r\n")
	}
	if !png {
		t.Errorf("the plot cell's outputs: got %d, want an image/png that is a PNG", len(outs))
	}
	if b := raw("POST", "/v1/sessions/"+sid+"/pause", "", http.StatusConflict); !strings.Contains(string(b), "kubernetes driver cannot pause") {
		t.Errorf("pausing: got %s, want the refusal with the reason", b)
	}
	running := pods()
	if len(running) != 1 || running[0].Status.Phase != corev1.PodRunning {
		t.Fatalf("pods while the session is open: got %d, want its one running pod", len(running))
	}
	daemon.Process.Kill()
	daemon.Wait()
	if p := pods(); len(p) != 1 || p[0].Name != running[0].Name {
		t.Fatalf("the killed daemon's session pod is gone already, so the check cannot see a reap")
	}
	start = time.Now()
	daemon = serve()
	for deadline := time.Now().Add(30 * time.Second); len(pods()) > 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the restarted daemon left the session's pod: %v", pods())
		}
	}
	t.Logf("restart to the session's pod reaped: %s", time.Since(start).Round(time.Millisecond))
	const why = "the daemon restarted and driver kubernetes cannot re-attach a sandbox"
	ended := call("GET", "/v1/sessions/"+sid, agent, "", http.StatusOK)
	if detail, _ := ended["end_detail"].(string); ended["state"] != "ended" || ended["end_reason"] != "interrupted" || !strings.HasPrefix(detail, why) {
		t.Errorf("the session after the restart: got %v, want ended interrupted: %s", ended, why)
	}
	if b := raw("POST", "/v1/sessions/"+sid+"/exec", `{"code":"print(x)"}`, http.StatusGone); !strings.Contains(string(b), why) {
		t.Errorf("a cell after the restart: got %s, want session_expired saying %q", b, why)
	}
	if ev := events(); !strings.Contains(ev, "session.ended") || !strings.Contains(ev, why) {
		t.Errorf("audit events lack the session's session.ended saying %q", why)
	}
	if out := cli("audit", "verify", "--workspace", "demo"); !strings.Contains(out, ": ok (") {
		t.Errorf("audit verify: %s", out)
	}
}

// ensureNamespace creates namespace ns unless it exists, enforcing the
// restricted Pod Security Standard as deploy/kubernetes/rbac.yaml's does
// (the driver's pods must meet it), and waits for its default service
// account, without which no pod is admitted.
func ensureNamespace(t *testing.T, cs k8s.Interface, ns string) {
	t.Helper()
	_, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: ns, Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"},
	}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if _, err := cs.CoreV1().ServiceAccounts(ns).Get(t.Context(), "default", metav1.GetOptions{}); err == nil {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("namespace %s has no default service account: %v", ns, err)
		}
	}
}
