package wiring

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/driver/kubernetes"
	"github.com/stockade-sh/stockade/internal/fsmode"
	"github.com/stockade-sh/stockade/internal/registry"
	"github.com/stockade-sh/stockade/sandbox"
)

// The names of the kubernetes driver's two values: one per tier, since a
// pod's RuntimeClass is the tier (driver/kubernetes). KubernetesGVisor is
// also the name of the configuration's driver (config.Config.Driver).
const (
	KubernetesGVisor    = "kubernetes"
	KubernetesContainer = "kubernetes-container"
)

// KubernetesDrivers returns the drivers of a daemon whose sandboxes are
// pods of the cluster k names: the gvisor tier (KubernetesGVisor) and the
// container tier (KubernetesContainer), and no local tier, so that every
// tool's tier is served by the cluster (tools.DriverFor picks by tier).
// The images are the runtime images with the guest at guestPath, named as
// kubernetes.ImageRef has it and imported on the nodes, or with
// k.Registry by digest in that registry (`stockade image push`). With
// k.SeccompDir set it writes Stockade's filters there (0600) and the
// pods load them as Localhost profiles.
//
// The driver has no egress (its capabilities declare only
// sandbox.NetworkNone), so a tool with egress is refused when the tools
// load, with the reason; nor pause, resume or fork (Capabilities.Lacks).
func KubernetesDrivers(k config.Kubernetes, guestPath string) (map[string]sandbox.Driver, error) {
	out := map[string]sandbox.Driver{}
	for name, tier := range kubernetesTiers {
		seccomp, err := kubernetesSeccomp(k.SeccompDir, tier, true)
		if err != nil {
			return nil, err
		}
		d, err := kubernetes.New(kubernetesConfig(k, tier, seccomp, guestPath))
		if err != nil {
			return nil, err
		}
		out[name] = d
	}
	return out, nil
}

// kubernetesTiers are the tiers of the kubernetes driver's values by name.
var kubernetesTiers = map[string]sandbox.Tier{KubernetesGVisor: sandbox.TierGVisor, KubernetesContainer: sandbox.TierContainer}

// KubernetesCapabilities are what KubernetesDrivers(k, ...) declare, by
// name, without building them or writing anything.
func KubernetesCapabilities(k config.Kubernetes) map[string]sandbox.Capabilities {
	out := map[string]sandbox.Capabilities{}
	for name, tier := range kubernetesTiers {
		// Without writing, naming the filter cannot fail but for a
		// broken profile, which every sandbox's creation reports.
		seccomp, _ := kubernetesSeccomp(k.SeccompDir, tier, false)
		out[name] = kubernetes.Capabilities(kubernetesConfig(k, tier, seccomp, ""))
	}
	return out
}

// kubernetesConfig is the driver's configuration of tier.
func kubernetesConfig(k config.Kubernetes, tier sandbox.Tier, seccomp, guestPath string) kubernetes.Config {
	class := k.GVisorClass
	if tier == sandbox.TierContainer {
		class = k.ContainerClass
	}
	return kubernetes.Config{Kubeconfig: k.Kubeconfig, Namespace: k.Namespace, Tier: tier,
		RuntimeClass: class, GuestPath: guestPath, Seccomp: seccomp, Registry: k.Registry, RegistryInsecure: k.RegistryInsecure,
		// The credentials `stockade image push` takes.
		RegistryAuth: registry.Options{Username: os.Getenv("STOCKADE_REGISTRY_USERNAME"), Password: os.Getenv("STOCKADE_REGISTRY_PASSWORD")}}
}

// kubernetesSeccomp returns the name of Stockade's filter of tier in the
// kubelet's seccomp directory dir, writing it there if write; "" without
// dir.
func kubernetesSeccomp(dir string, tier sandbox.Tier, write bool) (string, error) {
	if dir == "" {
		return "", nil
	}
	name, data, err := kubernetes.SeccompProfile(tier)
	if err != nil || !write {
		return name, err
	}
	if err := os.MkdirAll(dir, fsmode.Dir); err != nil {
		return "", fmt.Errorf("kubernetes: the kubelet's seccomp directory: %w", err)
	}
	p := filepath.Join(dir, name)
	if err := fsmode.PrivateFile(p); err != nil {
		return "", fmt.Errorf("kubernetes: writing Stockade's seccomp filter: %w", err)
	}
	if err := os.WriteFile(p, data, fsmode.File); err != nil {
		return "", fmt.Errorf("kubernetes: writing Stockade's seccomp filter: %w", err)
	}
	return name, nil
}
