package kubernetes

// Warm one-shot pools: a pod created before it is known whom it serves,
// and bound to them later.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/sandbox"
)

// CreateUnbound is Create for a sandbox that Bind binds later: a pod with
// its pool's labels (spec.Labels) and a lifetime for its wait in the pool
// and its run (spec's limits' Timeout: see podLifetime).
func (d *Driver) CreateUnbound(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	return d.create(ctx, spec, true)
}

// Bind binds a pod CreateUnbound made, once, with one merge patch of the
// pod: the binding's labels join the Spec's labels in the pod's
// AnnotationLabels (where Reap and Labels read them), and a binding
// with a Timeout lowers the pod's ActiveDeadlineSeconds to the time it
// has run plus that timeout and lifetimeMargin (the API server lets a
// deadline only decrease; a session's pod keeps its own). The output cap
// and the timeout tighten in the guest, between programs only. A pod's
// memory and CPU cannot change once it runs, nor its /tmp size or pids
// limit: a Binding whose field differs from the sandbox's is
// ErrInvalidArgument (Capabilities.BindFixedLimits). Nothing changes on
// error.
func (d *Driver) Bind(ctx context.Context, sb sandbox.Sandbox, b sandbox.Binding) error {
	s, ok := sb.(*sbx)
	if !ok || s.d != d {
		return fmt.Errorf("binding a sandbox the kubernetes driver did not create: %w", errdefs.ErrInvalidArgument)
	}
	if b.Network != sandbox.NetworkNone || b.Egress != nil {
		return fmt.Errorf("binding sandbox %s to a network: %s: %w", s.id, d.caps.Lacks["BindEgress"], errdefs.ErrInvalidArgument)
	}
	s.bindMu.Lock()
	defer s.bindMu.Unlock()
	if !s.unbound {
		return fmt.Errorf("sandbox %s is bound already (a Create binds at once; Bind binds once): %w", s.id, errdefs.ErrFailedPrecondition)
	}
	cur := s.Guest.Limits
	if err := b.Limits.Check(cur); err != nil {
		return fmt.Errorf("binding sandbox %s: limits only tighten: %w", s.id, err)
	}
	next := b.Limits.WithDefaults(cur)
	switch {
	case next.Memory != cur.Memory || next.CPU != cur.CPU:
		return fmt.Errorf("binding sandbox %s: a running pod's memory and CPU cannot change (%s, %g CPU): %w",
			s.id, sandbox.FormatSize(cur.Memory), cur.CPU, errdefs.ErrInvalidArgument)
	case next.TmpSize != cur.TmpSize:
		return fmt.Errorf("binding sandbox %s: /tmp keeps the size it was mounted with (%s): %w", s.id, sandbox.FormatSize(cur.TmpSize), errdefs.ErrInvalidArgument)
	case next.Pids != cur.Pids:
		return fmt.Errorf("binding sandbox %s: a pod's pids limit is fixed when it starts: %w", s.id, errdefs.ErrInvalidArgument)
	}
	pods := d.cs.CoreV1().Pods(d.cfg.Namespace)
	gctx, cancel := context.WithTimeout(ctx, d.cfg.CallTimeout)
	pod, err := pods.Get(gctx, s.name, metav1.GetOptions{})
	cancel()
	if err != nil {
		return d.apiError("reading pod "+s.name+" in", err)
	}
	if string(pod.UID) != s.uid {
		return fmt.Errorf("binding sandbox %s: its pod %s is gone: %w", s.id, s.name, errdefs.ErrFailedPrecondition)
	}
	labels := podLabels(pod)
	for k := range b.Labels {
		if _, ok := labels[k]; ok {
			return fmt.Errorf("binding sandbox %s: it has label %q already: %w", s.id, k, errdefs.ErrInvalidArgument)
		}
	}
	if labels == nil {
		labels = map[string]string{}
	}
	labels = maps.Clone(labels)
	maps.Copy(labels, b.Labels)
	patch, err := bindPatch(pod, labels, b.Limits.Timeout, s.session, time.Now())
	if err != nil {
		return err
	}
	return s.Guest.Retune(next, func() error {
		pctx, cancel := context.WithTimeout(ctx, d.cfg.CallTimeout)
		defer cancel()
		if _, err := pods.Patch(pctx, s.name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return d.apiError("binding pod "+s.name+" in", err)
		}
		s.unbound = false
		return nil
	})
}

// bindPatch is the JSON merge patch that binds pod: labels, the Spec's
// labels and the binding's, in its annotation, and, for a binding with
// a timeout of a pod that is not a session's, a deadline of the time the
// pod has run (since its start, from which the kubelet counts) plus the
// timeout and lifetimeMargin, where that is below the pod's.
func bindPatch(pod *corev1.Pod, labels map[string]string, timeout time.Duration, session bool, now time.Time) ([]byte, error) {
	lj, err := json.Marshal(labels)
	if err != nil {
		return nil, fmt.Errorf("encoding labels: %w", err)
	}
	type meta struct {
		Annotations map[string]string `json:"annotations"`
	}
	type spec struct {
		ActiveDeadlineSeconds int64 `json:"activeDeadlineSeconds"`
	}
	p := struct {
		Metadata meta  `json:"metadata"`
		Spec     *spec `json:"spec,omitempty"`
	}{Metadata: meta{Annotations: map[string]string{AnnotationLabels: string(lj)}}}
	if timeout > 0 && !session && pod.Spec.ActiveDeadlineSeconds != nil {
		start := pod.CreationTimestamp.Time
		if pod.Status.StartTime != nil {
			start = pod.Status.StartTime.Time
		}
		life := max(now.Sub(start), 0) + timeout + lifetimeMargin
		if secs := int64((life + time.Second - 1) / time.Second); secs < *pod.Spec.ActiveDeadlineSeconds {
			p.Spec = &spec{ActiveDeadlineSeconds: secs}
		}
	}
	return json.Marshal(p)
}
