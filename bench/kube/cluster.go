package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/stockade-sh/stockade/driver/kubernetes"
	"github.com/stockade-sh/stockade/sandbox"
)

// owner labels the benchmark's pods (kubernetes.LabelOwner), so that its
// clean-up reaps those and no other.
const owner = "bench-kube"

// clusterOpts say where the cluster is and how its node gets images.
type clusterOpts struct {
	kubeconfig, namespace string
	// ctr is the node's containerd client, the command that imports an
	// image archive (`ctr --address SOCK`).
	ctr []string
	// seccompDir is the kubelet's seccomp directory, where Stockade's
	// filter is written for the pods' Localhost profile.
	seccompDir string
	// guest is the guest binary the images carry.
	guest string
}

// kubeDriver returns a driver of tier whose pods run with RuntimeClass
// class, as driver/kubernetes/cluster_test.go builds its own: Stockade's
// seccomp filter written where the kubelet reads it, the namespace
// restricted (Pod Security), the guest as o.guest. qps > 0 lets its API
// client send that many requests a second (burst twice that) instead of
// the driver's default (kubernetes.DefaultQPS).
func kubeDriver(ctx context.Context, o clusterOpts, tier sandbox.Tier, class string, qps int) (*kubernetes.Driver, error) {
	name, data, err := kubernetes.SeccompProfile(tier)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.seccompDir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.seccompDir, name), data, 0o600); err != nil {
		return nil, err
	}
	cfg := kubernetes.Config{
		Kubeconfig: o.kubeconfig, Namespace: o.namespace, Tier: tier, RuntimeClass: class,
		GuestPath: o.guest, Owner: owner, Seccomp: name,
	}
	if qps > 0 {
		// New builds its clients from REST when it is set.
		if cfg.REST, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig); err != nil {
			return nil, err
		}
		cfg.REST.QPS, cfg.REST.Burst = float32(qps), 2*qps
	}
	d, err := kubernetes.New(cfg)
	if err != nil {
		return nil, err
	}
	if err := d.Health(ctx); err != nil {
		return nil, fmt.Errorf("the cluster (%s): %w", o.kubeconfig, err)
	}
	return d, nil
}

// ensureNamespace creates namespace ns, restricted by Pod Security as the
// cluster tests' is, unless it exists, and waits for its default service
// account (the API server refuses pods in a namespace without one).
func ensureNamespace(ctx context.Context, kubeconfig, ns string) error {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cs, err := k8s.NewForConfig(rc)
	if err != nil {
		return err
	}
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: ns, Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"},
	}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", ns, err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		_, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("namespace %s has no default service account: %w", ns, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for namespace %s's default service account: %w", ns, context.Cause(ctx))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// importImage imports img with the guest into the node's containerd
// (kubernetes.WriteImageArchive, `ctr -n k8s.io images import`), unless
// the node has it, and says how long that took.
func importImage(ctx context.Context, o clusterOpts, img sandbox.Image, tmp string) error {
	sum, err := kubernetes.GuestDigest(o.guest)
	if err != nil {
		return err
	}
	ref, err := kubernetes.ImageRef(img, sum)
	if err != nil {
		return err
	}
	ctr := func(args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, o.ctr[0], slices.Concat(o.ctr[1:], []string{"-n", "k8s.io"}, args)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("ctr %s: %v: %s", strings.Join(args, " "), err, stderr.Bytes())
		}
		return out, nil
	}
	have, err := ctr("images", "ls", "-q")
	if err != nil {
		return err
	}
	if slices.Contains(strings.Fields(string(have)), ref) {
		return nil
	}
	dir, err := os.MkdirTemp(tmp, "image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	f, err := os.Create(filepath.Join(dir, "image.tar"))
	if err != nil {
		return err
	}
	defer f.Close()
	start := time.Now()
	if err := kubernetes.WriteImageArchive(f, img, o.guest, ref, dir); err != nil {
		return err
	}
	if _, err := ctr("images", "import", f.Name()); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench/kube: imported %s on the node in %s\n", ref, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// reap deletes every pod of the benchmark's drivers that is left (a run
// that failed half-way) and reports what it deleted and whether any
// remains.
func reap(ds []*kubernetes.Driver) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	for _, d := range ds {
		ids, err := d.Reap(ctx, nil)
		if err != nil {
			errs = append(errs, err)
		}
		if len(ids) > 0 {
			fmt.Fprintf(os.Stderr, "bench/kube: reaped %d pods left behind: %v\n", len(ids), ids)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("reaping the benchmark's pods: %v", errs)
	}
	return nil
}
