//go:build kubecluster

// The tests on a live cluster (build tag kubecluster, so that CI, which
// brings up no cluster yet, neither runs nor skips them): start one with
// scripts/kube/up.sh and run (RUNSC from the cluster's
// /usr/local/lib/stockade/kube-cluster-*.env, for the gVisor suite)
//
//	STOCKADE_TEST_KUBECONFIG=/var/lib/stockade-kube/admin.kubeconfig \
//	STOCKADE_TEST_KUBE_CTR="/usr/local/lib/stockade/containerd-v2.1.9/ctr --address /var/lib/stockade-kube/run/containerd.sock" \
//	STOCKADE_TEST_KUBE_RUNSC=$RUNSC \
//	go test -tags kubecluster -count=1 -run TestCluster ./driver/kubernetes/

package kubernetes_test

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
	"testing"
	"time"

	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/stockade-sh/stockade/driver/kubernetes"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/sandbox/conformance"
)

// cluster returns a driver of tier on the cluster STOCKADE_TEST_KUBECONFIG
// names, in namespace STOCKADE_TEST_KUBE_NAMESPACE (default
// stockade-kubedriver, created if missing), with the shell image
// imported on the node, and that image.
func cluster(t *testing.T, tier sandbox.Tier) (*kubernetes.Driver, sandbox.Image) {
	t.Helper()
	// The test cluster's RuntimeClasses whose pods have no network
	// (scripts/kube/up.sh's gvisor-nonet, runsc --network=none, and
	// runc-nonet, a pod network of loopback only).
	class, env := "runc-nonet", "STOCKADE_TEST_KUBE_RUNC_CLASS"
	if tier == sandbox.TierGVisor {
		class, env = "gvisor-nonet", "STOCKADE_TEST_KUBE_GVISOR_CLASS"
	}
	if v, ok := os.LookupEnv(env); ok {
		class = v
	}
	return clusterClass(t, tier, class)
}

