package kubernetes

// Deleting, finding and reaping the driver's pods.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/stockade-sh/stockade/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// deletePod deletes the named pod (with uid set, only that pod, not a
// later one of the same name) with a grace period of grace seconds, and
// waits until the API server no longer has it: with a grace period, the
// kubelet has then stopped its containers (a grace period of 0 is a forced
// deletion, which does not wait for the kubelet). A pod that is already
// gone is success.
func (d *Driver) deletePod(ctx context.Context, name string, uid string, grace int64) error {
	gone, err := d.deleteOnce(ctx, name, uid, grace)
	if err != nil || gone {
		return err
	}
	return d.awaitGone(ctx, name, uid)
}

// deleteOnce asks the API server to delete the pod (see deletePod), within
// CallTimeout, and reports whether it is gone already.
func (d *Driver) deleteOnce(ctx context.Context, name string, uid string, grace int64) (gone bool, _ error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.CallTimeout)
	defer cancel()
	opts := metav1.DeleteOptions{GracePeriodSeconds: &grace}
	if uid != "" {
		u := types.UID(uid)
		opts.Preconditions = &metav1.Preconditions{UID: &u}
	}
	err := d.cs.CoreV1().Pods(d.cfg.Namespace).Delete(ctx, name, opts)
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case apierrors.IsConflict(err):
		return true, nil // another pod of that name now: ours is gone
	case err != nil:
		return false, d.apiError("deleting pod "+name+" in", err)
	}
	return false, nil
}

// awaitGone polls until the API server no longer has the pod (see
// deletePod) or ctx ends; its deadline passing is ErrUnavailable.
func (d *Driver) awaitGone(ctx context.Context, name string, uid string) error {
	pods := d.cs.CoreV1().Pods(d.cfg.Namespace)
	for {
		cctx, cancel := context.WithTimeout(ctx, d.cfg.CallTimeout)
		p, err := pods.Get(cctx, name, metav1.GetOptions{})
		cancel()
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err == nil && uid != "" && string(p.UID) != uid:
			return nil
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
			continue
		}
		err = ctx.Err()
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("waiting for pod %s to be deleted: %w: %w", name, err, errdefs.ErrUnavailable)
		}
		return fmt.Errorf("waiting for pod %s to be deleted: %w", name, err)
	}
}

// Leftovers lists the pods of sandbox id that the API server still has.
// Empty means clean. It bounds itself to 10 s within ctx.
func (d *Driver) Leftovers(ctx context.Context, id string) []string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list, err := d.cs.CoreV1().Pods(d.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: d.selector(id)})
	if err != nil {
		return []string{fmt.Sprintf("listing pods: %v", err)}
	}
	var out []string
	for _, p := range list.Items {
		if p.Annotations[AnnotationID] == id {
			out = append(out, fmt.Sprintf("pod %s/%s (%s)", p.Namespace, p.Name, p.Status.Phase))
		}
	}
	return out
}

// Reap deletes every pod of this driver (and owner) in its namespace whose
// labels contain all of match, running or not, and returns their sandbox
// IDs, sorted. Each call to the API server is bounded (CallTimeout), and
// the wait for the deleted pods to be gone too (reapWait, for them all):
// one whose node does not answer stays Terminating until the node comes
// back or is removed, and counts as reaped, its deletion under way. A pod
// that cannot be deleted does not stop the others: the errors are joined.
func (d *Driver) Reap(ctx context.Context, match map[string]string) ([]string, error) {
	lctx, cancel := context.WithTimeout(ctx, d.cfg.CallTimeout)
	list, err := d.cs.CoreV1().Pods(d.cfg.Namespace).List(lctx, metav1.ListOptions{LabelSelector: d.selector("")})
	cancel()
	if err != nil {
		return nil, d.apiError("listing pods in", err)
	}
	var reaped []string
	var errs []error
	var waiting []corev1.Pod
	for _, p := range list.Items {
		if !matches(podLabels(&p), match) {
			continue
		}
		gone, err := d.deleteOnce(ctx, p.Name, string(p.UID), 1)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		reaped = append(reaped, p.Annotations[AnnotationID])
		if !gone {
			waiting = append(waiting, p)
		}
	}
	// The kubelet stops a pod's containers before the API server lets it
	// go: a pod that is gone has nothing left on its node.
	wctx, cancel := context.WithTimeout(ctx, d.reapWait)
	defer cancel()
	for _, p := range waiting {
		if err := d.awaitGone(wctx, p.Name, string(p.UID)); err != nil && ctx.Err() != nil {
			errs = append(errs, err)
			break
		}
	}
	slices.Sort(reaped)
	return reaped, errors.Join(errs...)
}

// matches reports whether have holds every label of want.
func matches(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}

// Labels returns the Spec's labels of the pod of sandbox id, for tests.
func (d *Driver) Labels(ctx context.Context, id string) (map[string]string, error) {
	pod, err := d.cs.CoreV1().Pods(d.cfg.Namespace).Get(ctx, PodName(id), metav1.GetOptions{})
	if err != nil {
		return nil, d.apiError("reading pod "+PodName(id)+" in", err)
	}
	return maps.Clone(podLabels(pod)), nil
}
