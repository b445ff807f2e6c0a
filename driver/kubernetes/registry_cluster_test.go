//go:build kubecluster

package kubernetes_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/driver/kubernetes"
	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/registry"
	"github.com/stockade-sh/stockade/internal/testenv"
	"github.com/stockade-sh/stockade/sandbox"
)

// TestClusterRegistry pushes the shell image to the test cluster's
// registry (scripts/kube/up.sh: Debian's docker-registry on the host side
// of the veth, which the node's containerd pulls from over plain http;
// its host:port in STOCKADE_TEST_KUBE_REGISTRY, which scripts/kube/test.sh
// sets), runs a pod from it by digest, and holds that a registry without
// the image fails Create with the command to run.
func TestClusterRegistry(t *testing.T) {
	reg := os.Getenv("STOCKADE_TEST_KUBE_REGISTRY")
	if reg == "" {
		t.Fatal("set STOCKADE_TEST_KUBE_REGISTRY to the test cluster's registry, host:port (scripts/kube/test.sh does)")
	}
	if _, err := exec.LookPath("docker-registry"); err != nil {
		testenv.Missing(t, "docker-registry is not installed (apt-get install docker-registry), so scripts/kube/up.sh started no registry")
	}
	kc, ns := clusterEnv(t)
	guest := testenv.Guest(t)
	img := testenv.Image(t, "shell")

	start := time.Now()
	loc, err := registry.ParseLocation("http://"+reg+"/stockade-test", true)
	if err != nil {
		t.Fatal(err)
	}
	c, err := registry.New(loc, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	o, err := kubernetes.NewOCIImage(img, guest)
	if err != nil {
		t.Fatal(err)
	}
	digest, st, err := c.Push(t.Context(), o.Name, o.Tag, o.Blobs(), o.Manifest)
	if err != nil {
		t.Fatalf("push to %s: %v", reg, err)
	}
	t.Logf("pushed %s in %s (%+v)", loc.Ref(o.Name, digest), time.Since(start).Round(time.Millisecond), st)

	newDriver := func(registry string) *kubernetes.Driver {
		d, err := kubernetes.New(kubernetes.Config{Kubeconfig: kc, Namespace: ns, Tier: sandbox.TierContainer,
			RuntimeClass: "runc-nonet", GuestPath: guest, Owner: "kubedriver-test", Registry: registry, RegistryInsecure: true})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := newDriver(reg + "/stockade-test")
	for _, round := range []string{"pulled", "present"} {
		start = time.Now()
		sb, err := d.Create(t.Context(), sandbox.Spec{Image: img})
		if err != nil {
			t.Fatalf("Create (%s): %v", round, err)
		}
		created := time.Since(start)
		res, err := sandbox.Run(t.Context(), sb, sandbox.ExecRequest{
			File: sandbox.File{Name: "main.sh", Data: []byte("echo hi; cat /proc/1/cmdline\n")},
			Argv: []string{"/bin/sh", "{file}"},
		})
		sb.Destroy(t.Context())
		if err != nil {
			t.Fatalf("Run (%s): %v", round, err)
		}
		t.Logf("image %s: create %s: %s %q", round, created.Round(time.Millisecond), res.Status, res.Stdout)
		if res.Status != sandbox.StatusSucceeded || !strings.HasPrefix(string(res.Stdout), "hi\n/.stockade/guest") {
			t.Fatalf("got %s %q %q, want hi and the guest as PID 1", res.Status, res.Stdout, res.Stderr)
		}
	}

	// Nothing was pushed under this prefix.
	start = time.Now()
	sb, err := newDriver(reg+"/never-pushed").Create(t.Context(), sandbox.Spec{Image: img})
	if err == nil {
		sb.Destroy(t.Context())
		t.Fatal("Create with an image never pushed succeeded")
	}
	msg, _ := errdefs.PublicMessage(err)
	t.Logf("never pushed, after %s: %v", time.Since(start).Round(time.Millisecond), err)
	if !strings.Contains(msg, "stockade image push") || !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("Create with an image never pushed: %v (public %q); want the command to push", err, msg)
	}
}
