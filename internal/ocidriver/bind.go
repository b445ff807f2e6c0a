package ocidriver

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"

	"github.com/stockade-sh/stockade/errdefs"
	"github.com/stockade-sh/stockade/internal/oci"
	"github.com/stockade-sh/stockade/internal/sandboxkit"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/supervisor"
)

var _ sandbox.Binder = (*Driver)(nil)

// bindingFile holds, in a bundle, the labels a Bind gave the sandbox (for a
// detached one, its shim's record holds them).
const bindingFile = "binding.json"

// CreateUnbound is Create for a sandbox that Bind binds later.
func (d *Driver) CreateUnbound(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	return d.create(ctx, spec, true)
}

// Bind binds an unbound sandbox once: its labels are recorded where Reap
// and Reattach read them, and its limits tighten in its cgroup (memory)
// and through the runtime (CPU, pids) before the guest applies them
// (timeout, output cap). A sandbox's /tmp keeps the size it was mounted
// with, and under gVisor its pids limit (the Sentry's RLIMIT_NPROC) too:
// a Binding that changes either is refused. The network is given at
// create only (Capabilities.Lacks["BindEgress"]).
func (d *Driver) Bind(ctx context.Context, sb sandbox.Sandbox, b sandbox.Binding) error {
	s, ok := sb.(*sbx)
	if !ok || s.d != d {
		return fmt.Errorf("binding a sandbox the %s driver did not create: %w", d.cfg.Name, errdefs.ErrInvalidArgument)
	}
	if b.Network != sandbox.NetworkNone || b.Egress != nil {
		return fmt.Errorf("binding sandbox %s to a network: %s: %w", s.id, d.Capabilities().Lacks["BindEgress"], errdefs.ErrInvalidArgument)
	}
	s.bindMu.Lock()
	defer s.bindMu.Unlock()
	if !s.unbound {
		return fmt.Errorf("sandbox %s is bound already (a Create binds at once; Bind binds once): %w", s.id, errdefs.ErrFailedPrecondition)
	}
	for k := range b.Labels {
		if _, ok := s.labels[k]; ok {
			return fmt.Errorf("binding sandbox %s: it has label %q already: %w", s.id, k, errdefs.ErrInvalidArgument)
		}
	}
	cur := s.Guest.Limits
	if err := b.Limits.Check(cur); err != nil {
		return fmt.Errorf("binding sandbox %s: limits only tighten: %w", s.id, err)
	}
	next := b.Limits.WithDefaults(cur)
	switch {
	case next.TmpSize != cur.TmpSize:
		return fmt.Errorf("binding sandbox %s: /tmp keeps the size it was mounted with (%s): %w", s.id, sandbox.FormatSize(cur.TmpSize), errdefs.ErrInvalidArgument)
	case next.Pids != cur.Pids && d.cfg.Kernel == oci.UserSpaceKernel:
		return fmt.Errorf("binding sandbox %s: the %s tier's pids limit is fixed when the sandbox starts (the Sentry's RLIMIT_NPROC): %w", s.id, d.cfg.Name, errdefs.ErrInvalidArgument)
	}
	labels := maps.Clone(s.labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, b.Labels)
	return s.Guest.Retune(next, func() error {
		if err := s.tighten(ctx, cur, next); err != nil {
			return err
		}
		if err := s.recordBinding(labels, next); err != nil {
			// The record is what a restarted daemon trusts; without it
			// the tighter limits stay, the binding does not happen.
			return err
		}
		s.labels, s.unbound = labels, false
		return nil
	})
}

// tighten applies next's CPU and pids through the runtime and its memory
// in the sandbox's memory cgroup (which the driver made and owns: see
// prepare). Memory goes last: it may fail when the sandbox uses more than
// next allows, and then the runtime's update is undone.
func (s *sbx) tighten(ctx context.Context, cur, next sandbox.Limits) error {
	cpu, pids := next.CPU != cur.CPU, next.Pids != cur.Pids
	update := func(l sandbox.Limits) error {
		var args []string
		if cpu {
			args = append(args, "--cpu-quota", strconv.FormatInt(int64(l.CPU*oci.CPUPeriod), 10), "--cpu-period", strconv.Itoa(oci.CPUPeriod))
		}
		if pids {
			args = append(args, "--pids-limit", strconv.FormatInt(l.Pids, 10))
		}
		if len(args) == 0 {
			return nil
		}
		out, err := s.d.runtimeCmd(ctx, s.network, append(append([]string{"update"}, args...), s.id)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("updating sandbox %s's limits: %v: %s: %w", s.id, err, sandboxkit.OneLine(string(out)), errdefs.ErrUnavailable)
		}
		return nil
	}
	if err := update(next); err != nil {
		return err
	}
	if next.Memory != cur.Memory {
		if err := s.cg.prepare(next.Memory); err != nil {
			_ = update(cur)
			return fmt.Errorf("binding sandbox %s: %w (it may use more memory than the binding allows)", s.id, err)
		}
	}
	return nil
}

// recordBinding records a binding's labels and limits: in the shim's
// record of a detached sandbox, in the bundle otherwise.
func (s *sbx) recordBinding(labels map[string]string, limits sandbox.Limits) error {
	if s.shim == nil {
		b, err := json.Marshal(labels)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(s.d.bundleDir(s.id), bindingFile), b, 0o600); err != nil {
			return fmt.Errorf("recording the binding of sandbox %s: %w", s.id, err)
		}
		return nil
	}
	key, err := supervisor.LoadKey(s.d.shimRoot())
	if err != nil {
		return err
	}
	m, err := s.d.readShimMeta(s.id)
	if err != nil {
		return fmt.Errorf("recording the binding of sandbox %s: %w", s.id, err)
	}
	return s.writeMeta(key, m, labels, false, limits)
}

// readBinding reads the labels a Bind recorded in a bundle; nil when none.
func readBinding(bundle string) map[string]string {
	var labels map[string]string
	if b, err := os.ReadFile(filepath.Join(bundle, bindingFile)); err == nil {
		_ = json.Unmarshal(b, &labels)
	}
	return labels
}
