//go:build kubecluster

package kubernetes_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/stockade-sh/stockade/driver/kubernetes"
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
		t.Cleanup(func() {
			// t.Context() has ended by now.
			_ = cs.CoreV1().Namespaces().Delete(context.Background(), ns.GetName(), metav1.DeleteOptions{})
		})
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
