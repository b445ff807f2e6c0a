package kubernetes

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/profile"
)

func testLimits() sandbox.Limits {
	return sandbox.Limits{CPU: 0.5}.WithDefaults(sandbox.DefaultLimits())
}

func testPod(t *testing.T, c podConfig, spec sandbox.Spec) *corev1.Pod {
	t.Helper()
	if c.ID == "" {
		c.ID = "sbx-0123456789abcdef"
	}
	if c.Namespace == "" {
		c.Namespace = "sandboxes"
	}
	if c.Image == "" {
		c.Image = "stockade.invalid/shell:0-0-k1"
	}
	pod, err := buildPod(profile.Default(), c, spec, testLimits())
	if err != nil {
		t.Fatalf("buildPod: %v", err)
	}
	return pod
}

// TestPodSecurity asserts every field of the pod that holds the profile.
func TestPodSecurity(t *testing.T) {
	p := profile.Default()
	pod := testPod(t, podConfig{Owner: "daemon-a", RuntimeClass: "gvisor", PullPolicy: corev1.PullNever},
		sandbox.Spec{Labels: map[string]string{"workspace": "w/1: x"}})
	s := pod.Spec
	isFalse := func(name string, b *bool) {
		t.Helper()
		if b == nil || *b {
			t.Errorf("%s = %v, want false", name, b)
		}
	}
	isTrue := func(name string, b *bool) {
		t.Helper()
		if b == nil || !*b {
			t.Errorf("%s = %v, want true", name, b)
		}
	}
	isFalse("automountServiceAccountToken", s.AutomountServiceAccountToken)
	isFalse("enableServiceLinks", s.EnableServiceLinks)
	isFalse("shareProcessNamespace", s.ShareProcessNamespace)
	if s.HostNetwork || s.HostPID || s.HostIPC || s.HostUsers != nil {
		t.Errorf("host namespaces: network %v pid %v ipc %v users %v, want none", s.HostNetwork, s.HostPID, s.HostIPC, s.HostUsers)
	}
	if s.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restartPolicy %s, want Never", s.RestartPolicy)
	}
	if s.RuntimeClassName == nil || *s.RuntimeClassName != "gvisor" {
		t.Errorf("runtimeClassName %v, want gvisor", s.RuntimeClassName)
	}
	if s.ServiceAccountName != "" || len(s.ImagePullSecrets) > 0 || len(s.InitContainers) > 0 || len(s.EphemeralContainers) > 0 {
		t.Errorf("service account %q, pull secrets %v, init containers %d, ephemeral %d: want none", s.ServiceAccountName, s.ImagePullSecrets, len(s.InitContainers), len(s.EphemeralContainers))
	}
	if s.DNSPolicy != corev1.DNSNone || s.DNSConfig == nil || !slices.Equal(s.DNSConfig.Nameservers, []string{"127.0.0.1"}) {
		t.Errorf("dns policy %s config %+v, want None with 127.0.0.1 only", s.DNSPolicy, s.DNSConfig)
	}
	if s.Hostname != p.Hostname {
		t.Errorf("hostname %q, want %q", s.Hostname, p.Hostname)
	}
	for _, v := range s.Volumes {
		if v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory {
			t.Errorf("volume %s is %+v, want a memory-backed emptyDir (no host path)", v.Name, v.VolumeSource)
		}
	}
	psc := s.SecurityContext
	if psc == nil || psc.RunAsUser == nil || *psc.RunAsUser != int64(p.User.UID) || psc.RunAsGroup == nil || *psc.RunAsGroup != int64(p.User.GID) {
		t.Fatalf("pod securityContext %+v, want uid %d gid %d", psc, p.User.UID, p.User.GID)
	}
	isTrue("pod runAsNonRoot", psc.RunAsNonRoot)
	if psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod seccomp %+v, want RuntimeDefault", psc.SeccompProfile)
	}
	if len(psc.SupplementalGroups) > 0 || psc.FSGroup != nil {
		t.Errorf("supplementalGroups %v fsGroup %v, want none (the profile has no supplementary group)", psc.SupplementalGroups, psc.FSGroup)
	}
	if len(psc.Sysctls) != 0 {
		t.Errorf("sysctls %v under gVisor, want none (runsc applies none)", psc.Sysctls)
	}
	if len(s.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(s.Containers))
	}
	c := s.Containers[0]
	if !slices.Equal(c.Command, gate) || len(c.Args) > 0 || !strings.HasSuffix(c.Command[2], "exec "+profile.GuestPath) {
		t.Errorf("command %q args %q, want the gate that execs the guest", c.Command, c.Args)
	}
	if !c.Stdin || !c.StdinOnce || c.TTY {
		t.Errorf("stdin %v stdinOnce %v tty %v, want true true false", c.Stdin, c.StdinOnce, c.TTY)
	}
	if len(c.Env) > 0 || len(c.EnvFrom) > 0 || len(c.Ports) > 0 || len(c.VolumeDevices) > 0 {
		t.Errorf("env %v envFrom %v ports %v devices %v, want none", c.Env, c.EnvFrom, c.Ports, c.VolumeDevices)
	}
	if c.ImagePullPolicy != corev1.PullNever || c.Image != "stockade.invalid/shell:0-0-k1" {
		t.Errorf("image %q pull %s", c.Image, c.ImagePullPolicy)
	}
	if c.TerminationMessagePath != TerminationLogPath {
		t.Errorf("terminationMessagePath %q, want %q (below root's 0700 directory of the image)", c.TerminationMessagePath, TerminationLogPath)
	}
	sc := c.SecurityContext
	if sc == nil {
		t.Fatal("container securityContext is nil")
	}
	isFalse("privileged", sc.Privileged)
	isFalse("allowPrivilegeEscalation", sc.AllowPrivilegeEscalation)
	isTrue("readOnlyRootFilesystem", sc.ReadOnlyRootFilesystem)
	isTrue("container runAsNonRoot", sc.RunAsNonRoot)
	if sc.RunAsUser == nil || *sc.RunAsUser != int64(p.User.UID) || sc.RunAsGroup == nil || *sc.RunAsGroup != int64(p.User.GID) {
		t.Errorf("container user %v:%v, want %d:%d", sc.RunAsUser, sc.RunAsGroup, p.User.UID, p.User.GID)
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("capabilities %+v, want drop ALL and add none", sc.Capabilities)
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container seccomp %+v, want RuntimeDefault", sc.SeccompProfile)
	}
	if sc.ProcMount != nil && *sc.ProcMount != corev1.DefaultProcMount {
		t.Errorf("procMount %v, want Default (masked /proc)", *sc.ProcMount)
	}
	l := testLimits()
	for name, rl := range map[string]corev1.ResourceList{"limits": c.Resources.Limits, "requests": c.Resources.Requests} {
		if got := rl[corev1.ResourceMemory]; got.Value() != l.Memory {
			t.Errorf("%s memory %s, want %d", name, got.String(), l.Memory)
		}
		if got := rl[corev1.ResourceCPU]; got.MilliValue() != 500 {
			t.Errorf("%s cpu %s, want 500m", name, got.String())
		}
	}
	var paths []string
	for _, m := range c.VolumeMounts {
		paths = append(paths, m.MountPath)
		if m.SubPath != "" || m.MountPropagation != nil {
			t.Errorf("mount %+v: want a plain mount", m)
		}
	}
	if !slices.Equal(paths, []string{"/tmp"}) {
		t.Errorf("mounts %v, want /tmp only (no /workspace without Spec.Workspace)", paths)
	}
	if v := s.Volumes[0].EmptyDir.SizeLimit; v == nil || v.Value() != l.TmpSize {
		t.Errorf("/tmp size %v, want %d", v, l.TmpSize)
	}
	// Labels: the driver's own, valid for the API server; the Spec's in
	// an annotation.
	if pod.Labels[LabelManaged] != ManagedBy || pod.Labels[LabelSandbox] != "sbx-0123456789abcdef" || pod.Labels[LabelOwner] != "daemon-a" {
		t.Errorf("labels %v", pod.Labels)
	}
	for k, v := range pod.Labels {
		if errs := slices.Concat(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)); len(errs) > 0 {
			t.Errorf("label %s=%s: %v", k, v, errs)
		}
	}
	if got := podLabels(pod); got["workspace"] != "w/1: x" || len(got) != 1 {
		t.Errorf("labels read back %v", got)
	}
}

