package kubernetes

import (
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// TestCreateUnboundPod: CreateUnbound makes the pod Create would, with
// its pool's labels and the lifetime of its Spec's (long) timeout.
func TestCreateUnboundPod(t *testing.T) {
	cs := fake.NewClientset()
	d := fakeDriver(t, "", cs)
	created := failCreate(cs)
	img := sandbox.Image{Name: "python", Digest: "sha256:" + strings.Repeat("0", 64), Rootfs: "/x"}
	pool := map[string]string{"stockade.pool": "python/python"}
	timeout := 21 * time.Minute // a pool's: its wait and its run
	if _, err := d.CreateUnbound(t.Context(), sandbox.Spec{Image: img, Labels: pool, Limits: sandbox.Limits{Timeout: timeout}}); !errdefs.IsUnavailable(err) {
		t.Fatalf("CreateUnbound of a pod that ends: %v, want ErrUnavailable", err)
	}
	pods := created()
	if len(pods) != 1 {
		t.Fatalf("CreateUnbound made %d pods, want 1", len(pods))
	}
	if got := podLabels(pods[0]); !maps.Equal(got, pool) {
		t.Errorf("the pod's labels: %v, want the pool's %v", got, pool)
	}
	want := int64((timeout + d.cfg.ReadyTimeout + lifetimeMargin) / time.Second)
	if got := pods[0].Spec.ActiveDeadlineSeconds; got == nil || *got != want {
		t.Errorf("the pod's ActiveDeadlineSeconds: %v, want %d", got, want)
	}
}

// bindPod plants the pod of an unbound pool sandbox, started started ago
// with a deadline of deadline seconds, and returns its sandbox.
func bindPod(t *testing.T, d *Driver, cs *fake.Clientset, id string, started time.Duration, deadline int64) *sbx {
	t.Helper()
	pod := testPod(t, podConfig{ID: id, Lifetime: time.Duration(deadline) * time.Second}, sandbox.Spec{Labels: map[string]string{"pool": "p"}})
	pod.UID = types.UID("uid-" + id)
	start := metav1.NewTime(time.Now().Add(-started))
	pod.Status.StartTime = &start
	pod, err := cs.CoreV1().Pods("sandboxes").Create(t.Context(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := d.newSbx(id, pod, testLimits())
	s.unbound = true
	return s
}

// podState is what a Bind may change of a pod.
func podState(t *testing.T, cs *fake.Clientset, id string) (map[string]string, int64) {
	t.Helper()
	pod, err := cs.CoreV1().Pods("sandboxes").Get(t.Context(), PodName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return podLabels(pod), *pod.Spec.ActiveDeadlineSeconds
}

// TestBind: Bind adds the binding's labels to the pod's (Reap finds it by
// them) and lowers its deadline to the time it has run plus the
// binding's timeout, with one merge patch.
func TestBind(t *testing.T) {
	cs := fake.NewClientset()
	d := fakeDriver(t, "", cs)
	s := bindPod(t, d, cs, "bound", 90*time.Second, 3600)
	var patches []string
	cs.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.PatchAction)
		if p.GetPatchType() != types.MergePatchType {
			t.Errorf("patch type %s, want a merge patch", p.GetPatchType())
		}
		patches = append(patches, string(p.GetPatch()))
		return false, nil, nil
	})
	l := testLimits()
	b := sandbox.Binding{
		Labels: map[string]string{"execution": "e1"},
		// Equal memory and CPU keep; a shorter timeout tightens.
		Limits: sandbox.Limits{Memory: l.Memory, CPU: l.CPU, Timeout: 10 * time.Second},
	}
	if err := d.Bind(t.Context(), s, b); err != nil {
		t.Fatalf("Bind: %v", err)
	}
	if len(patches) != 1 {
		t.Fatalf("Bind sent %d patches, want 1", len(patches))
	}
	labels, deadline := podState(t, cs, "bound")
	if want := map[string]string{"pool": "p", "execution": "e1"}; !maps.Equal(labels, want) {
		t.Errorf("the pod's labels after Bind: %v, want %v", labels, want)
	}
	// 90 s run, 10 s timeout, the margin; a second for the clock.
	want := int64((90*time.Second + 10*time.Second + lifetimeMargin) / time.Second)
	if deadline < want || deadline > want+2 {
		t.Errorf("the pod's ActiveDeadlineSeconds after Bind: %d, want %d", deadline, want)
	}
	if s.Guest.Limits.Timeout != 10*time.Second {
		t.Errorf("the guest's timeout after Bind: %s, want 10s", s.Guest.Limits.Timeout)
	}
	if reaped, err := d.Reap(t.Context(), map[string]string{"execution": "e1"}); err != nil || len(reaped) != 1 || reaped[0] != "bound" {
		t.Errorf("Reap by the binding's labels: %v, %v; want bound", reaped, err)
	}
}

// TestBindRefusals: a second Bind, a Bind of a sandbox Create made, and a
// binding with other memory or CPU, a label the pod has or a network
// are refused, and leave the pod as it was.
func TestBindRefusals(t *testing.T) {
	cs := fake.NewClientset()
	d := fakeDriver(t, "", cs)
	l := testLimits()
	s := bindPod(t, d, cs, "refused", time.Minute, 3600)
	before, deadline := podState(t, cs, "refused")
	for name, tc := range map[string]struct {
		b    sandbox.Binding
		want error
	}{
		"tighter memory": {sandbox.Binding{Limits: sandbox.Limits{Memory: l.Memory / 2, Timeout: time.Second}}, errdefs.ErrInvalidArgument},
		"tighter CPU":    {sandbox.Binding{Limits: sandbox.Limits{CPU: l.CPU / 2, Timeout: time.Second}}, errdefs.ErrInvalidArgument},
		"looser memory":  {sandbox.Binding{Limits: sandbox.Limits{Memory: l.Memory * 2}}, errdefs.ErrInvalidArgument},
		"a label it has": {sandbox.Binding{Labels: map[string]string{"pool": "q"}, Limits: sandbox.Limits{Timeout: time.Second}}, errdefs.ErrInvalidArgument},
		"a network":      {sandbox.Binding{Network: sandbox.NetworkEgress}, errdefs.ErrInvalidArgument},
	} {
		if err := d.Bind(t.Context(), s, tc.b); !errors.Is(err, tc.want) {
			t.Errorf("Bind with %s: %v, want %v", name, err, tc.want)
		}
	}
	if labels, dl := podState(t, cs, "refused"); !maps.Equal(labels, before) || dl != deadline {
		t.Errorf("refused Binds changed the pod: labels %v, deadline %d; were %v, %d", labels, dl, before, deadline)
	}
	if s.Guest.Limits != l {
		t.Errorf("refused Binds changed the guest's limits: %+v", s.Guest.Limits)
	}

	// The pod is still unbound: a binding that fits binds it once.
	if err := d.Bind(t.Context(), s, sandbox.Binding{Labels: map[string]string{"execution": "e1"}}); err != nil {
		t.Fatalf("Bind after the refusals: %v", err)
	}
	bound, deadline := podState(t, cs, "refused")
	if err := d.Bind(t.Context(), s, sandbox.Binding{Labels: map[string]string{"again": "1"}}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("a second Bind: %v, want ErrFailedPrecondition", err)
	}
	created := bindPod(t, d, cs, "created", time.Minute, 3600)
	created.unbound = false // as Create leaves it
	if err := d.Bind(t.Context(), created, sandbox.Binding{Labels: map[string]string{"again": "1"}}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Bind of a sandbox Create made: %v, want ErrFailedPrecondition", err)
	}
	if labels, dl := podState(t, cs, "refused"); !maps.Equal(labels, bound) || dl != deadline {
		t.Errorf("a second Bind changed the pod: labels %v, deadline %d; were %v, %d", labels, dl, bound, deadline)
	}
	if labels, _ := podState(t, cs, "created"); labels["again"] != "" {
		t.Errorf("a Bind of a sandbox Create made changed its labels: %v", labels)
	}
}

// TestBindPatch: the deadline only decreases, and a session's pod keeps
// its own.
func TestBindPatch(t *testing.T) {
	now := time.Now()
	start := metav1.NewTime(now.Add(-time.Minute))
	secs := int64(3600)
	pod := &corev1.Pod{Spec: corev1.PodSpec{ActiveDeadlineSeconds: &secs}, Status: corev1.PodStatus{StartTime: &start}}
	for name, tc := range map[string]struct {
		timeout time.Duration
		session bool
		want    int64 // 0: no deadline in the patch
	}{
		"shorter":     {time.Minute, false, int64((2*time.Minute + lifetimeMargin) / time.Second)},
		"no timeout":  {0, false, 0},
		"longer":      {2 * time.Hour, false, 0},
		"a session's": {time.Minute, true, 0},
	} {
		b, err := bindPatch(pod, map[string]string{"a": "b"}, tc.timeout, tc.session, now)
		if err != nil {
			t.Fatal(err)
		}
		var p struct {
			Metadata struct{ Annotations map[string]string }
			Spec     *struct{ ActiveDeadlineSeconds int64 }
		}
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if p.Metadata.Annotations[AnnotationLabels] != `{"a":"b"}` {
			t.Errorf("%s: patch %s: want the labels' annotation", name, b)
		}
		var got int64
		if p.Spec != nil {
			got = p.Spec.ActiveDeadlineSeconds
		}
		if got != tc.want {
			t.Errorf("%s: patch %s: deadline %d, want %d", name, b, got, tc.want)
		}
	}
}
