//go:build kubecluster

package kubernetes_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/stockade-sh/stockade/driver/kubernetes"
	"github.com/stockade-sh/stockade/internal/guestbin"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// deployDir holds the manifests of docs/kubernetes.md's "Deploying on a
// cluster", from this package's directory.
const deployDir = "../../deploy/kubernetes"

// TestClusterDeployManifests applies every manifest of deploy/kubernetes
// to the cluster, as `kubectl apply --server-side --dry-run=server`
// would: the API server validates and admits each object (RBAC's
// escalation check, the RuntimeClasses' handlers, the Deployment's
// schema) and keeps none. Only the namespace and the daemon's
// ServiceAccount are created for real (a dry run of a namespaced object
// needs its namespace; a pod, its ServiceAccount), and removed after.
//
// Then the Deployment's pod, as its ReplicaSet would create it, is
// admitted (a dry run) in the namespace, which enforces the restricted
// Pod Security Standard; the same pod with its container's
// securityContext removed is refused by PodSecurity there first, so the
// check sees a refusal when there is one. The Deployment itself draws no
// PodSecurity warning. Needs only STOCKADE_TEST_KUBECONFIG (a cluster
// admin's: it creates a Role).
func TestClusterDeployManifests(t *testing.T) {
	kc := os.Getenv("STOCKADE_TEST_KUBECONFIG")
	if kc == "" {
		t.Fatal("set STOCKADE_TEST_KUBECONFIG (see cluster_test.go)")
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	warnings := &warningLog{}
	rc.WarningHandler = warnings
	cs, err := k8s.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(cs.Discovery())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)

	objs := readManifests(t, deployDir)
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
	}
	for _, k := range []string{"Namespace", "ServiceAccount", "Role", "RoleBinding", "RuntimeClass", "ConfigMap", "PersistentVolumeClaim", "Deployment", "Service"} {
		if kinds[k] == 0 {
			t.Errorf("no %s in %s (found %v)", k, deployDir, kinds)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	ns := only(t, objs, "Namespace")
	if got := ns.GetLabels()["pod-security.kubernetes.io/enforce"]; got != "restricted" {
		t.Fatalf("namespace %s enforces Pod Security %q, want restricted", ns.GetName(), got)
	}
	if _, err := cs.CoreV1().Namespaces().Get(t.Context(), ns.GetName(), metav1.GetOptions{}); apierrors.IsNotFound(err) {
		t.Cleanup(func() { deleteNamespace(t, cs, ns.GetName()) })
	} else if err != nil {
		t.Fatal(err)
	}
	var dep appsv1.Deployment
	var depApply func(*unstructured.Unstructured) error
	for _, o := range objs {
		m, err := mapper.RESTMapping(o.GroupVersionKind().GroupKind(), o.GroupVersionKind().Version)
		if err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if o.GetNamespace() != "" {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		opts := metav1.PatchOptions{FieldManager: "stockade-deploy-test", Force: new(true)}
		real := o.GetKind() == "Namespace" || o.GetKind() == "ServiceAccount"
		if !real {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		body, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		warnings.reset()
		got, err := ri.Patch(t.Context(), o.GetName(), types.ApplyPatchType, body, opts)
		if err != nil {
			t.Errorf("applying %s %s/%s (dry run: %t): %v", o.GetKind(), o.GetNamespace(), o.GetName(), !real, err)
			continue
		}
		t.Logf("applied %s %s/%s (dry run: %t)", got.GetKind(), got.GetNamespace(), got.GetName(), !real)
		if w := warnings.all(); len(w) > 0 {
			t.Errorf("applying %s %s: warnings %q", o.GetKind(), o.GetName(), w)
		}
		if o.GetKind() == "Deployment" {
			depApply = func(o *unstructured.Unstructured) error {
				body, err := o.MarshalJSON()
				if err != nil {
					return err
				}
				_, err = ri.Patch(t.Context(), o.GetName(), types.ApplyPatchType, body, opts)
				return err
			}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &dep); err != nil {
				t.Fatal(err)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// What the pod must be, besides what PodSecurity checks.
	tmpl := dep.Spec.Template
	sa := only(t, objs, "ServiceAccount")
	if tmpl.Spec.ServiceAccountName != sa.GetName() || tmpl.Spec.AutomountServiceAccountToken == nil || !*tmpl.Spec.AutomountServiceAccountToken {
		t.Errorf("pod: ServiceAccount %q (automount %v), want %q with its token mounted", tmpl.Spec.ServiceAccountName, tmpl.Spec.AutomountServiceAccountToken, sa.GetName())
	}
	if _, ok := tmpl.Labels[kubernetes.LabelManaged]; ok {
		t.Errorf("pod: label %s marks the sandboxes' pods (reaped, denied all traffic), not the daemon's", kubernetes.LabelManaged)
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 || dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("Deployment: %v replicas, strategy %s; the database admits one daemon: want 1, Recreate", dep.Spec.Replicas, dep.Spec.Strategy.Type)
	}
	if len(tmpl.Spec.Containers) != 1 {
		t.Fatalf("pod: %d containers, want 1", len(tmpl.Spec.Containers))
	}
	c := tmpl.Spec.Containers[0]
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("pod: readiness probe %+v, want GET /healthz", c.ReadinessProbe)
	}
	if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("pod: root filesystem not read-only: %+v", sc)
	}

	// The warning check sees PodSecurity's: the Deployment whose pod
	// sets no securityContext (root allowed, no seccomp profile) draws one.
	badDep := only(t, objs, "Deployment").DeepCopy()
	unstructured.RemoveNestedField(badDep.Object, "spec", "template", "spec", "securityContext")
	warnings.reset()
	if err := depApply(badDep); err != nil {
		t.Fatal(err)
	}
	if w := strings.Join(warnings.all(), "\n"); !strings.Contains(w, `would violate PodSecurity "restricted`) {
		t.Fatalf("a Deployment whose pod sets no securityContext drew warnings %q, want PodSecurity's", w)
	}

	// The pod its ReplicaSet would create, admitted under restricted.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "stockade-deploy-check", Namespace: dep.Namespace, Labels: tmpl.Labels},
		Spec:       *tmpl.Spec.DeepCopy(),
	}
	// First, that PodSecurity refuses what it should: the same pod without
	// its container's securityContext (privilege escalation allowed,
	// capabilities kept).
	bad := pod.DeepCopy()
	bad.Spec.Containers[0].SecurityContext = nil
	_, err = cs.CoreV1().Pods(pod.Namespace).Create(t.Context(), bad, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `violates PodSecurity "restricted`) {
		t.Fatalf("a pod without securityContext in %s: got %v, want PodSecurity's refusal (restricted)", pod.Namespace, err)
	}
	t.Logf("control, refused: %v", err)
	if _, err := cs.CoreV1().Pods(pod.Namespace).Create(t.Context(), pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("the Deployment's pod in %s (restricted): %v", pod.Namespace, err)
	}
}

// deleteNamespace deletes namespace ns and waits (a minute at most) for
// it to be gone, so that the next test can make it again. For cleanups:
// it does not use t.Context(), which has ended then.
func deleteNamespace(t *testing.T, cs k8s.Interface, ns string) {
	ctx := context.Background()
	if err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); apierrors.IsNotFound(err) {
		return
	} else if err != nil {
		t.Errorf("deleting namespace %s: %v", ns, err)
		return
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if _, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return
		}
	}
	t.Errorf("namespace %s still there a minute after its deletion", ns)
}