// clusterClass is cluster with the pods' RuntimeClass class.
func clusterClass(t *testing.T, tier sandbox.Tier, class string) (*kubernetes.Driver, sandbox.Image) {
	t.Helper()
	ctr := strings.Fields(os.Getenv("STOCKADE_TEST_KUBE_CTR"))
	if len(ctr) == 0 {
		t.Fatal("set STOCKADE_TEST_KUBE_CTR (see the file's comment)")
	}
	kc, ns := clusterEnv(t)
	guest := testenv.Guest(t)
	img := testenv.Image(t, "shell")
	importImage(t, ctr, img, guest)
	// Stockade's filter, where the node's kubelet reads Localhost
	// profiles.
	seccompDir := os.Getenv("STOCKADE_TEST_KUBE_SECCOMP_DIR")
	if seccompDir == "" {
		seccompDir = "/var/lib/stockade-kube/kubelet/seccomp"
	}
	name, data, err := kubernetes.SeccompProfile(tier)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(seccompDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(seccompDir, name), data, 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := kubernetes.New(kubernetes.Config{Kubeconfig: kc, Namespace: ns, Tier: tier, RuntimeClass: class, GuestPath: guest, Owner: "kubedriver-test", Seccomp: name})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Health(t.Context()); err != nil {
		t.Fatalf("Health: %v", err)
	}
	return d, img
}

// clusterEnv returns the kubeconfig STOCKADE_TEST_KUBECONFIG names and
// the tests' namespace, STOCKADE_TEST_KUBE_NAMESPACE (default
// stockade-kubedriver), created if missing.
func clusterEnv(t *testing.T) (kubeconfig, namespace string) {
	t.Helper()
	kc := os.Getenv("STOCKADE_TEST_KUBECONFIG")
	if kc == "" {
		t.Fatal("set STOCKADE_TEST_KUBECONFIG (see cluster_test.go's comment)")
	}
	ns := os.Getenv("STOCKADE_TEST_KUBE_NAMESPACE")
	if ns == "" {
		ns = "stockade-kubedriver"
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := k8s.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ensureNamespace(t, cs, ns)
	return kc, ns
}

// importImage imports img with guest into the node's containerd, unless it
// has it.
func importImage(t *testing.T, ctr []string, img sandbox.Image, guest string) {
	t.Helper()
	sum, err := kubernetes.GuestDigest(guest)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := kubernetes.ImageRef(img, sum)
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) []byte {
		cmd := exec.Command(ctr[0], slices.Concat(ctr[1:], []string{"-n", "k8s.io"}, args)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("ctr %v: %v: %s", args, err, stderr.String())
		}
		return out
	}
	if slices.Contains(strings.Fields(string(run("images", "ls", "-q"))), ref) {
		return
	}
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "image.tar"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	start := time.Now()
	if err := kubernetes.WriteImageArchive(f, img, guest, ref, dir); err != nil {
		t.Fatal(err)
	}
	run("images", "import", f.Name())
	t.Logf("imported %s in %s", ref, time.Since(start).Round(time.Millisecond))
}

func TestClusterConformanceGVisor(t *testing.T) {
	d, img := cluster(t, sandbox.TierGVisor)
	root := os.Getenv("STOCKADE_TEST_KUBE_RUNSC_ROOT")
	if root == "" {
		root = "/var/lib/stockade-kube/run/runsc/k8s.io"
	}
	runsc := os.Getenv("STOCKADE_TEST_KUBE_RUNSC")
	if runsc == "" {
		t.Fatal("set STOCKADE_TEST_KUBE_RUNSC to the cluster's runsc (RUNSC in /usr/local/lib/stockade/kube-cluster-*.env)")
	}
	conformance.Run(t, conformance.Harness{Driver: d, Image: img,
		Kernel: func(ctx context.Context, id string) (conformance.SandboxKernel, error) {
			return sentry(ctx, d, runsc, root, id)
		},
	})
}

// sentry reads the Sentry of sandbox id's pod through runsc, with the
// root the node's containerd gives it: its host pid (`runsc state`) and
// the tasks of the pod's container (`runsc ps`).
func sentry(ctx context.Context, d *kubernetes.Driver, runsc, root, id string) (conformance.SandboxKernel, error) {
	var k conformance.SandboxKernel
	cid, err := d.ContainerID(ctx, id)
	if err != nil {
		return k, err
	}
	out, err := exec.CommandContext(ctx, runsc, "--root", root, "state", cid).Output()
	if err != nil {
		return k, fmt.Errorf("runsc state %s: %w", cid, err)
	}
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
		return k, fmt.Errorf("runsc state %s: got %q, want a running sandbox's pid (%v)", cid, out, err)
	}
	out, err = exec.CommandContext(ctx, runsc, "--root", root, "ps", "--format=json", cid).Output()
	if err != nil {
		return k, fmt.Errorf("runsc ps %s: %w", cid, err)
	}
	if err := json.Unmarshal(out, &k.Tasks); err != nil {
		return k, fmt.Errorf("runsc ps %s: decoding %q: %w", cid, out, err)
	}
	k.HostPID = st.Pid
	return k, nil
}

func TestClusterConformanceRunc(t *testing.T) {
	d, img := cluster(t, sandbox.TierContainer)
	conformance.Run(t, conformance.Harness{Driver: d, Image: img})
}