func TestPodContainerTierAndWorkspace(t *testing.T) {
	pod := testPod(t, podConfig{Sysctls: true}, sandbox.Spec{Workspace: 32 << 20})
	if pod.Spec.RuntimeClassName != nil {
		t.Errorf("runtimeClassName %q, want none (the cluster's default runtime)", *pod.Spec.RuntimeClassName)
	}
	var got []string
	for _, s := range pod.Spec.SecurityContext.Sysctls {
		got = append(got, s.Name+"="+s.Value)
	}
	want := []string{"net.ipv4.ping_group_range=1 0", "net.ipv4.ip_unprivileged_port_start=1024"}
	if !slices.Equal(got, want) {
		t.Errorf("sysctls %v, want %v", got, want)
	}
	var paths []string
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		paths = append(paths, m.MountPath)
	}
	if !slices.Equal(paths, []string{"/tmp", "/workspace"}) {
		t.Errorf("mounts %v, want /tmp and /workspace", paths)
	}
	if v := pod.Spec.Volumes[1].EmptyDir.SizeLimit; v == nil || v.Cmp(*resource.NewQuantity(32<<20, resource.BinarySI)) != 0 {
		t.Errorf("/workspace size %v, want 32Mi", v)
	}
}

func TestPodRefusals(t *testing.T) {
	for name, spec := range map[string]sandbox.Spec{
		"egress": {Network: sandbox.NetworkEgress},
		"mounts": {Mounts: []sandbox.Mount{{Source: "/srv/data", Target: "/data/x"}}},
	} {
		_, err := buildPod(profile.Default(), podConfig{ID: "a", Namespace: "n"}, spec, testLimits())
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "kubernetes driver") {
			t.Errorf("%s: got %v, want ErrInvalidArgument with the reason", name, err)
		}
	}
}