// readManifests decodes every object of the YAML files in dir, in the
// order `kubectl apply -f dir` applies them (by file name).
func readManifests(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", dir, err)
	}
	slices.Sort(files)
	var out []*unstructured.Unstructured
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var m map[string]any
			if err := dec.Decode(&m); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if len(m) == 0 {
				continue // a document of comments only
			}
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
	return out
}

// only returns the one object of kind among objs.
func only(t *testing.T, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d objects of kind %s in %s, want 1", len(found), kind, deployDir)
	}
	return found[0]
}

// warningLog keeps the API server's warnings (rest.WarningHandler).
type warningLog struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warningLog) HandleWarningHeader(code int, agent, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

func (w *warningLog) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = nil
}

func (w *warningLog) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.msgs)
}

// TestClusterDeployDaemon runs the daemon as deploy/kubernetes/serve.yaml
// deploys it, in a pod of the cluster, and has it run a program on a
// gVisor pod: the Deployment's pod (non-root, read-only root, no
// capabilities, under the namespace's restricted level) becomes Ready on
// /healthz, which it answers once the driver, in the pod's in-cluster
// configuration and rbac.yaml's Role, lists the namespace's pods; then,
// as docs/kubernetes.md says, `kubectl exec deploy/stockade -- stockade
// ...` makes a workspace and a key on the daemon's database, and `stockade
// run --url` inside the pod runs `echo` on a sandbox pod the daemon
// creates, attaches to and deletes.
//
// What the test cluster lacks, the test makes up for, and only that: the
// daemon's image is a static stockade imported on the node (none is
// published); kubernetes.registry is removed from the configuration (no
// registry: the sandbox's image is imported on the node too); the claim
// is bound to a hostPath volume (no storage provisioner) holding the
// shell image's store; the database is SQLite on it (the host's
// PostgreSQL is not reachable from pods); KUBERNETES_SERVICE_HOST names
// the API server's node address (no kube-proxy: the Service address does
// not route). Needs podPidsLimit 320 (gVisor) and
// STOCKADE_TEST_KUBE_CTR.
func TestClusterDeployDaemon(t *testing.T) {
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
	apiHost, apiPort, err := net.SplitHostPort(strings.TrimPrefix(rc.Host, "https://"))
	if err != nil {
		t.Fatalf("the API server's address %q: %v", rc.Host, err)
	}
	objs := readManifests(t, deployDir)
	ns := only(t, objs, "Namespace").GetName()

	// The images: the daemon's, and the sandbox's (shell) on the node and
	// in the image store on the data volume, owned by the pod's user.
	start := time.Now()
	bin, guest := testenv.Build(t, "./cmd/stockade"), testenv.Guest(t)
	daemonRef := "stockade.invalid/stockade-daemon:test"
	importDaemonImage(t, ctr, bin, guest, daemonRef)
	// The sandbox's image carries the guest the daemon's binary embeds,
	// which it installs and names the image by (not the test's build of
	// the guest).
	embedded, err := guestbin.Install(filepath.Join(t.TempDir(), "bin"))
	if err != nil {
		t.Fatal(err)
	}
	img := testenv.Image(t, "shell")
	importImage(t, ctr, img, embedded)
	volume := t.TempDir()
	data := filepath.Join(volume, "data")
	for _, p := range []string{"images/refs/shell", "images/sha256/" + strings.TrimPrefix(img.Digest, "sha256:")} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(data, p)), 0o700); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-a", filepath.Join(testenv.DataDir(), p), filepath.Join(data, p)).CombinedOutput(); err != nil {
			t.Fatalf("copying the shell image: %v: %s", err, out)
		}
	}
	if out, err := exec.Command("chown", "-R", "65532:65532", volume).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v: %s", err, out)
	}
	t.Logf("images ready in %.1f s", time.Since(start).Seconds())

	// rbac.yaml for real; a Secret with the database; a volume for the
	// claim.
	create := func(o *unstructured.Unstructured) {
		t.Helper()
		groups, err := restmapper.GetAPIGroupResources(cs.Discovery())
		if err != nil {
			t.Fatal(err)
		}
		m, err := restmapper.NewDiscoveryRESTMapper(groups).RESTMapping(o.GroupVersionKind().GroupKind(), o.GroupVersionKind().Version)
		if err != nil {
			t.Fatal(err)
		}
		dyn, err := dynamic.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if o.GetNamespace() != "" {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		body, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ri.Patch(t.Context(), o.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "stockade-deploy-test", Force: new(true)}); err != nil {
			t.Fatalf("applying %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	pvName := "stockade-deploy-test"
	t.Cleanup(func() {
		// The namespace's pods first (the daemon's, then any sandbox it
		// left), so that nothing holds the volume when it goes.
		deleteNamespace(t, cs, ns)
		_ = cs.CoreV1().PersistentVolumes().Delete(context.Background(), pvName, metav1.DeleteOptions{})
	})
	for _, o := range objs {
		switch o.GetKind() {
		case "Namespace", "ServiceAccount", "Role", "RoleBinding":
			create(o)
		}
	}
	if _, err := cs.CoreV1().Secrets(ns).Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "stockade-db", Namespace: ns},
		StringData: map[string]string{"url": "sqlite:/var/lib/stockade/data/stockade.db"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim := only(t, objs, "PersistentVolumeClaim")
	if _, err := cs.CoreV1().PersistentVolumes().Create(t.Context(), &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("5Gi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: volume}},
			ClaimRef:               &corev1.ObjectReference{Namespace: ns, Name: claim.GetName()},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// serve.yaml, with what the test cluster lacks made up for.
	cm := only(t, objs, "ConfigMap").DeepCopy()
	conf, _, _ := unstructured.NestedString(cm.Object, "data", "config.yaml")
	lines := strings.Split(conf, "\n")
	kept := slices.DeleteFunc(slices.Clone(lines), func(l string) bool { return strings.HasPrefix(strings.TrimSpace(l), "registry:") })
	if len(lines)-len(kept) != 1 {
		t.Fatalf("config.yaml: no registry key to remove:\n%s", conf)
	}
	if err := unstructured.SetNestedField(cm.Object, strings.Join(kept, "\n"), "data", "config.yaml"); err != nil {
		t.Fatal(err)
	}
	create(cm)
	create(claim)
	var dep appsv1.Deployment
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(only(t, objs, "Deployment").Object, &dep); err != nil {
		t.Fatal(err)
	}
	c := &dep.Spec.Template.Spec.Containers[0]
	c.Image, c.ImagePullPolicy = daemonRef, corev1.PullNever
	c.Env = append(c.Env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: apiHost}, corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: apiPort})
	start = time.Now()
	if _, err := cs.AppsV1().Deployments(ns).Create(t.Context(), &dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := waitDaemonReady(t, cs, ns, dep.Spec.Selector.MatchLabels, 120*time.Second)
	t.Logf("the daemon's pod %s Ready in %.1f s (Deployment created to Ready)", pod, time.Since(start).Seconds())

	run := func(args ...string) string {
		t.Helper()
		out, errOut, err := podExec(t, rc, cs, ns, pod, append(slices.Clone(c.Command), args...))
		if err != nil {
			t.Fatalf("kubectl exec %s -- stockade %v: %v: %s%s\nthe daemon's log:\n%s", pod, args, err, out, errOut, podLog(cs, ns, pod))
		}
		return strings.TrimSpace(out)
	}
	run("workspace", "create", "demo")
	run("credits", "grant", "demo", "10")
	run("policy", "set", "demo", "--approval=none")
	key := run("key", "create", "--workspace", "demo", "--role", "agent")
	start = time.Now()
	out := run("run", "--url", "http://127.0.0.1:8700", "--key", key, "--runtime", "shell", "-c", "echo from a pod of the pod; id -u")
	t.Logf("stockade run through the daemon's pod: %.1f s: %q", time.Since(start).Seconds(), out)
	if out != "from a pod of the pod\n65534" {
		t.Errorf("stockade run: got %q, want the echo and uid 65534\nthe daemon's log:\n%s", out, podLog(cs, ns, pod))
	}
	// The run's sandbox pod is gone: the daemon deleted it.
	pods, err := cs.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: kubernetes.LabelManaged + "=" + kubernetes.ManagedBy})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			t.Errorf("sandbox pod %s left after the run (phase %s)", p.Name, p.Status.Phase)
		}
	}
}