// TestClusterRoundTrip is the smallest proof: a pod of each tier runs a
// program over the attach stream and leaves nothing.
func TestClusterRoundTrip(t *testing.T) {
	for _, tier := range []sandbox.Tier{sandbox.TierContainer, sandbox.TierGVisor} {
		t.Run(string(tier), func(t *testing.T) {
			d, img := cluster(t, tier)
			start := time.Now()
			sb, err := d.Create(t.Context(), sandbox.Spec{Image: img})
			if err != nil {
				t.Fatalf("Create: %v", err)
			}
			t.Cleanup(func() { sb.Destroy(t.Context()) })
			created := time.Since(start)
			res, err := sandbox.Run(t.Context(), sb, sandbox.ExecRequest{
				File: sandbox.File{Name: "main.sh", Data: []byte("echo hi; id -u; cat /proc/1/cmdline\n")},
				Argv: []string{"/bin/sh", "{file}"},
			})
			ran := time.Since(start) - created
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if err := sb.Destroy(t.Context()); err != nil {
				t.Fatalf("Destroy: %v", err)
			}
			t.Logf("create %s, run %s, destroy %s: %s %q %q", created.Round(time.Millisecond), ran.Round(time.Millisecond), (time.Since(start) - created - ran).Round(time.Millisecond), res.Status, res.Stdout, res.Stderr)
			if res.Status != sandbox.StatusSucceeded || !strings.HasPrefix(string(res.Stdout), "hi\n65534\n/.stockade/guest") {
				t.Errorf("got %s %q, want hi, uid 65534 and the guest as PID 1", res.Status, res.Stdout)
			}
			if left := d.Leftovers(t.Context(), sb.ID()); len(left) > 0 {
				t.Errorf("leftovers: %v", left)
			}
		})
	}
}