func TestNames(t *testing.T) {
	for _, id := range []string{"sbx-0123456789abcdef", "Upper_Case.id", "a", strings.Repeat("x", 64), "ends-", "x.y"} {
		if errs := validation.IsDNS1123Subdomain(PodName(id)); len(errs) > 0 {
			t.Errorf("PodName(%q) = %q: %v", id, PodName(id), errs)
		}
		if errs := validation.IsValidLabelValue(sandboxLabel(id)); len(errs) > 0 {
			t.Errorf("sandboxLabel(%q) = %q: %v", id, sandboxLabel(id), errs)
		}
	}
	if PodName("Upper") == PodName("upper") {
		t.Error("two IDs share a pod name")
	}
}

// fakeDriver is a driver over a fake clientset: the layer above the
// cluster, for the label and reap logic.
func fakeDriver(t *testing.T, owner string, cs *fake.Clientset) *Driver {
	t.Helper()
	d, err := New(Config{
		Namespace: "sandboxes", Tier: sandbox.TierGVisor, Owner: owner, Client: cs, REST: &rest.Config{Host: "https://cluster.invalid"},
		ImageRef: func(sandbox.Image) (string, corev1.PullPolicy, error) {
			return "stockade.invalid/shell:x", corev1.PullNever, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// plant creates the pod that Create would, as a crashed daemon left it.
func plant(t *testing.T, cs *fake.Clientset, owner, id string, labels map[string]string) {
	t.Helper()
	pod := testPod(t, podConfig{ID: id, Owner: owner}, sandbox.Spec{Labels: labels})
	pod.UID = types.UID("uid-" + id)
	if _, err := cs.CoreV1().Pods("sandboxes").Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestReap(t *testing.T) {
	cs := fake.NewClientset()
	d := fakeDriver(t, "daemon-a", cs)
	plant(t, cs, "daemon-a", "one", map[string]string{"run": "r", "group": "a"})
	plant(t, cs, "daemon-a", "Two_2", map[string]string{"run": "r", "group": "a"})
	plant(t, cs, "daemon-a", "three", map[string]string{"run": "r", "group": "b"})
	plant(t, cs, "daemon-b", "other", map[string]string{"run": "r", "group": "a"})
	ctx := t.Context()
	if left := d.Leftovers(ctx, "Two_2"); len(left) != 1 {
		t.Fatalf("Leftovers before Reap: %v, want the pod", left)
	}
	reaped, err := d.Reap(ctx, map[string]string{"run": "r", "group": "a"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"Two_2", "one"}; !slices.Equal(reaped, want) {
		t.Errorf("Reap group a: %v, want %v", reaped, want)
	}
	if left := d.Leftovers(ctx, "three"); len(left) != 1 {
		t.Errorf("Reap of group a took three: leftovers %v", left)
	}
	reaped, err = d.Reap(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"three"}; !slices.Equal(reaped, want) {
		t.Errorf("Reap all: %v, want %v (not daemon-b's)", reaped, want)
	}
	for _, id := range []string{"one", "Two_2", "three"} {
		if left := d.Leftovers(ctx, id); len(left) > 0 {
			t.Errorf("after Reap, %s left %v", id, left)
		}
	}
	pods, _ := cs.CoreV1().Pods("sandboxes").List(ctx, metav1.ListOptions{})
	if len(pods.Items) != 1 || pods.Items[0].Annotations[AnnotationID] != "other" {
		t.Errorf("pods left: %d, want daemon-b's only", len(pods.Items))
	}
}

func TestCreateRefusals(t *testing.T) {
	cs := fake.NewClientset()
	d := fakeDriver(t, "", cs)
	img := sandbox.Image{Name: "shell", Digest: "sha256:" + strings.Repeat("0", 64), Rootfs: "/x"}
	for name, spec := range map[string]sandbox.Spec{
		"detached": {Image: img, Detached: true},
		"egress":   {Image: img, Network: sandbox.NetworkEgress},
	} {
		if _, err := d.Create(t.Context(), spec); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", name, err)
		}
	}
	if pods, _ := cs.CoreV1().Pods("sandboxes").List(t.Context(), metav1.ListOptions{}); len(pods.Items) > 0 {
		t.Errorf("a refused Create left %d pods", len(pods.Items))
	}
}

func TestCapabilities(t *testing.T) {
	d := fakeDriver(t, "", fake.NewClientset())
	c := d.Capabilities()
	if c.Tier != sandbox.TierGVisor || c.SharedKernel || !strings.Contains(c.Boundary, "gvisor") {
		t.Errorf("capabilities %+v", c)
	}
	for _, f := range []string{"BindEgress", "Reattach", "Snapshots"} {
		if c.Lacks[f] == "" {
			t.Errorf("Lacks[%s] is empty, want the reason", f)
		}
	}
	var drv sandbox.Driver = d
	if _, ok := drv.(sandbox.Binder); !ok || !c.Bind || c.BindEgress || !c.BindFixedLimits || c.Lacks["Bind"] != "" {
		t.Error("the driver does not bind, or binds egress or other memory and CPU")
	}
	if _, ok := drv.(sandbox.Reattacher); ok || c.Reattach {
		t.Error("the driver re-attaches")
	}
	if _, ok := drv.(sandbox.Snapshotter); ok || c.Snapshots {
		t.Error("the driver snapshots")
	}
	if !slices.Equal(c.NetworkModes, []sandbox.NetworkMode{sandbox.NetworkNone}) {
		t.Errorf("network modes %v, want none only", c.NetworkModes)
	}
}

func TestDenyAll(t *testing.T) {
	cs := fake.NewClientset()
	d := fakeDriver(t, "", cs)
	for range 2 {
		if err := d.ensurePolicy(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	d.policyOK = false
	if err := d.ensurePolicy(t.Context()); err != nil {
		t.Fatalf("a policy that exists: %v", err)
	}
	np, err := cs.NetworkingV1().NetworkPolicies("sandboxes").Get(t.Context(), PolicyName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(np.Spec.Ingress) > 0 || len(np.Spec.Egress) > 0 || len(np.Spec.PolicyTypes) != 2 || np.Spec.PodSelector.MatchLabels[LabelManaged] != ManagedBy {
		t.Errorf("policy %+v, want deny-all of both directions for the driver's pods", np.Spec)
	}
}

func FuzzPodLabels(f *testing.F) {
	f.Add(`{"a":"b"}`)
	f.Add(`[]`)
	f.Add(`{"a":1}`)
	f.Fuzz(func(t *testing.T, s string) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationLabels: s}}}
		m := podLabels(pod)
		if !matches(m, nil) {
			t.Error("every label set matches the empty match")
		}
	})
}

func TestPodSeccompLocalhost(t *testing.T) {
	name, data, err := SeccompProfile(sandbox.TierContainer)
	if err != nil {
		t.Fatal(err)
	}
	gname, gdata, err := SeccompProfile(sandbox.TierGVisor)
	if err != nil {
		t.Fatal(err)
	}
	if gname == name || len(gdata) == 0 {
		t.Errorf("the gVisor filter %s is the host's %s, want the Sentry's variant", gname, name)
	}
	// An allowlist that admits read and leaves ptrace out.
	if !strings.HasPrefix(name, "stockade-") || !strings.Contains(string(data), `"read"`) || strings.Contains(string(data), `"ptrace"`) {
		t.Fatalf("profile %s: %.200s, want Stockade's filter: read allowed, ptrace not", name, data)
	}
	pod := testPod(t, podConfig{Seccomp: name}, sandbox.Spec{})
	for where, sp := range map[string]*corev1.SeccompProfile{"pod": pod.Spec.SecurityContext.SeccompProfile, "container": pod.Spec.Containers[0].SecurityContext.SeccompProfile} {
		if sp == nil || sp.Type != corev1.SeccompProfileTypeLocalhost || sp.LocalhostProfile == nil || *sp.LocalhostProfile != name {
			t.Errorf("%s seccomp %+v, want Localhost %s", where, sp, name)
		}
	}
}

// TestPodNProc: a gVisor pod's gate lowers RLIMIT_NPROC to the pids limit
// before it execs the guest; a runc pod's gate sets none.
func TestPodNProc(t *testing.T) {
	for _, nproc := range []bool{false, true} {
		pod, err := buildPod(profile.Default(), podConfig{ID: "n", Namespace: "ns", Image: "img", NProc: nproc}, sandbox.Spec{}, sandbox.Limits{Pids: 64, Memory: 1 << 28, CPU: 1, TmpSize: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		cmd := pod.Spec.Containers[0].Command
		has := strings.Contains(cmd[2], "{ ulimit -u 64 2>/dev/null || ulimit -p 64; } && ")
		if has != nproc || !strings.HasSuffix(cmd[2], "exec "+profile.GuestPath) {
			t.Errorf("NProc %v: command %q, want ulimit -u 64 %v and the guest exec'd", nproc, cmd, nproc)
		}
	}
}

// TestPodActiveDeadline: every pod carries a deadline the kubelet ends it
// at, should the daemon lose it: a one-shot sandbox's from its timeout, a
// session's from its Deadline or the session ceiling, each with the wait
// to run and a margin.
func TestPodActiveDeadline(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ready, ceiling := time.Minute, 24*time.Hour
	l := testLimits()
	for name, tc := range map[string]struct {
		spec sandbox.Spec
		want time.Duration
	}{
		"one-shot":         {sandbox.Spec{}, l.Timeout},
		"session":          {sandbox.Spec{Workspace: 1 << 20}, ceiling},
		"session deadline": {sandbox.Spec{Workspace: 1 << 20, Deadline: now.Add(2 * time.Hour)}, 2 * time.Hour},
	} {
		life := podLifetime(tc.spec, l, ready, ceiling, now)
		if want := tc.want + ready + lifetimeMargin; life != want {
			t.Errorf("%s: lifetime %s, want %s", name, life, want)
		}
		pod := testPod(t, podConfig{Lifetime: life}, tc.spec)
		if got := pod.Spec.ActiveDeadlineSeconds; got == nil || *got != int64(life/time.Second) {
			t.Errorf("%s: ActiveDeadlineSeconds %v, want %d", name, got, int64(life/time.Second))
		}
	}
	if pod := testPod(t, podConfig{Lifetime: 1500 * time.Millisecond}, sandbox.Spec{}); *pod.Spec.ActiveDeadlineSeconds != 2 {
		t.Errorf("1.5 s: ActiveDeadlineSeconds %d, want 2 (rounded up)", *pod.Spec.ActiveDeadlineSeconds)
	}
}

// failCreate makes the fake's pods end as soon as they are created, so
// that Create fails at once (the pod ended before it ran), and returns
// the pods created.
func failCreate(cs *fake.Clientset) func() []*corev1.Pod {
	var mu sync.Mutex
	var created []*corev1.Pod
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		pod.Status.Phase = corev1.PodFailed
		mu.Lock()
		created = append(created, pod.DeepCopy())
		mu.Unlock()
		return false, nil, nil
	})
	return func() []*corev1.Pod {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(created)
	}
}

// TestCreateActiveDeadline: the pod Create makes carries the deadline of
// its one-shot sandbox.
func TestCreateActiveDeadline(t *testing.T) {
	cs := fake.NewClientset()
	d := fakeDriver(t, "", cs)
	created := failCreate(cs)
	img := sandbox.Image{Name: "shell", Digest: "sha256:" + strings.Repeat("0", 64), Rootfs: "/x"}
	if _, err := d.Create(t.Context(), sandbox.Spec{Image: img}); !errdefs.IsUnavailable(err) {
		t.Fatalf("Create of a pod that ends: %v, want ErrUnavailable", err)
	}
	pods := created()
	if len(pods) != 1 {
		t.Fatalf("Create made %d pods, want 1", len(pods))
	}
	want := int64((d.cfg.Defaults.Timeout + d.cfg.ReadyTimeout + lifetimeMargin) / time.Second)
	if got := pods[0].Spec.ActiveDeadlineSeconds; got == nil || *got != want {
		t.Errorf("the pod's ActiveDeadlineSeconds: %v, want %d", got, want)
	}
}

// TestKillGrace: kill deletes with a grace period, not a forced deletion,
// which drops the pod's object before the kubelet has stopped it.
func TestKillGrace(t *testing.T) {
	cs := fake.NewClientset()
	d := fakeDriver(t, "", cs)
	plant(t, cs, "", "one", nil)
	var grace []int64
	cs.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if g := a.(k8stesting.DeleteAction).GetDeleteOptions().GracePeriodSeconds; g != nil {
			grace = append(grace, *g)
		}
		return false, nil, nil
	})
	pod, err := cs.CoreV1().Pods("sandboxes").Get(t.Context(), PodName("one"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.newSbx("one", pod, testLimits()).kill(t.Context())
	if !slices.Equal(grace, []int64{1}) {
		t.Errorf("kill's grace periods: %v, want [1]", grace)
	}
}

// TestCreateLogsDestroyError: a Create that fails and then cannot delete
// its pod says so in the log, as its error is the start's.
func TestCreateLogsDestroyError(t *testing.T) {
	cs := fake.NewClientset()
	var log bytes.Buffer
	d := fakeDriver(t, "", cs)
	d.cfg.Log = slog.New(slog.NewTextHandler(&log, nil))
	failCreate(cs)
	cs.PrependReactor("delete", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "x", errors.New("no deleting"))
	})
	img := sandbox.Image{Name: "shell", Digest: "sha256:" + strings.Repeat("0", 64), Rootfs: "/x"}
	if _, err := d.Create(t.Context(), sandbox.Spec{ID: "logged", Image: img}); !errdefs.IsUnavailable(err) {
		t.Fatalf("Create of a pod that ends: %v, want ErrUnavailable", err)
	}
	if s := log.String(); !strings.Contains(s, "no deleting") || !strings.Contains(s, "sandbox=logged") {
		t.Errorf("the log: %q, want the failed deletion of sandbox logged", s)
	}
}