// importDaemonImage imports on the node an image of one layer holding bin
// as /usr/local/bin/stockade, named ref: the daemon's image, as an
// operator would build it, for the kubelet to run without a registry.
func importDaemonImage(t *testing.T, ctr []string, bin, guest, ref string) {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"usr/local/bin", "tmp", "etc/stockade", "var/lib/stockade", "run/stockade"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("cp", bin, filepath.Join(root, "usr/local/bin/stockade")).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	if err := os.Chmod(filepath.Join(root, "usr/local/bin/stockade"), 0o755); err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(t.TempDir(), "daemon.tar")
	f, err := os.Create(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	// WriteImageArchive adds the guest and the sandbox images' kubelet
	// directory; neither is in the daemon's way.
	if err := kubernetes.WriteImageArchive(f, sandbox.Image{Name: "stockade-daemon", Rootfs: root}, guest, ref, filepath.Dir(tarPath)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(ctr[0], slices.Concat(ctr[1:], []string{"-n", "k8s.io", "images", "import", tarPath})...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ctr images import: %v: %s", err, out)
	}
}

// waitDaemonReady waits for the one pod matching labels to be Ready and
// returns its name; it fails with the pod's state and log otherwise.
func waitDaemonReady(t *testing.T, cs k8s.Interface, ns string, labels map[string]string, within time.Duration) string {
	t.Helper()
	var sel []string
	for k, v := range labels {
		sel = append(sel, k+"="+v)
	}
	var last corev1.Pod
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		pods, err := cs.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: strings.Join(sel, ",")})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			last = p
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return p.Name
				}
			}
		}
	}
	st, _ := json.MarshalIndent(last.Status, "", "  ")
	events, _ := cs.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{})
	var ev []string
	for _, e := range events.Items {
		ev = append(ev, e.InvolvedObject.Name+": "+e.Reason+": "+e.Message)
	}
	t.Fatalf("the daemon's pod %q not Ready in %s: %s\nevents:\n%s\nlog:\n%s", last.Name, within, st, strings.Join(ev, "\n"), podLog(cs, ns, last.Name))
	return ""
}

// podLog is the log of pod's container stockade, or why there is none.
func podLog(cs k8s.Interface, ns, pod string) string {
	if pod == "" {
		return "(no pod)"
	}
	b, err := cs.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: "stockade"}).Do(context.Background()).Raw()
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	return string(b)
}

// podExec runs cmd in pod's container stockade, as kubectl exec does, and
// returns its output.
func podExec(t *testing.T, rc *rest.Config, cs k8s.Interface, ns, pod string, cmd []string) (stdout, stderr string, err error) {
	t.Helper()
	req := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "stockade", Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(rc, "POST", req.URL())
	if err != nil {
		return "", "", err
	}
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut})
	return out.String(), errOut.String(), err
}