// TestClusterReap stands in for a daemon that crashed: its pods are
// found by their labels and deleted.
func TestClusterReap(t *testing.T) {
	d, img := cluster(t, sandbox.TierContainer)
	run := "reap-" + time.Now().Format("150405.000000")
	var ids []string
	for _, group := range []string{"a", "b"} {
		sb, err := d.Create(t.Context(), sandbox.Spec{Image: img, Labels: map[string]string{"run": run, "group": group}})
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		ids = append(ids, sb.ID())
	}
	reaped, err := d.Reap(t.Context(), map[string]string{"run": run, "group": "a"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(reaped, ids[:1]) {
		t.Errorf("Reap group a: %v, want %v", reaped, ids[:1])
	}
	if left := d.Leftovers(t.Context(), ids[1]); len(left) == 0 {
		t.Errorf("Reap of group a removed %s of group b", ids[1])
	}
	if reaped, err = d.Reap(t.Context(), map[string]string{"run": run}); err != nil || !slices.Equal(reaped, ids[1:]) {
		t.Errorf("Reap run: %v, %v; want %v", reaped, err, ids[1:])
	}
}

// TestClusterNoNetwork probes, from inside a sandbox, what a pod of the
// cluster could reach: the API server (the node's address, the node's
// bridge address and the Service VIP), the kubelet's port, cluster DNS
// and the metadata address, and lists the network devices. A pod on the
// cluster network (runc, no RuntimeClass) first shows that the probe sees
// the API server and the kubelet; the pods of the nonet RuntimeClasses
// reach none of them and have loopback only.
func TestClusterNoNetwork(t *testing.T) {
	targets := []string{
		"10.250.250.2 6443",  // the API server on the node's address
		"10.88.0.1 6443",     // ... on the node's bridge (the pods' gateway)
		"10.96.0.1 443",      // ... its Service VIP
		"10.250.250.2 10250", // the kubelet
		"10.88.0.1 10250",
		"10.96.0.10 53",      // cluster DNS's conventional VIP
		"169.254.169.254 80", // metadata
	}
	script := "cat /proc/net/dev | sed 1,2d | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' '; echo\n" +
		"while read -r h p; do if e=$(busybox nc -w 2 $h $p </dev/null 2>&1 >/dev/null); then echo \"$h:$p connected\"; else echo \"$h:$p unreachable:\" $e; fi; done\n"
	for _, tc := range []struct {
		name, class string
		tier        sandbox.Tier
		control     bool
	}{
		{"control-runc-cluster-network", "", sandbox.TierContainer, true},
		{"runc-nonet", "runc-nonet", sandbox.TierContainer, false},
		{"gvisor-nonet", "gvisor-nonet", sandbox.TierGVisor, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, img := clusterClass(t, tc.tier, tc.class)
			sb, err := d.Create(t.Context(), sandbox.Spec{Image: img})
			if err != nil {
				t.Fatalf("Create: %v", err)
			}
			t.Cleanup(func() { sb.Destroy(t.Context()) })
			res, err := sandbox.Run(t.Context(), sb, sandbox.ExecRequest{
				File:    sandbox.File{Name: "net.sh", Data: []byte(script)},
				Argv:    []string{"/bin/sh", "{file}"},
				Stdin:   []byte(strings.Join(targets, "\n") + "\n"),
				Timeout: time.Minute,
			})
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			t.Logf("%s: %q", res.Status, res.Stdout)
			lines := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
			if len(lines) != len(targets)+1 {
				t.Fatalf("got %d lines %q (stderr %q), want the devices and one per target", len(lines), res.Stdout, res.Stderr)
			}
			devices := strings.Fields(lines[0])
			connected := map[string]bool{}
			for _, l := range lines[1:] {
				if a, ok := strings.CutSuffix(l, " connected"); ok {
					connected[a] = true
				}
			}
			if tc.control {
				for _, a := range []string{"10.250.250.2:6443", "10.250.250.2:10250"} {
					if !connected[a] {
						t.Errorf("control: %s unreachable from the cluster network, so the probe cannot see a connection", a)
					}
				}
				if !slices.Contains(devices, "eth0") {
					t.Errorf("control: devices %v, want eth0", devices)
				}
				return
			}
			if len(connected) > 0 {
				t.Errorf("connected to %v, want nothing reachable", connected)
			}
			if !slices.Equal(devices, []string{"lo"}) {
				t.Errorf("devices %v, want lo only", devices)
			}
		})
	}
}

// TestClusterTerminationLog holds the mitigation of the kubelet's
// termination message file (kubernetes.TerminationLogPath): from inside a
// sandbox of each tier the mount is there (the check sees it in
// /proc/self/mountinfo), /dev has no termination-log, and neither writing
// the file nor listing its directory gets through.
func TestClusterTerminationLog(t *testing.T) {
	script := "grep -c ' " + kubernetes.TerminationLogPath + " ' /proc/self/mountinfo\n" +
		"ls /dev/termination-log >/dev/null 2>&1 && echo dev-present || echo dev-absent\n" +
		"if echo x >" + kubernetes.TerminationLogPath + "; then echo written; else echo refused; fi\n" +
		"if ls " + kubernetes.TerminationLogDir + " >/dev/null; then echo listed; else echo unlisted; fi\n" +
		"if dd if=/dev/zero of=/proc/self/root" + kubernetes.TerminationLogPath + " bs=1k count=1; then echo written; else echo refused; fi\n"
	for _, tier := range []sandbox.Tier{sandbox.TierContainer, sandbox.TierGVisor} {
		t.Run(string(tier), func(t *testing.T) {
			d, img := cluster(t, tier)
			sb, err := d.Create(t.Context(), sandbox.Spec{Image: img})
			if err != nil {
				t.Fatalf("Create: %v", err)
			}
			t.Cleanup(func() { sb.Destroy(t.Context()) })
			res, err := sandbox.Run(t.Context(), sb, sandbox.ExecRequest{
				File: sandbox.File{Name: "tl.sh", Data: []byte(script)},
				Argv: []string{"/bin/sh", "{file}"},
			})
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			t.Logf("%s: stdout %q stderr %q", res.Status, res.Stdout, res.Stderr)
			if got, want := strings.Fields(string(res.Stdout)), []string{"1", "dev-absent", "refused", "unlisted", "refused"}; !slices.Equal(got, want) {
				t.Errorf("got %q, want %q: the mount seen, no /dev/termination-log, the file out of reach", got, want)
			}
		})
	}
}
