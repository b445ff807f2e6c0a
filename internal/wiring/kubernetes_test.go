package wiring

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stockade-sh/stockade/config"
	"github.com/stockade-sh/stockade/sandbox"
	"github.com/stockade-sh/stockade/tools"
)

// kubeconfig writes a kubeconfig of a cluster that does not exist: the
// kubernetes driver reads it but contacts the cluster only in Health and
// Create.
func kubeconfig(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	const kc = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: stockade}}]
current-context: x
`
	if err := os.WriteFile(p, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKubernetesDrivers checks the wiring of driver kubernetes: only the
// cluster's two drivers, one per tier, each tier served by the cluster;
// Stockade's filters written to the seccomp directory; a tool with egress
// refused with the reason; pause, resume and fork declared absent.
func TestKubernetesDrivers(t *testing.T) {
	cfg := config.Default()
	seccomp := t.TempDir()
	cfg.Driver, cfg.Kubernetes.Kubeconfig, cfg.Kubernetes.SeccompDir = KubernetesGVisor, kubeconfig(t), seccomp
	cfg.Kubernetes.ContainerClass = "runc-nonet"
	cfg.DataDir, cfg.StateDir, cfg.GuestPath, cfg.Egress = t.TempDir(), t.TempDir(), "/nonexistent/guest", false
	drivers, err := Drivers(cfg)
	if err != nil {
		t.Fatal(err)
	}
	caps := tools.CapabilitiesOf(drivers)
	for tier, want := range map[sandbox.Tier]string{sandbox.TierGVisor: KubernetesGVisor, sandbox.TierContainer: KubernetesContainer} {
		if name, _, _ := tools.DriverFor(caps, tier); name != want {
			t.Errorf("tier %s: served by driver %q, want %q", tier, name, want)
		}
	}
	if len(drivers) != 2 {
		t.Errorf("drivers %v, want the cluster's two only", slices.Sorted(maps.Keys(drivers)))
	}
	if b := caps[KubernetesGVisor].Boundary; !strings.Contains(b, "RuntimeClass gvisor") {
		t.Errorf("gvisor tier's boundary %q, want its RuntimeClass named", b)
	}
	if b := caps[KubernetesContainer].Boundary; !strings.Contains(b, "Stockade's seccomp filter") {
		t.Errorf("container tier's boundary %q, want Stockade's filter", b)
	}
	for _, c := range caps {
		if c.Snapshots || c.Lacks["Snapshots"] == "" || slices.Contains(c.NetworkModes, sandbox.NetworkEgress) {
			t.Errorf("capabilities %+v: want no snapshots (with the reason) and no egress", c)
		}
	}
	files, _ := os.ReadDir(seccomp)
	if len(files) != 2 {
		t.Errorf("the seccomp directory holds %d files, want a filter per tier", len(files))
	}
	for _, f := range files {
		if fi, err := f.Info(); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() == 0 {
			t.Errorf("%s: %v, %v: want a filter of mode 0600", f.Name(), fi.Mode(), err)
		}
	}

	// A tool with egress is refused when the tools load, with the reason.
	dir := t.TempDir()
	const tool = `tools:
  - name: fetch
    tier: gvisor
    input_trust: untrusted
    runtimes: [python]
    egress: {allow: [example.com], ports: [443]}
`
	if err := os.WriteFile(filepath.Join(dir, "tools.yaml"), []byte(tool), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Tools, cfg.Serving = filepath.Join(dir, "tools.yaml"), true
	_, err = Engine(cfg)
	if err == nil || !strings.Contains(err.Error(), "no driver of this host gives egress") {
		t.Errorf("Engine with a tool with egress: got %v, want it refused with the reason", err)
	}
	t.Logf("a tool with egress: %v", err)
	cfg.Tools = ""
	if _, err := Engine(cfg); err != nil {
		t.Errorf("Engine without the tool: %v", err)
	}
}
